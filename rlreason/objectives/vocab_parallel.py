"""Vocabulary-parallel token statistics: log π(token), entropy and Σπ² with the LM head
sharded over its vocabulary, via `jax.shard_map`.

  stats = vocab_parallel.token_stats_from_hidden(h_NxTxD, w_DxV, tokens_NxT, temperature=τ)

Under a mesh (`jax.set_mesh`) whose rule table shards 'vocab' over axes of total size tp > 1,
each device computes the chunked kernel of token_stats.py on its own V/tp columns of w only:
per position it reduces its columns to the online-logsumexp partials (max, Σe, Σe·z, Σe², the
token's logit if it owns it), and the devices merge them with a pmax and a psum of those
per-position scalars. A device computes logits for token_chunk x vocab_chunk (position, column)
pairs at a time, nothing V-sized is gathered, and w and its gradient stay D x V/tp per device.
The backward pass (a custom VJP, as in token_stats.py) recomputes each device's logit blocks
from the merged logsumexp, entropy and Σπ²; the gradient w.r.t. h is then a psum over the vocabulary shards
(one D-vector per position, as in any column-parallel output layer), and the gradient w.r.t.
w a psum over the rows' data axes, the data-parallel gradient reduction, of a D x V/tp shard.

Anywhere else (no mesh, tp = 1, or a V that tp does not divide, which the rules then leave
replicated) this is token_stats.token_stats_from_hidden, unchanged. Called directly with
explicit `vocab_axes`, `sharded_token_stats` rejects a V that the axes do not divide rather
than padding w (a copy of w at every step, and masked columns in the kernels); Qwen2.5/3's
151,936 and Llama 3's 128,256 are multiples of 8.

Deliberately not here: sharding the positions' hidden dimension, sequence parallelism.
"""

import dataclasses
import functools
import math
from typing import Any

import jax
import jax.numpy as jnp
from jax.sharding import PartitionSpec as P

from rlreason.model import sharding
from rlreason.objectives import token_stats
from rlreason.objectives.token_stats import TokenStats


def token_stats_from_hidden(h_NxTxD, w_DxV, tokens_NxT, *, temperature: float = 1.0,
                            token_chunk: int = 1024, vocab_chunk: int = 16384,
                            mesh=None, rules: sharding.Rules = sharding.TRAIN_RULES) -> TokenStats:
  """token_stats.token_stats_from_hidden, vocabulary-parallel where `rules` shard 'vocab'.

  Args:
    h_NxTxD, w_DxV, tokens_NxT, temperature, token_chunk, vocab_chunk: as in
      token_stats.token_stats_from_hidden (token_chunk then counts each device's positions,
      vocab_chunk each device's columns).
    mesh: default the mesh of the context (`jax.set_mesh`); none means the unsharded path.
    rules: the logical-axis table that placed w; 'vocab' and 'batch' are read from it.
  """
  mesh = jax.sharding.get_abstract_mesh() if mesh is None else mesh
  if mesh.empty:
    vocab_axes = ()
  else:
    vocab_axes = _axes(sharding.logical_to_spec(('vocab',), rules, mesh, (w_DxV.shape[1],)))
  if math.prod(mesh.shape[a] for a in vocab_axes) <= 1:
    return token_stats.token_stats_from_hidden(h_NxTxD, w_DxV, tokens_NxT,
                                               temperature=temperature, token_chunk=token_chunk,
                                               vocab_chunk=vocab_chunk)
  batch_spec = sharding.logical_to_spec(('batch',), rules, mesh, (h_NxTxD.shape[0],))
  batch_axes = tuple(a for a in _axes(batch_spec) if a not in vocab_axes and mesh.shape[a] > 1)
  return sharded_token_stats(h_NxTxD, w_DxV, tokens_NxT, mesh=mesh, vocab_axes=vocab_axes,
                             batch_axes=batch_axes, temperature=temperature,
                             token_chunk=token_chunk, vocab_chunk=vocab_chunk)


