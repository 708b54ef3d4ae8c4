"""Tests for rlreason.rl.prompt_schedule: HeaPA's frontier pool by hand, and exact resume."""

import itertools
import json

import numpy as np
import pytest

from rlreason.rl import prompt_schedule as ps
from rlreason.tasks import data


def scored_pool(rewards, **kw):
  pool = ps.FrontierPool(capacity=kw.pop('capacity', 100), **kw)
  for i, r in enumerate(rewards):
    pool.add_scored(f'p{i}', r)
  return pool


def rewards_in(pool):
  return sorted(r for r, _, _ in pool.scored)


def test_candidates_are_the_two_prompts_at_the_boundary():
  # algorithms.md §17: rewards {0.1, 0.3, 0.45, 0.55, 0.7, 0.9}, low_fraction 0.5, k = 1.
  # low = {0.1, 0.3, 0.45} (round(0.5 * 6) = 3), high = {0.55, 0.7, 0.9}; the 2k = 2
  # candidates are high's minimum 0.55 and low's maximum 0.45; one is kept, one stays.
  rewards = [0.1, 0.3, 0.45, 0.55, 0.7, 0.9]
  seen = set()
  for seed in range(20):
    pool = scored_pool(rewards, seed=seed)
    assert pool.boundary() == 3
    (item,) = pool.sample(1)
    chosen = rewards[int(item[1:])]
    assert chosen in (0.45, 0.55)
    other = 0.55 if chosen == 0.45 else 0.45
    assert rewards_in(pool) == sorted(set(rewards) - {chosen}) and other in rewards_in(pool)
    seen.add(chosen)
  assert seen == {0.45, 0.55}  # Chosen at random, not always the same side.


def test_k2_takes_four_candidates_alternately_from_the_boundary():
  # 8 prompts, low_fraction 0.25: low = {0.0, 0.1} (round(2) = 2), high = {0.2, ..., 0.7}.
  # Candidates for k = 2, high first: 0.2 (high min), 0.1 (low max), 0.3, 0.0.
  rewards = [0.0, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7]
  for seed in range(10):
    pool = scored_pool(rewards, low_fraction=0.25, seed=seed)
    chosen = {rewards[int(i[1:])] for i in pool.sample(2)}
    assert len(chosen) == 2 and chosen <= {0.0, 0.1, 0.2, 0.3}
    assert rewards_in(pool) == sorted(set(rewards) - chosen)


def test_exhausted_side_yields_to_the_other():
  # 3 prompts, low_fraction 0.2: round(0.6) = 1 low ({0.1}); k = 2 wants 3 candidates = all.
  pool = scored_pool([0.1, 0.5, 0.9], low_fraction=0.2)
  assert pool.boundary() == 1
  assert len(pool.sample(2)) == 2 and len(pool.scored) == 1


def test_easy_medium_takes_half_from_the_easiest():
  # k = 4: 2 from the top of the high side (0.9, 0.8), then 2 of the 4 boundary candidates of
  # what is left {0.0 .. 0.7}: round(0.5 * 8) = 4 low, candidates 0.4, 0.3, 0.5, 0.2.
  rewards = [0.0, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9]
  pool = scored_pool(rewards, mode='easy_medium', seed=3)
  chosen = [rewards[int(i[1:])] for i in pool.sample(4)]
  assert {0.8, 0.9} <= set(chosen)
  assert set(chosen) - {0.8, 0.9} <= {0.2, 0.3, 0.4, 0.5}


def test_cold_prompts_are_served_first_in_order():
  pool = scored_pool([0.2, 0.5, 0.8])
  for name in ('c0', 'c1', 'c2'):
    pool.add_cold(name)
  assert pool.sample(2) == ['c0', 'c1']
  first, second = pool.sample(2)
  assert first == 'c2' and second.startswith('p')  # The last cold one, then one scored.


def test_capacity_and_eviction():
  pool = scored_pool([0.5, 0.2, 0.7, 0.4], capacity=4)
  pool.add_scored('new', 0.6)  # Over capacity: the lowest reward (0.2) leaves.
  assert pool.size() == 4 and rewards_in(pool) == [0.4, 0.5, 0.6, 0.7]
  pool.add_scored('hardest', 0.1)  # Inserted, then itself the lowest: evicted at once.
  assert rewards_in(pool) == [0.4, 0.5, 0.6, 0.7]
  pool.add_cold('cold')  # A cold prompt makes room by evicting the easiest (0.7).
  assert pool.size() == 4 and rewards_in(pool) == [0.4, 0.5, 0.6]
  for i in range(5):
    pool.add_cold(f'c{i}')
    assert pool.size() <= 4
  assert [item for _, item in pool.cold] == ['c1', 'c2', 'c3', 'c4']  # Oldest cold evicted.


def test_served_prompts_return_when_the_pool_runs_low():
  pool = scored_pool([0.1, 0.4, 0.6, 0.9], capacity=4)
  served = pool.sample(2)
  for item in served:
    pool.record(item, 1.0)
  assert pool.size() == 2 and len(pool.trained) == 2
  pool.sample(1)  # 2 >= 1 left: no put-back yet.
  assert len(pool.trained) == 2
  pool.sample(2)  # Only 1 left: the two served prompts come back (reward 1.0) first.
  assert pool.trained == [] and pool.size() == 1


def test_bad_knobs_name_the_field():
  with pytest.raises(ValueError, match='low_fraction'):
    ps.FrontierPool(capacity=4, low_fraction=1.0)
  with pytest.raises(ValueError, match='mode'):
    ps.FrontierPool(capacity=4, mode='hard')
  with pytest.raises(ValueError, match='capacity'):
    ps.FrontierPool(capacity=0)
  with pytest.raises(ValueError, match='below the batch size 4'):
    ps.FrontierSchedule(iter([]), batch_size=4, pool=ps.FrontierPool(capacity=3))


def _schedule(seed=0):
  stream = iter(data.synthetic_stream('arithmetic', seed=seed, difficulty=2))
  return ps.FrontierSchedule(stream, batch_size=3, fresh_per_step=1,
                             pool=ps.FrontierPool(capacity=7, seed=seed))


def _run(schedule, steps, rng):
  batches = []
  for _ in range(steps):
    batch = next(schedule)
    schedule.record(batch, rng.integers(0, 2, size=(len(batch), 4)))
    batches.append([ex.id for ex in batch])
  return batches


def test_schedule_resumes_exactly_from_its_json_state():
  straight = _schedule()
  rng = np.random.default_rng(0)
  first = _run(straight, 4, rng)
  state = json.loads(json.dumps(straight.get_state()))  # What a checkpoint stores.
  rng_state = rng.bit_generator.state
  expected = _run(straight, 6, rng)
  resumed = _schedule()
  resumed.set_state(state)
  rng.bit_generator.state = rng_state
  assert _run(resumed, 6, rng) == expected
  ids = list(itertools.chain(*first, *expected))
  assert len(set(first[0])) == 3 and len(set(ids)) < len(ids)  # Prompts come back.
  assert resumed.pool.size() <= 7


def test_uniform_schedule_keeps_the_stream_state():
  batches = data.batched(data.synthetic_stream('arithmetic', seed=0, difficulty=2), 2)
  it = iter(batches)
  schedule = ps.UniformSchedule(iter(batches))
  next(it), next(schedule)
  schedule.record([], np.zeros((0, 2)))
  assert schedule.get_state() == it.get_state()
  with pytest.raises(ValueError, match='data.schedule'):
    _schedule().set_state(schedule.get_state())
