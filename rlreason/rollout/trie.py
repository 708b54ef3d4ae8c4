"""Trie packing of threaded rows: one forward per episode, its shared prefixes computed once.

  packing = trie.build(tokens_NxT, mask_NxT, rows=1 + K, width=J)   # host, numpy
  h_NxTxD = trie.packed_hidden(params, tokens_NxT, mask_NxT, packing, cfg=cfg)   # jittable

ThreadWeaver (arXiv 2512.07843) trains on "a rollout as a trie of threads": the parent's
context is the prefix of every worker's, so the learner should see it once. A fork/join
episode (rollout/fork_join.py) is `rows` consecutive rows, the parent's and its K worker slots,
each a root-to-leaf path of the episode's trie: the prompt and the parent's spawn block are
shared, then one branch per worker (`h_k worker_open` and its tokens) and the parent's own
branch (the join block and its ending). `build` merges the rows' real tokens into that trie
(a row's tokens that equal another row's on the whole path from the root are one node; an
unspawned worker slot, a copy of the prompt, adds no node) and lays the nodes out in
depth-first preorder, so node j's subtree is the index range [j, end[j]]. One packed sequence
per episode, of static width J, then runs through the transformer with
  positions  each node's depth (its row position: branches restart at the branch point),
  attention  key j is seen by queries j..end[j] only (attention.causal_attention's
             subtree_end): every node attends to exactly its ancestors and itself,
so every node's hidden state equals the one its rows compute in the per-row forward (the same
tokens at the same positions over the same keys; up to float rounding). `packed_hidden`
gathers them back into the rows' layout, where the loss, its aggregation and its advantages
are untouched: the same tokens, predicted from the same states. The gradient of a shared node
sums over the rows that read it, as the per-row forward's does.

Provenance: the trie and the prefix-once forward are ThreadWeaver's [P]; the preorder layout
with a per-key subtree end as the attention mask is our formalisation [F].

Layout: `Packing` arrays are row-major like the batch (N leading), so the learner's minibatch
and micro-batch slices (whole groups, whole episodes) carry them along: the episode's packed
sequence is its rows' C-wide chunks laid end to end (J = rows * C).

Deliberately not here: several episodes per packed row, and the vocabulary projection (the
loss still projects every row's completion columns).
"""

import flax
import jax
import jax.numpy as jnp
import numpy as np

from rlreason.model import transformer


@flax.struct.dataclass
class Packing:
  """Where each row token lives in its episode's packed trie (arrays N-leading, int32).

  index_NxT: the node of each real token (-1 for padding).
  source_NxC: per packed node, chunked (episode e's node j is row e * rows + j // C, column
    j % C), the flat index row_in_episode * T + column of one row token holding it; -1 unused.
  end_NxC: per packed node, chunked likewise, its subtree's last node (-1 unused).
  rows: rows per episode (static).
  """
  index_NxT: jax.Array
  source_NxC: jax.Array
  end_NxC: jax.Array
  rows: int = flax.struct.field(pytree_node=False, default=1)

  @property
  def width(self) -> int:
    return self.rows * self.source_NxC.shape[1]


def build(tokens_NxT, mask_NxT, *, rows: int, width: int) -> Packing:
  """The trie of each episode (`rows` consecutive rows; their real tokens as sequences),
  packed in preorder into `width` (rounded up to a multiple of rows) slots.

  Rows sorted lexicographically visit the trie in preorder: each row adds the nodes past its
  longest common prefix with the previous row, after every node added so far."""
  tokens_NxT, mask_NxT = np.asarray(tokens_NxT), np.asarray(mask_NxT, bool)
  n, t = tokens_NxT.shape
  if rows < 1 or n % rows:
    raise ValueError(f'trie.build: {n} rows do not split into episodes of rows={rows}.')
  c = -(-width // rows)
  j_max = rows * c
  index = np.full((n, t), -1, np.int32)
  source = np.full((n // rows, j_max), -1, np.int32)
  end = np.full((n // rows, j_max), -1, np.int32)
  for e in range(n // rows):
    cols = [np.flatnonzero(mask_NxT[e * rows + r]) for r in range(rows)]
    seqs = [tuple(tokens_NxT[e * rows + r, cols[r]].tolist()) for r in range(rows)]
    prev, prev_nodes, count = (), [], 0
    for r in sorted(range(rows), key=lambda r: seqs[r]):
      seq = seqs[r]
      shared = 0
      while shared < min(len(seq), len(prev)) and seq[shared] == prev[shared]:
        shared += 1
      nodes = prev_nodes[:shared] + list(range(count, count + len(seq) - shared))
      if count + len(seq) - shared > j_max:
        raise ValueError(f'trie.build: episode {e} has more than width={j_max} trie nodes; '
                         'raise the packed width (threads budgets: rl/threads.trie_width).')
      source[e, nodes[shared:]] = r * t + cols[r][shared:]
      count += len(seq) - shared
      index[e * rows + r, cols[r]] = nodes
      if nodes:
        end[e, nodes] = np.maximum(end[e, nodes], nodes[-1])
      prev, prev_nodes = seq, nodes
  return Packing(index_NxT=index, source_NxC=source.reshape(n, c),
                 end_NxC=end.reshape(n, c), rows=rows)


def node_counts(packing: Packing) -> np.ndarray:
  """Trie nodes per episode (the positions its packed forward needs)."""
  source = np.asarray(packing.source_NxC).reshape(-1, packing.width)
  return (source >= 0).sum(axis=1)


def _episodes(x_NxA, rows: int):
  """N x A... -> E x (rows * A) ...: an episode's rows end to end."""
  return x_NxA.reshape(x_NxA.shape[0] // rows, rows * x_NxA.shape[1], *x_NxA.shape[2:])


def packed_hidden(params, tokens_NxT, mask_NxT, packing: Packing, *,
                  cfg: transformer.ModelConfig):
  """Final hidden states NxTxD of the rows, from one forward per episode over its packed trie
  (padding gets the root's state, finite and never trained)."""
  n, t = tokens_NxT.shape
  r = packing.rows
  if n % r:
    raise ValueError(f'trie.packed_hidden: {n} rows are not whole episodes of {r} rows '
                     '(rl.micro_batches must split the batch into whole groups).')
  source_ExJ = _episodes(packing.source_NxC, r)
  valid_ExJ = source_ExJ >= 0
  src_ExJ = jnp.maximum(source_ExJ, 0)
  gather = lambda x_NxT: jnp.take_along_axis(_episodes(x_NxT, r), src_ExJ, axis=1)
  positions_ExJ = jnp.where(valid_ExJ, gather(transformer.default_positions(mask_NxT)), 0)
  h_ExJxD, _ = transformer.apply(params, gather(tokens_NxT), cfg=cfg, mask_NxT=valid_ExJ,
                                 positions_NxT=positions_ExJ, return_hidden=True,
                                 subtree_end_NxT=_episodes(packing.end_NxC, r))
  index_ExRT = jnp.maximum(_episodes(packing.index_NxT, r), 0)
  h_ExRTxD = jnp.take_along_axis(h_ExJxD, index_ExRT[..., None], axis=1)
  return h_ExRTxD.reshape(n, t, -1)


def positions(packing: Packing, mask_NxT) -> dict[str, int]:
  """Positions the learner's forward computes: packed (episodes x J) and per row (N x T),
  and the real ones: trie nodes against the rows' real tokens."""
  n, t = np.asarray(mask_NxT).shape
  return {'packed': n // packing.rows * packing.width, 'rows': n * t,
          'packed_real': int(node_counts(packing).sum()),
          'rows_real': int(np.asarray(mask_NxT).sum())}