def sharded_token_stats(h_NxTxD, w_DxV, tokens_NxT, *, mesh, vocab_axes: tuple[str, ...],
                        batch_axes: tuple[str, ...] = (), temperature: float = 1.0,
                        token_chunk: int = 1024, vocab_chunk: int = 16384) -> TokenStats:
  """The vocabulary-parallel path with explicit mesh axes: w's columns over `vocab_axes`,
  the rows of h and tokens over `batch_axes` (their product must divide N), replicated
  over the mesh's other axes. Differentiable w.r.t. h_NxTxD and w_DxV.
  """
  v = w_DxV.shape[1]
  tp = math.prod(mesh.shape[a] for a in vocab_axes)
  if v % tp:
    raise ValueError(f'vocab_parallel: the vocabulary ({v}) is not divisible by the '
                     f'{tp} devices of mesh axes {vocab_axes}, and this path does not pad; '
                     'use vocab_parallel.token_stats_from_hidden (it falls back to the '
                     'unsharded kernel there) or a tensor size that divides the vocabulary.')
  n, t, _ = h_NxTxD.shape
  rows = math.prod(mesh.shape[a] for a in batch_axes)
  if n % rows:
    raise ValueError(f'vocab_parallel: {n} rows do not split over the {rows} devices of '
                     f'mesh axes {batch_axes}.')
  # Equal blocks of a device's U = V / tp columns, none wider than vocab_chunk: U = 18,992 at
  # tp = 8 is two blocks of 9,496, not 16,384 + an overlapping 16,384 (twice the scratch).
  blocks = -(-(v // tp) // vocab_chunk)
  plan = _Plan(mesh=mesh, vocab_axes=tuple(vocab_axes), batch_axes=tuple(batch_axes),
               temperature=float(temperature), token_chunk=min(token_chunk, n // rows * t),
               vocab_chunk=-(-(v // tp) // blocks))
  lp_NxT, ent_NxT, sq_NxT = _stats(plan, h_NxTxD, w_DxV, tokens_NxT.astype(jnp.int32))
  return TokenStats(logprobs_NxT=lp_NxT, entropy_NxT=ent_NxT, sum_sq_probs_NxT=sq_NxT)


def _axes(entry_spec: P) -> tuple[str, ...]:
  """The mesh axes of a one-dimensional PartitionSpec, as a tuple."""
  entry = entry_spec[0] if len(entry_spec) else None
  return () if entry is None else (entry,) if isinstance(entry, str) else tuple(entry)


@dataclasses.dataclass(frozen=True)
class _Plan:
  """Static layout and chunking of one call (a hashable nondiff argument of the VJP)."""
  mesh: Any
  vocab_axes: tuple[str, ...]
  batch_axes: tuple[str, ...]
  temperature: float
  token_chunk: int
  vocab_chunk: int

  def shard_map(self, f, *, row_inputs: int, out_specs):
    """f(h, w, tokens, *row_inputs per-position arrays) over shards of rows and columns."""
    rows = self.batch_axes or None
    in_specs = (P(rows, None, None), P(None, self.vocab_axes), P(rows, None)) + (
        P(rows, None),) * row_inputs
    # check_vma=False: the kernels' fori_loop/scan carries start unvarying and become
    # varying; nothing here is differentiated by shard_map (the VJP is ours), and the
    # out_specs' replication is what the explicit pmax/psum below establish.
    return jax.shard_map(functools.partial(f, plan=self), mesh=self.mesh, in_specs=in_specs,
                         out_specs=out_specs, check_vma=False)

  def row_spec(self, *rest):
    return P(self.batch_axes or None, *rest)


def _local_tokens(tokens_nxT, w_DxU, plan):
  """Token ids relative to this device's columns [i·U, (i+1)·U) of w (U = V / tp): ids of other
  devices' columns fall outside [0, U) and match none of this device's columns."""
  return tokens_nxT - jax.lax.axis_index(plan.vocab_axes) * w_DxU.shape[1]


def _forward_shard(h_nxTxD, w_DxU, tokens_nxT, *, plan):
  """On one device: its rows (n of N) against its columns (U of V); merged per position."""
  n, t, _ = h_nxTxD.shape
  part = token_stats.vocab_partials(
      token_stats.pad_rows(h_nxTxD, plan.token_chunk), w_DxU,
      token_stats.pad_rows(_local_tokens(tokens_nxT, w_DxU, plan), plan.token_chunk),
      temperature=plan.temperature, token_chunk=plan.token_chunk, vocab_chunk=plan.vocab_chunk)
  # The merge of the block loop, across devices: rescale each device's sums to the global max.
  max_M = jax.lax.pmax(part.max_M, plan.vocab_axes)
  shift_M = part.max_M - max_M
  scale_M = jnp.exp(shift_M)
  sums = jax.lax.psum((scale_M * part.sum_exp_M,
                       scale_M * (part.sum_exp_z_M + shift_M * part.sum_exp_M),
                       scale_M * scale_M * part.sum_exp2_M, part.picked_M), plan.vocab_axes)
  stats_M = token_stats.finish(token_stats.VocabPartials(max_M, *sums))
  return tuple(s_M[:n * t].reshape(n, t) for s_M in stats_M)


def _backward_shard(h_nxTxD, w_DxU, tokens_nxT, *per_position_nxT, plan):
  """On one device: its share of dh (summed over devices) and its columns of dw (summed
  over the devices that hold other rows)."""
  n, t, d = h_nxTxD.shape
  pad = functools.partial(token_stats.pad_rows, token_chunk=plan.token_chunk)
  dh_MxD, dw_DxU = token_stats.logit_backward(
      pad(h_nxTxD), w_DxU, pad(_local_tokens(tokens_nxT, w_DxU, plan)),
      *(pad(x) for x in per_position_nxT), temperature=plan.temperature,
      token_chunk=plan.token_chunk, vocab_chunk=plan.vocab_chunk)
  dh_nxTxD = jax.lax.psum(dh_MxD[:n * t].reshape(n, t, d), plan.vocab_axes)
  if plan.batch_axes:
    dw_DxU = jax.lax.psum(dw_DxU, plan.batch_axes)
  return dh_nxTxD.astype(h_nxTxD.dtype), dw_DxU.astype(w_DxU.dtype)


def _forward(plan, h_NxTxD, w_DxV, tokens_NxT):
  return plan.shard_map(_forward_shard, row_inputs=0, out_specs=plan.row_spec(None))(
      h_NxTxD, w_DxV, tokens_NxT)


@functools.partial(jax.custom_vjp, nondiff_argnums=(0,))
def _stats(plan, h_NxTxD, w_DxV, tokens_NxT):
  return _forward(plan, h_NxTxD, w_DxV, tokens_NxT)[:3]


def _stats_fwd(plan, h_NxTxD, w_DxV, tokens_NxT):
  lp, ent, sq, lse = _forward(plan, h_NxTxD, w_DxV, tokens_NxT)
  return (lp, ent, sq), (h_NxTxD, w_DxV, tokens_NxT, lse, ent, sq)


def _stats_bwd(plan, residuals, cotangents):
  h_NxTxD, w_DxV, tokens_NxT, lse, ent, sq = residuals
  out_specs = (plan.row_spec(None, None), P(None, plan.vocab_axes))
  dh_NxTxD, dw_DxV = plan.shard_map(_backward_shard, row_inputs=6, out_specs=out_specs)(
      h_NxTxD, w_DxV, tokens_NxT, lse, ent, sq, *cotangents)
  return dh_NxTxD, dw_DxV, None


_stats.defvjp(_stats_fwd, _stats_bwd)
