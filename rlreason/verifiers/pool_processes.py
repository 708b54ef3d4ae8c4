"""VerifierPool's worker processes: what runs in them, how they start clean and stop.

`worker_main` is the spawned process's entry point: it sets a CPU-only environment before
anything heavy is imported, caps its address space, preloads sympy and math-verify, warms
math-verify's LaTeX grammar, reports `ready` (with whether JAX got imported: it must not),
then verifies one item per message, in its main thread, so math-verify's SIGALRM timeouts
work. Messages are pickled (batch id, index, verifier name, item); replies are
('done', batch id, index, (reward, status, components, detail), seconds).
`Housekeeper` is the pool's background thread that starts requested workers and stops
discarded ones (SIGTERM, SIGKILL after a grace period, reap, remove sandbox directories).

Not here: scheduling, deadlines, which worker to stop (pool.py); the verifiers (registry.py).
"""

import collections
import contextlib
import dataclasses
import importlib
import os
import pickle
import queue
import resource
import signal
import sys
import threading
import time
import traceback

from rlreason.verifiers import registry
from rlreason.verifiers import sandbox
from rlreason.verifiers import verdict as V

DEFAULT_PRELOAD = ('sympy', 'math_verify', 'rlreason.verifiers.registry')
# Seen by everything a worker starts: no accelerator is visible, libraries stay single-threaded.
CPU_ONLY_ENV = {
    'CUDA_VISIBLE_DEVICES': '', 'HIP_VISIBLE_DEVICES': '', 'ROCR_VISIBLE_DEVICES': '',
    'TPU_VISIBLE_DEVICES': '', 'JAX_PLATFORMS': 'cpu', 'OMP_NUM_THREADS': '1',
    'OPENBLAS_NUM_THREADS': '1', 'MKL_NUM_THREADS': '1',
}


@dataclasses.dataclass(frozen=True)
class WorkerConfig:
  preload: tuple[str, ...]
  memory_limit_bytes: int
  warmup: bool


def worker_main(conn, config: WorkerConfig) -> None:
  """Runs in the spawned process: preload, then verify items one at a time."""
  os.environ.update(CPU_ONLY_ENV)
  signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the trainer's to handle.
  if config.memory_limit_bytes:
    resource.setrlimit(resource.RLIMIT_AS, (config.memory_limit_bytes,) * 2)
  start = time.monotonic()
  for name in config.preload:
    importlib.import_module(name)
  if config.warmup:  # math-verify loads its LaTeX grammar on first use.
    registry.get_verifier('math')({'completion': '\\boxed{\\frac{1}{2}}', 'answer': '\\pi'})
  try:
    conn.send(('ready', os.getpid(), 'jax' in sys.modules, time.monotonic() - start))
  except OSError:
    return  # the pool closed while this worker was starting.
  while True:
    try:
      message = conn.recv_bytes()
    except (EOFError, OSError):
      return
    if not message:
      return
    batch, index, name, item = pickle.loads(message)
    start = time.perf_counter()
    try:
      result = registry.get_verifier(name)(item)
      if not isinstance(result, V.Verdict):
        raise TypeError(f'verifier {name!r} returned {type(result).__name__}, not a Verdict')
      out = (float(result.reward), result.status, dict(result.components), result.detail)
    except BaseException as e:  # math-verify's TimeoutException is a BaseException.
      if isinstance(e, (KeyboardInterrupt, SystemExit)):
        raise
      out = (0.0, V.CRASH, {}, crash_detail(e))
    conn.send(('done', batch, index, out, time.perf_counter() - start))


def crash_detail(e: BaseException) -> str:
  """`Type: message [at file:line in function]`, the innermost frame: enough to find the bug in
  a user's reward from the run's stop message."""
  frames = traceback.extract_tb(e.__traceback__)
  where = f' [at {frames[-1].filename}:{frames[-1].lineno} in {frames[-1].name}]' if frames else ''
  text = f'{type(e).__name__}: {e}'
  return (text[:300 - len(where)] + where)[:300]


@contextlib.contextmanager
def main_module_hidden():
  """Makes spawn skip re-importing the parent's __main__ in the child.

  multiprocessing's spawn re-runs the parent's main module (as __mp_main__) so that pickled
  functions defined there resolve. A trainer's main imports JAX; workers need nothing from
  it, since their entry point, worker_main, lives in this module. Without __spec__ and __file__ spawn
  treats main as interactive and skips it.
  """
  main = sys.modules.get('__main__')
  saved = {k: main.__dict__[k] for k in ('__spec__', '__file__') if main and k in main.__dict__}
  try:
    if main is not None:
      main.__dict__.pop('__file__', None)
      main.__spec__ = None
    yield
  finally:
    if main is not None:
      main.__dict__.update(saved)


