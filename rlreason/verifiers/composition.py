"""Reward composition: a weighted sum of named components, weights scheduled over training.

  mix = RewardComposition(weights={'math': 1.0, 'overlong': 1.0,
                                   'format': linear(0.5, 0.0, end=0.3)})
  rewards_B, metrics = mix.combine(components_B, progress=step / total_steps)

`components_B` holds one mapping per item, name -> score. Names are free: a verifier's
reward ('math'), its sub-scores ('correctness'), shaping terms ('overlong'), or scores
computed elsewhere, such as the model-judged `judge` reward that lives outside this
package because it needs JAX — the composition only sees numbers. A schedule maps training
progress in [0, 1] to a weight; `transforms` rescale a component before weighting.

  reward = scale · Σ_c w_c(progress) · transform_c(score_c)

Metrics per component: mean, min, max, weight and mean weighted contribution, plus the
reward's mean and std. Not here: computing any component, or advantages.
"""

import dataclasses
import math
from typing import Callable, Mapping, Sequence

Schedule = Callable[[float], float]


def _clip01(progress: float) -> float:
  return min(1.0, max(0.0, float(progress)))


def constant(value: float) -> Schedule:
  return lambda progress: float(value)


def linear(start: float, end: float, *, begin: float = 0.0, stop: float = 1.0) -> Schedule:
  """start until progress `begin`, then linear to `end` at `stop`, then end."""
  if not 0.0 <= begin < stop <= 1.0:
    raise ValueError(f'need 0 <= begin < stop <= 1, got {begin}, {stop}.')

  def schedule(progress: float) -> float:
    t = min(1.0, max(0.0, (_clip01(progress) - begin) / (stop - begin)))
    return start + (end - start) * t

  return schedule


def step(values: Sequence[float], boundaries: Sequence[float]) -> Schedule:
  """values[i] while progress < boundaries[i]; the last value after the last boundary."""
  if len(values) != len(boundaries) + 1 or list(boundaries) != sorted(boundaries):
    raise ValueError('need len(values) == len(boundaries) + 1 and sorted boundaries.')

  def schedule(progress: float) -> float:
    p = _clip01(progress)
    return float(values[sum(p >= b for b in boundaries)])

  return schedule


def sigmoid(start: float, end: float, *, midpoint: float = 0.5, sharpness: float = 12.0) -> Schedule:
  """start + (end - start) · σ(sharpness · (progress - midpoint)); Prolog-as-a-Tool suite 3."""
  def schedule(progress: float) -> float:
    s = 1.0 / (1.0 + math.exp(-sharpness * (_clip01(progress) - midpoint)))
    return start + (end - start) * s

  return schedule


@dataclasses.dataclass(frozen=True)
class RewardComposition:
  """reward = scale · Σ_c weights[c](progress) · transforms[c](components[c])."""
  weights: Mapping[str, float | Schedule]
  transforms: Mapping[str, Callable[[float], float]] = dataclasses.field(default_factory=dict)
  scale: float = 1.0
  missing: str = 'error'  # 'error' or 'zero': what a component absent from an item counts.

  def __post_init__(self):
    if self.missing not in ('error', 'zero'):
      raise ValueError(f"missing={self.missing!r}; known: 'error', 'zero'.")
    unknown = set(self.transforms) - set(self.weights)
    if unknown:
      raise ValueError(f'transforms for components without a weight: {sorted(unknown)}')

  def weights_at(self, progress: float) -> dict[str, float]:
    return {name: float(w(progress) if callable(w) else w) for name, w in self.weights.items()}

  def combine(self, components: Sequence[Mapping[str, float]], *,
              progress: float) -> tuple[list[float], dict[str, float]]:
    """Rewards, one per item, and metrics for the batch."""
    weights = self.weights_at(progress)
    rewards, columns = [], {name: [] for name in weights}
    for i, item in enumerate(components):
      total = 0.0
      for name, weight in weights.items():
        if name not in item and self.missing == 'error':
          raise KeyError(f'item {i} has no component {name!r}; it has {sorted(item)}')
        value = float(item.get(name, 0.0))
        if name in self.transforms:
          value = float(self.transforms[name](value))
        columns[name].append(value)
        total += weight * value
      rewards.append(self.scale * total)
    metrics = {}
    n = max(1, len(rewards))
    mean = sum(rewards) / n
    metrics['reward/mean'] = mean
    metrics['reward/std'] = math.sqrt(sum((r - mean)**2 for r in rewards) / n)
    for name, values in columns.items():
      metrics[f'{name}/weight'] = weights[name]
      metrics[f'{name}/mean'] = sum(values) / n
      metrics[f'{name}/min'] = min(values, default=0.0)
      metrics[f'{name}/max'] = max(values, default=0.0)
      metrics[f'{name}/contribution'] = self.scale * weights[name] * sum(values) / n
    return rewards, metrics


def _prolog_curriculum() -> RewardComposition:
  """Prolog-as-a-Tool suite 3 (reward_suite_3.py: progressive_reward_func)."""
  early = {'semantic': .35, 'format': .25, 'syntax': .10, 'correctness': .15, 'structure': .15}
  late = {'semantic': .10, 'format': .10, 'syntax': .10, 'correctness': .45, 'structure': .25}

  def half(x: float) -> float:
    return min(x, 2.0) / 2.0

  return RewardComposition(
      weights={name: sigmoid(early[name], late[name]) for name in early},
      transforms={'semantic': half, 'correctness': half, 'structure': half,
                  'syntax': lambda x: min(x, 1.0),
                  'format': lambda x: max(0.0, min(1.0, 0.67 * x))},
      scale=2.0)


# Components: `prolog`'s correctness, syntax, structure and format, plus `semantic` from the
# caller (the paper's sentence-embedding similarity; 0.5 * max(0.5, 2 cos) + overlap).
PROLOG_CURRICULUM = _prolog_curriculum()
