"""Decoder-only transformer for the Llama 3, Qwen2/2.5 and Qwen3 families.

Written with flax.nnx, seen from outside as pure functions over a params pytree
(nested dicts of arrays) and an explicit KV cache:

  params = init_params(cfg, rng)
  logits_NxTxV, cache = apply(params, tokens_NxT, cfg=cfg, mask_NxT=m, cache=cache)

What the families differ in is a config field each: qkv bias (Qwen2), q/k RMSNorm
(Qwen3), Llama 3 RoPE scaling, tied or untied embeddings, GQA head counts. Every
parameter carries logical axis names (`param_axes`), which sharding.py maps to a
mesh; this module never names a mesh axis.

`init_value_head` and `values_from_hidden` are the optional critic head (PPO with GAE).

Deliberately not here: sampling, losses, sharding rules, checkpoint formats.
"""

import dataclasses
import functools
import math
from typing import Any

import flax
from flax import nnx
import jax
import jax.numpy as jnp
import numpy as np

from rlreason.model import attention
from rlreason.model import dart
from rlreason.model import rollout_head

Params = Any  # nested dict of arrays, as returned by init_params.


@dataclasses.dataclass(frozen=True)
class Llama3RopeScaling:
  """Llama 3.1's frequency-dependent RoPE rescaling (HF rope_type 'llama3')."""
  factor: float = 8.0
  low_freq_factor: float = 1.0
  high_freq_factor: float = 4.0
  original_max_position_embeddings: int = 8192


@dataclasses.dataclass(frozen=True)
class ModelConfig:
  """Architecture plus dtype policy; hashable, so it can be a static jit arg."""
  vocab_size: int
  hidden_size: int
  intermediate_size: int
  num_layers: int
  num_heads: int
  num_kv_heads: int
  head_dim: int
  rms_norm_eps: float = 1e-6
  rope_theta: float = 10_000.0
  rope_scaling: Llama3RopeScaling | None = None
  qkv_bias: bool = False
  qk_norm: bool = False
  tie_embeddings: bool = False
  max_position_embeddings: int = 4096
  family: str = 'qwen2'  # 'llama' | 'qwen2' | 'qwen3': the HF class export writes.
  param_dtype: str = 'float32'
  compute_dtype: str = 'float32'
  remat: str = 'none'  # 'none' | 'full' | 'dots' (save matmul outputs only).

  def __post_init__(self):
    if self.num_heads % self.num_kv_heads:
      raise ValueError(f'ModelConfig.num_heads={self.num_heads} is not a multiple of '
                       f'num_kv_heads={self.num_kv_heads}.')
    if self.head_dim % 2:
      raise ValueError(f'ModelConfig.head_dim={self.head_dim} must be even for RoPE.')
    if self.family not in ('llama', 'qwen2', 'qwen3'):
      raise ValueError(f"ModelConfig.family={self.family!r}; known: 'llama', 'qwen2', 'qwen3'.")
    if self.remat not in ('none', 'full', 'dots'):
      raise ValueError(f"ModelConfig.remat={self.remat!r}; known: 'none', 'full', 'dots'.")
    for name in ('param_dtype', 'compute_dtype'):
      if getattr(self, name) not in ('float32', 'bfloat16'):
        raise ValueError(f"ModelConfig.{name}={getattr(self, name)!r}; known: 'float32', 'bfloat16'.")

  def replace(self, **kw) -> 'ModelConfig':
    return dataclasses.replace(self, **kw)

  def num_params(self) -> int:
    return sum(int(np.prod(x.shape)) for x in jax.tree.leaves(abstract_params(self)))


@flax.struct.dataclass
class FrozenKV:
  """A read-only cache segment that new tokens attend to but never write: keys AxKxDhxS and
  values AxKxSxDh per layer, mask_AxS its valid slots. A cache of N rows may hold one with
  A = N/G rows, each read by G consecutive rows (a prompt's cache shared by its samples)."""
  keys: tuple[jax.Array, ...]
  values: tuple[jax.Array, ...]
  mask_AxS: jax.Array


