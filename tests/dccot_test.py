"""DC-CoT (methods/dccot.py, tasks/dccot_demos.py): stage rewards, the demonstration set, a run."""

import types

import numpy as np
import pytest

from rlreason import config as config_lib
from rlreason.methods import dccot
from rlreason.model import tokenizer
from rlreason.rl import sft
from rlreason.rollout import fork_join
from rlreason.tasks import dccot_demos
from rlreason.tasks import parallel_sums

TOK = tokenizer.from_characters(parallel_sums.CHARS)
FMT = fork_join.SpawnFormat.from_tokenizer(TOK, **parallel_sums.THREAD_MARKERS)
EOS = TOK.eos_id


def test_stage_switches_after_stage1_steps():
  assert [dccot.stage(s, stage1_steps=2) for s in (1, 2, 3, 4)] == [1, 1, 2, 2]
  assert dccot.stage(1, stage1_steps=0) == 2  # No accuracy-recovery stage.


def test_combine_hand_computed_terms_sum_to_the_reward():
  c = dccot.Components(answer_E=np.array([1.0, 0.0, 1.0]), format_E=np.array([1.0, 0.0, 1.0]),
                       workers_E=np.array([1.0, 0.5, 0.5]), gain_E=np.array([0.5, 0.6, 0.0]),
                       spawned_E=np.array([True, True, False]))
  w = dict(format_weight=0.2, worker_weight=0.4, path_weight=0.5)
  # Stage 1: answer - 0.2 (1 - format) - 0.4 (1 - workers) = [1, 0 - 0.2 - 0.2, 1 - 0.2].
  r1, t1 = dccot.combine(c, stage_id=1, **w)
  np.testing.assert_allclose(r1, [1.0, -0.4, 0.8])
  np.testing.assert_allclose(t1['path'], 0.0)
  # Stage 2 adds 0.5 * correct * gain = [0.25, 0 (wrong: its 0.6 gain earns nothing), 0].
  r2, t2 = dccot.combine(c, stage_id=2, **w)
  np.testing.assert_allclose(r2, [1.25, -0.4, 0.8])
  np.testing.assert_allclose(t2['path'], [0.25, 0.0, 0.0])
  np.testing.assert_allclose(sum(t2.values()), r2)
  np.testing.assert_allclose(dccot.path_gain_E([5, 10, 0], [10, 10, 0]), [0.5, 0.0, 0.0])


def test_check_episode_spawn_validity_and_worker_correctness():
  want = {'a': '34', 'b': '54'}
  assert dccot.check_episode(['a', 'b'], ['34', '55'], want) == (1.0, 0.5)
  assert dccot.check_episode(['b', 'a'], ['54', '34'], want) == (1.0, 1.0)  # any order
  assert dccot.check_episode(['a'], ['34'], want) == (0.0, 1.0)  # b never spawned
  assert dccot.check_episode(['a', 'a'], ['34', '34'], want) == (0.0, 1.0)  # a twice
  assert dccot.check_episode(['x', 'y'], ['1', '2'], None) == (1.0, 1.0)  # nothing checkable


def _threaded_rollout():
  """Episode 0 spawns a and b: parent '<a,b>' + join '[34,55]' + '+9#' EOS; worker a writes
  '34' EOS (right), worker b '55' EOS (wrong: 5, 5+9 = 54). Episode 1: 'a:34' EOS, no spawn."""
  enc = TOK.encode
  rows = [  # (prefix ids, trained ids, context ids), in column order
      [(enc('<a,b>'), True), (enc('[34,55]'), False), (enc('+9#') + [EOS], True)],
      [(enc('<a,b>a:'), None), (enc('34') + [EOS], True)],
      [(enc('<a,b>b:'), None), (enc('55') + [EOS], True)],
      [(enc('a:34') + [EOS], True)], [], []]
  width = 20
  tokens = np.zeros((6, width), np.int32)
  mask, prefix, loss = (np.zeros((6, width), bool) for _ in range(3))
  for n, segs in enumerate(rows):
    col = 0
    for ids, trained in segs:
      tokens[n, col:col + len(ids)] = ids
      mask[n, col:col + len(ids)] = True
      prefix[n, col:col + len(ids)] = trained is None
      loss[n, col:col + len(ids)] = bool(trained)
      col += len(ids)
  ro = types.SimpleNamespace(tokens_NxL=tokens, mask_NxL=mask, prefix_mask_NxL=prefix,
                             loss_mask_NxL=loss)
  return fork_join.ThreadedRollout(
      rollout=ro, thread_N=np.tile([0, 1, 2], 2), parent_N=np.array([-1, 0, 0, -1, 3, 3]),
      active_N=np.array([True, True, True, True, False, False]),
      spawned_E=np.array([True, False]), final_texts=[], max_workers=2)


