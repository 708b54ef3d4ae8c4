"""Checkpoints that resume a run bit for bit: train state, data-iterator state, config.

Two orbax CheckpointManagers under the workdir: `checkpoints/` keeps the last k saves and
`best/` keeps the single best by an evaluation metric. Each save holds the TrainState pytree
(params, optimizer state, step, RNG key data), the data iterator's state and the config as
JSON. Restoring tries the newest step first; a step that fails to restore (a write cut off
by preemption, a corrupt file) is reported and the previous one is used.

A save is atomic: orbax writes a step into a temporary directory and renames it into place
once every item is written, so a process killed mid-write (SIGKILL, OOM, a lost host) leaves
the previous step as the newest (tests/checkpoint_crash_test.py kills a run inside an item's
write and just before the rename; the resume is bit-exact). A disk that fills up while saving
raises `DiskFullError`, which names the workdir and the intact previous step, after removing
the partial step. Files the run writes beside its checkpoints (`write_run_config`) go
through `write_text_atomic`; the in-flight rollouts' file (async_rl.py) renames likewise.
The workdir may be local or gs:// (workdir_paths.py): orbax takes the epath as is, and on an
object store a save is final once orbax writes its commit marker, a file a single put.

A SIGTERM (TPU preemption notice) or a Ctrl-C sets a flag that the loop polls after each step:
it saves and exits cleanly instead of dying mid-write; a second Ctrl-C exits at once. A
checkpoint of another model is refused with the differing config fields (`config_diff`).

Deliberately not here: what the state contains (update.py) and when to save (train.py).
"""

from collections.abc import Mapping
import contextlib
import errno
import json
import logging
import pathlib
import signal
import subprocess
from typing import Any

import jax
import orbax.checkpoint as ocp

from rlreason import workdir_paths


def write_text_atomic(path, text: str) -> None:
  """Writes `text` to `path` whole or not at all: locally a temporary file beside it, then a
  rename (a process killed meanwhile leaves the previous file, or none); on an object store a
  single put (workdir_paths.write_atomic)."""
  workdir_paths.write_atomic(path, text)


def git_commit() -> str:
  """The commit of the code that runs (recorded beside the checkpoints), or 'unknown'."""
  try:
    return subprocess.run(['git', 'rev-parse', 'HEAD'], capture_output=True, text=True,
                          cwd=pathlib.Path(__file__).parent, timeout=10).stdout.strip() or 'unknown'
  except (OSError, subprocess.SubprocessError):
    return 'unknown'


def write_run_config(workdir, config: Mapping[str, Any]) -> None:
  """The workdir's config.json: the config and commit that make its checkpoints. Written after
  a successful restore or a fresh init, so a failed resume never overwrites the record."""
  write_text_atomic(workdir_paths.as_path(workdir) / 'config.json', json.dumps(
      {'git_commit': git_commit(), 'config': dict(config)}, indent=2, default=str))


class DiskFullError(OSError):
  """No space left while saving; the previous checkpoint is intact (see the message)."""


def _disk_full(e: BaseException) -> bool:
  """Whether `e` or anything it wraps (causes, contexts, exception groups) is ENOSPC/EDQUOT;
  tensorstore reports it as text."""
  seen, todo = set(), [e]
  while todo:
    e = todo.pop()
    if e is None or id(e) in seen:
      continue
    seen.add(id(e))
    if isinstance(e, OSError) and e.errno in (errno.ENOSPC, errno.EDQUOT):
      return True
    if 'No space left on device' in str(e) or 'Disk quota exceeded' in str(e):
      return True
    todo += [e.__cause__, e.__context__, *getattr(e, 'exceptions', ())]
  return False


class CheckpointMismatchError(RuntimeError):
  """The workdir's checkpoints belong to another model or adapter shape (see the message)."""


def _first_line(e: BaseException, limit: int = 300) -> str:
  return (str(e).strip().splitlines() or [''])[0][:limit]


def _flat(tree: Any, prefix: str = '') -> dict[str, Any]:
  if isinstance(tree, Mapping):
    out = {}
    for k, v in tree.items():
      out.update(_flat(v, f'{prefix}{k}.'))
    return out
  return {prefix[:-1]: tree}