@flax.struct.dataclass
class KVCache:
  """Keys and values of every layer, written slot by slot, after optional frozen segments.

  keys: one NxKxDhxS array per layer; values: one NxKxSxDh array per layer. Both put the
  contracted axis second to last, as a matmul reads it: q . k contracts Dh, p . v contracts S.
  Stored NxKxSxDh, keys make the decode step's scores reduce over the minor Dh axis, which
  XLA:CPU runs 3-4x slower (the sampler benchmark's shapes; ~8x with the demo's Dh = 16).
  mask_NxS: the slot holds a real token (left padding and unused slots are False). end: the
  next slot to write, shared by all rows. pos_N: each row's next RoPE position (its count of
  real tokens so far, frozen segments included). frozen: earlier segments (`freeze`), all
  before this one's slots; new tokens attend to their valid slots and to their own.
  """
  keys: tuple[jax.Array, ...]
  values: tuple[jax.Array, ...]
  mask_NxS: jax.Array
  end: jax.Array
  pos_N: jax.Array
  frozen: tuple[FrozenKV, ...] = ()

  @property
  def size(self) -> int:
    return self.mask_NxS.shape[1]


def init_cache(cfg: ModelConfig, batch: int, size: int, dtype=None, *,
               frozen: tuple[FrozenKV, ...] = (), pos_N=None) -> KVCache:
  """An empty cache of `size` slots for `batch` rows (dtype defaults to compute dtype).

  frozen: segments attended before these slots; pos_N: the rows' next RoPE positions (give
  the frozen segments' token counts, e.g. `freeze`'s cache's pos_N; default 0).
  """
  dtype = dtype or cfg.compute_dtype
  n, k, dh = batch, cfg.num_kv_heads, cfg.head_dim
  for seg in frozen:
    if batch % seg.mask_AxS.shape[0]:
      raise ValueError(f'init_cache: a frozen segment has {seg.mask_AxS.shape[0]} rows, which '
                       f'does not divide batch={batch}.')
  zeros = lambda shape: tuple(jnp.zeros(shape, dtype) for _ in range(cfg.num_layers))
  pos_N = jnp.zeros((batch,), jnp.int32) if pos_N is None else jnp.asarray(pos_N, jnp.int32)
  return KVCache(keys=zeros((n, k, dh, size)), values=zeros((n, k, size, dh)),
                 mask_NxS=jnp.zeros((batch, size), bool), end=jnp.zeros((), jnp.int32),
                 pos_N=pos_N, frozen=tuple(frozen))


def freeze(cache: KVCache, after: FrozenKV | None = None) -> FrozenKV:
  """The cache's own slots as a read-only segment (its frozen segments are not included),
  appended to the slots of `after` (same rows) if given: one segment, one copy."""
  seg = FrozenKV(keys=cache.keys, values=cache.values, mask_AxS=cache.mask_NxS)
  if after is None:
    return seg
  cat = lambda axis: lambda a, b: jnp.concatenate([a, b.astype(a.dtype)], axis=axis)
  return FrozenKV(keys=tuple(map(cat(3), after.keys, seg.keys)),
                  values=tuple(map(cat(2), after.values, seg.values)),
                  mask_AxS=cat(1)(after.mask_AxS, seg.mask_AxS))


# ----------------------------------------------------------------------------- layers


def _param(rngs, shape, axes, dtype, init='normal'):
  if init == 'normal':
    value = 0.02 * jax.random.normal(rngs.params(), shape, jnp.float32)
  elif init == 'ones':
    value = jnp.ones(shape, jnp.float32)
  else:
    value = jnp.zeros(shape, jnp.float32)
  return nnx.Param(value.astype(dtype), axes=axes)


class RMSNorm(nnx.Module):

  def __init__(self, dim: int, eps: float, dtype, rngs: nnx.Rngs, axes=('norm',)):
    self.scale = _param(rngs, (dim,), axes, dtype, init='ones')
    self.eps = eps

  def __call__(self, x):
    # Normalise in fp32 and cast back before the scale, as HF's Llama/Qwen RMSNorm does.
    x32 = x.astype(jnp.float32)
    y = x32 * jax.lax.rsqrt(jnp.mean(x32 * x32, axis=-1, keepdims=True) + self.eps)
    return self.scale[...].astype(x.dtype) * y.astype(x.dtype)


