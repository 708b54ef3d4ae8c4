"""Trie packing of threaded rows (rollout/trie.py) and the attention hook it runs on.

A hand-built group of two episodes in fork_join's row layout (3 worker slots each): episode 0
spawns three workers of different lengths, episode 1 does not spawn (its worker slots are
empty). The packed forward must give the per-row forward's log-probs, loss and gradient.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rlreason.model import attention
from rlreason.model import tokenizer
from rlreason.model import transformer
from rlreason.objectives import aggregation
from rlreason.rl import update
from rlreason.rollout import trie
from rlreason.structs import TrainBatch
from rlreason.tasks import parallel_sums

TOK = tokenizer.from_characters(parallel_sums.CHARS)
CFG = transformer.ModelConfig(vocab_size=TOK.vocab_size, hidden_size=32, intermediate_size=64,
                              num_layers=2, num_heads=4, num_kv_heads=2, head_dim=8)
P, L, ROWS = 16, 24, 4
PROMPT = 'a:12 b:345 c:6='  # 15 real tokens, left-padded to P
SPAWN, JOIN, ENDING = '<a,b,c>', '[3,712,6]', '+06#'
WORKERS = [('a:', '3'), ('b:', '712'), ('c:', '6####')]  # 1, 3 and 5 own tokens


def _rows():
  """tokens, mask (NxT), loss mask (NxL) of the two episodes: 8 rows."""
  enc = TOK.encode
  segs = [[(SPAWN, True), (JOIN, False), (ENDING, True)]]  # parent: join block is context
  segs += [[(SPAWN + h, False), (out, True)] for h, out in WORKERS]
  segs += [[('+1#', True)], [], [], []]  # episode 1: no spawn, empty worker slots
  n = len(segs)
  tokens = np.zeros((n, P + L), np.int32)
  mask = np.zeros((n, P + L), bool)
  loss = np.zeros((n, L), bool)
  prompt = enc(PROMPT)
  tokens[:, P - len(prompt):P] = prompt
  mask[:, P - len(prompt):P] = True
  for r, row in enumerate(segs):
    col = 0
    for text, trained in row:
      ids = enc(text)
      tokens[r, P + col:P + col + len(ids)] = ids
      mask[r, P + col:P + col + len(ids)] = True
      loss[r, col:col + len(ids)] = trained
      col += len(ids)
  return tokens, mask, loss


TOKENS, MASK, LOSS = _rows()
PARAMS = transformer.init_params(CFG, jax.random.key(0))
WIDTH = P + L + 3 * 12


def test_packed_length_is_the_tries_node_count():
  packing = trie.build(TOKENS, MASK, rows=ROWS, width=WIDTH)
  shared = len(PROMPT) + len(SPAWN)
  branches = len(JOIN + ENDING) + sum(len(h + out) for h, out in WORKERS)
  # The prefix once; an unspawned episode is its parent's row, its empty slots add nothing.
  np.testing.assert_array_equal(trie.node_counts(packing),
                                [shared + branches, len(PROMPT) + 3])
  assert shared + branches == 15 + 7 + 13 + 3 + 5 + 7 == 50
  cost = trie.positions(packing, MASK)
  assert cost['packed_real'] == 50 + 18 and cost['rows_real'] == MASK.sum()
  assert cost["rows_real"] == 8 * 15 + 20 + 10 + 12 + 14 + 3 == 179
  assert cost['packed'] == 2 * packing.width and cost['rows'] == 8 * (P + L)
  # Every row token's node holds the same token, at the row's depth (its position).
  src = np.asarray(packing.source_NxC).reshape(2, -1)
  flat = TOKENS.reshape(2, -1)
  for n in range(8):
    e, cols = n // ROWS, np.flatnonzero(MASK[n])
    nodes = packing.index_NxT[n, cols]
    np.testing.assert_array_equal(flat[e][src[e][nodes]], TOKENS[n, cols])
  with pytest.raises(ValueError, match='width'):
    trie.build(TOKENS, MASK, rows=ROWS, width=40)
  with pytest.raises(ValueError, match='rows=3'):
    trie.build(TOKENS, MASK, rows=3, width=WIDTH)


def test_preorder_and_subtree_ends_of_a_hand_built_trie():
  # Rows (real tokens) 'ab', 'acd', 'ace', 'a': the trie a -> {b, c -> {d, e}}.
  rows = ['ab', 'acd', 'ace', 'a']
  tokens = np.zeros((4, 3), np.int32)
  mask = np.zeros((4, 3), bool)
  for r, text in enumerate(rows):
    tokens[r, :len(text)] = TOK.encode(text)
    mask[r, :len(text)] = True
  packing = trie.build(tokens, mask, rows=4, width=8)
  # Preorder: a=0, b=1, c=2, d=3, e=4; subtrees a [0, 4], b [1, 1], c [2, 4], d, e leaves.
  np.testing.assert_array_equal(np.asarray(packing.end_NxC).reshape(-1)[:6], [4, 1, 4, 3, 4, -1])
  np.testing.assert_array_equal(packing.index_NxT, [[0, 1, -1], [0, 2, 3], [0, 2, 4],
                                                    [0, -1, -1]])


def test_subtree_end_spanning_everything_is_plain_causal():
  q = jax.random.normal(jax.random.key(1), (2, 6, 1, 2, 4))
  k, v = (jax.random.normal(jax.random.key(i), (2, 6, 1, 4)) for i in (2, 3))
  mask = jnp.array([[False, True, True, True, True, True], [True] * 6])
  plain = attention.causal_attention(q, k, v, mask)
  wide = attention.causal_attention(q, k, v, mask, subtree_end_NxT=jnp.full((2, 6), 5))
  np.testing.assert_allclose(np.asarray(wide), np.asarray(plain), atol=1e-6)
  # Key 1 seen only by queries 1..2: query 3's output changes, queries 0..2 do not.
  cut = attention.causal_attention(q, k, v, mask, subtree_end_NxT=jnp.array(
      [[5, 2, 5, 5, 5, 5]] * 2))
  np.testing.assert_allclose(np.asarray(cut)[:, :3], np.asarray(plain)[:, :3], atol=1e-6)
  assert np.abs(np.asarray(cut)[:, 3] - np.asarray(plain)[:, 3]).max() > 1e-4


def _batch(packing):
  rng = np.random.default_rng(0)
  old = np.asarray(update.logprobs_step(PARAMS, TOKENS, MASK, cfg=CFG, completion_len=L)
                   .logprobs_NxT) + rng.normal(0, 0.1, (8, L)).astype(np.float32)
  adv = np.repeat(np.array([1.5, -0.5]), ROWS)[:, None] * LOSS
  zeros = jnp.zeros((8, L), jnp.float32)
  return TrainBatch(tokens_NxT=jnp.asarray(TOKENS), mask_NxT=jnp.asarray(MASK),
                    loss_mask_NxL=jnp.asarray(LOSS), advantages_NxL=jnp.asarray(adv, jnp.float32),
                    old_logprobs_NxL=jnp.asarray(old), ref_logprobs_NxL=zeros,
                    behaviour_logprobs_NxL=jnp.asarray(old), prefix_mask_NxL=jnp.zeros((8, L), bool),
                    trie=packing)


def test_packed_forward_equals_the_per_row_forward_logprobs_loss_and_gradient():
  packing = trie.build(TOKENS, MASK, rows=ROWS, width=WIDTH)
  per_row = update.logprobs_step(PARAMS, TOKENS, MASK, cfg=CFG, completion_len=L)
  packed = jax.jit(lambda p, t, m, tr: update.logprobs_step(p, t, m, cfg=CFG, completion_len=L,
                                                            trie=tr))(PARAMS, TOKENS, MASK,
                                                                      packing)
  real = MASK[:, P:]  # every real completion token, branch starts included
  diff = np.abs(np.asarray(packed.logprobs_NxT) - np.asarray(per_row.logprobs_NxT))[real]
  assert diff.max() <= 1e-5, diff.max()
  assert np.abs(np.asarray(per_row.logprobs_NxT)[real]).min() > 0  # real predictions
  objective = update.Objective(group_size=1)
  batch = _batch(packing)
  den = aggregation.denominators(batch.loss_mask_NxL, mode='token_mean')
  grad_fn = jax.jit(jax.value_and_grad(
      lambda p, b: update.loss_fn(p, b, den, cfg=CFG, objective=objective)[0]))
  loss_rows, grads_rows = grad_fn(PARAMS, batch.replace(trie=None))
  loss_trie, grads_trie = grad_fn(PARAMS, batch)
  assert abs(float(loss_rows) - float(loss_trie)) <= 1e-5 and abs(float(loss_rows)) > 1e-3
  gaps = jax.tree.map(lambda a, b: float(jnp.abs(a - b).max()), grads_rows, grads_trie)
  assert max(jax.tree.leaves(gaps)) <= 1e-5, gaps
  assert float(optax_norm(grads_rows)) > 1e-3


def optax_norm(tree):
  return jnp.sqrt(sum(jnp.sum(x * x) for x in jax.tree.leaves(tree)))


def test_config_checks_name_trie_packing():
  from rlreason import config as config_lib
  from experiments import parallel_reasoning
  c = parallel_reasoning.get_config('runlocal')
  c.threads.trie_packing = True
  config_lib.validate(c, num_devices=8)
  c.rl.micro_batches = c.rl.prompts_per_step * c.rl.group_size + 1
  with pytest.raises(ValueError, match='threads.trie_packing packs whole episodes'):
    config_lib.validate(c, num_devices=8)
