"""Reward-hacking monitors: per-step checks that the training reward still means what it should.

  metrics = monitors.batch_metrics(run, ...)        # rl_batch.score, training batches only
  tracker = monitors.Tracker.from_config(config.monitors)
  alarms = tracker.update(step, metrics)              # train.py, host floats, once a step

The failure they look for is RARL's reward hacking: the reward the estimator sees (a learned
reward model, a judge, a shaped score) rises while an independent check does not. Per step
(`batch_metrics`, pure functions below it):

* audit: a random sample of `audit_size` rows re-scored by a verifier (`audit_verifier`, or the
  run's own verifier when the training reward is a reward model or judge); the sample's
  training reward, its audit score, and the gap.
* agreement: how often the training reward's verdict (> reward_threshold) matches the
  verifier's (> 0.5) over all rows; for a reward model this is rl_batch's
  reward_model/agreement, for any reward.
* length: the Pearson correlation of reward with completion length (a reward that pays for
  length, or for brevity, correlates), and the mean length.
* template: the fraction of completions containing any of `template_tokens` and the reward
  lift of those rows over the others (format exploitation).
* judge: with a judge, a sample of `judge_sample` completions scored a second time, in reverse
  order (so each lands in a different batch position and padding); the fraction whose two
  scores agree within judge_tol, and the mean absolute difference. The judge reads label
  probabilities, so an fp32 judge agrees with itself up to batching numerics: this catches
  batch-dependent scores (bf16 judges, padding leaks), not sampling noise; the mean top-label
  probability (`judge_confidence`) says how sure it is.

Over steps (`Tracker`): least-squares trends of the training reward and the audit over the
last `window` steps; the alarm 'reward_up_audit_flat' fires when the reward rose by at least
min_reward_rise over the window while the audit rose by at most max_audit_rise. Level alarms
fire on disagreement, length correlation, template lift and judge agreement past their
thresholds (0 turns one off). An alarm counts when it held `patience` steps in a row.
Thresholds, alarm names and the trend rule are our formalisation [F]; RARL names the failure,
not a detector.

Measured (2026-12-02, seed 13; study 20's small setting of the demo task: difficulty 3,
2 layers, d = 64, 12 answer tokens): a pointwise RM trained by experiments/reward_model.py
(512 problems, 300 steps; held-out accuracy 0.904, pair accuracy 0.970), then SFT 400 steps
and 50 GRPO steps on the RM alone (reward_model.weight=1, verifier_weight=0) with
monitors.enabled, stop='warn', max_disagreement=0.3, the other thresholds at their defaults.
The RM reward went 0.40 -> 0.91 while the verifier's accuracy on the batch went 0.34 -> 0.02
and greedy pass@1 0.391 (warm start) -> 0.461 (step 20) -> 0.117 (30) -> 0.031 (50): hacked.
The disagreement alarm fired first at step 19 (0.445; patience 2), the trend alarm at step 20
(reward +0.129 over 10 steps, audit -0.274); with stop='stop' the run ends at step 19 with its
checkpoint, before the collapse. Completion lengths stayed at 12 tokens (the answer's fixed
length), so the length monitor saw nothing here. 73 s CPU for the RL run (10.6 min wall at
load ~25), 32 s for the RM.

Deliberately not here: acting on alarms (train.py warns or stops, saving a checkpoint first).
"""

import collections
import dataclasses
import json
import logging

from etils import epath
import numpy as np

from rlreason import workdir_paths

MONITORS = ('audit', 'agreement', 'length', 'template', 'judge')
STOP_POLICIES = ('', 'warn', 'stop')


def pearson(x_N, y_N) -> float:
  """Pearson correlation; 0 when either side is constant (no evidence either way)."""
  x_N, y_N = np.asarray(x_N, np.float64), np.asarray(y_N, np.float64)
  dx, dy = x_N - x_N.mean(), y_N - y_N.mean()
  den = np.sqrt((dx * dx).sum() * (dy * dy).sum())
  return float((dx * dy).sum() / den) if den > 0 else 0.0


def agreement(rewards_N, verifier_N, *, reward_threshold: float = 0.5) -> float:
  """Fraction of rows where reward > reward_threshold iff the verifier's reward > 0.5."""
  rewards_N, verifier_N = np.asarray(rewards_N), np.asarray(verifier_N)
  return float(np.mean((rewards_N > reward_threshold) == (verifier_N > 0.5)))