def rope_inv_freq(cfg: ModelConfig) -> np.ndarray:
  """Inverse frequencies (Dh/2,), with Llama 3 scaling when configured."""
  dim = cfg.head_dim
  inv = 1.0 / (cfg.rope_theta ** (np.arange(0, dim, 2, dtype=np.float32) / dim))
  inv = inv.astype(np.float32)
  s = cfg.rope_scaling
  if s is None:
    return inv
  old = s.original_max_position_embeddings
  low_wavelen, high_wavelen = old / s.low_freq_factor, old / s.high_freq_factor
  wavelen = 2 * math.pi / inv
  scaled = np.where(wavelen > low_wavelen, inv / s.factor, inv)
  smooth = (old / wavelen - s.low_freq_factor) / (s.high_freq_factor - s.low_freq_factor)
  smoothed = (1 - smooth) * scaled / s.factor + smooth * scaled
  medium = ~(wavelen < high_wavelen) & ~(wavelen > low_wavelen)
  return np.where(medium, smoothed, scaled).astype(np.float32)


def rope_cos_sin(positions_NxT, inv_freq):
  """cos and sin of every position's angles, NxTx(Dh/2) each (any leading shape)."""
  angles = positions_NxT.astype(jnp.float32)[..., None] * jnp.asarray(inv_freq)
  return jnp.cos(angles), jnp.sin(angles)


def rope_table(cfg: ModelConfig, size: int):
  """`rope_cos_sin` of positions [0, size), SxDh/2 each, for `apply(rope_table=...)`.

  A decode loop computes it once before the loop and gathers one row per step. Computed
  inside the step instead, XLA fuses cos and sin into every consumer, so they are evaluated
  again per layer, per head and per use: 0.3 ms a layer in the mid sampler benchmark's
  decode step on CPU (64 rows).
  """
  return rope_cos_sin(jnp.arange(size), rope_inv_freq(cfg))


def rotate(x_NxTxHxDh, cos_sin):
  """Rotate-half RoPE (the HF layout: first and second halves of head_dim pair up)."""
  cos, sin = (c[:, :, None, :].astype(x_NxTxHxDh.dtype) for c in cos_sin)
  x1, x2 = jnp.split(x_NxTxHxDh, 2, axis=-1)
  return jnp.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1)


def apply_rope(x_NxTxHxDh, positions_NxT, inv_freq):
  """RoPE at the given positions: `rotate` with freshly computed tables."""
  return rotate(x_NxTxHxDh, rope_cos_sin(positions_NxT, inv_freq))


