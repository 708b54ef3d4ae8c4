"""Model invariants that need no reference implementation (parity with transformers lives in
model_parity_test.py): cache equivalence, padding, sharding, remat and dtype policy."""

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rlreason.model import sharding
from rlreason.model import transformer

CFG = transformer.ModelConfig(vocab_size=97, hidden_size=64, intermediate_size=96, num_layers=2,
                        num_heads=4, num_kv_heads=2, head_dim=16, qkv_bias=True, qk_norm=True)


@pytest.fixture(scope='module')
def params():
  return transformer.init_params(CFG, jax.random.key(0))


def _tokens(n, t, seed=1):
  return jax.random.randint(jax.random.key(seed), (n, t), 0, CFG.vocab_size)


# Jitted: eager dispatch compiles every primitive of every shape apart (3x the CPU). The
# eager path is the without_jit variant of test_prefill_then_decode_equals_full_forward.
_apply = jax.jit(transformer.apply, static_argnames=('cfg',))


@jax.jit
def _forward(params, tokens, mask=None):
  return transformer.apply(params, tokens, cfg=CFG, mask_NxT=mask)[0]


class ModelTest(chex.TestCase):

  @chex.variants(with_jit=True, without_jit=True)
  def test_prefill_then_decode_equals_full_forward(self):
    params = transformer.init_params(CFG, jax.random.key(0))
    tokens_NxT = _tokens(3, 11)
    full_NxTxV = _forward(params, tokens_NxT)
    step = self.variant(lambda p, t, c: transformer.apply(p, t, cfg=CFG, cache=c))
    cache = transformer.init_cache(CFG, 3, 16)
    logits, cache = step(params, tokens_NxT[:, :5], cache)
    outs = [logits]
    for i in range(5, 11):
      logits, cache = step(params, tokens_NxT[:, i:i + 1], cache)
      outs.append(logits)
    np.testing.assert_allclose(jnp.concatenate(outs, axis=1), full_NxTxV, atol=1e-5, rtol=1e-5)
    self.assertEqual(int(cache.end), 11)
    np.testing.assert_array_equal(cache.pos_N, [11, 11, 11])

  def test_chunked_prefill_equals_one_prefill(self):
    params = transformer.init_params(CFG, jax.random.key(0))
    tokens_NxT = _tokens(2, 12)
    cache = transformer.init_cache(CFG, 2, 12)
    a, cache = _apply(params, tokens_NxT[:, :7], cfg=CFG, cache=cache)
    b, cache = _apply(params, tokens_NxT[:, 7:], cfg=CFG, cache=cache)
    np.testing.assert_allclose(jnp.concatenate([a, b], 1), _forward(params, tokens_NxT),
                               atol=1e-5, rtol=1e-5)


def test_decode_with_a_rope_table_equals_computed_rope(params):
  # The sampler gathers RoPE's cos/sin from a table built once; left padding makes the two
  # rows' positions differ from their slots.
  tokens = _tokens(2, 9)
  mask = jnp.array([[False] * 2 + [True] * 5, [True] * 7])
  table = transformer.rope_table(CFG, 12)
  outs = {}
  for name, rope_table in (('computed', None), ('table', table)):
    cache = transformer.init_cache(CFG, 2, 12)
    _, cache = _apply(params, tokens[:, :7], cfg=CFG, mask_NxT=mask, cache=cache,
                      rope_table=rope_table)
    steps = []
    for i in (7, 8):
      logits, cache = _apply(params, tokens[:, i:i + 1], cfg=CFG, cache=cache,
                             rope_table=rope_table)
      steps.append(logits)
    # Keys of real slots only: a pad slot's key is never attended to.
    outs[name] = (jnp.concatenate(steps, 1), jnp.where(cache.mask_NxS[:, None, None],
                                                       cache.keys[1], 0.0))
  np.testing.assert_allclose(outs['table'][0], outs['computed'][0], atol=1e-6, rtol=1e-6)
  np.testing.assert_allclose(outs['table'][1], outs['computed'][1], atol=1e-6, rtol=1e-6)
  # And both equal the plain forward of each row's real tokens.
  row0 = _forward(params, tokens[:1, 2:])
  np.testing.assert_allclose(outs['table'][0][0], row0[0, -2:], atol=1e-5, rtol=1e-5)


def test_left_padding_does_not_change_real_logits(params):
  tokens = _tokens(1, 6)
  padded = jnp.concatenate([jnp.zeros((1, 4), tokens.dtype), tokens], axis=1)
  mask = jnp.arange(10)[None] >= 4
  np.testing.assert_allclose(_forward(params, padded, mask)[:, 4:], _forward(params, tokens),
                             atol=1e-5, rtol=1e-5)
  # Padded positions stay finite: a pad query with no visible key must not produce NaN.
  assert np.isfinite(np.asarray(_forward(params, padded, mask))).all()


