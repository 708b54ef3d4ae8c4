"""Partial rollouts: carried rows continue where they stopped (the continuous path's tokens
when the params do not change), carry their sampling versions across an update, groups stay
whole; the train loop resumes bit-exactly with rows in flight; config errors name fields."""

import functools
import os

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rlreason import config as config_lib
from rlreason.methods import partial_rollouts
from rlreason.model import transformer
from rlreason.rl import memory
from rlreason.rl import metrics
from rlreason.rl import train
from rlreason.rollout import continuous
from rlreason.rollout import partial
from rlreason.rollout import sampler
from rlreason.rollout import sampling
from tests import train_test

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


@pytest.fixture(scope='module')
def same(params):
  return run_steps(lambda s: params, 4)


@pytest.fixture(scope='module')
def updated(params):  # Step 0 samples with version 0, step 1 with the negated params.
  other = jax.tree.map(lambda x: -x, params)
  return run_steps(lambda s: params if s == 0 else other, 2)


def batch(i):
  prompts = sampler.prepare_prompts(PROMPTS[i], buckets=(6,))
  rng = jax.random.key(100 + i)
  return prompts, jax.random.key_data(sampling.row_keys(rng, jnp.arange(B * G))), rng


def run_steps(params_by_step, steps, **extra):
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
        version=s, **KW, **extra)
    picked = [int(i) for i in groups_B]
    released = [ids[i] for i in picked]
    ids = [x for i, x in enumerate(ids) if i not in picked]
    out.append((released, jax.device_get(rollout), jax.device_get(stats), jax.device_get(pool),
                ids))
  return out


def test_with_unchanged_params_carried_rows_sample_what_continuous_batching_does(params, same):
  steps = same
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


def test_carried_tokens_keep_the_version_that_sampled_them(same, updated):
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


def _teacher_forced(params, rollout):
  tokens, mask = sampler.sequences(rollout)
  return np.asarray(_teacher_forced_lp(params, tokens, mask, rollout.tokens_NxL,
                                       rollout.mask_NxL, p=rollout.prompts.tokens_BxP.shape[1]))


@functools.partial(jax.jit, static_argnames='p')  # One compilation (op by op: one per primitive).
def _teacher_forced_lp(params, tokens, mask, sampled_NxL, mask_NxL, *, p):
  logits = transformer.apply(params, tokens, cfg=CFG, mask_NxT=mask)[0] / 1.2
  lp = jnp.take_along_axis(jax.nn.log_softmax(logits[:, p - 1:-1], -1),
                           sampled_NxL[..., None], -1)[..., 0]
  return jnp.where(mask_NxL, lp, 0.0)