class Attention(nnx.Module):

  def __init__(self, cfg: ModelConfig, rngs: nnx.Rngs):
    d, h, k, dh, pdt = cfg.hidden_size, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim, cfg.param_dtype
    self.q = _param(rngs, (d, h, dh), ('embed', 'heads', 'head_dim'), pdt)
    self.k = _param(rngs, (d, k, dh), ('embed', 'kv_heads', 'head_dim'), pdt)
    self.v = _param(rngs, (d, k, dh), ('embed', 'kv_heads', 'head_dim'), pdt)
    self.o = _param(rngs, (h, dh, d), ('heads', 'head_dim', 'embed'), pdt)
    if cfg.qkv_bias:
      self.q_bias = _param(rngs, (h, dh), ('heads', 'head_dim'), pdt, init='zeros')
      self.k_bias = _param(rngs, (k, dh), ('kv_heads', 'head_dim'), pdt, init='zeros')
      self.v_bias = _param(rngs, (k, dh), ('kv_heads', 'head_dim'), pdt, init='zeros')
    if cfg.qk_norm:
      self.q_norm = RMSNorm(dh, cfg.rms_norm_eps, pdt, rngs, axes=('head_dim',))
      self.k_norm = RMSNorm(dh, cfg.rms_norm_eps, pdt, rngs, axes=('head_dim',))
    self.cfg = cfg

  def __call__(self, x_NxTxD, rope, mask_NxT, layer_cache, lr=None, subtree_end_NxT=None):
    """rope: the (cos, sin) tables of this call's positions (`rope_cos_sin`); lr: DART's
    routed adapters of this layer (dart.layer), or None; subtree_end_NxT: a packed trie's
    attention limits (attention.causal_attention), full forward only."""
    cfg, cdt = self.cfg, self.cfg.compute_dtype
    proj = lambda w, eq, name: (jnp.einsum(eq, x_NxTxD, w[...].astype(cdt))
                                + dart.lowrank(lr, 'attn', name, x_NxTxD, 1, cdt))
    q_NxTxHxDh = proj(self.q, 'ntd,dhk->nthk', 'q')
    k_NxTxKxDh = proj(self.k, 'ntd,dhk->nthk', 'k')
    v_NxTxKxDh = proj(self.v, 'ntd,dhk->nthk', 'v')
    if cfg.qkv_bias:
      q_NxTxHxDh += self.q_bias[...].astype(cdt)
      k_NxTxKxDh += self.k_bias[...].astype(cdt)
      v_NxTxKxDh += self.v_bias[...].astype(cdt)
    if cfg.qk_norm:
      q_NxTxHxDh, k_NxTxKxDh = self.q_norm(q_NxTxHxDh), self.k_norm(k_NxTxKxDh)
    q_NxTxHxDh, k_NxTxKxDh = rotate(q_NxTxHxDh, rope), rotate(k_NxTxKxDh, rope)

    n, t, k = x_NxTxD.shape[0], x_NxTxD.shape[1], cfg.num_kv_heads
    q_NxTxKxRxDh = q_NxTxHxDh.reshape(n, t, k, cfg.num_heads // k, cfg.head_dim)
    if layer_cache is None:  # Full forward: keys are this call's tokens, causal in order.
      out_NxTxKxRxDh = attention.causal_attention(q_NxTxKxRxDh, k_NxTxKxDh, v_NxTxKxDh,
                                                  mask_NxT, subtree_end_NxT=subtree_end_NxT)
      out_NxTxHxDh = out_NxTxKxRxDh.reshape(n, t, cfg.num_heads, cfg.head_dim)
      return (jnp.einsum('nthk,hkd->ntd', out_NxTxHxDh, self.o[...].astype(cdt))
              + dart.lowrank(lr, 'attn', 'o', out_NxTxHxDh, 2, cdt)), None

    # Write this call's keys at slots [end, end + T), attend to every valid slot <= own and
    # to the frozen segments' valid slots.
    cache_k, cache_v, cache_mask_NxS, end, frozen = layer_cache
    keys_NxKxDhxS = jax.lax.dynamic_update_slice_in_dim(
        cache_k, k_NxTxKxDh.transpose(0, 2, 3, 1).astype(cache_k.dtype), end, axis=3)
    values_NxKxSxDh = jax.lax.dynamic_update_slice_in_dim(
        cache_v, v_NxTxKxDh.swapaxes(1, 2).astype(cache_v.dtype), end, axis=2)
    slot_S = jnp.arange(cache_mask_NxS.shape[1])
    causal_TxS = slot_S[None, :] <= (end + jnp.arange(t))[:, None]
    segments = [(fk, fv, fmask_AxS[:, None]) for fk, fv, fmask_AxS in frozen]
    segments.append((keys_NxKxDhxS, values_NxKxSxDh, causal_TxS[None] & cache_mask_NxS[:, None]))
    out_NxTxKxRxDh = attention.cache_attention(q_NxTxKxRxDh, segments, dtype=cdt)
    out_NxTxHxDh = out_NxTxKxRxDh.reshape(n, t, cfg.num_heads, cfg.head_dim)
    y_NxTxD = (jnp.einsum('nthk,hkd->ntd', out_NxTxHxDh, self.o[...].astype(cdt))
               + dart.lowrank(lr, 'attn', 'o', out_NxTxHxDh, 2, cdt))
    return y_NxTxD, (keys_NxKxDhxS, values_NxKxSxDh)


class MLP(nnx.Module):

  def __init__(self, cfg: ModelConfig, rngs: nnx.Rngs):
    d, f, pdt = cfg.hidden_size, cfg.intermediate_size, cfg.param_dtype
    self.gate = _param(rngs, (d, f), ('embed', 'mlp'), pdt)
    self.up = _param(rngs, (d, f), ('embed', 'mlp'), pdt)
    self.down = _param(rngs, (f, d), ('mlp', 'embed'), pdt)
    self.cdt = cfg.compute_dtype

  def __call__(self, x_NxTxD, lr=None):
    """lr: DART's routed adapters of this layer (dart.layer), or None."""
    low = lambda name, x: dart.lowrank(lr, 'mlp', name, x, 1, self.cdt)
    if x_NxTxD.shape[1] == 1:  # Decoding: stacking would copy both weights every step.
      gate_NxTxF = x_NxTxD @ self.gate[...].astype(self.cdt) + low('gate', x_NxTxD)
      up_NxTxF = x_NxTxD @ self.up[...].astype(self.cdt) + low('up', x_NxTxD)
      hidden_NxTxF = jax.nn.silu(gate_NxTxF) * up_NxTxF
      return hidden_NxTxF @ self.down[...].astype(self.cdt) + low('down', hidden_NxTxF)
    # Training and prefill: one matmul for both input projections, stacked on a new axis so
    # each keeps its own 'mlp' sharding; the backward then sums one product for dx, not two.
    w_Dx2xF = jnp.stack([self.gate[...], self.up[...]], axis=1).astype(self.cdt)
    gate_up_NxTx2xF = jnp.einsum('ntd,dcf->ntcf', x_NxTxD, w_Dx2xF)
    hidden_NxTxF = (jax.nn.silu(gate_up_NxTx2xF[..., 0, :] + low('gate', x_NxTxD))
                    * (gate_up_NxTx2xF[..., 1, :] + low('up', x_NxTxD)))
    return hidden_NxTxF @ self.down[...].astype(self.cdt) + low('down', hidden_NxTxF)


class Block(nnx.Module):

  def __init__(self, cfg: ModelConfig, rngs: nnx.Rngs):
    self.attn_norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, cfg.param_dtype, rngs)
    self.attn = Attention(cfg, rngs)
    self.mlp_norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, cfg.param_dtype, rngs)
    self.mlp = MLP(cfg, rngs)

  def __call__(self, x_NxTxD, rope, mask_NxT, layer_cache, lr=None, subtree_end_NxT=None):
    y_NxTxD, new_kv = self.attn(self.attn_norm(x_NxTxD), rope, mask_NxT, layer_cache, lr,
                                subtree_end_NxT)
    x_NxTxD = x_NxTxD + y_NxTxD
    return x_NxTxD + self.mlp(self.mlp_norm(x_NxTxD), lr), new_kv