def test_left_padded_prefill_then_decode(params):
  # Row 0 has 3 pads; row 1 none. Decoding continues each row at its own RoPE position.
  tokens = _tokens(2, 8)
  mask = jnp.array([[False] * 3 + [True] * 5, [True] * 8])
  cache = transformer.init_cache(CFG, 2, 12)
  _, cache = _apply(params, tokens, cfg=CFG, mask_NxT=mask, cache=cache)
  np.testing.assert_array_equal(cache.pos_N, [5, 8])
  nxt = _tokens(2, 1, seed=7)
  step_logits, _ = _apply(params, nxt, cfg=CFG, cache=cache)
  row0 = jnp.concatenate([tokens[:1, 3:], nxt[:1]], axis=1)
  row1 = jnp.concatenate([tokens[1:], nxt[1:]], axis=1)
  np.testing.assert_allclose(step_logits[0, 0], _forward(params, row0)[0, -1], atol=1e-5,
                             rtol=1e-5)
  np.testing.assert_allclose(step_logits[1, 0], _forward(params, row1)[0, -1], atol=1e-5,
                             rtol=1e-5)


@pytest.mark.parametrize('rules', [sharding.TRAIN_RULES, sharding.SAMPLE_RULES],
                         ids=['train', 'sample'])
def test_sharded_forward_equals_single_device(params, rules):
  mesh = sharding.make_mesh({'fsdp': 2, 'tensor': 4})
  shardings = sharding.param_shardings(CFG, mesh, rules)
  tokens = _tokens(4, 9)
  with jax.set_mesh(mesh):
    sharded = jax.device_put(params, shardings)
    tokens_sharded = jax.device_put(tokens, sharding.data_sharding(mesh, tokens.shape, rules))
    logits = jax.jit(_forward)(sharded, tokens_sharded)
  assert sharded['layers']['0']['mlp']['gate'].sharding.spec == jax.P(*(
      ('fsdp', 'tensor') if rules is sharding.TRAIN_RULES else (None, 'tensor')))
  np.testing.assert_allclose(logits, jax.jit(_forward)(params, tokens), atol=1e-5, rtol=1e-5)


def test_remat_leaves_gradients_unchanged(params):
  tokens = _tokens(2, 8)

  def loss(p, cfg):
    logits = transformer.apply(p, tokens, cfg=cfg)[0]
    return jnp.mean(jax.nn.logsumexp(logits, -1) - jnp.take_along_axis(
        logits, tokens[..., None], -1)[..., 0])

  plain = jax.jit(jax.grad(loss), static_argnums=1)(params, CFG)
  for remat in ('full', 'full_checkpoint', 'dots'):
    rematted = jax.jit(jax.grad(loss), static_argnums=1)(params, CFG.replace(remat=remat))
    chex.assert_trees_all_close(rematted, plain, atol=1e-6, rtol=1e-6)


def test_bf16_policy(params):
  cfg = CFG.replace(param_dtype='bfloat16', compute_dtype='bfloat16')
  p16 = transformer.init_params(cfg, jax.random.key(0))
  assert all(x.dtype == jnp.bfloat16 for x in jax.tree.leaves(p16))
  tokens = _tokens(2, 8)
  logits16 = _apply(p16, tokens, cfg=cfg)[0]
  assert logits16.dtype == jnp.float32  # log-softmax downstream is always fp32.
  # Same weights (bf16-rounded) in fp32 compute: bf16 activations stay close (relative to scale).
  p32 = jax.tree.map(lambda x: x.astype(jnp.float32), p16)
  logits32 = _apply(p32, tokens, cfg=CFG)[0]
  err = float(jnp.max(jnp.abs(logits16 - logits32)) / jnp.max(jnp.abs(logits32)))
  assert err < 0.05, err


def test_rope_is_relative():
  # <R(m) q, R(n) k> depends only on m - n: shift both positions, the scores stay the same.
  inv = transformer.rope_inv_freq(CFG)
  q = jax.random.normal(jax.random.key(0), (1, 1, 1, CFG.head_dim))
  k = jax.random.normal(jax.random.key(1), (1, 1, 1, CFG.head_dim))
  score = lambda m, n: jnp.sum(transformer.apply_rope(q, jnp.array([[m]]), inv) *
                               transformer.apply_rope(k, jnp.array([[n]]), inv))
  np.testing.assert_allclose(score(7, 3), score(107, 103), rtol=1e-4)
  np.testing.assert_allclose(transformer.apply_rope(q, jnp.array([[0]]), inv), q)