def test_components_of_a_hand_built_threaded_rollout():
  ex = parallel_sums.generate(0, 0, difficulty=2, groups=2)
  ex = ex.__class__(**{**ex.__dict__, 'meta': {'groups': [[3, 1], [5, 9]]}})
  decode = lambda ids: TOK.decode(ids, skip_special_tokens=True)
  c = dccot.components(_threaded_rollout(), [ex], np.array([[1.0, 0.0]]), group_size=2,
                       decode=decode, worker_open=FMT.worker_open)
  np.testing.assert_array_equal(c.format_E, [1.0, 1.0])
  np.testing.assert_array_equal(c.workers_E, [0.5, 1.0])
  # Episode 0: parent 5 + 4 trained tokens, workers 3 and 3: path 9 + 3 = 12 of 15.
  np.testing.assert_allclose(c.gain_E, [1 - 12 / 15, 0.0])


def _demo_config(num_demos=64):
  c = config_lib.default()
  c.data.update(task='parallel_sums', difficulty=3, task_options={'groups': 4, 'min_groups': 1})
  c.sft.num_demos = num_demos
  return c


def test_demonstration_set_size_and_spawn_count_distribution():
  demos = sft.demonstration_set(_demo_config())
  assert len(demos) == 64 and len({ex.prompt for ex in demos}) == 64
  counts = dccot_demos.spawn_counts(demos)
  assert set(counts) == {0, 2, 3, 4} and sum(counts.values()) == 64
  assert min(counts.values()) >= 8  # 1-4 groups uniformly: about 16 each.
  assert sft.demonstration_set(_demo_config(0)) == []
  one = next(ex for ex in demos if len(ex.meta['groups']) == 1)
  three = next(ex for ex in demos if len(ex.meta['groups']) == 3)
  rng = np.random.default_rng(0)
  assert dccot_demos.director_teacher(one, rng) == one.solution  # a chain, no spawn block
  rows = [dccot_demos.director_teacher(three, rng) for _ in range(20)]
  assert all(r[0][0].startswith('<a,b,c>') for r in rows)  # every thread sees the spawn block
  assert ['<a,b,c>', True] in [r[0] for r in rows]  # the parent's rows train it
  assert {r[0][0] for r in rows if not r[0][1]} == {'<a,b,c>a:', '<a,b,c>b:', '<a,b,c>c:'}
  # The default (min_groups 0) draws the same problems as before the option existed.
  from rlreason.tasks import example as example_lib
  before = example_lib.example_rng('parallel_sums', 0, 3, 4 * 16 + 3).integers(
      0, 10, size=(3, 4)).tolist()
  assert parallel_sums.generate(0, 3, difficulty=4, groups=3).meta['groups'] == before


def test_config_checks_name_the_dccot_fields():
  from experiments import dccot as dccot_config
  c = dccot_config.get_config('runlocal')
  config_lib.validate(c, num_devices=8)
  c.threads.enabled = False
  c.dccot.path_weight = -1.0
  c.dccot.stage1_steps = -2
  c.sft.num_demos = -1
  with pytest.raises(ValueError) as e:
    config_lib.validate(c, num_devices=8)
  for text in ('set threads.enabled', 'dccot.path_weight=-1.0', 'dccot.stage1_steps=-2',
               'sft.num_demos=-1'):
    assert text in str(e.value)
  c = dccot_config.get_config('runlocal')
  c.threads.max_workers = 1
  with pytest.raises(ValueError, match='groups=2 exceeds threads.max_workers=1'):
    config_lib.validate(c, num_devices=8)


def test_runlocal_two_steps_cross_the_stage_boundary(tmp_path, monkeypatch):
  from experiments import dccot as dccot_config
  from rlreason.rl import train
  c = dccot_config.get_config('runlocal')
  assert (c.rl.steps, c.dccot.stage1_steps) == (2, 1)
  seen, inner = [], dccot.stage_rewards

  def spy(run, out, examples, verifier_BxG, *, step, fmt):
    rewards_BxG, m = inner(run, out, examples, verifier_BxG, step=step, fmt=fmt)
    seen.append((step, m, np.asarray(verifier_BxG), rewards_BxG, out))
    return rewards_BxG, m

  monkeypatch.setattr(dccot, 'stage_rewards', spy)
  c.eval.every = 0  # The loop's (forked) evaluation is threaded_eval_test's and train_test's.
  train.train(c, str(tmp_path))
  assert [(s, m['dccot/stage']) for s, m, *_ in seen] == [(1, 1.0), (2, 2.0)]
  (_, m1, v1, r1, _), (_, m2, v2, r2, out2) = seen
  np.testing.assert_allclose(r1, v1)  # Stage 1, weights 0: correctness only.
  np.testing.assert_allclose(m1['dccot/term_path'], 0.0)
  tokens_N = np.asarray(out2.rollout.loss_mask_NxL).sum(axis=1)
  gain_E = dccot.path_gain_E(fork_join.longest_path_E(tokens_N, out2.parent_N),
                             fork_join.total_tokens_E(tokens_N, out2.parent_N))
  want = v2.reshape(-1) + 0.5 * (v2.reshape(-1) >= 1.0) * gain_E
  np.testing.assert_allclose(r2.reshape(-1), want, rtol=1e-6)
  np.testing.assert_allclose(m2['dccot/term_path'], np.mean(want - v2.reshape(-1)), atol=1e-6)
