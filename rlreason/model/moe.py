"""The Mixture-of-Experts MLP of Qwen3-MoE and Qwen2-MoE: routing, replay, dropless dispatch.

Pure functions over one layer's params (moe_config.py has the layout and the HF names):

  y_NxD, routed = moe_mlp(params, x_NxD, top_k=k, norm_topk_prob=True)

Routing is transformers' (Qwen{2,3}MoeTopKRouter): an fp32 softmax over all E experts, top-k,
renormalised when norm_topk_prob [algorithms.md §25]. Dispatch is dropless: every token's k
slots are sorted by expert and the SwiGLU experts run as `jax.lax.ragged_dot` over the groups
(no capacity, nothing dropped). With a mesh whose `expert` axis is > 1, the experts are sharded
over that axis and tokens travel to their experts' shard and back by `jax.lax.all_to_all`
inside `jax.shard_map` (`_dispatch`); on one device the same function runs with the exchange
left out. `load_balancing_loss` and `router_z_loss` are the auxiliary losses; `routing_stats`
compares two forwards' routes (replay's metrics).

The exchange is the padded all-to-all, not the ragged one: XLA:CPU has no ragged-all-to-all
("HLO opcode `ragged-all-to-all` is not supported by XLA:CPU ThunkEmitter", jax 0.10.2), so
each shard sends each shard (itself included) a fixed buffer of n*k rows (its n tokens'
slots), filled up to that destination's count. That is the dropless worst case (all slots to
one shard), so it moves and holds S times the rows a ragged exchange would (n*k*S rows per
shard each way, where a ragged exchange moves about n*k on balanced routing); a
ragged_all_to_all variant for TPU/GPU is not written.

Cost on CPU: XLA:CPU lowers ragged_dot to one dense dot over all E groups (a masked [R, E*D]
operand), so it does E times the routed work (4096x256 rows times 128-wide experts, 2 cores:
E=4 0.022 s, 16 0.13 s, 64 0.63 s; one 256x128 dot on all rows 0.0034 s). TPU and GPU have
grouped kernels. `grouped='tiled'` is the CPU path (`tiled_grouped_matmul`): a scan over
(row tile, expert) pairs, about R/tile + E small dots; 18-23x faster than ragged_dot there
(same shapes, E=16/64, tile 256), equal to it within fp32 round-off.

Deliberately not here: the decoder block and the model's forward (transformer.py), mesh
axes and rule tables (sharding.py), recording routes in the sampler.
"""

import functools
from typing import NamedTuple

import jax
import jax.numpy as jnp
from jax.sharding import PartitionSpec as P

# Logical axes of one MoE layer's params (moe_config.py's layout); 'expert' needs a rule
# mapping it to the mesh's expert axis. The router stays whole (E x D is small).
PARAM_AXES = {
    'router': ('embed', None),
    'gate': ('expert', 'embed', 'moe_mlp'),
    'up': ('expert', 'embed', 'moe_mlp'),
    'down': ('expert', 'moe_mlp', 'embed'),
    'shared': {'gate': ('embed', 'mlp'), 'up': ('embed', 'mlp'), 'down': ('mlp', 'embed')},
    'shared_expert_gate': ('embed',),
}


class Routed(NamedTuple):
  """What a block's routing produced, for recording (ids) and the auxiliary losses (logits)."""
  expert_ids_NxK: jax.Array  # int32, the experts used, in top-k order (or the replayed ids)
  router_logits_NxE: jax.Array  # fp32


def init_moe_params(rng, *, hidden_size: int, num_experts: int, moe_intermediate_size: int,
                    shared_expert_intermediate_size: int = 0, dtype=jnp.float32) -> dict:
  """Normal(0, 0.02) weights in the layout of moe_config.py (the shared expert iff its size > 0)."""
  d, e, i, s = hidden_size, num_experts, moe_intermediate_size, shared_expert_intermediate_size
  shapes = {'router': (d, e), 'gate': (e, d, i), 'up': (e, d, i), 'down': (e, i, d)}
  if s:
    shapes.update({'shared/gate': (d, s), 'shared/up': (d, s), 'shared/down': (s, d),
                   'shared_expert_gate': (d,)})
  keys = jax.random.split(rng, len(shapes))
  params = {}
  for key, (name, shape) in zip(keys, shapes.items()):
    value = (0.02 * jax.random.normal(key, shape, jnp.float32)).astype(dtype)
    if '/' in name:
      params.setdefault('shared', {})[name.split('/')[1]] = value
    else:
      params[name] = value
  return params