def test_llama3_rope_scaling_hand_computed():
  # head_dim 4, theta 10000: inv_freq = [1, 0.01], wavelengths 2*pi and 628.3.
  # original context 64, low 1 -> low_wavelen 64, high 4 -> high_wavelen 16:
  # 2*pi < 16 keeps 1.0; 628.3 > 64 divides by factor 8 -> 0.00125.
  cfg = CFG.replace(head_dim=4, rope_scaling=transformer.Llama3RopeScaling(
      factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0, original_max_position_embeddings=64))
  np.testing.assert_allclose(transformer.rope_inv_freq(cfg), [1.0, 0.00125], rtol=1e-6)
  # Medium band: theta = (32 / 2pi)^2 makes inv_freq[1] = 2pi/32 =: f, wavelength 32, between
  # 16 and 64: smooth = (64/32 - 1) / (4 - 1) = 1/3, inv = (1 - 1/3) f/8 + (1/3) f = f * 10/24.
  f = 2 * np.pi / 32
  cfg = cfg.replace(rope_theta=(32 / (2 * np.pi)) ** 2)
  np.testing.assert_allclose(transformer.rope_inv_freq(cfg), [1.0, f * 10 / 24], rtol=1e-5)


def test_config_errors_name_the_field():
  with pytest.raises(ValueError, match='num_kv_heads'):
    CFG.replace(num_heads=4, num_kv_heads=3)
  with pytest.raises(ValueError, match='family'):
    CFG.replace(family='gpt2')
  with pytest.raises(ValueError, match='compute_dtype'):
    CFG.replace(compute_dtype='float16')


def test_param_axes_match_params():
  axes = transformer.param_axes(CFG)
  shapes = transformer.abstract_params(CFG)
  jax.tree.map(lambda a, s: len(a) == len(s.shape) or pytest.fail(f'{a} vs {s.shape}'),
               axes, shapes, is_leaf=lambda x: isinstance(x, tuple))
  assert CFG.num_params() == sum(x.size for x in jax.tree.leaves(shapes))


def test_decode_over_a_shared_frozen_prompt_equals_a_repeated_cache(params):
  # The sampler's layout: B prompts prefilled once, read by G rows each through a frozen
  # segment, then each row's own tokens in chunks (one frozen, one being written).
  b, g = 2, 3
  prompts = _tokens(b, 6)
  mask = jnp.array([[False] * 2 + [True] * 4, [True] * 6])
  steps = _tokens(b * g, 5, seed=4)
  # Reference: the prompt cache repeated G times, one cache for everything.
  ref = transformer.init_cache(CFG, b * g, 11)
  _, ref = _apply(params, jnp.repeat(prompts, g, 0), cfg=CFG,
                  mask_NxT=jnp.repeat(mask, g, 0), cache=ref)
  want = []
  for i in range(5):
    logits, ref = _apply(params, steps[:, i:i + 1], cfg=CFG, cache=ref)
    want.append(logits)
  # Segments: the prompt once, then chunks of 2 and 3 own slots.
  prompt_cache = transformer.init_cache(CFG, b, 6)
  _, prompt_cache = _apply(params, prompts, cfg=CFG, mask_NxT=mask, cache=prompt_cache)
  shared = (transformer.freeze(prompt_cache),)
  cache = transformer.init_cache(CFG, b * g, 2, frozen=shared,
                                 pos_N=jnp.repeat(prompt_cache.pos_N, g))
  got = []
  for i in range(2):
    logits, cache = _apply(params, steps[:, i:i + 1], cfg=CFG, cache=cache)
    got.append(logits)
  history = transformer.freeze(cache)
  cache = transformer.init_cache(CFG, b * g, 2, frozen=shared + (history,), pos_N=cache.pos_N)
  logits, cache = _apply(params, steps[:, 2:4], cfg=CFG, cache=cache)  # T = 2 at once.
  got.append(logits)
  history = transformer.freeze(cache, after=history)
  assert history.mask_AxS.shape == (b * g, 4)
  cache = transformer.init_cache(CFG, b * g, 1, frozen=shared + (history,), pos_N=cache.pos_N)
  logits, cache = _apply(params, steps[:, 4:5], cfg=CFG, cache=cache)
  got.append(logits)
  np.testing.assert_allclose(jnp.concatenate(got, 1), jnp.concatenate(want, 1), atol=1e-5,
                             rtol=1e-5)
  np.testing.assert_array_equal(cache.pos_N, ref.pos_N)


def test_frozen_segment_rows_must_divide_the_batch(params):
  seg = transformer.freeze(transformer.init_cache(CFG, 2, 4))
  with pytest.raises(ValueError, match='frozen segment has 2 rows.*batch=3'):
    transformer.init_cache(CFG, 3, 4, frozen=(seg,))
