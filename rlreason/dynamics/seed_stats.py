"""Across-seed means with Student-t confidence intervals, for the dynamics studies' curves.

  mean_I, lo_I, hi_I = seed_stats.t_interval(acc_SxI)        # 95% two-sided, over axis 0
  seed_stats.plot_ci(ax, steps_I, acc_SxI, label='GRPO')      # mean line + shaded interval
  seed_stats.format_ci(acc_SxE[:, -1])                        # '0.512 ± 0.034'
  seed_stats.block_mean(mixed_SxT, 50)                        # S x (T / 50) block means

The interval is mean ± t_{(1+level)/2, S-1} · sd / sqrt(S) with the sample (ddof = 1) sd over
S seeds (textbook Student t; it assumes roughly normal seed outcomes, which at S = 5 is an
assumption, not a check). Paired comparisons between methods that share seeds and warm starts
pass the per-seed differences. Deliberately not here: bootstrap intervals (at S = 5 a bootstrap
understates the spread), and the loops that produce the seeds (bandit, toy_lm).
"""

import numpy as np
from scipy import stats


def t_interval(y_SxI, *, level: float = 0.95):
  """(mean_I, lo_I, hi_I) over axis 0 (seeds); lo = hi = mean when there is one seed."""
  y_SxI = np.asarray(y_SxI, np.float64)
  if y_SxI.ndim == 0 or y_SxI.shape[0] < 1:
    raise ValueError(f'y_SxI needs a leading seed axis of length >= 1, got shape {y_SxI.shape}.')
  if not 0 < level < 1:
    raise ValueError(f'level={level} must be in (0, 1).')
  s = y_SxI.shape[0]
  mean_I = y_SxI.mean(0)
  if s == 1:
    return mean_I, mean_I, mean_I
  half_I = stats.t.ppf((1 + level) / 2, s - 1) * y_SxI.std(0, ddof=1) / np.sqrt(s)
  return mean_I, mean_I - half_I, mean_I + half_I


def format_ci(y_S, *, digits: int = 3, level: float = 0.95) -> str:
  """'mean ± half-width' of a per-seed vector (the half-width of `t_interval`)."""
  mean, lo, hi = (float(v[0]) for v in t_interval(np.asarray(y_S, np.float64)[:, None],
                                                  level=level))
  return f'{mean:.{digits}f} ± {(hi - lo) / 2:.{digits}f}'


def plot_ci(ax, x_I, y_SxI, *, label: str, color=None, level: float = 0.95, **line_kw):
  """Seed mean with its t-interval shaded on a matplotlib axes; returns the line."""
  mean_I, lo_I, hi_I = t_interval(y_SxI, level=level)
  (line,) = ax.plot(x_I, mean_I, label=label, color=color, **line_kw)
  ax.fill_between(x_I, lo_I, hi_I, color=line.get_color(), alpha=0.2, linewidth=0)
  return line


def block_mean(x_SxT, every: int) -> np.ndarray:
  """Mean over consecutive blocks of `every` steps along the last axis: S x (T / every)."""
  x_SxT = np.asarray(x_SxT, np.float64)
  if x_SxT.shape[-1] % every:
    raise ValueError(f'block_mean: length {x_SxT.shape[-1]} is not a multiple of every={every}.')
  return x_SxT.reshape(*x_SxT.shape[:-1], -1, every).mean(-1)
