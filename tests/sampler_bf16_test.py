"""Sampler's bf16 mode (sample_dtype='bfloat16'): same greedy tokens as fp32 where logits are
well separated, fp32 log-probs whose gap to the learner's fp32 recompute is reported, one
compile per bucket, sharded rows, and the memory estimate of the cast copy."""

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rlreason.model import sharding
from rlreason.model import transformer
from rlreason.rollout import sampler
from rlreason.structs import Prefixes

CFG = transformer.ModelConfig(vocab_size=32, hidden_size=32, intermediate_size=64, num_layers=2,
                              num_heads=4, num_kv_heads=2, head_dim=8, qkv_bias=True)
BF16 = 'bfloat16'

# The teacher-forced references, jitted: eager, each primitive compiles on its own.
_apply = jax.jit(transformer.apply, static_argnames=('cfg',))


@pytest.fixture(scope='module')
def params():
  # As sampler_test's fixture: larger-than-default weights give peaked distributions.
  p = transformer.init_params(CFG, jax.random.key(0))
  return jax.tree.map(lambda x: x * 5 if x.ndim > 1 else x, p)


@pytest.fixture(scope='module')
def separated():
  """Well-separated logits: a permutation-copy head (lm_head = 10 E[perm]^T) makes the
  current token's successor win by a wide margin, shifted by the layers (weights x2, which
  change the margins by half). The random x5 model above has margins down to 1e-3, under
  bf16's ~2e-2 logit error, so its greedy tokens may rightly differ."""
  p = jax.tree.map(lambda x: x * 2 if x.ndim > 1 else x,
                   transformer.init_params(CFG, jax.random.key(0)))
  p['lm_head'] = 10 * p['embed'][np.random.default_rng(0).permutation(CFG.vocab_size)].T
  return p


@pytest.fixture(scope='module')
def prompts():
  return sampler.prepare_prompts([[5, 6, 7], [1, 2, 3, 4, 9], [8]], buckets=(4, 8), pad_id=0)


def _teacher_forced(params, rollout, temperature=1.0):
  """The learner's fp32 log-probs of the rollout's tokens."""
  tokens, mask = sampler.sequences(rollout)
  logits = _apply(params, tokens, cfg=CFG, mask_NxT=mask)[0] / temperature
  p = rollout.prompts.tokens_BxP.shape[1]
  lp = jnp.take_along_axis(jax.nn.log_softmax(logits[:, p - 1:-1], -1),
                           rollout.tokens_NxL[..., None], -1)[..., 0]
  return jnp.where(rollout.mask_NxL, lp, 0.0)


def _assert_well_separated(params, rollout):
  """At every sampled position fp32's best logit leads the runner-up by more than twice the
  largest change bf16 makes to any logit (a bf16 teacher-forced forward of the same
  sequences), so no argmax can flip."""
  tokens, mask = sampler.sequences(rollout)
  bf16_cfg = CFG.replace(param_dtype=BF16, compute_dtype=BF16)
  bf16_params = jax.tree.map(lambda x: x.astype(BF16), params)
  p = rollout.prompts.tokens_BxP.shape[1]
  f32_NxLxV = _apply(params, tokens, cfg=CFG, mask_NxT=mask)[0][:, p - 1:-1]
  bf16_NxLxV = _apply(bf16_params, tokens, cfg=bf16_cfg, mask_NxT=mask)[0][:, p - 1:-1]
  sampled = np.asarray(rollout.mask_NxL)
  top2_NxLx2 = jax.lax.top_k(f32_NxLxV, 2)[0]
  margin = np.asarray(top2_NxLx2[..., 0] - top2_NxLx2[..., 1])[sampled].min()
  error = np.abs(np.asarray(bf16_NxLxV - f32_NxLxV))[sampled].max()
  assert margin > 2 * error, (margin, error)


