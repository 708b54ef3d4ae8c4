"""LoRA by merging (lora.py) and base quantisation (quantize.py): exactness at B = 0, merged vs
unmerged projections, where gradients go, quantisation error bounds and hand cases, config
errors, sharding of the adapter on 8 fake devices."""

import functools

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rlreason.model import lora
from rlreason.model import quantize
from rlreason.model import sharding
from rlreason.model import transformer

CFG = transformer.ModelConfig(vocab_size=96, hidden_size=64, intermediate_size=96, num_layers=2,
                              num_heads=4, num_kv_heads=2, head_dim=16, qkv_bias=True)
CFG_TIED = CFG.replace(tie_embeddings=True, qk_norm=True, family='qwen3', qkv_bias=False)
ALL = lora.LoraConfig(rank=4, alpha=8.0, targets=('*',))


def _params(cfg, seed=0):
  return transformer.init_params(cfg, jax.random.key(seed))


def _random_adapter(cfg, lora_cfg, seed=1):
  """init's A with B redrawn nonzero, so every target changes the model."""
  adapter = lora.init(cfg, lora_cfg, jax.random.key(seed))
  leaves, treedef = jax.tree_util.tree_flatten_with_path(adapter)
  keys = jax.random.split(jax.random.key(seed + 1), len(leaves))
  new = [0.05 * jax.random.normal(k, x.shape) if path[-1].key == 'b' else x
         for (path, x), k in zip(leaves, keys)]
  return jax.tree.unflatten(treedef, new)


def _tokens(n=2, t=9, seed=3):
  return jax.random.randint(jax.random.key(seed), (n, t), 0, CFG.vocab_size)


def _logits(params, tokens, cfg):
  return transformer.apply(params, tokens, cfg=cfg)[0]


# Reference forwards outside the variant under test, jitted: eager, each primitive compiles
# on its own.
_jit_logits = jax.jit(_logits, static_argnums=2)
_jit_apply = jax.jit(transformer.apply, static_argnames=('cfg',))