def test_recompute_continues_carried_rows_under_the_new_params_alone(params, same, updated):
  other = jax.tree.map(lambda x: -x, params)
  np.testing.assert_array_equal(run_steps(lambda s: params, 2, recompute=True)[1][1].tokens_NxL,
                                same[1][1].tokens_NxL)  # Unchanged params: nothing changes.
  checked = {}
  for recompute in (False, True):
    steps = updated if not recompute else run_steps(
        lambda s: params if s == 0 else other, 2, recompute=True)
    _, _, _, pool, carried_ids = steps[0]
    released, rollout, _, _, _ = steps[1]
    new_lp = _teacher_forced(other, rollout)  # Every token's log-prob under the new params.
    gaps = []
    for slot in np.flatnonzero(pool['live_S'] & (pool['j_S'] > 0)):
      row, j0 = int(pool['row_S'][slot]), int(pool['j_S'][slot])
      if carried_ids[row // G] not in released:
        continue
      n = released.index(carried_ids[row // G]) * G + row % G
      length = int(rollout.lengths_N[n])
      first_new = j0 if recompute else j0 + 1  # Recomputed: token j0 from the new logits too.
      np.testing.assert_array_equal(rollout.version_NxL[n, :length],
                                    np.where(np.arange(length) < first_new, 0, 1))
      gaps.append(np.abs(rollout.logprobs_NxL[n, first_new:length]
                         - new_lp[n, first_new:length]))
    checked[recompute] = np.concatenate(gaps)
  # With the cache prefilled again, the carried rows' new tokens are the new params' exactly;
  # on the kept old cache they are not.
  assert checked[True].size and checked[True].max() < 1e-4
  assert checked[False].size and checked[False].max() > 1e-2


def test_groups_are_released_whole_and_every_group_once(same):
  steps = same
  seen = [x for released, *_ in steps for x in released]
  assert len(seen) == len(set(seen)) == 4 * B
  for released, rollout, stats, pool, ids in steps:
    assert (np.asarray(rollout.lengths_N) > 0).all()  # Every member of a released group ran,
    last = np.asarray(stats.finished_N).reshape(B, G).max(axis=1)  # and finished by then.
    np.testing.assert_array_equal(stats.released_B, last)
    live_rows = np.asarray(pool['row_S'])[np.asarray(pool['live_S'])]
    assert (live_rows < B * G).all()  # Only carried groups (the first B) hold slots,
    assert int(pool['next_b']) <= B  # and the queue continues behind them.


def partial_config(steps=2):
  c = train_test.tiny_config(steps=steps)
  c.sft.steps, c.eval.every = 0, 0
  c.rl.update(sampler='continuous', slots=4, partial_rollouts=True)
  return c


def test_resume_with_rows_in_flight_is_bit_exact(tmp_path):
  straight, _ = train.train(partial_config(), str(tmp_path / 'straight'))
  train_test.train_preempted_at(1, partial_config(), str(tmp_path / 'resumed'))
  saved = tmp_path / 'resumed' / 'partial_rollouts' / 'checkpoints'
  assert '1' in os.listdir(saved)  # Step 1 left rows in flight (its pool holds 2B groups).
  resumed, _ = train.train(partial_config(), str(tmp_path / 'resumed'))
  chex.assert_trees_all_equal(jax.device_get(resumed.params), jax.device_get(straight.params))
  chex.assert_trees_all_equal(jax.device_get(resumed.opt_state),
                              jax.device_get(straight.opt_state))
  logs = {name: {r['step']: r for r in metrics.read_jsonl(tmp_path / name / 'metrics.jsonl')}
          for name in ('straight', 'resumed')}
  for key in ('train/reward', 'loss', 'partial/decode_steps', 'offpolicy/staleness/1'):
    assert logs['resumed'][2][key] == logs['straight'][2][key], key
  # Rows carried over an update: tokens one step (or more) stale were trained on.
  stale = sum(logs['straight'][s].get(f'offpolicy/staleness/{k}', 0)
              for s in (1, 2) for k in range(1, 5))
  assert stale > 0
  # A resume whose pool does not fit the config is refused at start-up, naming the field.
  c = partial_config(steps=3)
  c.rl.slots = 8
  with pytest.raises(ValueError, match=r'rl\.slots=8 \(the pool was sampled with rl\.slots=4\)'):
    train.train(c, str(tmp_path / 'resumed'))


def _config(**rl):
  c = config_lib.default()
  c.rl.prompts_per_step, c.rl.group_size, c.rl.max_new_tokens = 4, 2, 8
  c.data.prompt_buckets = (6,)
  c.model.arch.vocab_size = 64
  c.rl.update(sampler='continuous', slots=4, partial_rollouts=True)
  c.rl.update(rl)
  return c


@pytest.mark.parametrize('overrides, match', [
    (dict(sampler='static'), r"rl.partial_rollouts .* set rl.sampler='continuous'"),
    (dict(dynamic_sampling=True), r'rl.dynamic_sampling is not supported'),
    (dict(sample_memory_gb=-1.0), r'rl.sample_memory_gb=-1.0 must be a number >= 0'),
    (dict(sampler='static', partial_rollouts=False, sample_memory_gb=1.0),
     r"rl.sample_memory_gb=1.0 bounds the continuous sampler's slots"),
])
def test_config_errors_name_the_field(overrides, match):
  with pytest.raises(ValueError, match=match):
    config_lib.validate(_config(**overrides), num_devices=1)
  c = _config()
  c.hapo.enabled = True
  with pytest.raises(ValueError, match='hapo.enabled is not supported'):
    config_lib.validate(c, num_devices=1)


def test_more_slots_than_the_memory_budget_allows_names_rl_slots():
  # The pool holds 2B groups: rows 2 x 4 x 2 = 16; prompts of the largest bucket (6).
  kw = dict(rows=16, group_size=2, prompt_len=6, max_new_tokens=8, prefix_len=0,
            sample_dtype=None)
  fits = continuous.memory_estimate(CFG, slots=4, **kw)['total']
  memory.check_sample_memory(_config(sample_memory_gb=fits / 2**30), CFG)
  memory.check_sample_memory(_config(sample_memory_gb=0.0), CFG)  # 0: no check.
  with pytest.raises(ValueError, match=r'rl.slots=4: .*rl.sample_memory_gb=.*at most 2 slots'):
    memory.check_sample_memory(_config(sample_memory_gb=(fits - 1) / 2**30), CFG)


def test_staleness_by_length_hand_case():
  # Learner version 5. Row 0: fresh (length 2); row 1: its first token by version 4 (3);
  # row 2: by 3, two steps stale (4); row 3: a teacher token (-1) is not sampled: fresh (2).
  v = [[5, 5, 0, 0], [4, 5, 5, 0], [3, 4, 5, 5], [-1, 5, 0, 0]]
  lengths = np.array([2, 3, 4, 2])
  rollout = type('Rollout', (), dict(  # The fields it reads.
      version_NxL=np.array(v), lengths_N=lengths,
      mask_NxL=np.arange(4)[None, :] < lengths[:, None]))
  got = partial_rollouts.staleness_by_length(rollout, learner_version=5)
  assert got == {'partial/rows_by_staleness/0': 2, 'partial/length_by_staleness/0': 2.0,
                 'partial/rows_by_staleness/1': 1, 'partial/length_by_staleness/1': 3.0,
                 'partial/rows_by_staleness/2': 1, 'partial/length_by_staleness/2': 4.0}
  # Staleness 3 and more share the last bucket; an empty bucket has length 0.
  got = partial_rollouts.staleness_by_length(rollout, learner_version=7, buckets=2)
  assert got == {'partial/rows_by_staleness/0': 0, 'partial/length_by_staleness/0': 0.0,
                 'partial/rows_by_staleness/1': 4, 'partial/length_by_staleness/1': 2.75}
