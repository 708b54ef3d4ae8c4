"""methods/monitors.py: each monitor on a hand case, the trend alarm, the config checks, and a
scripted hacked run that the loop stops, checkpoint saved."""

import importlib
import io
import json
import types

import numpy as np
import pytest

from rlreason import config as config_lib
from rlreason.config_checks import monitoring
from rlreason.methods import monitors
from rlreason.rl import metrics as metrics_lib
from rlreason.rl import train


def test_names_agree_with_the_config_checks():
  assert monitors.MONITORS == monitoring.MONITORS
  assert monitors.STOP_POLICIES == monitoring.STOP_POLICIES


def test_pearson_agreement_template_and_consistency_by_hand():
  # Reward 1 on the two short rows, 0 on the two long: perfectly anti-correlated with length.
  assert monitors.pearson([1, 1, 0, 0], [10, 12, 20, 22]) == pytest.approx(-0.98058, abs=1e-5)
  assert monitors.pearson([1, 1, 1], [1, 2, 3]) == 0.0  # constant reward: no evidence
  # Reward verdicts (> 0.5): T T F F; verifier's: T F F T -> rows 0 and 2 agree.
  assert monitors.agreement([0.9, 0.7, 0.2, 0.1], [1, 0, 0, 1]) == 0.5
  assert monitors.agreement([0.9, 0.7], [1, 0], reward_threshold=0.8) == 1.0
  # 2 of 4 texts carry the template; their mean reward 1.0, the others' 0.25: lift 0.75.
  frac, lift = monitors.template_stats(['<ok> 1', 'x', '<ok>', 'y'], [1, 0.5, 1, 0], ('<ok>',))
  assert (frac, lift) == (0.5, 0.75)
  assert monitors.template_stats(['a', 'b'], [1, 0], ('<ok>',)) == (0.0, 0.0)
  # |diff| = 0, 0.05, 0.5: two within 0.1; mean 0.55 / 3.
  agree, diff = monitors.self_consistency([1, 0.5, 0], [1, 0.45, 0.5], tol=0.1)
  assert agree == pytest.approx(2 / 3) and diff == pytest.approx(0.55 / 3)


def test_step_metrics_by_hand():
  out = monitors.step_metrics(
      rewards_N=[0.9, 0.9, 0.1, 0.9], verifier_N=[1, 0, 0, 0], lengths_N=[5, 5, 9, 5],
      texts=['a', 'b', 'c', 'DONE d'], audit_idx=np.array([1, 3]), audit_N=np.array([0.0, 0.0]),
      template_tokens=('DONE',), judge_pair=([1.0, 0.0], [1.0, 1.0]), judge_tol=0.1)
  # The audited rows' training reward (0.9 + 0.9) / 2 = 0.9, their audit 0: gap 0.9.
  assert out['monitors/audit_reward'] == pytest.approx(0.9)
  assert out['monitors/audit'] == 0.0 and out['monitors/audit_gap'] == pytest.approx(0.9)
  # Verdicts T T F T vs verifier T F F F: rows 1 and 3 disagree.
  assert out['monitors/disagreement'] == 0.5
  # Reward is an affine, decreasing function of length here (5 -> 0.9, 9 -> 0.1): -1.
  assert out['monitors/length_corr'] == pytest.approx(-1.0)
  assert out['monitors/length_mean'] == 6.0
  assert out['monitors/template_frac'] == 0.25
  assert out['monitors/template_lift'] == pytest.approx(0.9 - 1.9 / 3)
  assert out['monitors/judge_agreement'] == 0.5 and out['monitors/judge_abs_diff'] == 0.5
  only = monitors.step_metrics(rewards_N=[1.0], verifier_N=[1.0], lengths_N=[3], which=('length',))
  assert set(only) == {'monitors/length_corr', 'monitors/length_mean'}


def test_audit_rows_are_distinct_and_fixed_by_seed_and_step():
  rows = monitors.audit_rows(100, 10, seed=0, step=3)
  assert len(set(rows)) == 10 and list(rows) == sorted(rows)
  np.testing.assert_array_equal(rows, monitors.audit_rows(100, 10, seed=0, step=3))
  assert list(rows) != list(monitors.audit_rows(100, 10, seed=0, step=4))
  np.testing.assert_array_equal(monitors.audit_rows(4, 10, seed=0, step=0), np.arange(4))


