"""Decoder-only transformer for the Llama 3, Qwen2/2.5 and Qwen3 families.

Written with flax.nnx, seen from outside as pure functions over a params pytree
(nested dicts of arrays) and an explicit KV cache:

  params = init_params(cfg, rng)
  logits_NxTxV, cache = apply(params, tokens_NxT, cfg=cfg, mask_NxT=m, cache=cache)

What the families differ in is a config field each: qkv bias (Qwen2), q/k RMSNorm
(Qwen3), Llama 3 RoPE scaling, tied or untied embeddings, GQA head counts, and Mixture-of-
Experts MLPs in the layers `moe_config.is_moe_layer` picks (cfg.moe: Qwen2-MoE, Qwen3-MoE;
moe_layer.py), whose routes `apply` can return and replay. Every
parameter carries logical axis names (`param_axes`), which sharding.py maps to a
mesh; this module never names a mesh axis.

`init_value_head` and `values_from_hidden` are the optional critic head (PPO with GAE).
The layers (attention, MLP, block) are in layers.py; RoPE (rope.py) and the KV cache
(kv_cache.py) have their own modules, re-exported here.

Deliberately not here: sampling, losses, sharding rules, checkpoint formats.
"""

import dataclasses
import functools
from typing import Any

from flax import nnx
import jax
import jax.numpy as jnp
import numpy as np

from rlreason.model import dart
from rlreason.model import kv_cache
from rlreason.model import layers
from rlreason.model import moe_config
from rlreason.model import moe_layer
from rlreason.model import rollout_head
from rlreason.model import rope as rope_lib

# Re-exported: callers name them transformer.X (RoPE and the cache were split out of here).
Llama3RopeScaling = rope_lib.Llama3RopeScaling
rope_inv_freq, rope_cos_sin, rope_table = (rope_lib.rope_inv_freq, rope_lib.rope_cos_sin,
                                           rope_lib.rope_table)
rotate, apply_rope = rope_lib.rotate, rope_lib.apply_rope
FrozenKV, KVCache, init_cache, freeze = (kv_cache.FrozenKV, kv_cache.KVCache, kv_cache.init_cache,
                                         kv_cache.freeze)

Params = Any  # nested dict of arrays, as returned by init_params.


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
  # 'none' | 'full' (recompute each block in the backward, after its cotangent:
  # layers.remat_after_cotangent) | 'full_checkpoint' (jax.checkpoint saving nothing) |
  # 'dots' (jax.checkpoint saving matmul outputs only).
  remat: str = 'none'
  # Mixture-of-Experts (Qwen3-MoE / Qwen2-MoE): the layers moe_config.is_moe_layer picks carry
  # moe_layer.MoEMLP instead of the dense MLP (whose width stays intermediate_size); None: dense.
  moe: moe_config.MoEConfig | None = None

  def __post_init__(self):
    if self.num_heads % self.num_kv_heads:
      raise ValueError(f'ModelConfig.num_heads={self.num_heads} is not a multiple of '
                       f'num_kv_heads={self.num_kv_heads}.')
    if self.head_dim % 2:
      raise ValueError(f'ModelConfig.head_dim={self.head_dim} must be even for RoPE.')
    if self.family not in ('llama', 'qwen2', 'qwen3'):
      raise ValueError(f"ModelConfig.family={self.family!r}; known: 'llama', 'qwen2', 'qwen3'.")
    if self.remat not in ('none', 'full', 'full_checkpoint', 'dots'):
      raise ValueError(f"ModelConfig.remat={self.remat!r}; known: 'none', 'full', "
                       "'full_checkpoint', 'dots'.")
    for name in ('param_dtype', 'compute_dtype'):
      if getattr(self, name) not in ('float32', 'bfloat16'):
        raise ValueError(f"ModelConfig.{name}={getattr(self, name)!r}; known: 'float32', 'bfloat16'.")
    if self.moe is not None:
      moe_config.check_moe(self.moe, num_layers=self.num_layers)
      if self.family == 'llama':
        raise ValueError("ModelConfig.moe: family='llama' has no MoE variant here; use 'qwen2' "
                         "(Qwen2-MoE) or 'qwen3' (Qwen3-MoE).")

  def replace(self, **kw) -> 'ModelConfig':
    return dataclasses.replace(self, **kw)

  def num_params(self) -> int:
    return sum(int(np.prod(x.shape)) for x in jax.tree.leaves(abstract_params(self)))


# ----------------------------------------------------------------------------- layers