class MergeTest(chex.TestCase):

  @chex.variants(with_jit=True, without_jit=True)
  def test_zero_b_is_the_base_model_bit_for_bit(self):
    for cfg in (CFG, CFG_TIED):
      params = _params(cfg)
      adapter = lora.init(cfg, ALL, jax.random.key(5))
      merge = self.variant(lambda p, a, cfg=cfg: lora.merge(p, a, cfg, ALL))
      jax.tree.map(np.testing.assert_array_equal, merge(params, adapter), params)
      # And through the forward, each compiled the same way (jitted or not).
      fwd = self.variant(lambda p, a, t, cfg=cfg: _logits(lora.merge(p, a, cfg, ALL), t, cfg))
      base_fwd = self.variant(lambda p, t, cfg=cfg: _logits(p, t, cfg))
      tokens = _tokens()
      np.testing.assert_array_equal(fwd(params, adapter, tokens), base_fwd(params, tokens))

  @chex.variants(with_jit=True, without_jit=True)
  def test_zero_b_over_a_bf16_base_is_the_base_bit_for_bit(self):
    # Targets come out fp32 (bf16 W upcast exactly, + 0); apply casts to the compute dtype.
    for compute in ('float32', 'bfloat16'):
      cfg = CFG.replace(param_dtype='bfloat16', compute_dtype=compute)
      params = _params(cfg)
      adapter = lora.init(cfg, ALL, jax.random.key(5))
      merged = self.variant(lambda p, a, cfg=cfg: lora.merge(p, a, cfg, ALL))(params, adapter)
      assert merged['layers']['0']['attn']['q'].dtype == jnp.float32
      assert merged['layers']['0']['attn']['q_bias'].dtype == jnp.bfloat16  # Untouched.
      tokens = _tokens()
      fwd = jax.jit(lambda p, t, cfg=cfg: _logits(p, t, cfg))
      np.testing.assert_array_equal(fwd(merged, tokens), fwd(params, tokens))

  @chex.variants(with_jit=True, without_jit=True)
  def test_zero_b_decode_step_is_the_base_bit_for_bit(self):
    # The MLP runs gate and up unstacked for one token: merging happens before either path.
    params, tokens = _params(CFG), _tokens()
    merged = self.variant(lambda p, a: lora.merge(p, a, CFG, ALL))(
        params, lora.init(CFG, ALL, jax.random.key(5)))
    outs = []
    for p in (params, merged):
      cache = transformer.init_cache(CFG, 2, 12)
      _, cache = _jit_apply(p, tokens[:, :8], cfg=CFG, cache=cache)
      outs.append(_jit_apply(p, tokens[:, 8:], cfg=CFG, cache=cache)[0])
    np.testing.assert_array_equal(outs[1], outs[0])

  @chex.variants(with_jit=True, without_jit=True)
  def test_merged_projections_equal_x_w_plus_s_x_a_b(self):
    params, adapter = _params(CFG), _random_adapter(CFG, ALL)
    merged = self.variant(lambda p, a: lora.merge(p, a, CFG, ALL))(params, adapter)
    x_NxTxD = jax.random.normal(jax.random.key(7), (2, 5, CFG.hidden_size))
    o_in = jax.random.normal(jax.random.key(8), (2, 5, CFG.num_heads, CFG.head_dim))
    s = ALL.alpha / ALL.rank
    hi = functools.partial(jnp.einsum, precision='highest')
    layer, ad = params['layers']['1'], adapter['layers']['1']
    m = merged['layers']['1']
    for n in ('q', 'k', 'v'):
      want = hi('ntd,dhk->nthk', x_NxTxD, layer['attn'][n]) + s * hi(
          'ntr,rhk->nthk', hi('ntd,dr->ntr', x_NxTxD, ad['attn'][n]['a']), ad['attn'][n]['b'])
      got = hi('ntd,dhk->nthk', x_NxTxD, m['attn'][n])
      np.testing.assert_allclose(got, want, atol=1e-5, rtol=1e-5)
    want = hi('nthk,hkd->ntd', o_in, layer['attn']['o']) + s * hi(
        'nthk,hkr,rd->ntd', o_in, ad['attn']['o']['a'], ad['attn']['o']['b'])
    np.testing.assert_allclose(hi('nthk,hkd->ntd', o_in, m['attn']['o']), want, atol=1e-5,
                               rtol=1e-5)
    for n in ('gate', 'up'):
      want = x_NxTxD @ layer['mlp'][n] + s * (x_NxTxD @ ad['mlp'][n]['a']) @ ad['mlp'][n]['b']
      np.testing.assert_allclose(x_NxTxD @ m['mlp'][n], want, atol=1e-5, rtol=1e-5)
    h_NxTxF = jax.random.normal(jax.random.key(9), (2, 5, CFG.intermediate_size))
    want = h_NxTxF @ layer['mlp']['down'] + s * (h_NxTxF @ ad['mlp']['down']['a']) @ ad['mlp'][
        'down']['b']
    np.testing.assert_allclose(h_NxTxF @ m['mlp']['down'], want, atol=1e-5, rtol=1e-5)
    tokens = _tokens()  # The embedding is a gather: row t of W plus s * (row t of A) B.
    want = params['embed'][tokens] + s * adapter['embed']['a'][tokens] @ adapter['embed']['b']
    np.testing.assert_allclose(merged['embed'][tokens], want, atol=1e-5, rtol=1e-5)
    want = x_NxTxD @ params['lm_head'] + s * (x_NxTxD @ adapter['lm_head']['a']) @ adapter[
        'lm_head']['b']
    np.testing.assert_allclose(x_NxTxD @ merged['lm_head'], want, atol=1e-5, rtol=1e-5)
    # Untargeted leaves pass through unchanged.
    np.testing.assert_array_equal(m['attn']['q_bias'], layer['attn']['q_bias'])

  @chex.variants(with_jit=True, without_jit=True)
  def test_gradients_reach_only_the_adapter(self):
    params, tokens = _params(CFG), _tokens()
    lora_cfg = lora.LoraConfig(rank=4, alpha=8.0)

    def loss(base, adapter):
      logits = _logits(lora.merge(base, adapter, CFG, lora_cfg), tokens, CFG)
      logp = jax.nn.log_softmax(logits[:, :-1])
      return -jnp.mean(jnp.take_along_axis(logp, tokens[:, 1:, None], axis=-1))

    grad = self.variant(jax.grad(loss, argnums=(0, 1)))
    adapter = lora.init(CFG, lora_cfg, jax.random.key(5))
    g_base, g_ad = grad(params, adapter)
    for g in jax.tree.leaves(g_base):
      np.testing.assert_array_equal(g, 0.0)
    q = g_ad['layers']['0']['attn']['q']
    # B = 0: dL/dA = s dL/dW' B^T = 0, while dL/dB = s A^T dL/dW' is not.
    np.testing.assert_array_equal(q['a'], 0.0)
    assert all(float(jnp.abs(g['b']).max()) > 0 for g in _leaf_dicts(g_ad))
    adapter = jax.tree.map(lambda p, g: p - 0.1 * g, adapter, g_ad)  # One SGD step moves B.
    g_base, g_ad = grad(params, adapter)
    assert all(float(jnp.abs(jnp.asarray(g)).max()) == 0 for g in jax.tree.leaves(g_base))
    assert all(float(jnp.abs(g['a']).max()) > 0 and float(jnp.abs(g['b']).max()) > 0
               for g in _leaf_dicts(g_ad))

  @chex.variants(with_jit=True, without_jit=True)
  def test_quantised_base_merges_to_its_dequantised_weights(self):
    params, tokens = _params(CFG), _tokens()
    for mode in ('int8', 'nf4'):
      lora_cfg = lora.LoraConfig(rank=4, alpha=8.0, quantize=mode, nf4_block=16)
      base = self.variant(lambda p, c=lora_cfg: lora.quantize_base(p, CFG, c))(params)
      assert base['layers']['0']['mlp']['up'][mode].dtype == (jnp.int8 if mode == 'int8'
                                                             else jnp.uint8)
      np.testing.assert_array_equal(base['embed'], params['embed'])  # Not quantised.
      adapter = lora.init(CFG, lora_cfg, jax.random.key(5))
      merged = self.variant(lambda b, a, c=lora_cfg: lora.merge(b, a, CFG, c))(base, adapter)
      deq = lora.dequantize_base(base, CFG)
      np.testing.assert_array_equal(_jit_logits(merged, tokens, CFG),
                                    _jit_logits(deq, tokens, CFG))
      for path in lora.target_paths(CFG, lora_cfg):
        w, q = lora._get(params, path), lora._get(base, path)
        bound = quantize.max_error(q) * (1 + 1e-6)
        assert bool(jnp.all(jnp.abs(lora._get(merged, path) - w) <= bound)), (mode, path)
      # Gradients still reach A and B through the dequantised base.
      loss = lambda a, c=lora_cfg: _logits(lora.merge(base, a, CFG, c), tokens, CFG).sum()
      g = jax.jit(jax.grad(loss))(_random_adapter(CFG, lora_cfg))
      assert all(float(jnp.abs(x).max()) > 0 for x in jax.tree.leaves(g))