def test_slope_and_the_trend_alarm():
  assert monitors.slope([0.0, 0.1, 0.2, 0.3]) == pytest.approx(0.1)
  assert monitors.slope([1.0]) == 0.0
  tracker = monitors.Tracker(window=3, min_reward_rise=0.1, max_audit_rise=0.02, patience=2)
  fired = []
  # Reward 0.4, 0.5, ...; audit 0.8 falling by 0.1 a step. The window is full at step 3 (the
  # condition holds: rise 0.2 >= 0.1, audit -0.2 <= 0.02), fires at step 4 (patience 2).
  for step in range(1, 6):
    fired.append(tracker.update(step, {'train/reward': 0.3 + 0.1 * step,
                                       'monitors/audit': 0.9 - 0.1 * step}))
  assert [len(a) for a in fired] == [0, 0, 0, 1, 1]
  assert fired[3][0].name == 'reward_up_audit_flat' and fired[3][0].step == 4
  assert 'rose +0.200 over 3 steps' in fired[3][0].message
  trends = tracker.trend_metrics()
  assert trends['monitors/reward_trend'] == pytest.approx(0.2)
  assert trends['monitors/audit_trend'] == pytest.approx(-0.2)
  # The audit rising with the reward (an honest verifier reward): no alarm.
  honest = monitors.Tracker(window=3, patience=1)
  assert not any(honest.update(s, {'train/reward': 0.1 * s, 'monitors/audit': 0.1 * s})
                 for s in range(1, 8))


def test_level_alarms_need_their_threshold_and_patience():
  tracker = monitors.Tracker(window=2, max_disagreement=0.3, max_length_corr=0.5,
                             min_judge_agreement=0.9, patience=2)
  bad = {'monitors/disagreement': 0.4, 'monitors/length_corr': -0.6,
         'monitors/judge_agreement': 0.5, 'monitors/template_lift': 5.0}  # lift: off (0)
  assert tracker.update(1, bad) == []
  names = sorted(a.name for a in tracker.update(2, bad))
  assert names == ['disagreement', 'judge_inconsistent', 'length_exploit']
  assert tracker.update(3, {'monitors/disagreement': 0.1}) == []  # streaks reset
  assert tracker.update(4, bad) == []


def test_batch_metrics_audits_with_a_second_verifier_and_rejudges_a_sample():
  c = config_lib.default()
  c.monitors.update(enabled=True, audit_size=2, audit_verifier='exact', judge_sample=2)
  c.rl.steps = 10
  calls = []

  class Pool:
    def score(self, items, *, verifier, deadline_s):
      calls.append((verifier, len(items)))
      return [types.SimpleNamespace(reward=0.0) for _ in items]

  class Judge:
    def score(self, problems, texts, *, params):
      calls.append(('judge', tuple(texts)))
      return types.SimpleNamespace(rewards_N=np.array([1.0, 1.0], np.float32),
                                   label_probs_Mx3=np.array([[0.1, 0.1, 0.8]]))

  run = types.SimpleNamespace(config=c, pool=Pool(), judge=Judge())
  examples = [types.SimpleNamespace(prompt='p0'), types.SimpleNamespace(prompt='p1')]
  out = monitors.batch_metrics(
      run, texts=['a', 'b', 'c', 'd'], items=list('ABCD'), examples=examples,
      rewards_BxG=np.array([[1.0, 1.0], [1.0, 0.0]]), verifier_BxG=np.ones((2, 2)),
      lengths_N=np.array([1, 2, 3, 4]), judge_N=np.array([1.0, 1.0, 0.0, 0.0]), progress=0.3)
  assert calls[0] == ('exact', 2) and calls[1][0] == 'judge'
  assert out['monitors/audit'] == 0.0  # the audit verifier's, not the run's own (all 1)
  picked = [list('abcd').index(t) for t in calls[1][1]]
  # The judge's first scores of the picked rows vs its second (all 1).
  assert out['monitors/judge_agreement'] == np.mean([[1.0, 1.0, 0.0, 0.0][i] == 1.0
                                                     for i in picked])
  assert out['monitors/judge_confidence'] == pytest.approx(0.8)


def test_bad_monitor_config_names_the_field():
  c = importlib.import_module('experiments.demo').get_config('runlocal')
  c.monitors.update(which=('audit', 'vibes'), stop='halt', window=1)
  with pytest.raises(ValueError) as e:
    config_lib.validate(c, num_devices=8)
  for field in ("monitors.which has ['vibes']", 'monitors.stop', 'monitors.window'):
    assert field in str(e.value)
  c.monitors.update(which=('audit',), stop='', window=2, audit_verifier='no_such_verifier')
  with pytest.raises(ValueError, match='monitors.audit_verifier'):
    config_lib.validate(c, num_devices=8)


