"""Metric writers: TensorBoard event files, a JSONL log, and a one-line progress report.

`Writer.write(step, metrics)` takes device or host scalars. The loop hands it step t's
metrics while step t+1 runs (one step late), so reading them never stalls the device.
Only process 0 writes; other processes get a writer that does nothing. The workdir may be
local or gs:// (workdir_paths.py). An object store has no append: there metrics.jsonl is put
whole at each write, and TensorBoard's event file at each of tensorboardX's flushes (every
2 minutes and at close), through etils.epath like every other file of the run (tensorboardX's
own gs:// writer uploads again whenever it is garbage-collected, even after close).

Deliberately not here: computing metrics (losses.py, sampler.py, verifiers do that), plots
(experiments draw them from the JSONL log).
"""

from collections.abc import Mapping
import json
import logging
import pathlib
import sys
import time
from typing import Any

import jax
import numpy as np

from rlreason import workdir_paths


def to_host(metrics: Mapping[str, Any]) -> dict[str, float]:
  """Scalars only, as Python floats; one device_get for the whole dict."""
  host = jax.device_get(dict(metrics))
  return {k: float(np.asarray(v)) for k, v in host.items() if np.asarray(v).size == 1}


class Writer:
  """TensorBoard + JSONL + progress line; a no-op on processes other than 0."""

  def __init__(self, workdir: str | pathlib.Path, *, total_steps: int | None = None,
               tensorboard: bool = True, stream=None, every: int = 1):
    self.active = jax.process_index() == 0
    # sys.stdout when the run starts (not at import: notebooks and tests swap it).
    self.total_steps, self.stream, self.every = total_steps, stream or sys.stdout, every
    self._start, self._start_step = time.time(), None
    self._tb = self._jsonl = None
    if not self.active:
      return
    workdir = workdir_paths.as_path(workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    self.jsonl_path = workdir / 'metrics.jsonl'
    self._jsonl = (self.jsonl_path.open('a', encoding='utf-8') if workdir_paths.is_local(workdir)
                   else _ObjectLog(self.jsonl_path))
    if tensorboard and workdir_paths.scheme(workdir) not in (None, 'gs'):
      logging.warning('TensorBoard is off for workdir %s: tensorboardX writes local or gs:// '
                      'event files only.', workdir)
    elif tensorboard:
      import tensorboardX  # Writes event files without TensorFlow.
      if workdir_paths.scheme(workdir) == 'gs':  # Replaces tensorboardX's own gs:// writer.
        from tensorboardX import record_writer
        record_writer.register_writer_factory('gs', _ObjectEvents())
      self.tensorboard_dir = workdir / 'tensorboard'
      self._tb = tensorboardX.SummaryWriter(str(self.tensorboard_dir))

  def write(self, step: int, metrics: Mapping[str, Any], *, prefix: str = '') -> dict[str, float]:
    host = {prefix + k: v for k, v in to_host(metrics).items()}
    if not self.active:
      return host
    self._jsonl.write(json.dumps({'step': int(step), **host}) + '\n')
    self._jsonl.flush()
    if self._tb is not None:
      for k, v in host.items():
        self._tb.add_scalar(k.replace('@', '_at_'), v, int(step))  # TB rejects '@'.
    return host

  def progress(self, step: int, summary: Mapping[str, float], keys=(),
               label: str | None = None) -> None:
    """One line with rate and ETA: `step 40/200 | 2.1 s/step | ETA 5m36s | reward 0.41`.

    Every `every` steps, and always the first and the last."""
    if label is not None:  # A phase with its own counter (the SFT warm start): no ETA.
      if self.active:
        parts = [label] + [f'{k} {summary[k]:.4g}' for k in keys if k in summary]
        print(' | '.join(parts), file=self.stream, flush=True)
      return
    first, last = self._start_step is None, step == self.total_steps
    if not self.active or (step % self.every and not first and not last):
      return
    if self._start_step is None:
      self._start, self._start_step = time.time(), step
      rate = float('nan')
    else:
      rate = (time.time() - self._start) / max(step - self._start_step, 1)
    parts = [f'step {step}' + (f'/{self.total_steps}' if self.total_steps else '')]
    if rate == rate:  # Not NaN: at least one step has been timed.
      parts.append(f'{rate:.2f} s/step')
      if self.total_steps:
        eta = int(rate * max(self.total_steps - step, 0))
        parts.append(f'ETA {eta // 60}m{eta % 60:02d}s')
    parts += [f'{k.split("/")[-1]} {summary[k]:.4g}' for k in keys if k in summary]
    print(' | '.join(parts), file=self.stream, flush=True)

  def note(self, text: str) -> None:
    """A line of its own in the progress stream (a monitor's alarm, a stop)."""
    if self.active:
      print(text, file=self.stream, flush=True)

  def close(self) -> None:
    if self._jsonl is not None:
      self._jsonl.close()
    if self._tb is not None:
      self._tb.close()


class _ObjectLog:
  """An appendable file on an object store: the whole object is put again at each flush that
  follows a write (no append there; metrics.jsonl and event files are small)."""

  def __init__(self, path, *, binary: bool = False):
    self.path = path
    self._text = (path.read_bytes() if binary else path.read_text()) if path.exists() else (
        b'' if binary else '')
    self._dirty = False

  def write(self, text: str) -> None:
    self._text += text
    self._dirty = True

  def flush(self) -> None:
    if self._dirty:
      workdir_paths.write_atomic(self.path, self._text)
      self._dirty = False

  def close(self) -> None:
    self.flush()


class _ObjectEvents:
  """tensorboardX's writer factory (record_writer.register_writer_factory) for gs:// event
  files, through etils.epath."""

  def open(self, path):
    return _ObjectLog(workdir_paths.as_path(path), binary=True)

  def directory_check(self, path):
    del path  # Object stores have no directories to create.


def read_jsonl(path: str | pathlib.Path) -> list[dict[str, float]]:
  """The metrics log as a list of dicts (for plots and tests)."""
  with workdir_paths.as_path(path).open(encoding='utf-8') as f:
    return [json.loads(line) for line in f if line.strip()]