def _check_shapes(abstract_state, state) -> None:
  """Orbax restores a saved array at its saved shape even when the target's differs."""
  wanted = jax.tree_util.tree_flatten_with_path(abstract_state)[0]
  for (path, want), got in zip(wanted, jax.tree.leaves(state)):
    if getattr(want, 'shape', None) is not None and tuple(got.shape) != tuple(want.shape):
      raise ValueError(f'{jax.tree_util.keystr(path)} has shape {tuple(got.shape)} in the '
                       f'checkpoint, this run expects {tuple(want.shape)}')


# Fields that decide the checkpoint's tree and shapes come first in a mismatch message.
_SHAPE_FIELDS = ('model.', 'lora.', 'critic.', 'r2po.', 'tokenizer.')


def config_diff(saved: Mapping[str, Any], requested: Mapping[str, Any], *,
                limit: int = 12) -> list[str]:
  """'field: saved -> requested' lines for the fields that differ (lists and tuples compare
  alike), the model-shaping sections first, at most `limit` lines plus a count of the rest."""
  a, b = _flat(saved), _flat(requested)
  norm = lambda v: list(v) if isinstance(v, tuple) else v
  keys = sorted((k for k in a.keys() | b.keys() if norm(a.get(k)) != norm(b.get(k))),
                key=lambda k: (not k.startswith(_SHAPE_FIELDS), k))
  missing = '(absent)'
  lines = [f'{k}: {a.get(k, missing)!r} -> {b.get(k, missing)!r}' for k in keys[:limit]]
  if len(keys) > limit:
    lines.append(f'... and {len(keys) - limit} more')
  return lines


