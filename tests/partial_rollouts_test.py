"""Partial rollouts: carried rows continue where they stopped (the continuous path's tokens
when the params do not change), carry their sampling versions across an update, groups stay
whole; the train loop resumes bit-exactly with rows in flight; config errors name fields."""

import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rlreason.model import transformer
from rlreason.rollout import continuous
from rlreason.rollout import partial
from rlreason.rollout import sampler
from rlreason.rollout import sampling

CFG = transformer.ModelConfig(vocab_size=32, hidden_size=32, intermediate_size=64, num_layers=1,
                              num_heads=2, num_kv_heads=1, head_dim=16)
B, G, S, M = 2, 2, 4, 8
KW = dict(cfg=CFG, group_size=G, slots=S, max_new_tokens=M, top_k=6, stop_tokens=(3,),
          donate=False)
# Row limits differ, so groups finish out of order and rows are cut mid-answer by a release.
LIMITS = [np.array(x, np.int32) for x in ([8, 2, 3, 8], [8, 8, 1, 2], [2, 5, 8, 7],
                                           [4, 8, 8, 1], [8, 3, 2, 8])]
PROMPTS = [[[5, 6, 7], [1, 2]], [[8], [4, 4, 9]], [[2, 3, 4, 5], [6]], [[7, 7], [9, 1, 2]],
           [[4], [5, 5]]]


@pytest.fixture(scope='module')
def params():
  p = transformer.init_params(CFG, jax.random.key(0))
  return jax.tree.map(lambda x: x * 4 if x.ndim > 1 else x, p)


def batch(i):
  prompts = sampler.prepare_prompts(PROMPTS[i], buckets=(6,))
  rng = jax.random.key(100 + i)
  return prompts, jax.random.key_data(sampling.row_keys(rng, jnp.arange(B * G))), rng


def run_steps(params_by_step, steps):
  """start(batch 0), then advance(batch s + 1, version s) for s < steps: the released
  (batch, group) ids per step, rollouts, and the pools after each call (host copies)."""
  prompts, keys, _ = batch(0)
  pool = partial.start(params_by_step(0), prompts, keys, jnp.asarray(LIMITS[0]),
                       temperature=1.2, version=0, **KW)
  ids = [(0, 0), (0, 1)]  # Host bookkeeping: which (batch, group) each pool entry holds.
  out = []
  for s in range(steps):
    prompts, keys, _ = batch(s + 1)
    ids = ids[:B] + [(s + 1, 0), (s + 1, 1)]
    rollout, groups_B, stats, pool = partial.advance(
        params_by_step(s), pool, prompts, keys, jnp.asarray(LIMITS[s + 1]), temperature=1.2,
        version=s, **KW)
    picked = [int(i) for i in groups_B]
    released = [ids[i] for i in picked]
    ids = [x for i, x in enumerate(ids) if i not in picked]
    out.append((released, jax.device_get(rollout), jax.device_get(stats), jax.device_get(pool),
                ids))
  return out


def test_with_unchanged_params_carried_rows_sample_what_continuous_batching_does(params):
  steps = run_steps(lambda s: params, 4)
  reference = {}
  for i in range(5):
    prompts, _, rng = batch(i)
    reference[i] = jax.device_get(continuous.generate(
        params, prompts, rng=rng, max_new_tokens_N=LIMITS[i], temperature=1.2,
        **{k: v for k, v in KW.items() if k != 'donate'}))
  carried = 0
  for released, rollout, stats, pool, _ in steps:
    assert len(released) == B
    for b, (i, k) in enumerate(released):
      rows, ref_rows = slice(b * G, (b + 1) * G), slice(k * G, (k + 1) * G)
      for name in ('tokens_NxL', 'mask_NxL', 'truncated_N', 'lengths_N'):
        np.testing.assert_array_equal(getattr(rollout, name)[rows],
                                      getattr(reference[i], name)[ref_rows], err_msg=name)
      for name in ('logprobs_NxL', 'behaviour_logprobs_NxL'):
        np.testing.assert_allclose(getattr(rollout, name)[rows],
                                   getattr(reference[i], name)[ref_rows], atol=1e-5)
    carried += int((pool['live_S'] & (pool['j_S'] > 0)).sum())
  assert carried > 0  # Rows were cut mid-answer by a release and finished in a later call.