class Transformer(nnx.Module):

  def __init__(self, cfg: ModelConfig, rngs: nnx.Rngs):
    self.cfg = cfg
    self.embed = layers.param(rngs, (cfg.vocab_size, cfg.hidden_size), ('vocab', 'embed'), cfg.param_dtype)
    self.layers = nnx.Dict({str(i): layers.Block(cfg, rngs, make_mlp=_mlp_maker(cfg, i))
                            for i in range(cfg.num_layers)})
    self.final_norm = layers.RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, cfg.param_dtype, rngs)
    if not cfg.tie_embeddings:
      self.lm_head = layers.param(rngs, (cfg.hidden_size, cfg.vocab_size), ('embed', 'vocab'),
                            cfg.param_dtype)

  def hidden(self, tokens_NxT, rope, mask_NxT, cache: KVCache | None, dart_in=None,
             subtree_end_NxT=None, forced_routes=None):
    """dart_in: (params carrying DART's adapters, route_NxT), or None; forced_routes: expert
    ids LxNxTxK to replay, one slice per MoE layer in order, or None. Returns (hidden, keys,
    values, the MoE layers' moe.Routed in order)."""
    cfg = self.cfg
    x_NxTxD = jnp.take(self.embed[...], tokens_NxT, axis=0).astype(cfg.compute_dtype)
    block_call = lambda block, *args: block(*args)
    if cfg.remat == 'full':
      block_call = layers.remat_after_cotangent
    elif cfg.remat != 'none':
      policy = (jax.checkpoint_policies.dots_with_no_batch_dims_saveable if cfg.remat == 'dots'
                else jax.checkpoint_policies.nothing_saveable)
      block_call = nnx.remat(block_call, policy=policy)
    if cache is not None:  # The new tokens are valid slots for themselves and later ones.
      cache_mask_NxS = jax.lax.dynamic_update_slice_in_dim(cache.mask_NxS, mask_NxT, cache.end,
                                                           axis=1)
    new_keys, new_values, routed = [], [], []
    for i in range(cfg.num_layers):
      layer_cache = None if cache is None else (
          cache.keys[i], cache.values[i], cache_mask_NxS, cache.end,
          [(f.keys[i], f.values[i], f.mask_AxS) for f in cache.frozen])
      lr = None if dart_in is None else dart.layer(dart_in[0], dart_in[1], i)
      forced = None
      if forced_routes is not None and cfg.moe is not None and moe_config.is_moe_layer(i, cfg.moe):
        forced = forced_routes[len(routed)]
      x_NxTxD, new_kv, layer_routed = block_call(self.layers[str(i)], x_NxTxD, rope, mask_NxT,
                                                 layer_cache, lr, subtree_end_NxT, forced)
      if new_kv is not None:
        new_keys.append(new_kv[0])
        new_values.append(new_kv[1])
      if layer_routed is not None:
        routed.append(layer_routed)
    return self.final_norm(x_NxTxD), tuple(new_keys), tuple(new_values), tuple(routed)


def _mlp_maker(cfg: ModelConfig, layer: int):
  """Layer `layer`'s MLP class: MoE where the config's MoE rule says so, else the dense one."""
  if cfg.moe is not None and moe_config.is_moe_layer(layer, cfg.moe):
    return moe_layer.MoEMLP
  return layers.MLP


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
          route_NxT=None, subtree_end_NxT=None, forced_routes=None, return_routing: bool = False):
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
    forced_routes: with cfg.moe, expert ids LxNxTxK (L = the MoE layers, in order) to replay
      instead of routing (router replay: the gate weights still come from the live router
      at those ids, moe.route); a token whose ids hold a -1 is routed live. None: route.
    return_routing: also return the MoE layers' moe_layer.Routing (None for a dense model).

  Returns:
    (logits_NxTxV in fp32, or hidden_NxTxD; the updated cache or None), plus the Routing as
    a third element when return_routing.
  """
  if mask_NxT is None:
    mask_NxT = jnp.ones(tokens_NxT.shape, bool)
  mask_NxT = mask_NxT.astype(bool)
  if positions_NxT is None:
    positions_NxT = default_positions(mask_NxT, cache)
  if rope_table is None:
    rope = rope_cos_sin(positions_NxT, rope_inv_freq(cfg))
    if cache is None:  # The training forward: one table of this call's positions, read by
      # every layer (forward and backward); unbarriered, XLA fuses cos and sin into each use.
      rope = jax.lax.optimization_barrier(rope)
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
  if forced_routes is not None and cfg.moe is None:
    raise ValueError('transformer.apply: forced_routes given but cfg.moe is None (a dense model '
                     'has no routes to replay).')
  h_NxTxD, keys, values, routed = model.hidden(tokens_NxT, rope, mask_NxT, cache, dart_in,
                                               subtree_end_NxT, forced_routes)
  new_cache = None
  if cache is not None:
    t = tokens_NxT.shape[1]
    new_cache = KVCache(
        keys=keys, values=values,
        mask_NxS=jax.lax.dynamic_update_slice_in_dim(cache.mask_NxS, mask_NxT, cache.end, axis=1),
        end=cache.end + t,
        pos_N=cache.pos_N + mask_NxT.sum(axis=1, dtype=jnp.int32), frozen=cache.frozen)
  out = h_NxTxD if return_hidden else logits_from_hidden(params, h_NxTxD, cfg=cfg)
  if return_routing:
    return out, new_cache, moe_layer.routing_of(routed)
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