def route(router_logits_NxE, *, top_k: int, norm_topk_prob: bool, forced_ids_NxK=None):
  """(expert_ids_NxK int32, weights_NxK fp32) as transformers routes, or replaying given ids.

  p = softmax(logits) in fp32 over all E; ids, w = top_k(p); w /= sum(w) if norm_topk_prob.
  Ties go to the lower expert index (jax.lax.top_k is stable). torch.topk does not promise
  an order among ties and on CPU (torch 2.13) returns [2, 3] for top-2 of four equal
  probabilities, so exact ties can choose other experts than transformers; with real-valued
  weights they have probability zero.

  Replay (R2/R3, algorithms.md §25): with forced_ids_NxK the ids are used and the weights are
  the live dense softmax gathered at them (renormalised when norm_topk_prob), so the router
  keeps its gradient even where it would now choose other experts. A row holding any
  negative id (no recorded route: padding) is routed live.
  """
  probs_NxE = jax.nn.softmax(router_logits_NxE.astype(jnp.float32), axis=-1)
  weights_NxK, ids_NxK = jax.lax.top_k(probs_NxE, top_k)
  if forced_ids_NxK is not None:
    forced_NxK = forced_ids_NxK.astype(jnp.int32)
    replay_Nx1 = jnp.all(forced_NxK >= 0, axis=-1, keepdims=True)
    ids_NxK = jnp.where(replay_Nx1, forced_NxK, ids_NxK)
    weights_NxK = jnp.take_along_axis(probs_NxE, ids_NxK, axis=-1)
  if norm_topk_prob:
    weights_NxK = weights_NxK / jnp.sum(weights_NxK, axis=-1, keepdims=True)
  return ids_NxK.astype(jnp.int32), weights_NxK