class Transformer(nnx.Module):

  def __init__(self, cfg: ModelConfig, rngs: nnx.Rngs):
    self.cfg = cfg
    self.embed = _param(rngs, (cfg.vocab_size, cfg.hidden_size), ('vocab', 'embed'), cfg.param_dtype)
    self.layers = nnx.Dict({str(i): Block(cfg, rngs) for i in range(cfg.num_layers)})
    self.final_norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, cfg.param_dtype, rngs)
    if not cfg.tie_embeddings:
      self.lm_head = _param(rngs, (cfg.hidden_size, cfg.vocab_size), ('embed', 'vocab'),
                            cfg.param_dtype)

  def hidden(self, tokens_NxT, rope, mask_NxT, cache: KVCache | None, dart_in=None,
             subtree_end_NxT=None):
    """dart_in: (params carrying DART's adapters, route_NxT), or None."""
    cfg = self.cfg
    x_NxTxD = jnp.take(self.embed[...], tokens_NxT, axis=0).astype(cfg.compute_dtype)
    block_call = lambda block, *args: block(*args)
    if cfg.remat != 'none':
      policy = (jax.checkpoint_policies.dots_with_no_batch_dims_saveable if cfg.remat == 'dots'
                else jax.checkpoint_policies.nothing_saveable)
      block_call = nnx.remat(block_call, policy=policy)
    if cache is not None:  # The new tokens are valid slots for themselves and later ones.
      cache_mask_NxS = jax.lax.dynamic_update_slice_in_dim(cache.mask_NxS, mask_NxT, cache.end,
                                                           axis=1)
    new_keys, new_values = [], []
    for i in range(cfg.num_layers):
      layer_cache = None if cache is None else (
          cache.keys[i], cache.values[i], cache_mask_NxS, cache.end,
          [(f.keys[i], f.values[i], f.mask_AxS) for f in cache.frozen])
      lr = None if dart_in is None else dart.layer(dart_in[0], dart_in[1], i)
      x_NxTxD, new_kv = block_call(self.layers[str(i)], x_NxTxD, rope, mask_NxT, layer_cache, lr,
                                   subtree_end_NxT)
      if new_kv is not None:
        new_keys.append(new_kv[0])
        new_values.append(new_kv[1])
    return self.final_norm(x_NxTxD), tuple(new_keys), tuple(new_values)