def test_greedy_tokens_equal_fp32_where_logits_are_well_separated(separated, prompts):
  kw = dict(cfg=CFG, group_size=2, max_new_tokens=12, temperature=0.0, rng=jax.random.key(1))
  f32 = sampler.generate(separated, prompts, **kw)
  bf16 = sampler.generate(separated, prompts, sample_dtype=BF16, **kw)
  _assert_well_separated(separated, f32)
  assert len(np.unique(np.asarray(f32.tokens_NxL))) > 10  # Not one token repeated.
  np.testing.assert_array_equal(bf16.tokens_NxL, f32.tokens_NxL)
  np.testing.assert_array_equal(bf16.mask_NxL, f32.mask_NxL)
  # Recorded log-probs are fp32 numbers, close to fp32's but not equal (the bf16 policy's).
  assert bf16.logprobs_NxL.dtype == jnp.float32
  np.testing.assert_allclose(bf16.logprobs_NxL, f32.logprobs_NxL, atol=0.05)
  assert not np.array_equal(np.asarray(bf16.logprobs_NxL), np.asarray(f32.logprobs_NxL))


def test_greedy_with_prefixes_equals_fp32(separated, prompts):
  toks = np.tile(np.array([[4, 5]], np.int32), (6, 1))
  pmask = np.array([[True, True], [True, False], [False, False]] * 2)
  prefixes = Prefixes(tokens_NxQ=jnp.asarray(toks), mask_NxQ=jnp.asarray(pmask))
  kw = dict(cfg=CFG, group_size=2, max_new_tokens=6, temperature=0.0, prefixes=prefixes,
            rng=jax.random.key(2))
  f32 = sampler.generate(separated, prompts, **kw)
  bf16 = sampler.generate(separated, prompts, sample_dtype=BF16, **kw)
  _assert_well_separated(separated, f32)
  np.testing.assert_array_equal(bf16.tokens_NxL, f32.tokens_NxL)
  np.testing.assert_allclose(bf16.logprobs_NxL, f32.logprobs_NxL, atol=0.05)


@pytest.mark.parametrize('temperature, top_k', [(1.0, 0), (0.7, 5)])
def test_logprob_gap_to_the_fp32_recompute_is_reported(params, prompts, temperature, top_k):
  r = sampler.generate(params, prompts, cfg=CFG, group_size=4, max_new_tokens=16,
                       temperature=temperature, top_k=top_k, sample_dtype=BF16,
                       rng=jax.random.key(3))
  learner = _teacher_forced(params, r, temperature)
  sampled = np.asarray(r.mask_NxL)
  gap = np.asarray(r.logprobs_NxL - learner)[sampled]
  abs_gap, behaviour_minus_learner = np.abs(gap).mean(), gap.mean()
  print(f'bf16 mode at temperature {temperature}, top_k {top_k}: mean |gap| {abs_gap:.2e}, '
        f'mean behaviour - learner {behaviour_minus_learner:+.2e}, max |gap| '
        f'{np.abs(gap).max():.2e} over {gap.size} tokens')
  # The bf16 policy is not the fp32 one (gap > 0), and near it: the fp32 mode's gap is
  # <= 1e-5 (sampler_test); bf16 rounding of weights, activations and cache gives ~1e-3.
  assert 0 < abs_gap < 0.05
  assert np.isfinite(behaviour_minus_learner) and abs(behaviour_minus_learner) <= abs_gap
  # Within the bf16 policy, truncation still renormalises upwards, as in fp32.
  trunc_gap = np.asarray(r.behaviour_logprobs_NxL - r.logprobs_NxL)[sampled]
  if top_k:
    assert (trunc_gap >= -1e-6).all() and trunc_gap.max() > 0
  else:
    np.testing.assert_array_equal(trunc_gap, 0.0)


def test_no_recompilation_within_a_bucket(params, monkeypatch):
  chex.clear_trace_counter()  # sampler_test's same check counts traces of the same function.
  monkeypatch.setattr(sampler, '_generate', chex.assert_max_traces(sampler._generate, n=1))
  sampler._generate_fn.cache_clear()
  for i, rows in enumerate([[[1, 2]], [[3, 4, 5]], [[6]]]):  # All fit bucket 4.
    prompts = sampler.prepare_prompts(rows, buckets=(4, 8))
    sampler.generate(params, prompts, cfg=CFG, group_size=2, max_new_tokens=3,
                     temperature=0.5 + i, sample_dtype=BF16, rng=jax.random.key(i))
  sampler._generate_fn.cache_clear()


