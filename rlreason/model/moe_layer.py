"""The MoE MLP as a decoder layer's flax.nnx module, and the model-level auxiliary losses.

`MoEMLP` holds one MoE layer's params in moe_config.py's layout (router, stacked experts,
Qwen2-MoE's shared expert) with logical axes from moe.PARAM_AXES, and runs moe.moe_mlp on
them. transformer.py builds it for the layers moe_config.is_moe_layer picks; the forward
(`transformer.apply(..., forced_routes=, return_routing=True)`) hands back a `Routing`, from
which `aux_losses` computes the load-balancing and z losses over the model's MoE layers.

Where it runs: under a mesh (`jax.set_mesh`) with an 'expert' axis of size > 1 the experts are
sharded over that axis and tokens reach them by all-to-all (moe._dispatch); otherwise the
same dispatch runs locally. The grouped matmul is jax.lax.ragged_dot on TPU/GPU and
moe.tiled_grouped_matmul on CPU (XLA:CPU's ragged_dot is dense over all experts; moe.py).

Deliberately not here: routing and dispatch math (moe.py), HF names (moe_config.py).
"""

from typing import NamedTuple

from flax import nnx
import jax
import jax.numpy as jnp

from rlreason.model import layers
from rlreason.model import moe
from rlreason.model import moe_config

EXPERT_AXIS = 'expert'  # The mesh axis experts are sharded over (sharding.py's rules).


class Routing(NamedTuple):
  """The MoE layers' routing in one forward, layer order (L = MoE layers only).

  expert_ids_LxNxTxK: int32 experts used per token (top-k order, or the replayed ids);
  router_logits_LxNxTxE: fp32 raw router logits (for the auxiliary losses).
  """
  expert_ids_LxNxTxK: jax.Array
  router_logits_LxNxTxE: jax.Array


class SampledRoutes(NamedTuple):
  """The routes a sampler call recorded (rollout/sampler.py, generate(return_routes=True)).

  M = the MoE layers, in order. Expert ids are packed (`route_dtype`): uint8 when there are
  fewer than 256 experts, else int16, with NO_ROUTE (255 or -1) where no forward routed the
  token (prompt padding, completion padding, the last sampled token, which is never fed);
  `unpack_routes` gives int32 with -1 there, what transformer.apply(forced_routes=) reads
  (a -1 routes that token live).

  prompt_MxBxPxK: the prompt tokens' ids from the prefill (shared by a prompt's G rows).
  completion_MxNxLxK: aligned with Rollout.tokens_NxL: prefix tokens' ids from the prefix
    feed, then each sampled token's from the decode step that fed it.
  """
  prompt_MxBxPxK: jax.Array
  completion_MxNxLxK: jax.Array


def route_dtype(num_experts: int):
  """uint8 below 256 experts (255 marks no route), else int16 (-1 marks it)."""
  return jnp.uint8 if num_experts < 256 else jnp.int16


def pack_routes(ids_MxNxTxK, mask_NxT, *, num_experts: int):
  """int32 expert ids as route_dtype, NO_ROUTE where mask_NxT is False."""
  dtype = route_dtype(num_experts)
  none = jnp.iinfo(dtype).max if dtype == jnp.uint8 else -1
  return jnp.where(mask_NxT[None, ..., None], ids_MxNxTxK, none).astype(dtype)


def unpack_routes(packed):
  """Packed routes as int32 expert ids, -1 where none was recorded."""
  if packed.dtype == jnp.uint8:
    return jnp.where(packed == 255, -1, packed.astype(jnp.int32))
  return packed.astype(jnp.int32)


class SharedExpert(nnx.Module):
  """Qwen2-MoE's always-on expert (a dense SwiGLU of shared_expert_intermediate_size)."""

  def __init__(self, d: int, s: int, dtype, rngs: nnx.Rngs):
    axes = moe.PARAM_AXES['shared']
    self.gate = layers.param(rngs, (d, s), axes['gate'], dtype)
    self.up = layers.param(rngs, (d, s), axes['up'], dtype)
    self.down = layers.param(rngs, (s, d), axes['down'], dtype)


class MoEMLP(nnx.Module):
  """One MoE layer: router [D, E], experts gate/up [E, D, I] and down [E, I, D], and with
  shared_expert_intermediate_size > 0 the sigmoid-gated shared expert."""

  def __init__(self, cfg, rngs: nnx.Rngs):
    m, d, pdt = cfg.moe, cfg.hidden_size, cfg.param_dtype
    e, i = m.num_experts, m.moe_intermediate_size
    axes = moe.PARAM_AXES
    self.router = layers.param(rngs, (d, e), axes['router'], pdt)
    self.gate = layers.param(rngs, (e, d, i), axes['gate'], pdt)
    self.up = layers.param(rngs, (e, d, i), axes['up'], pdt)
    self.down = layers.param(rngs, (e, i, d), axes['down'], pdt)
    if m.shared_expert_intermediate_size:
      self.shared = SharedExpert(d, m.shared_expert_intermediate_size, pdt, rngs)
      self.shared_expert_gate = layers.param(rngs, (d,), axes['shared_expert_gate'], pdt)
    self.moe = m
    self.cdt = cfg.compute_dtype

  def __call__(self, x_NxTxD, forced_ids_NxTxK=None):
    """(y_NxTxD, moe.Routed); forced_ids_NxTxK replays expert ids (rows with a -1 route live)."""
    params = {name: getattr(self, name)[...] for name in ('router', 'gate', 'up', 'down')}
    if self.moe.shared_expert_intermediate_size:
      params['shared'] = {n: getattr(self.shared, n)[...] for n in ('gate', 'up', 'down')}
      params['shared_expert_gate'] = self.shared_expert_gate[...]
    mesh = jax.sharding.get_abstract_mesh()
    if mesh.empty or EXPERT_AXIS not in mesh.axis_names or mesh.shape[EXPERT_AXIS] == 1:
      mesh = None
    grouped = 'tiled' if jax.default_backend() == 'cpu' else 'ragged_dot'
    return moe.moe_mlp(params, x_NxTxD, top_k=self.moe.num_experts_per_tok,
                       norm_topk_prob=self.moe.norm_topk_prob, forced_ids_NxK=forced_ids_NxTxK,
                       mesh=mesh, expert_axis=EXPERT_AXIS, compute_dtype=self.cdt,
                       grouped=grouped)


def routing_of(routed: tuple) -> Routing | None:
  """The per-layer moe.Routed of a forward stacked into a Routing (None for a dense model)."""
  if not routed:
    return None
  return Routing(jnp.stack([r.expert_ids_NxK for r in routed]),
                 jnp.stack([r.router_logits_NxE for r in routed]))


def aux_losses(routing: Routing, *, cfg: moe_config.MoEConfig, mask_NxT=None) -> dict:
  """{'load_balancing': transformers' auxiliary loss pooled over the MoE layers (moe.py; k when
  balanced), 'z': ST-MoE's router z-loss}, over the tokens mask_NxT marks (all when None).
  Weighting them is the caller's: transformers adds router_aux_loss_coef x load_balancing to
  its LM loss; an RL loss leaves both off unless configured [ours]."""
  logits = list(routing.router_logits_LxNxTxE)
  mask_N = None if mask_NxT is None else mask_NxT.reshape(-1)
  return {'load_balancing': moe.load_balancing_loss(logits, top_k=cfg.num_experts_per_tok,
                                                    mask_N=mask_N),
          'z': moe.router_z_loss(logits, mask_N=mask_N)}