class Housekeeper(threading.Thread):
  """Off the caller's thread: starts requested workers, and stops discarded ones
  (SIGTERM, then SIGKILL after the grace period, then reap), so `score` never waits on
  either. It never dies of an error: a failed step is logged on stderr and retried on the
  next round (a thread that died would leave the pool without workers for good). A dead
  worker's sandbox directories are removed on a second thread: a program can leave tens
  of thousands of directories (minutes of rmdir on a slow disk), and replacements must not
  wait for that."""

  def __init__(self, grace_s: float, spawn):
    super().__init__(name='verifier-pool-housekeeper', daemon=True)
    self._grace_s = grace_s
    self._spawn = spawn
    self._lock = threading.Lock()
    self._wake = threading.Event()
    self._closing = threading.Event()
    self._dying: list[list] = []  # [process, time of next escalation, stage]
    self._requested = 0
    self._spawning = False
    self._born = collections.deque()  # _Worker, or the exception that stopped its start.
    self._dead_pids = queue.SimpleQueue()  # None: the pool is closing; finish and stop.
    self._cleaned = threading.Event()
    threading.Thread(target=self._clean, name='verifier-pool-cleaner', daemon=True).start()

  def request(self, count: int) -> None:
    with self._lock:
      self._requested += count
    self._wake.set()

  def adopt(self) -> list:
    with self._lock:
      born, self._born = list(self._born), collections.deque()
    return born

  def add(self, process, *, graceful: bool) -> None:
    if not graceful:
      process.terminate()
    with self._lock:
      self._dying.append([process, time.monotonic() + (4 if graceful else 1) * self._grace_s,
                          'stop' if graceful else 'term'])
    self._wake.set()

  def busy(self) -> bool:
    with self._lock:
      return bool(self._dying or self._requested or self._spawning)

  def run(self) -> None:
    while not self._closing.is_set() or self.busy():
      with self._lock:
        count, self._requested = self._requested, 0
        self._spawning = count > 0 and not self._closing.is_set()
      for _ in range(count if self._spawning else 0):
        try:
          born = self._spawn()
        except Exception as e:  # pylint: disable=broad-except
          born = e
        with self._lock:
          self._born.append(born)
      with self._lock:
        self._spawning = False
      self._reap()
      self._wake.wait(0.02)
      self._wake.clear()

  def _reap(self) -> None:
    now = time.monotonic()
    with self._lock:
      dying = list(self._dying)
    for entry in dying:
      try:
        self._step(entry, now)
      except Exception as e:  # pylint: disable=broad-except
        print(f'verifier pool housekeeper: stopping worker {entry[0].pid}: '
              f'{type(e).__name__}: {e}', file=sys.stderr, flush=True)
        if entry[0].exitcode is not None:  # reaped; only its clean-up failed: drop it.
          with self._lock:
            self._dying.remove(entry)

  def _step(self, entry: list, now: float) -> None:
    process, when, stage = entry
    if process.exitcode is not None:
      process.join(0)
      self._dead_pids.put(process.pid)  # a killed worker cannot clean up after itself.
      with self._lock:
        self._dying.remove(entry)
    elif now >= when and stage == 'stop':
      process.terminate()
      entry[1:] = [now + self._grace_s, 'term']
    elif now >= when and stage == 'term':
      process.kill()
      entry[1:] = [now + 5.0, 'kill']

  def _clean(self) -> None:
    while True:
      pid = self._dead_pids.get()
      if pid is None:
        self._cleaned.set()
        return
      try:
        sandbox.remove_worker_dirs(pid)
      except Exception as e:  # pylint: disable=broad-except
        print(f'verifier pool cleaner: worker {pid}: {type(e).__name__}: {e}', file=sys.stderr,
              flush=True)

  def close(self, timeout_s: float) -> None:
    """Stops every worker and waits (up to timeout_s each) for the reaping and clean-up."""
    self._closing.set()
    self._wake.set()
    self.join(timeout_s)
    self._dead_pids.put(None)
    self._cleaned.wait(timeout_s)