def test_sharded_greedy_equals_single_device(params, prompts):
  mesh = sharding.make_mesh({'data': 2, 'fsdp': 1, 'tensor': 4})
  kw = dict(cfg=CFG, group_size=4, max_new_tokens=20, temperature=0.0, sample_dtype=BF16,
            rng=jax.random.key(8))
  single = sampler.generate(params, prompts, **kw)
  with jax.set_mesh(mesh):
    sharded_params = jax.device_put(params, sharding.param_shardings(CFG, mesh,
                                                                     sharding.SAMPLE_RULES))
    sharded = sampler.generate(sharded_params, prompts, mesh=mesh, **kw)
  np.testing.assert_array_equal(sharded.tokens_NxL, single.tokens_NxL)
  np.testing.assert_allclose(sharded.logprobs_NxL, single.logprobs_NxL, atol=0.05)


def test_memory_estimate_counts_the_cast_copy():
  kw = dict(batch=2, group_size=4, prompt_len=8, max_new_tokens=40, max_chunks=1)
  f32 = sampler.memory_estimate(CFG, **kw)
  bf16 = sampler.memory_estimate(CFG, sample_dtype=BF16, **kw)
  # K and V of 2 layers x 2 kv heads x Dh 8 per slot: 64 numbers, 256 bytes fp32, 128 bf16;
  # slots 2 * 8 prompt + 8 rows * 40 = 336.
  assert f32['kv_cache'] == 336 * 256 and bf16['kv_cache'] == 336 * 128
  assert 'sample_params' not in f32
  assert bf16['sample_params'] == CFG.num_params() * 2  # The bf16 copy, next to fp32 params.
  assert bf16['params'] == f32['params'] == CFG.num_params() * 4
  # An explicit cache dtype wins; params already in bf16 need no copy.
  assert sampler.memory_estimate(CFG, sample_dtype=BF16, cache_dtype='float32',
                                 **kw)['kv_cache'] == f32['kv_cache']
  assert 'sample_params' not in sampler.memory_estimate(CFG.replace(param_dtype=BF16),
                                                        sample_dtype=BF16, **kw)


def test_unknown_sample_dtype_fails_before_compiling(params, prompts):
  sampler._generate_fn.cache_clear()
  with pytest.raises(ValueError, match='sample_dtype'):
    sampler.generate(params, prompts, cfg=CFG, group_size=2, max_new_tokens=4,
                     sample_dtype='float16', rng=jax.random.key(0))
  assert sampler._generate_fn.cache_info().currsize == 0


def test_the_loop_samples_in_bf16_when_configured(tmp_path):
  """rl.sample_dtype reaches the sampler: the learner-vs-sampler gap is logged and nonzero
  (fp32 sampling records the learner's own log-probs, up to numerics)."""
  import train_test  # tests/ is on sys.path under pytest
  from rlreason import config as config_lib
  from rlreason.rl import metrics, train
  c = train_test.tiny_config(steps=1)
  c.sft.steps, c.eval.every, c.checkpoint.every = 0, 0, 0
  with pytest.raises(ValueError, match='rl.sample_dtype'):
    bad = train_test.tiny_config(steps=1)
    bad.rl.sample_dtype = 'float16'
    config_lib.validate(bad, num_devices=jax.device_count())
  gaps = {}
  for dtype in ('', 'bfloat16'):
    c.rl.sample_dtype = dtype
    train.train(c, str(tmp_path / (dtype or 'fp32')))
    log = [r for r in metrics.read_jsonl(tmp_path / (dtype or 'fp32') / 'metrics.jsonl')
           if r['step'] == 1][-1]
    gaps[dtype] = log['offpolicy/abs_logprob_diff']
  assert gaps['bfloat16'] > 10 * gaps[''] and gaps['bfloat16'] > 1e-4, gaps