# ----------------------------------------------------------------------------- functional API


@functools.lru_cache(maxsize=64)
def _graphdef_and_abstract(cfg: ModelConfig):
  model = nnx.eval_shape(lambda: Transformer(cfg, rngs=nnx.Rngs(0)))
  graphdef, state = nnx.split(model)
  return graphdef, state


def init_params(cfg: ModelConfig, rng: jax.Array) -> Params:
  """Random parameters (normal(0.02) matrices, unit norms, zero biases); jittable."""
  return nnx.to_pure_dict(nnx.state(Transformer(cfg, rngs=nnx.Rngs(params=rng)), nnx.Param))


def abstract_params(cfg: ModelConfig) -> Params:
  """ShapeDtypeStructs of the params, with no allocation."""
  return nnx.to_pure_dict(_graphdef_and_abstract(cfg)[1])


def param_axes(cfg: ModelConfig) -> Params:
  """The params tree with each leaf replaced by its tuple of logical axis names."""
  state = _graphdef_and_abstract(cfg)[1]
  axes = jax.tree.map(lambda v: v.get_metadata()['axes'], state,
                      is_leaf=lambda x: isinstance(x, nnx.Variable))
  return nnx.to_pure_dict(axes)


def _merge(params: Params, cfg: ModelConfig) -> Transformer:
  return nnx.merge(_graphdef_and_abstract(cfg)[0], params)


def module(params: Params, cfg: ModelConfig) -> Transformer:
  """The nnx module holding `params`, for code that walks its layers one at a time
  (analysis/: logit lens, activation patching); `apply` is the forward everything else uses."""
  if dart.has(params):
    raise ValueError('transformer.module: params carry DART adapters, whose routed forward only '
                     '`apply` runs; merge or drop them first.')
  return _merge(rollout_head.detach(params), cfg)


def default_positions(mask_NxT, cache: KVCache | None = None):
  """RoPE positions that skip left padding: the count of real tokens before each one."""
  start_N = jnp.zeros(mask_NxT.shape[0], jnp.int32) if cache is None else cache.pos_N
  return start_N[:, None] + jnp.cumsum(mask_NxT.astype(jnp.int32), axis=1) - 1