class Checkpointer:
  """Keep-last-k plus best-by-metric checkpoints of (state, data state, config)."""

  def __init__(self, workdir, *, keep: int = 3,
               best_metric: str | None = None, best_mode: str = 'max', async_save: bool = False):
    workdir = workdir_paths.as_path(workdir)
    workdir = workdir.absolute() if workdir_paths.is_local(workdir) else workdir
    options = lambda **kw: ocp.CheckpointManagerOptions(
        create=True, enable_async_checkpointing=async_save, **kw)
    self.latest = ocp.CheckpointManager(workdir / 'checkpoints', options=options(max_to_keep=keep))
    self.best = None
    if best_metric:
      self.best = ocp.CheckpointManager(workdir / 'best', options=options(
          max_to_keep=1, best_fn=lambda m: m[best_metric], best_mode=best_mode,
          keep_checkpoints_without_metrics=False))
    self.best_metric = best_metric
    self.workdir = workdir

  @staticmethod
  def _args(state, data_state, config):
    return ocp.args.Composite(state=ocp.args.StandardSave(state),
                              data=ocp.args.JsonSave(data_state or {}),
                              config=ocp.args.JsonSave(config or {}))

  def save(self, step: int, state, *, data_state: Mapping[str, Any] | None = None,
           config: Mapping[str, Any] | None = None, metrics: Mapping[str, float] | None = None,
           force: bool = False) -> None:
    """Saves to `checkpoints/`; with eval `metrics`, also offers it to `best/`.

    Raises DiskFullError (the partial step removed, the previous one intact) when the disk
    fills up; with async_save, that surfaces in `wait`."""
    with self._disk_full_is_clear(step):
      self.latest.save(step, args=self._args(state, data_state, config), force=force)
      if self.best is not None and metrics and self.best_metric in metrics:
        self.best.save(step, args=self._args(state, data_state, config),
                       metrics={self.best_metric: float(metrics[self.best_metric])}, force=True)

  def wait(self) -> None:
    with self._disk_full_is_clear(None):
      self.latest.wait_until_finished()
      if self.best is not None:
        self.best.wait_until_finished()

  @contextlib.contextmanager
  def _disk_full_is_clear(self, step: int | None):
    try:
      yield
    except Exception as e:  # pylint: disable=broad-except
      if not _disk_full(e):
        raise
      managers = [m for m in (self.latest, self.best) if m is not None]
      for manager in managers:  # Orbax's temporaries ('<step>.orbax-checkpoint-tmp-...').
        for tmp in workdir_paths.as_path(manager.directory).glob('*.orbax-checkpoint-tmp*'):
          tmp.rmtree(missing_ok=True)
      steps = sorted(s for s in self.latest.all_steps(read=True) if s != step)
      previous = (f'the previous checkpoint (step {steps[-1]}) is intact and a restart resumes '
                  'from it' if steps else 'there is no previous checkpoint')
      raise DiskFullError(
          errno.ENOSPC, f'checkpoint{"" if step is None else f" at step {step}"} not saved: no '
          f'space left on the disk holding {self.workdir} ({type(e).__name__}: '
          f'{str(e)[:300]}); the partial step was removed; {previous}. Free space, then '
          'restart.') from e

  def steps(self) -> list[int]:
    return sorted(self.latest.all_steps())

  def restore(self, abstract_state, *, step: int | None = None, from_best: bool = False,
              config: Mapping[str, Any] | None = None):
    """Returns (step, state, data_state, config) or None when there is nothing to restore.

    `abstract_state` (ShapeDtypeStructs with shardings) fixes the tree and placement. Without
    `step`, tries the newest step and falls back to older ones, logging each failure. When no
    step restores and the saved config differs from `config` (this run's), raises
    CheckpointMismatchError with the differing fields instead of orbax's tree dump.
    """
    manager = self.best if from_best else self.latest
    if manager is None:
      raise ValueError('restore(from_best=True) needs a Checkpointer with best_metric set.')
    candidates = [step] if step is not None else sorted(manager.all_steps(), reverse=True)
    args = ocp.args.Composite(state=ocp.args.StandardRestore(abstract_state),
                              data=ocp.args.JsonRestore(), config=ocp.args.JsonRestore())
    errors = []
    for s in candidates:
      try:
        out = manager.restore(s, args=args)
        _check_shapes(abstract_state, out['state'])
      except Exception as e:  # pylint: disable=broad-except
        # A half-written or corrupt step: say which and why, then use the one before it.
        errors.append(f'step {s}: {type(e).__name__}: {_first_line(e)}')
        logging.warning('checkpoint at step %d in %s could not be restored (%s); trying the '
                        'previous one.', s, manager.directory, _first_line(e))
        continue
      return s, out['state'], dict(out['data'] or {}), dict(out['config'] or {})
    if errors:
      saved = self.saved_config() if config is not None else None
      differ = config_diff(saved, config) if saved else []
      if differ:
        raise CheckpointMismatchError(
            f'the checkpoints in {manager.directory} were made by a different config, so they '
            f'do not fit this run\'s model; fields that differ (saved -> this run):\n  '
            + '\n  '.join(differ) + '\nUse a new --workdir for this config, or run with the '
            'saved config (its config.json in the workdir).')
      raise RuntimeError(f'no checkpoint in {manager.directory} could be restored:\n  ' +
                         '\n  '.join(errors))
    return None

  def saved_config(self) -> dict | None:
    """The config saved with the newest readable step (read alone: the state's tree may not
    match this run's), or None when there is none."""
    for step in sorted(self.latest.all_steps(), reverse=True):
      try:
        out = self.latest.restore(step, args=ocp.args.Composite(config=ocp.args.JsonRestore()))
      except Exception:  # pylint: disable=broad-except  (restore() reports corrupt steps)
        continue
      return dict(out['config'] or {})
    return None

  def close(self) -> None:
    self.latest.close()
    if self.best is not None:
      self.best.close()


class PreemptionFlag:
  """Set by SIGTERM (a preemption notice) or SIGINT (Ctrl-C); the loop checks it between
  steps, saves, and exits. A second SIGINT exits at once (KeyboardInterrupt)."""

  def __init__(self, signals=(signal.SIGTERM, signal.SIGINT)):
    self.requested = False
    self._previous = {}
    for sig in signals:
      self._previous[sig] = signal.signal(sig, self._handle)

  def _handle(self, signum, frame):
    del frame
    if signum == signal.SIGINT and self.requested:
      raise KeyboardInterrupt('second SIGINT: exiting without saving')
    again = ' (Ctrl-C again to exit now)' if signum == signal.SIGINT else ''
    message = (f'received {signal.Signals(signum).name}: saving a checkpoint after this step, '
               f'then exiting{again}.')
    logging.warning('%s', message)
    print(message, flush=True)
    self.requested = True

  def should_stop(self, step: int, manager: ocp.CheckpointManager | None = None) -> bool:
    """True on a local signal, or (multi-host) when orbax's preemption sync says so."""
    if self.requested:
      return True
    return bool(manager is not None and jax.process_count() > 1 and
                manager.reached_preemption(step))

  def restore_handlers(self) -> None:
    for sig, handler in self._previous.items():
      signal.signal(sig, handler)