def test_carried_tokens_keep_the_version_that_sampled_them(params):
  other = jax.tree.map(lambda x: -x, params)
  same = run_steps(lambda s: params, 2)
  updated = run_steps(lambda s: params if s == 0 else other, 2)
  _, _, _, pool, carried_ids = updated[0]  # Out of step 0 (version 0) into step 1 (version 1).
  released, rollout, _, _, _ = updated[1]
  assert released == same[1][0]  # The same groups finish first here.
  checked = mixed = 0
  for slot in np.flatnonzero(pool['live_S'] & (pool['j_S'] > 0)):
    row, j0 = int(pool['row_S'][slot]), int(pool['j_S'][slot])
    if carried_ids[row // G] not in released:
      continue
    n = released.index(carried_ids[row // G]) * G + row % G
    length = int(rollout.lengths_N[n])
    assert length > j0
    # Tokens 0..j0 - 1 were sampled before the update; token j0 from the logits the old params
    # computed and carried over it; the rest under the new params.
    np.testing.assert_array_equal(rollout.version_NxL[n, :length],
                                  np.where(np.arange(length) <= j0, 0, 1))
    np.testing.assert_array_equal(rollout.tokens_NxL[n, :j0 + 1],
                                  same[1][1].tokens_NxL[n, :j0 + 1])
    checked, mixed = checked + 1, mixed + (length > j0 + 1)
  assert checked and mixed  # A row holding tokens of versions 0 and 1 was checked.
  for b, (i, _) in enumerate(released):  # Groups queued in step 1 ran under version 1 alone.
    rows = slice(b * G, (b + 1) * G)
    versions = np.asarray(rollout.version_NxL[rows])[np.asarray(rollout.mask_NxL[rows])]
    assert (versions == 1).all() if i == 2 else (versions == 0).any()


def test_groups_are_released_whole_and_every_group_once(params):
  steps = run_steps(lambda s: params, 4)
  seen = [x for released, *_ in steps for x in released]
  assert len(seen) == len(set(seen)) == 4 * B
  for released, rollout, stats, pool, ids in steps:
    assert (np.asarray(rollout.lengths_N) > 0).all()  # Every member of a released group ran,
    last = np.asarray(stats.finished_N).reshape(B, G).max(axis=1)  # and finished by then.
    np.testing.assert_array_equal(stats.released_B, last)
    live_rows = np.asarray(pool['row_S'])[np.asarray(pool['live_S'])]
    assert (live_rows < B * G).all()  # Only carried groups (the first B) hold slots,
    assert int(pool['next_b']) <= B  # and the queue continues behind them.


def partial_config(steps=4):
  from tests import train_test
  c = train_test.tiny_config(steps=steps)
  c.sft.steps, c.eval.every = 0, 0
  c.rl.update(sampler='continuous', slots=4, partial_rollouts=True)
  return c


def test_resume_with_rows_in_flight_is_bit_exact(tmp_path):
  from tests import train_test
  from rlreason.rl import metrics
  from rlreason.rl import train
  import chex
  straight, _ = train.train(partial_config(), str(tmp_path / 'straight'))
  train_test.train_preempted_at(2, partial_config(), str(tmp_path / 'resumed'))
  saved = tmp_path / 'resumed' / 'partial_rollouts' / 'checkpoints'
  assert '2' in os.listdir(saved)
  resumed, _ = train.train(partial_config(), str(tmp_path / 'resumed'))
  chex.assert_trees_all_equal(jax.device_get(resumed.params), jax.device_get(straight.params))
  chex.assert_trees_all_equal(jax.device_get(resumed.opt_state),
                              jax.device_get(straight.opt_state))
  logs = {name: {r['step']: r for r in metrics.read_jsonl(tmp_path / name / 'metrics.jsonl')}
          for name in ('straight', 'resumed')}
  for step in (3, 4):
    for key in ('train/reward', 'loss', 'partial/decode_steps', 'offpolicy/staleness/1'):
      assert logs['resumed'][step][key] == logs['straight'][step][key], (step, key)
  # Rows carried over an update: tokens one step (or more) stale were trained on.
  stale = sum(logs['straight'][s].get(f'offpolicy/staleness/{k}', 0)
              for s in range(1, 5) for k in range(1, 5))
  assert stale > 0
  # A resume whose pool does not fit the config is refused at start-up, naming the field.
  c = partial_config(steps=5)
  c.rl.slots = 8
  with pytest.raises(ValueError, match=r'rl\.slots=8 \(the pool was sampled with rl\.slots=4\)'):
    train.train(c, str(tmp_path / 'resumed'))