def test_warn_prints_and_does_not_stop():
  c = config_lib.default()
  c.monitors.update(enabled=True, stop='warn')
  stream = io.StringIO()
  writer = types.SimpleNamespace(note=lambda text: stream.write(text + '\n'))
  tracker = monitors.Tracker(window=2, max_disagreement=0.1, patience=1)
  metrics = {'monitors/disagreement': 0.5}
  stop = monitors.watch(c.monitors, tracker, 7, metrics, writer)
  assert stop == [] and metrics['monitors/alarms'] == 1
  assert 'step 7 | monitor alarm disagreement' in stream.getvalue()


def test_a_scripted_hacked_run_stops_with_its_checkpoint_saved(tmp_path, monkeypatch):
  """The demo (runlocal) with real RL steps whose logged reward is scripted to rise while the
  audit stays flat: the loop stops at the step the alarm fires, after saving it."""
  c = importlib.import_module('experiments.demo').get_config('runlocal')
  c.rl.steps, c.log_every = 8, 1
  c.monitors.update(enabled=True, window=2, patience=2, stop='stop', audit_size=4,
                    perplexity=True)
  real_step = train.rl_step

  def hacked(run, state, step, *args):
    state, metrics = real_step(run, state, step, *args)
    assert 0.0 <= metrics['monitors/audit'] <= 1.0  # computed from the real batch
    metrics['train/reward'] = 0.2 * step  # rising
    metrics['monitors/audit'] = 0.1  # flat
    return state, metrics

  stream = io.StringIO()

  class Captured(metrics_lib.Writer):
    def __init__(self, *args, **kwargs):
      super().__init__(*args, **{**kwargs, 'stream': stream})

  monkeypatch.setattr(train, 'rl_step', hacked)
  monkeypatch.setattr(metrics_lib, 'Writer', Captured)
  train.train(c, str(tmp_path))
  out = stream.getvalue()
  stop = json.loads((tmp_path / 'monitor_stop.json').read_text())
  # Window full at step 2, patience 2: stops at step 3 of 8.
  assert stop['step'] == 3 and stop['alarms'][0]['name'] == 'reward_up_audit_flat'
  assert 'RewardHackingStop at step 3' in out and 'monitor alarm reward_up_audit_flat' in out
  assert 'audit 0.1' in out  # the progress line shows the audit
  rows = metrics_lib.read_jsonl(tmp_path / 'metrics.jsonl')
  assert max(r['step'] for r in rows) == 3
  assert [r['monitors/alarms'] for r in rows if r['step'] >= 1] == [0, 0, 1]
  assert all(r['perplexity/answer'] >= 1 and r['perplexity/prompt'] >= 1
             for r in rows if r['step'] >= 1)  # monitors.perplexity's training-time split
  from rlreason.rl import checkpoint
  assert checkpoint.Checkpointer(tmp_path, keep=3).steps()[-1] == 3  # saved before stopping


def test_a_real_fp32_judge_agrees_with_itself_in_another_batch_order():
  """The random-tiny judge (rollout/judge.py) scores the sample a second time in reverse order:
  an fp32 judge reads label probabilities, so the two scorings agree."""
  from rlreason.rollout import judge as judge_lib
  c = config_lib.default()
  c.monitors.update(enabled=True, which=('judge',), judge_sample=4)  # every row re-scored
  c.judge.update(model='random-tiny', batch_size=2, prompt_buckets=(64, 128), score='expected')
  j, _ = judge_lib.from_config(c.judge, policy_cfg=None, policy_tok=None)
  texts = ['1+1=2\nso 2', '3', 'a\nb\nc', 'x = 4']
  scored = j.score(['p'] * 4, texts)
  first = scored.rewards_N
  run = types.SimpleNamespace(config=c, pool=None, judge=j)
  examples = [types.SimpleNamespace(prompt='p')] * 2
  out = monitors.batch_metrics(run, texts=texts, items=[None] * 4, examples=examples,
                               rewards_BxG=np.zeros((2, 2)), verifier_BxG=np.zeros((2, 2)),
                               lengths_N=np.ones(4), judge_N=first)
  assert out['monitors/judge_agreement'] == 1.0
  assert out['monitors/judge_abs_diff'] < 1e-5
  # The mean top-label probability over every judged step (the sample is all 4 rows).
  assert out['monitors/judge_confidence'] == pytest.approx(
      float(np.asarray(scored.label_probs_Mx3).max(-1).mean()), abs=1e-5)