def _leaf_dicts(tree):
  if 'a' in tree:
    return [tree]
  return [d for v in tree.values() for d in _leaf_dicts(v)]


# ----------------------------------------------------------------------------- quantisation


def test_int8_hand_case():
  # Columns are output channels (in_axes=(0,)): absmax 1.27 -> scale 0.01, 2.54 -> 0.02;
  # codes 1.27/0.01 = 127, 0/0.01 = 0, -0.5/0.02 = -25, 2.54/0.02 = 127.
  w = jnp.array([[1.27, -0.5], [0.0, 2.54]], jnp.float32)
  q = quantize.quantize_int8(w, in_axes=(0,))
  np.testing.assert_array_equal(q['int8'], [[127, -25], [0, 127]])
  np.testing.assert_allclose(q['scale'], [[0.01, 0.02]], rtol=1e-6)
  np.testing.assert_allclose(quantize.dequantize(q), w, rtol=1e-6)


def test_int8_error_within_half_a_step_and_zero_channels_stay_zero():
  w = jax.random.normal(jax.random.key(0), (4, 3, 8)).at[..., 0].set(0.0)
  q = quantize.quantize_int8(w, in_axes=(0, 1))
  assert q['scale'].shape == (1, 1, 8)
  err = jnp.abs(quantize.dequantize(q) - w)
  assert bool(jnp.all(err <= quantize.max_error(q) * (1 + 1e-6)))
  np.testing.assert_array_equal(quantize.dequantize(q)[..., 0], 0.0)
  assert not bool(jnp.any(jnp.isnan(quantize.dequantize(quantize.quantize_int8(
      jnp.zeros((3, 2)), in_axes=(0,))))))