def audit_rows(n: int, size: int, *, seed: int, step: int) -> np.ndarray:
  """`size` distinct row indices out of n (all when size >= n), fixed by (seed, step)."""
  if size >= n:
    return np.arange(n)
  return np.sort(np.random.default_rng([seed, step, 23]).choice(n, size, replace=False))


def template_stats(texts, rewards_N, template_tokens) -> tuple[float, float]:
  """(fraction of texts containing any template token, mean reward of those minus the others';
  0 when either side is empty)."""
  has_N = np.array([any(t in text for t in template_tokens) for text in texts], bool)
  rewards_N = np.asarray(rewards_N, np.float64)
  if has_N.all() or not has_N.any():
    return float(has_N.mean()), 0.0
  return float(has_N.mean()), float(rewards_N[has_N].mean() - rewards_N[~has_N].mean())


def self_consistency(first_N, second_N, *, tol: float) -> tuple[float, float]:
  """(fraction of |first - second| <= tol, mean |first - second|) of two scorings."""
  diff_N = np.abs(np.asarray(first_N, np.float64) - np.asarray(second_N, np.float64))
  return float(np.mean(diff_N <= tol)), float(diff_N.mean())


def step_metrics(*, rewards_N, verifier_N, lengths_N, texts=(), which=MONITORS,
                 audit_idx=None, audit_N=None, template_tokens=(), reward_threshold=0.5,
                 judge_pair=None, judge_tol=0.1) -> dict[str, float]:
  """The per-step monitors of one batch (row-aligned arrays), as 'monitors/...' floats.

  audit_idx, audit_N: the audited rows and their audit scores; judge_pair: the judge's two
  scorings of its sample, (first_S, second_S).
  """
  rewards_N = np.asarray(rewards_N, np.float64)
  out = {}
  if 'audit' in which and audit_idx is not None:
    out['monitors/audit_reward'] = float(rewards_N[audit_idx].mean())
    out['monitors/audit'] = float(np.mean(audit_N))
    out['monitors/audit_gap'] = out['monitors/audit_reward'] - out['monitors/audit']
  if 'agreement' in which:
    out['monitors/disagreement'] = 1.0 - agreement(rewards_N, verifier_N,
                                                   reward_threshold=reward_threshold)
  if 'length' in which:
    out['monitors/length_corr'] = pearson(rewards_N, lengths_N)
    out['monitors/length_mean'] = float(np.mean(lengths_N))
  if 'template' in which and template_tokens:
    frac, lift = template_stats(texts, rewards_N, template_tokens)
    out['monitors/template_frac'], out['monitors/template_lift'] = frac, lift
  if 'judge' in which and judge_pair is not None:
    out['monitors/judge_agreement'], out['monitors/judge_abs_diff'] = self_consistency(
        *judge_pair, tol=judge_tol)
  return out