def apply(params: Params, tokens_NxT, *, cfg: ModelConfig, mask_NxT=None, positions_NxT=None,
          cache: KVCache | None = None, return_hidden: bool = False, rope_table=None,
          route_NxT=None, subtree_end_NxT=None):
  """Runs the transformer on T new tokens per row.

  Args:
    params: from init_params or weights.load.
    tokens_NxT: int token ids.
    cfg: the architecture.
    mask_NxT: True for real tokens (False for padding); defaults to all True.
    positions_NxT: RoPE positions; default skips padding and continues after `cache`.
    cache: None for a plain causal forward; else the T tokens are written at slots
      [cache.end, cache.end + T) and attend to every valid earlier slot.
    return_hidden: return the final-norm hidden states (NxTxD) instead of logits, for
      losses that project to the vocabulary chunk by chunk (see `logits_from_hidden`).
    rope_table: `rope_table(cfg, size)` with size above every position, to gather RoPE's
      cos and sin rather than compute them (for loops that call `apply` many times).
    route_NxT: with DART's adapters in params (model/dart.py), True for tool-call tokens;
      required with a cache (the caller carries the routing state), computed from the
      tokens when None without one.
    subtree_end_NxT: with no cache, None (causal) or int: key s is seen by queries s..end[s]
      only (a trie packed in preorder, rollout/trie.py; give its depths as positions_NxT).

  Returns:
    (logits_NxTxV in fp32, or hidden_NxTxD; the updated cache or None).
  """
  if mask_NxT is None:
    mask_NxT = jnp.ones(tokens_NxT.shape, bool)
  mask_NxT = mask_NxT.astype(bool)
  if positions_NxT is None:
    positions_NxT = default_positions(mask_NxT, cache)
  if rope_table is None:
    rope = rope_cos_sin(positions_NxT, rope_inv_freq(cfg))
  else:
    # Clipped: left padding has position -1 (its keys are never attended to).
    rope = tuple(jnp.take(t, positions_NxT, axis=0, mode='clip') for t in rope_table)
  dart_in = None
  if dart.has(params):  # DART: routed adapters, not in the model's own params.
    if route_NxT is None:
      if cache is not None:
        raise ValueError('transformer.apply: params carry DART adapters and a cache was given, '
                         'but no route_NxT: a cached call sees only its new tokens, so the '
                         'caller must carry the routing state (dart.feed).')
      route_NxT, _ = dart.route(tokens_NxT, mask_NxT, params[dart.KEY])
    dart_in = (params, route_NxT)
  model = _merge(rollout_head.detach(dart.detach(params)), cfg)
  if subtree_end_NxT is not None and cache is not None:
    raise ValueError('transformer.apply: subtree_end_NxT (a packed trie) is for the full '
                     'forward; a cached call attends by slots.')
  h_NxTxD, keys, values = model.hidden(tokens_NxT, rope, mask_NxT, cache, dart_in,
                                       subtree_end_NxT)
  new_cache = None
  if cache is not None:
    t = tokens_NxT.shape[1]
    new_cache = KVCache(
        keys=keys, values=values,
        mask_NxS=jax.lax.dynamic_update_slice_in_dim(cache.mask_NxS, mask_NxT, cache.end, axis=1),
        end=cache.end + t,
        pos_N=cache.pos_N + mask_NxT.sum(axis=1, dtype=jnp.int32), frozen=cache.frozen)
  out = h_NxTxD if return_hidden else logits_from_hidden(params, h_NxTxD, cfg=cfg)
  return out, new_cache


def logits_from_hidden(params: Params, h_NxTxD, *, cfg: ModelConfig):
  """fp32 logits of final hidden states: the projection accumulates in fp32. Params that
  carry R²PO's rollout head (model/rollout_head.py) add its term: W_lm h + W2 ReLU(W1 h)."""
  w = params['embed'].T if cfg.tie_embeddings else params['lm_head']
  logits = jnp.einsum('ntd,dv->ntv', h_NxTxD, w.astype(cfg.compute_dtype),
                      preferred_element_type=jnp.float32)
  if rollout_head.has_head(params):
    head = params[rollout_head.KEY]
    f_NxTxD = rollout_head.features(head, h_NxTxD, cfg.compute_dtype)
    logits = logits + jnp.einsum('ntd,dv->ntv', f_NxTxD, head['w2'].astype(cfg.compute_dtype),
                                 preferred_element_type=jnp.float32)
  return logits


def init_value_head(cfg: ModelConfig) -> Params:
  """A Dense D -> 1 on the final hidden states (PPO's critic head), zero-initialised.

  Zero, so the first GAE advantages are the plain returns (V = 0) rather than returns minus
  a random baseline. Kept apart from the policy params (TrainState.value_params): the sampler,
  weight export and reference policy never see it. fp32, replicated (D + 1 numbers).
  """
  return {'kernel': jnp.zeros((cfg.hidden_size, 1), jnp.float32),
          'bias': jnp.zeros((1,), jnp.float32)}


def values_from_hidden(head: Params, h_NxTxD):
  """fp32 values V = h W + b of final hidden states: NxTxD -> NxT."""
  return (jnp.einsum('ntd,dk->ntk', h_NxTxD.astype(jnp.float32), head['kernel'])
          + head['bias'])[..., 0]