def test_nf4_code_table_and_hand_case():
  # Table from QLoRA appendix E / bitsandbytes: 16 levels, -1 .. 1, an exact zero at index 7.
  assert quantize.NF4_CODE.shape == (16,) and quantize.NF4_CODE[7] == 0.0
  assert quantize.NF4_CODE[0] == -1.0 and quantize.NF4_CODE[15] == 1.0
  assert np.all(np.diff(quantize.NF4_CODE) > 0)
  # One block of 4, absmax 2: normalised [1, -0.5, 0.05, 0] -> nearest levels
  # 1.0 (15), -0.5251 (2: 0.025 away, vs 0.105 to -0.3949), 0.0796 (8: 0.030 away, vs 0.05
  # to 0.0), 0.0 (7). Packed high nibble first: 15 << 4 | 2 = 242, 8 << 4 | 7 = 135.
  w = jnp.array([[2.0, -1.0, 0.1, 0.0]], jnp.float32)
  q = quantize.quantize_nf4(w, block=4)
  np.testing.assert_array_equal(q['nf4'], [[242, 135]])
  np.testing.assert_array_equal(quantize.nf4_codes(q), [[15, 2, 8, 7]])
  np.testing.assert_array_equal(q['absmax'], [[2.0]])
  np.testing.assert_allclose(quantize.dequantize(q),
                             [[2.0, -2 * 0.5250730514526367, 2 * 0.07958029955625534, 0.0]],
                             rtol=1e-7)
  # Every level times an absmax comes back exactly.
  w = jnp.asarray(quantize.NF4_CODE * 3.0)[None]
  q = quantize.quantize_nf4(w, block=16)
  np.testing.assert_array_equal(quantize.nf4_codes(q), [np.arange(16)])
  np.testing.assert_array_equal(quantize.dequantize(q), w)


def test_nf4_error_bound_blocks_and_zero_blocks():
  w = jax.random.normal(jax.random.key(1), (6, 4, 32)).at[0, 0, :16].set(0.0)
  q = quantize.quantize_nf4(w, block=16)
  assert q['nf4'].shape == (6, 4, 16) and q['absmax'].shape == (6, 4, 2)
  deq = quantize.dequantize(q)
  assert bool(jnp.all(jnp.abs(deq - w) <= quantize.max_error(q) * (1 + 1e-6)))
  np.testing.assert_array_equal(deq[0, 0, :16], 0.0)
  # The bound is half the widest gap (-1.0 .. -0.6962) times the block's absmax.
  np.testing.assert_allclose(float(quantize.max_error(q)[1, 0, 0]),
                             (1 - 0.6961928009986877) / 2 * float(q['absmax'][1, 0, 0]),
                             rtol=1e-6)
  with pytest.raises(ValueError, match='block=12'):
    quantize.quantize_nf4(w, block=12)


# ----------------------------------------------------------------------------- config


def test_target_patterns():
  names = lambda **kw: ['.'.join(p) for p in lora.target_paths(
      CFG, lora.LoraConfig(rank=2, alpha=1.0, **kw))]
  assert names(targets=('q',)) == ['layers.0.attn.q', 'layers.1.attn.q']
  assert names(targets=('layers.1.*',)) == [f'layers.1.{n}' for n in (
      'attn.q', 'attn.k', 'attn.v', 'attn.o', 'mlp.gate', 'mlp.up', 'mlp.down')]
  assert names(targets=('layers.[0].mlp.d*', 'lm_head')) == ['layers.0.mlp.down', 'lm_head']
  assert names(targets=('embed', 'o')) == ['layers.0.attn.o', 'layers.1.attn.o', 'embed']
  assert len(names()) == 14 and len(names(targets=('*',))) == 16


@pytest.mark.parametrize('kw,cfg,match', [
    (dict(targets=('qproj',)), CFG, r"'qproj' matches no weight.*'down', 'embed', 'gate'"),
    (dict(targets=('q', 'lm_head')), CFG_TIED, r"'lm_head' matches no weight.*tied"),
    (dict(targets='q'), CFG, 'non-empty tuple'),
    (dict(targets=['q']), CFG, 'non-empty tuple'),  # A list is not hashable: no static jit arg.
    (dict(rank=0), CFG, r'rank=0 must be a positive'),
    (dict(rank=33), CFG, r'rank=33 exceeds min\(in, out\) = min\(64, 32\).*layers.0.attn.k'),
    (dict(rank=8, targets=('layers.1.attn.o',)), CFG.replace(num_heads=2, num_kv_heads=1,
                                                             head_dim=2),
     r'min\(4, 64\).*layers.1.attn.o'),
    (dict(alpha=0.0), CFG, r'alpha=0.0 must be > 0'),
    (dict(quantize='int4'), CFG, r"quantize='int4'; known"),
    (dict(dropout=1.0), CFG, r'dropout=1.0 must be in \[0, 1\)'),
    (dict(dropout=0.1), CFG, r'dropout=0.1: only 0 is supported.*ratio'),
    (dict(quantize='nf4', nf4_block=64), CFG, r'nf4_block=64.*\(16\) of layers.0.attn.q'),
])
def test_bad_configs_raise_naming_the_culprit(kw, cfg, match):
  with pytest.raises(ValueError, match=match):
    lora.check(cfg, lora.LoraConfig(**({'rank': 4, 'alpha': 8.0} | kw)))