def tiled_grouped_matmul(rows_RxD, w_GxDxI, sizes_G, *, tile: int = 256):
  """jax.lax.ragged_dot(rows_RxD, w_GxDxI, sizes_G) as a scan over (row tile, group) pairs.

  Rows are grouped consecutively (group g: rows [start_g, start_g + sizes_g)); rows past the
  groups come out 0. Step p visits the p-th pair in row order (a group spanning t tiles owns
  t pairs; at most R/tile + G - 1 in all) and adds its tile's product with the group's
  weights, masked to the group's rows. For XLA:CPU, whose ragged_dot is dense over groups.
  """
  r, g = rows_RxD.shape[0], w_GxDxI.shape[0]
  tiles = -(-r // tile)
  rows_TxD = jnp.pad(rows_RxD, ((0, tiles * tile - r), (0, 0)))
  end_G = jnp.cumsum(sizes_G)
  start_G = end_G - sizes_G
  first_G = start_G // tile
  span_G = jnp.where(sizes_G > 0, (end_G - 1) // tile - first_G + 1, 0)
  pairs_end_G = jnp.cumsum(span_G)

  def step(out_TxI, p):
    # searchsorted(side='right'), spelled out: jnp.searchsorted trips shard_map's vma check.
    grp = jnp.minimum(jnp.sum(pairs_end_G <= p), g - 1)
    live = p < pairs_end_G[-1]
    t = jnp.where(live, jnp.clip(first_G[grp] + p - pairs_end_G[grp] + span_G[grp], 0,
                                 tiles - 1), 0)
    row_t = t * tile + jnp.arange(tile)
    mine_t = live & (row_t >= start_G[grp]) & (row_t < end_G[grp])
    y_txI = jnp.where(mine_t[:, None],
                      jax.lax.dynamic_slice_in_dim(rows_TxD, t * tile, tile) @ w_GxDxI[grp], 0)
    y_txI += jax.lax.dynamic_slice_in_dim(out_TxI, t * tile, tile)
    return jax.lax.dynamic_update_slice_in_dim(out_TxI, y_txI, t * tile, 0), None

  # Zeros built from both operands, so that inside shard_map the carry varies over the same
  # mesh axes as the step's output (scan requires equal types).
  out_TxI = jnp.zeros_like(rows_TxD[:, :1]) * jnp.zeros_like(w_GxDxI[0, :1, :])
  return jax.lax.scan(step, out_TxI, jnp.arange(tiles + g - 1))[0][:r]


def _swiglu_experts(rows_RxD, group_sizes_G, gate_GxDxI, up_GxDxI, down_GxIxD, grouped):
  """Each group of consecutive rows through its expert; rows past the groups come out 0."""
  if grouped == 'tiled':
    matmul = tiled_grouped_matmul
  elif grouped == 'ragged_dot':
    matmul = jax.lax.ragged_dot
  else:
    raise ValueError(f"moe_mlp: grouped={grouped!r}; known: 'ragged_dot', 'tiled'")
  gate_RxI = matmul(rows_RxD, gate_GxDxI, group_sizes_G)
  up_RxI = matmul(rows_RxD, up_GxDxI, group_sizes_G)
  return matmul(jax.nn.silu(gate_RxI) * up_RxI, down_GxIxD, group_sizes_G)


def _dispatch(x_nxD, ids_nxK, weights_nxK, gate, up, down, *, num_experts: int,
              axis_name: str | None, axis_size: int, grouped: str):
  """One shard's tokens through the experts (this shard's E/S of them hold gate/up/down).

  Slots (token, j) are sorted by expert, so each destination shard's slots are contiguous;
  row p of the buffer for shard s is the p-th of them (zero past its count). After the
  all-to-all a shard holds, per source, rows for its own experts; it sorts them by local
  expert (padding last), runs the grouped matmuls, unsorts, and sends the rows back.
  """
  n, k = ids_nxK.shape
  m, s, local = n * k, axis_size, gate.shape[0]
  expert_M = ids_nxK.reshape(m)
  order_M = jnp.argsort(expert_M, stable=True)
  expert_sorted_M = expert_M[order_M]
  counts_S = jnp.sum(jax.nn.one_hot(expert_sorted_M // local, s, dtype=jnp.int32), axis=0)
  start_S = jnp.cumsum(counts_S) - counts_S
  pos_M = jnp.arange(m)
  valid_SxM = pos_M[None, :] < counts_S[:, None]
  src_SxM = jnp.minimum(start_S[:, None] + pos_M[None, :], m - 1)
  rows_SxMxD = jnp.where(valid_SxM[..., None], x_nxD[order_M[src_SxM] // k], 0)
  local_SxM = jnp.where(valid_SxM, expert_sorted_M[src_SxM] - jnp.arange(s)[:, None] * local,
                        local)
  rows_RxD, local_R = rows_SxMxD.reshape(s * m, -1), local_SxM.reshape(s * m)
  if axis_name is not None:
    exchange = functools.partial(jax.lax.all_to_all, axis_name=axis_name, split_axis=0,
                                 concat_axis=0, tiled=True)
    rows_RxD, local_R = exchange(rows_RxD), exchange(local_R)
  by_expert_R = jnp.argsort(local_R, stable=True)
  sizes_G = jnp.sum(jax.nn.one_hot(local_R, local, dtype=jnp.int32), axis=0)
  out_RxD = _swiglu_experts(rows_RxD[by_expert_R], sizes_G, gate, up, down, grouped)
  out_RxD = out_RxD[jnp.argsort(by_expert_R)]
  out_RxD = jnp.where((local_R < local)[:, None], out_RxD, 0)
  if axis_name is not None:
    out_RxD = exchange(out_RxD)
  dest_M = expert_sorted_M // local
  out_sorted_MxD = out_RxD.reshape(s, m, -1)[dest_M, pos_M - start_S[dest_M]]
  out_nxKxD = out_sorted_MxD[jnp.argsort(order_M)].reshape(n, k, -1)
  return jnp.einsum('nk,nkd->nd', weights_nxK.astype(out_nxKxD.dtype), out_nxKxD)


def moe_mlp(params, x_NxD, *, top_k: int, norm_topk_prob: bool, forced_ids_NxK=None,
            mesh=None, expert_axis: str = 'expert', compute_dtype=jnp.float32,
            grouped: str = 'ragged_dot'):
  """The sparse MoE block: routed SwiGLU experts (+ Qwen2-MoE's gated shared expert).

  y = sum_j w_j * down_{i_j}(silu(gate_{i_j}(x)) * up_{i_j}(x))
      [+ sigmoid(x . shared_expert_gate) * down_s(silu(gate_s(x)) * up_s(x))]
  x_NxD may carry any leading dims (flattened to tokens), forced_ids_NxK the same ones.
  The router runs in fp32 (transformers computes its logits in the hidden dtype: equal in
  fp32). With `mesh` and mesh.shape[expert_axis] > 1 the experts are sharded over that axis
  (E must divide; moe_config.check_moe) and tokens split over it, padded to a multiple.
  grouped: 'ragged_dot' (TPU, GPU) or 'tiled' (CPU: tiled_grouped_matmul). Returns (y, Routed).
  """
  lead, d = x_NxD.shape[:-1], x_NxD.shape[-1]
  x_NxD = x_NxD.reshape(-1, d).astype(compute_dtype)
  forced = None if forced_ids_NxK is None else forced_ids_NxK.reshape(-1, top_k)
  logits_NxE = x_NxD.astype(jnp.float32) @ params['router'].astype(jnp.float32)
  ids_NxK, weights_NxK = route(logits_NxE, top_k=top_k, norm_topk_prob=norm_topk_prob,
                               forced_ids_NxK=forced)
  experts = [params[name].astype(compute_dtype) for name in ('gate', 'up', 'down')]
  num_experts = experts[0].shape[0]
  shards = 1 if mesh is None else mesh.shape[expert_axis]
  if num_experts % shards:
    raise ValueError(f'moe_mlp: mesh axis {expert_axis!r} of size {shards} does not divide '
                     f'num_experts={num_experts}')
  if shards == 1:
    y_NxD = _dispatch(x_NxD, ids_NxK, weights_NxK, *experts, num_experts=num_experts,
                      axis_name=None, axis_size=1, grouped=grouped)
  else:
    n = x_NxD.shape[0]
    pad = -n % shards  # Padding tokens route like any token; their outputs are dropped.
    padded = [jnp.pad(a, ((0, pad), (0, 0))) for a in (x_NxD, ids_NxK, weights_NxK)]
    spec = P(expert_axis)  # Tokens split over the expert axis, and experts too.
    run = jax.shard_map(
        functools.partial(_dispatch, num_experts=num_experts, axis_name=expert_axis,
                          axis_size=shards, grouped=grouped),
        mesh=mesh, in_specs=(spec,) * 6, out_specs=spec,
        axis_names={expert_axis})
    y_NxD = run(*padded, *experts)[:n]
  if 'shared' in params:
    sh = {k: v.astype(compute_dtype) for k, v in params['shared'].items()}
    shared_NxD = (jax.nn.silu(x_NxD @ sh['gate']) * (x_NxD @ sh['up'])) @ sh['down']
    gate_Nx1 = jax.nn.sigmoid(x_NxD @ params['shared_expert_gate'].astype(compute_dtype))[:, None]
    y_NxD = y_NxD + gate_Nx1 * shared_NxD
  return y_NxD.reshape(*lead, d), Routed(ids_NxK.reshape(*lead, top_k),
                                        logits_NxE.reshape(*lead, num_experts))


def load_balancing_loss(router_logits, *, top_k: int, mask_N=None):
  """Switch-Transformer auxiliary loss as transformers' load_balancing_loss_func defines it,
  pooled over layers: E * sum_e f_e * P_e, with f_e = (top-k slots routed to e) / tokens
  (so sum_e f_e = k) and P_e = mean router probability of e, over the valid tokens of all
  layers. Equals k when perfectly balanced (f_e = k/E, P_e = 1/E).

  router_logits: a sequence of per-layer [N, E] raw logits (Routed.router_logits_NxE,
  flattened); mask_N: 1 for tokens to count. One softmax, on the raw logits. transformers
  issue 45120: several routers (Mixtral, Qwen2-MoE and the models copied from it) returned
  their softmax output as `router_logits`, which load_balancing_loss_func softmaxed again,
  flattening P toward 1/E so the loss barely steers; 5.24's Qwen2/Qwen3-MoE routers return
  raw logits (fixed), which is what this takes.
  """
  counts_E = probs_E = rows = 0.0
  for logits_NxE in router_logits:
    logits_NxE = logits_NxE.reshape(-1, logits_NxE.shape[-1]).astype(jnp.float32)
    num_experts = logits_NxE.shape[-1]
    m_N = (jnp.ones(logits_NxE.shape[:1]) if mask_N is None
           else mask_N.reshape(-1).astype(jnp.float32))
    probs_NxE = jax.nn.softmax(logits_NxE, axis=-1)
    ids_NxK = jax.lax.top_k(probs_NxE, top_k)[1]
    counts_E += jnp.einsum('nke,n->e', jax.nn.one_hot(ids_NxK, num_experts), m_N)
    probs_E += jnp.einsum('ne,n->e', probs_NxE, m_N)
    rows += jnp.sum(m_N)
  return num_experts * jnp.sum((counts_E / rows) * (probs_E / rows))


def router_z_loss(router_logits, *, mask_N=None):
  """ST-MoE's router z-loss (arXiv 2202.08906, eq. 5): mean over valid tokens and layers of
  logsumexp(logits)^2; keeps router logits small (bf16 round-off)."""
  total = rows = 0.0
  for logits_NxE in router_logits:
    logits_NxE = logits_NxE.reshape(-1, logits_NxE.shape[-1]).astype(jnp.float32)
    m_N = (jnp.ones(logits_NxE.shape[:1]) if mask_N is None
           else mask_N.reshape(-1).astype(jnp.float32))
    total += jnp.sum(jax.nn.logsumexp(logits_NxE, axis=-1) ** 2 * m_N)
    rows += jnp.sum(m_N)
  return total / rows


def routing_stats(ids_LxNxK, other_LxNxK, *, num_experts: int, mask_N=None) -> dict:
  """Routing metrics of algorithms.md §25 between two forwards' expert ids (e.g. sampler and
  learner) over L MoE layers and N tokens (mask_N: 1 for tokens to count):

  disagreement: fraction of token x layer decisions whose expert sets differ;
  mismatch_rate: mean of 1 - |a & b| / k (MaxText's RoutingMismatchRate);
  tokens_any_layer_differ: fraction of tokens whose set differs in at least one layer;
  load_max_over_mean: per-expert slot counts of `ids`, max / mean, averaged over layers.
  """
  k = ids_LxNxK.shape[-1]
  m_N = (jnp.ones(ids_LxNxK.shape[1]) if mask_N is None else mask_N.astype(jnp.float32))
  shared_LxN = jnp.sum(jnp.any(ids_LxNxK[..., :, None] == other_LxNxK[..., None, :], axis=-1),
                       axis=-1)
  differ_LxN = (shared_LxN < k).astype(jnp.float32)
  tokens, layers = jnp.sum(m_N), ids_LxNxK.shape[0]
  counts_LxE = jnp.einsum('lnke,n->le', jax.nn.one_hot(ids_LxNxK, num_experts), m_N)
  return {
      'disagreement': jnp.sum(differ_LxN * m_N) / (tokens * layers),
      'mismatch_rate': jnp.sum((1 - shared_LxN / k) * m_N) / (tokens * layers),
      'tokens_any_layer_differ': jnp.sum(jnp.max(differ_LxN, axis=0) * m_N) / tokens,
      'load_max_over_mean': jnp.mean(jnp.max(counts_LxE, -1) / jnp.mean(counts_LxE, -1)),
  }
