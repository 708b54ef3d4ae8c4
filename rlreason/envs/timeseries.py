"""The 'timeseries' tool: ARTIST-style inspection of segments of a series given in the episode.

The series is `context['series']` (numbers), with optional `context['timestamps']` (same
length, any JSON scalars). Actions, over the half-open index range [start, end):

  length                     the number of values
  window(start, end)         the values, as a JSON list, or [timestamp, value] pairs when the
                             episode has timestamps; at most MAX_WINDOW values per call
  stats(start, end)          JSON {min, max, mean, std, argmin, argmax}: std is the population
                             std (ddof=0); argmin/argmax are absolute indices, first occurrence

Numbers are printed to 6 significant digits (`rounded`), so a series of 2-decimal values reads back
exactly. Stats are not capped: they read the whole range but print six numbers. A bound outside
0 <= start < end <= length -> ToolError(BAD_ARGUMENTS) naming the bound.

Not here: resampling, forecasting, plotting, anything that changes the series.
"""

import json
import math
from typing import Any, Mapping

from rlreason.envs import base

ACTIONS = ('length', 'window', 'stats')
MAX_WINDOW = 200


def rounded(x: float) -> float | int:
  """6 significant digits; integral values print without '.0'."""
  y = float(f'{x:.6g}')
  return int(y) if y.is_integer() and abs(y) < 1e15 else y


class Series:
  """The episode's series, validated once."""

  def __init__(self, values, timestamps=None):
    if not isinstance(values, (list, tuple)) or not values or not all(
        isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)
        for v in values):
      raise base.ToolError(base.TOOL_FAILED, 'timeseries: the series must be a non-empty list '
                           'of finite numbers')
    if timestamps is not None and (not isinstance(timestamps, (list, tuple)) or
                                   len(timestamps) != len(values)):
      raise base.ToolError(base.TOOL_FAILED, 'timeseries: timestamps must be a list with '
                           f'one item per value ({len(values)})')
    self.values, self.timestamps = [float(v) for v in values], timestamps


def _bounds(series: Series, arguments: Mapping[str, Any], action: str) -> tuple[int, int]:
  n = len(series.values)
  for name in ('start', 'end'):
    if name not in arguments:
      raise base.ToolError(base.BAD_ARGUMENTS, f'timeseries: {action} needs {name}')
  start, end = arguments['start'], arguments['end']
  if not 0 <= start < n:
    raise base.ToolError(base.BAD_ARGUMENTS,
                         f'timeseries: start={start} is outside [0, {n - 1}] (length {n})')
  if not start < end <= n:
    raise base.ToolError(base.BAD_ARGUMENTS,
                         f'timeseries: end={end} must be in [{start + 1}, {n}] (end is exclusive)')
  return start, end


def stats(values: list[float], offset: int) -> dict:
  """min, max, mean, population std, and the first argmin/argmax shifted by `offset`."""
  mean = math.fsum(values) / len(values)
  std = math.sqrt(math.fsum((v - mean)**2 for v in values) / len(values))
  lo = min(range(len(values)), key=values.__getitem__)
  hi = max(range(len(values)), key=lambda i: (values[i], -i))  # First occurrence of the max.
  return {'min': rounded(values[lo]), 'max': rounded(values[hi]), 'mean': rounded(mean),
          'std': rounded(std), 'argmin': lo + offset, 'argmax': hi + offset}


class TimeSeries:
  """One tool for the three actions; the session is a `Series`."""

  spec = base.ToolSpec(
      name='timeseries',
      description=('Inspects the episode\'s time series. action=length; window(start, end): '
                   f'values[start:end], at most {MAX_WINDOW}; stats(start, end): min, max, mean, '
                   'std, argmin, argmax of values[start:end]. Indices start at 0, end is '
                   'exclusive.'),
      parameters={
          'type': 'object',
          'properties': {
              'action': {'type': 'string', 'enum': list(ACTIONS)},
              'start': {'type': 'integer', 'description': 'first index, inclusive'},
              'end': {'type': 'integer', 'description': 'last index, exclusive'},
          },
          'required': ['action'],
      })

  def new_session(self, context: Mapping[str, Any]) -> Series:
    if 'series' not in context:
      raise base.ToolError(base.TOOL_FAILED, 'timeseries: this episode has no series')
    return Series(context['series'], context.get('timestamps'))

  def call(self, session: Series, arguments: Mapping[str, Any]) -> str:
    action = arguments['action']
    if action == 'length':
      return str(len(session.values))
    if action not in ACTIONS:
      raise base.ToolError(base.BAD_ARGUMENTS,
                           f'timeseries: unknown action {action!r}; actions: {", ".join(ACTIONS)}')
    start, end = _bounds(session, arguments, action)
    if action == 'stats':
      return json.dumps(stats(session.values[start:end], start))
    if end - start > MAX_WINDOW:
      raise base.ToolError(base.BAD_ARGUMENTS, f'timeseries: window of {end - start} values; '
                           f'at most {MAX_WINDOW} per call (end - start)')
    values = [rounded(v) for v in session.values[start:end]]
    if session.timestamps is None:
      return json.dumps(values)
    return json.dumps([[t, v] for t, v in zip(session.timestamps[start:end], values)],
                      ensure_ascii=False)


TOOL = TimeSeries()