def test_init_shapes_and_distribution():
  adapter = lora.init(CFG, ALL, jax.random.key(0))
  attn = adapter['layers']['0']['attn']
  assert attn['q']['a'].shape == (64, 4) and attn['q']['b'].shape == (4, 4, 16)
  assert attn['o']['a'].shape == (4, 16, 4) and attn['o']['b'].shape == (4, 64)
  assert adapter['embed']['a'].shape == (96, 4) and adapter['lm_head']['b'].shape == (4, 96)
  for d in _leaf_dicts(adapter):
    assert d['a'].dtype == d['b'].dtype == jnp.float32
    np.testing.assert_array_equal(d['b'], 0.0)
  # Kaiming-uniform(a=sqrt(5)) is U(-1/sqrt(fan_in), 1/sqrt(fan_in)); o's fan_in is H*Dh = 64.
  a = adapter['layers']['0']['mlp']['down']['a']
  assert float(jnp.abs(a).max()) <= 1 / np.sqrt(96) and float(jnp.abs(a).max()) > 0.8 / np.sqrt(96)
  assert float(jnp.abs(attn['o']['a']).max()) <= 1 / 8
  assert 0.8 < float(jnp.std(adapter['embed']['a'])) < 1.2


def test_num_bytes():
  # 2*3 fp32 = 24 bytes, 4 int8 = 4 bytes, abstract leaves count too: 5 bf16 = 10 bytes.
  tree = {'a': jnp.zeros((2, 3)), 'b': {'c': jnp.zeros(4, jnp.int8),
                                        'd': jax.ShapeDtypeStruct((5,), jnp.bfloat16)}}
  assert lora.num_bytes(tree) == 38


# ----------------------------------------------------------------------------- sharding


def test_adapter_and_quantised_base_shard_by_logical_axes_and_merge_under_a_mesh():
  mesh = sharding.make_mesh({'fsdp': 2, 'tensor': 4})
  rules = sharding.TRAIN_RULES
  lora_cfg = lora.LoraConfig(rank=4, alpha=8.0, targets=('*',), quantize='int8')
  params = _params(CFG)
  base = lora.quantize_base(params, CFG, lora_cfg)
  adapter = _random_adapter(CFG, lora_cfg)
  ad_sh = sharding.tree_shardings(adapter, lora.adapter_axes(CFG, lora_cfg), mesh, rules)
  base_sh = sharding.tree_shardings(base, lora.base_axes(CFG, lora_cfg), mesh, rules)
  q, gate = ad_sh['layers']['0']['attn']['q'], ad_sh['layers']['0']['mlp']['gate']
  assert q['a'].spec == jax.P('fsdp', None) and q['b'].spec == jax.P(None, 'tensor', None)
  assert gate['b'].spec == jax.P(None, 'tensor')
  assert ad_sh['lm_head']['b'].spec == jax.P(None, 'tensor')
  assert base_sh['layers']['0']['mlp']['up']['int8'].spec == jax.P('fsdp', 'tensor')
  assert base_sh['layers']['0']['mlp']['up']['scale'].spec == jax.P(None, 'tensor')
  adapter_s, base_s = jax.device_put(adapter, ad_sh), jax.device_put(base, base_sh)
  tokens = _tokens(n=4)
  fwd = lambda b, a, t: _logits(lora.merge(b, a, CFG, lora_cfg), t, CFG)
  want = jax.jit(fwd)(base, adapter, tokens)
  with jax.set_mesh(mesh):
    got = jax.jit(fwd)(base_s, adapter_s, tokens)
    grads = jax.jit(jax.grad(lambda a: fwd(base_s, a, tokens).sum()))(adapter_s)
  np.testing.assert_allclose(got, want, atol=1e-5, rtol=1e-5)
  assert jax.tree.structure(grads) == jax.tree.structure(adapter)