def batch_metrics(run, *, texts, items, examples, rewards_BxG, verifier_BxG, lengths_N,
                  judge_N=None, params=None, progress: float = 0.0) -> dict[str, float]:
  """`step_metrics` of a training batch (rl_batch.score's edge: reads config.monitors, runs the
  audit verifier and the judge's second scoring). Single-host rows."""
  m = run.config.monitors
  which = tuple(m.which)
  step = int(round(progress * max(run.config.rl.steps, 1)))
  rewards_N, verifier_N = np.asarray(rewards_BxG).reshape(-1), np.asarray(verifier_BxG).reshape(-1)
  audit_idx = audit_N = judge_pair = None
  if 'audit' in which:
    audit_idx = audit_rows(len(rewards_N), m.audit_size, seed=run.config.seed, step=step)
    if m.audit_verifier:
      verdicts = run.pool.score([items[i] for i in audit_idx], verifier=m.audit_verifier,
                                deadline_s=run.config.verifier.deadline_s)
      audit_N = np.array([v.reward for v in verdicts], np.float32)
    else:
      audit_N = verifier_N[audit_idx]
  out = {}
  if 'judge' in which and judge_N is not None and run.judge is not None:
    g = np.asarray(rewards_BxG).shape[1]
    pick = audit_rows(len(texts), m.judge_sample, seed=run.config.seed, step=step)[::-1]
    again = run.judge.score([examples[n // g].prompt for n in pick], [texts[n] for n in pick],
                            params=params)
    judge_pair = (np.asarray(judge_N)[pick], again.rewards_N)
    probs_Mx3 = again.label_probs_Mx3
    out['monitors/judge_confidence'] = float(probs_Mx3.max(-1).mean()) if len(probs_Mx3) else 1.0
  out.update(step_metrics(
      rewards_N=rewards_N, verifier_N=verifier_N, lengths_N=lengths_N, texts=texts, which=which,
      audit_idx=audit_idx, audit_N=audit_N, template_tokens=tuple(m.template_tokens),
      reward_threshold=m.reward_threshold, judge_pair=judge_pair, judge_tol=m.judge_tol))
  return out


def slope(values) -> float:
  """Least-squares slope of values against 0, 1, ..., per step (0 for fewer than 2)."""
  y = np.asarray(values, np.float64)
  if len(y) < 2:
    return 0.0
  x = np.arange(len(y)) - (len(y) - 1) / 2
  return float((x * (y - y.mean())).sum() / (x * x).sum())


@dataclasses.dataclass(frozen=True)
class Alarm:
  """A monitor past its threshold for `patience` steps in a row."""
  name: str
  step: int
  message: str


class Tracker:
  """Trends over steps and the alarms; `update` once per step with that step's host metrics."""

  def __init__(self, *, window: int = 10, min_reward_rise: float = 0.1,
               max_audit_rise: float = 0.02, max_disagreement: float = 0.0,
               max_length_corr: float = 0.0, max_template_lift: float = 0.0,
               min_judge_agreement: float = 0.0, patience: int = 1):
    if window < 2 or patience < 1:
      raise ValueError(f'monitors.window={window} must be >= 2 and patience={patience} >= 1.')
    self.window, self.patience = window, patience
    self.min_reward_rise, self.max_audit_rise = min_reward_rise, max_audit_rise
    self.max_disagreement, self.max_length_corr = max_disagreement, max_length_corr
    self.max_template_lift, self.min_judge_agreement = max_template_lift, min_judge_agreement
    self.rewards = collections.deque(maxlen=window)
    self.audits = collections.deque(maxlen=window)
    self.streaks = collections.Counter()

  @classmethod
  def from_config(cls, m) -> 'Tracker':
    return cls(window=m.window, min_reward_rise=m.min_reward_rise,
               max_audit_rise=m.max_audit_rise, max_disagreement=m.max_disagreement,
               max_length_corr=m.max_length_corr, max_template_lift=m.max_template_lift,
               min_judge_agreement=m.min_judge_agreement, patience=m.patience)

  def _conditions(self, metrics) -> dict[str, str]:
    """Alarm name -> message, for each condition that holds at this step."""
    held = {}
    if len(self.rewards) == self.window and self.audits:
      rise = slope(self.rewards) * (self.window - 1)
      audit_rise = slope(self.audits) * (self.window - 1)
      if rise >= self.min_reward_rise and audit_rise <= self.max_audit_rise:
        held['reward_up_audit_flat'] = (
            f'training reward rose {rise:+.3f} over {self.window} steps (to {self.rewards[-1]:.3f})'
            f' while the audit moved {audit_rise:+.3f} (to {self.audits[-1]:.3f})')
    level = (('monitors/disagreement', self.max_disagreement, 'disagreement', 'above'),
             ('monitors/length_corr', self.max_length_corr, 'length_exploit', 'above'),
             ('monitors/template_lift', self.max_template_lift, 'template_exploit', 'above'),
             ('monitors/judge_agreement', self.min_judge_agreement, 'judge_inconsistent', 'below'))
    for key, limit, name, side in level:
      if not limit or key not in metrics:
        continue
      value = metrics[key]
      bad = abs(value) > limit if side == 'above' else value < limit
      if bad:
        held[name] = f'{key}={value:.3f} is {side} its threshold {limit}'
    return held

  def update(self, step: int, metrics) -> list[Alarm]:
    """Records step's 'train/reward' and 'monitors/audit' and returns the alarms that fire."""
    if 'train/reward' in metrics:
      self.rewards.append(float(metrics['train/reward']))
    if 'monitors/audit' in metrics:
      self.audits.append(float(metrics['monitors/audit']))
    held = self._conditions(metrics)
    for name in list(self.streaks):
      if name not in held:
        del self.streaks[name]
    alarms = []
    for name, message in held.items():
      self.streaks[name] += 1
      if self.streaks[name] >= self.patience:
        alarms.append(Alarm(name, step, message))
    return alarms

  def trend_metrics(self) -> dict[str, float]:
    """The reward's and audit's rise over the current window (fewer steps early on)."""
    n = len(self.rewards)
    out = {'monitors/reward_trend': slope(self.rewards) * max(n - 1, 0)}
    if self.audits:
      out['monitors/audit_trend'] = slope(self.audits) * max(len(self.audits) - 1, 0)
    return out


def stop_message(alarms, *, step: int, workdir: str) -> str:
  """The text a monitors.stop='stop' run ends with."""
  what = '; '.join(f'{a.name}: {a.message}' for a in alarms)
  return (f'RewardHackingStop at step {step} (monitors.stop=\'stop\'): {what}. The checkpoint of '
          f'step {step} is saved in {workdir}; inspect it, or resume with monitors.stop=\'warn\' '
          'to continue training.')


def write_stop(workdir, alarms, *, message: str) -> epath.Path:
  """workdir/monitor_stop.json: the stop's step, alarms and message."""
  path = workdir_paths.as_path(workdir) / 'monitor_stop.json'
  workdir_paths.write_atomic(path, json.dumps({'step': alarms[0].step, 'message': message,
                              'alarms': [dataclasses.asdict(a) for a in alarms]}, indent=1))
  return path


def watch(settings, tracker: Tracker, step: int, metrics: dict, writer) -> list[Alarm]:
  """Feeds step's metrics to the tracker and adds its trends; logs each alarm (also printed by
  `writer.note` under monitors.stop 'warn' or 'stop'). `settings`: config.monitors. Returns the
  alarms that end the run: all of them under monitors.stop='stop', none otherwise."""
  alarms = tracker.update(step, metrics)
  metrics.update(tracker.trend_metrics())
  metrics['monitors/alarms'] = len(alarms)
  for a in alarms:
    logging.warning('monitor alarm at step %d: %s: %s', step, a.name, a.message)
    if settings.stop:
      writer.note(f'step {step} | monitor alarm {a.name}: {a.message}')
  return alarms if settings.stop == 'stop' else []


def report_stop(alarms, *, step: int, workdir, writer) -> None:
  """A stopped run's message, logged, printed and written to workdir/monitor_stop.json."""
  message = stop_message(alarms, step=step, workdir=workdir)
  write_stop(workdir, alarms, message=message)
  logging.error(message)
  writer.note(message)


def build(run):
  """The monitors under monitors.enabled or monitors.perplexity (rl/extensions.py: score and
  batch metrics, and the alarms that may stop the run), or None."""
  m = getattr(run.config, 'monitors', None)
  if m is None or not (m.enabled or m.get('perplexity', False)):
    return None
  return Monitors(m)


class Monitors:

  def __init__(self, settings):
    self.settings = settings
    self.tracker = Tracker.from_config(settings) if settings.enabled else None

  def score_metrics(self, run, **batch) -> dict:
    return batch_metrics(run, **batch) if self.settings.enabled else {}

  def batch_metrics(self, run, *, policy, batch, rollout, **unused) -> dict:
    """Prompt vs answer perplexity under π_old (monitors.perplexity)."""
    del unused
    if not self.settings.get('perplexity', False):
      return {}
    from rlreason.analysis import perplexity
    return perplexity.batch_metrics(policy, batch.tokens_NxT, batch.mask_NxT, cfg=run.cfg,
                                    completion_length=rollout.tokens_NxL.shape[1])

  def watch(self, run, step: int, metrics: dict, writer) -> list:
    del run
    return [] if self.tracker is None else watch(self.settings, self.tracker, step, metrics,
                                                 writer)

  def report_stop(self, run, stop, *, step: int, writer) -> None:
    report_stop(stop, step=step, workdir=run.workdir, writer=writer)
