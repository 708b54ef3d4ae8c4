"""A persistent pool of spawned, CPU-only verifier processes with a deadline per batch.

  with VerifierPool(num_workers=2) as pool:
    verdicts = pool.score(items, verifier='math', deadline_s=30.0)

Why processes: verifiers hang (sympy evaluating 9^(9^9) inside C, where no signal reaches),
crash, leak memory, and call `signal.alarm`, which only works in a main thread. Each worker
runs verifiers in its main thread. Why spawn: a fork of the trainer would copy JAX's
threads and accelerator handles half-initialised; a spawned worker starts clean, sets a
CPU-only environment, preloads the heavy imports (sympy, math-verify) once, and never
imports JAX (it does not re-run the trainer's __main__ either); see pool_processes.py.
A replacement worker takes as long as those imports (~0.5 s idle, several seconds on a
loaded machine), so workers start on a background thread, and one warm spare takes over
the share of any worker whose item has run past STUCK_S (the items prefetched behind it
are re-queued too). start_method='forkserver' (a spawned, JAX-free server with the
imports preloaded forks each worker) makes a replacement ~50 ms.

What `score` guarantees:
  * it returns by `deadline_s` plus a few milliseconds (OVERRUN_SLACK_S counts a batch
    as overrun), whatever the items do;
  * an item running longer than `item_timeout_s`, or unfinished at the deadline, gets
    status timeout; its worker is stopped (SIGTERM, SIGKILL `kill_grace_s` later, off the
    caller's thread) and replaced;
  * a worker that dies costs only the item it was running (status crash); the items queued
    behind it go to other workers;
  * a worker that still holds prefetched items another worker already finished is left to
    finish them (their results are dropped), not stopped: workers_stopped counts only
    timeouts, crashes, deadlines and recycling;
  * every failure status gets `default_reward`;
  * workers are retired after `recycle_after` items (sympy's caches only grow).

Not here: the verifiers (registry.py), retries (an item that hung once would likely hang
again and cost another deadline), reward composition.
"""

import collections
import contextlib
import dataclasses
import multiprocessing
from multiprocessing import connection as mp_connection
import pickle
import time
from typing import Any, Mapping, Sequence

from rlreason.verifiers import pool_processes
from rlreason.verifiers import registry
from rlreason.verifiers import verdict as V

_PREFETCH_MAX_BYTES = 8192  # queued payloads must fit a socket buffer: send never blocks.
_STALE = None  # in _Worker.inflight: an earlier batch's item, whose result nobody awaits.


@dataclasses.dataclass(frozen=True)
class PoolStats:
  """Counters since the pool started (or since the last `stats(reset=True)`)."""
  items: int
  statuses: Mapping[str, int]
  latency_p50_s: float
  latency_p90_s: float
  latency_p99_s: float
  latency_max_s: float
  batches: int
  deadline_overruns: int
  worst_overrun_s: float
  workers_started: int
  workers_stopped: Mapping[str, int]  # reason -> count: timeout, crash, deadline, recycle.
  workers_with_jax: int


@dataclasses.dataclass(eq=False)
class _Worker:
  process: Any
  conn: Any
  ready: bool = False
  pid: int = 0
  done: int = 0
  inflight: collections.deque = dataclasses.field(default_factory=collections.deque)
  head_since: float = 0.0  # when the item at inflight[0] started running.
  stolen: set = dataclasses.field(default_factory=set)  # queued here, re-queued elsewhere.


@dataclasses.dataclass(eq=False)
class _Batch:
  id: int
  items: Sequence[Mapping[str, Any]]
  names: Sequence[str]
  results: list
  queue: collections.deque
  remaining: int
  default_reward: float

  def settle(self, index: int, verdict: V.Verdict) -> None:
    if self.results[index] is None:
      if verdict.failed:
        verdict = dataclasses.replace(verdict, reward=self.default_reward)
      self.results[index] = verdict
      self.remaining -= 1


class VerifierPool:
  """Spawned workers that score batches of items under a deadline. Not thread-safe."""

  def __init__(self, *, num_workers: int = 2, spare_workers: int = 1,
               item_timeout_s: float = 10.0,
               recycle_after: int = 2000, default_reward: float = 0.0, prefetch: int = 2,
               kill_grace_s: float = 0.5, memory_limit_bytes: int = 4 << 30,
               preload: Sequence[str] = pool_processes.DEFAULT_PRELOAD, warmup: bool = True,
               start_method: str = 'spawn', start_timeout_s: float = 120.0):
    if num_workers < 1 or prefetch < 1 or recycle_after < 1 or item_timeout_s <= 0:
      raise ValueError('num_workers, prefetch, recycle_after and item_timeout_s must be positive.')
    self.num_workers = num_workers
    self.spare_workers = spare_workers
    self.item_timeout_s = item_timeout_s
    self.recycle_after = recycle_after
    self.default_reward = default_reward
    self.prefetch = prefetch
    self._config = pool_processes.WorkerConfig(tuple(preload), memory_limit_bytes, warmup)
    if start_method not in ('spawn', 'forkserver'):
      raise ValueError(f"start_method={start_method!r}; known: 'spawn', 'forkserver'.")
    self._ctx = multiprocessing.get_context(start_method)
    if start_method == 'forkserver':
      self._ctx.set_forkserver_preload(list(preload))
    self._workers: list[_Worker] = []
    self._pending_starts = 0
    self._housekeeper = pool_processes.Housekeeper(kill_grace_s, self._spawn)
    self._housekeeper.start()
    self._batch_id = 0
    self._failed_starts = 0
    self._closed = False
    self._reset_counters()
    if not self.wait_ready(start_timeout_s):
      self.close()
      raise RuntimeError('verifier pool workers failed to start; see their stderr above.')

  def __enter__(self) -> 'VerifierPool':
    return self

  def __exit__(self, *exc) -> None:
    self.close()

  def wait_ready(self, timeout_s: float) -> bool:
    """Blocks until every worker (replacements included) has started; False on timeout."""
    deadline = time.monotonic() + timeout_s
    self._top_up()
    while self._pending_starts or not all(w.ready for w in self._workers):
      if time.monotonic() > deadline or self._failed_starts > self.MAX_FAILED_STARTS:
        return False
      self._wait(deadline)
      for w in list(self._workers):
        self._drain(w, None)
      self._top_up()
    return bool(self._workers)

  def worker_pids(self) -> list[int]:
    self._adopt()
    return [w.process.pid for w in self._workers]

  def score(self, items: Sequence[Mapping[str, Any]], *, verifier: str | Sequence[str],
            deadline_s: float) -> list[V.Verdict]:
    """Verdicts for `items`, in order, by `deadline_s` seconds from now."""
    if self._closed:
      raise RuntimeError('VerifierPool is closed.')
    start = time.monotonic()
    deadline = start + deadline_s
    names = [verifier] * len(items) if isinstance(verifier, str) else list(verifier)
    if len(names) != len(items):
      raise ValueError(f'{len(names)} verifier names for {len(items)} items.')
    for name in set(names):
      registry.check_name(name)
    self._batch_id += 1
    for w in self._workers:
      w.stolen.clear()
    batch = _Batch(self._batch_id, items, names, [None] * len(items),
                   collections.deque(range(len(items))), len(items), self.default_reward)
    while batch.remaining and time.monotonic() < deadline:
      self._top_up()
      self._dispatch(batch)
      self._wait(deadline)
      now = time.monotonic()
      for w in list(self._workers):
        self._drain(w, batch)
        if w.inflight and now - w.head_since >= self.item_timeout_s:
          self._abandon(w, batch, f'item took over {self.item_timeout_s:g}s', 'timeout')
        elif w.inflight and now - w.head_since > self.STUCK_S:
          # Items prefetched behind a stuck one go to other workers meanwhile; whichever
          # result comes first counts.
          tail = [i for i in list(w.inflight)[1:] if i is not _STALE and i not in w.stolen]
          w.stolen.update(tail)
          batch.queue.extendleft(reversed(tail))
    for w in list(self._workers):
      if any(i is not _STALE and batch.results[i] is None for i in w.inflight):
        self._abandon(w, batch, f'batch deadline of {deadline_s:g}s reached', 'deadline')
      elif w.inflight:
        # Stolen items that other workers finished: w finishes them too (a kill would cost
        # a respawn and count as a deadline kill that no deadline caused).
        w.inflight = collections.deque([_STALE] * len(w.inflight))
    for index in batch.queue:
      batch.settle(index, V.failure(V.TIMEOUT, 'batch deadline reached before the item started'))
    self._top_up()
    self._record(batch, time.monotonic() - deadline)
    return batch.results

  def stats(self, *, reset: bool = False) -> PoolStats:
    lat = sorted(self._latencies)

    def pick(q: float) -> float:
      return lat[min(len(lat) - 1, int(q * len(lat)))] if lat else 0.0

    out = PoolStats(
        items=sum(self._statuses.values()), statuses=dict(self._statuses),
        latency_p50_s=pick(0.5), latency_p90_s=pick(0.9), latency_p99_s=pick(0.99),
        latency_max_s=lat[-1] if lat else 0.0, batches=self._batches,
        deadline_overruns=self._overruns, worst_overrun_s=self._worst_overrun,
        workers_started=self._started, workers_stopped=dict(self._stopped),
        workers_with_jax=self._with_jax)
    if reset:
      self._reset_counters()
    return out

  def _reset_counters(self) -> None:
    self._statuses = collections.Counter()
    self._latencies = collections.deque(maxlen=100_000)
    self._stopped = collections.Counter()
    self._batches = self._overruns = self._started = self._with_jax = 0
    self._worst_overrun = 0.0

  def close(self) -> None:
    if self._closed:
      return
    self._closed = True
    while self._pending_starts and self._housekeeper.is_alive():
      self._adopt()  # workers still starting are stopped like the others.
      time.sleep(0.01)
    for w in list(self._workers):
      with contextlib.suppress(OSError):
        w.conn.send_bytes(b'')  # an empty message asks the worker to exit.
      self._remove(w, None, graceful=True)
    self._housekeeper.close(timeout_s=10.0)

  # Slack between the deadline and the return, beyond which a batch counts as overrun.
  OVERRUN_SLACK_S = 0.1
  # A worker whose item has run this long stops counting against num_workers (a spare
  # takes over its share) and gets no more prefetched items.
  STUCK_S = 1.0
  MAX_FAILED_STARTS = 3

  def _record(self, batch: _Batch, late_s: float) -> None:
    self._batches += 1
    if late_s > self.OVERRUN_SLACK_S:
      self._overruns += 1
    self._worst_overrun = max(self._worst_overrun, late_s)
    for v in batch.results:
      self._statuses[v.status] += 1
      self._latencies.append(v.latency_s)

  def _spawn(self) -> _Worker:
    """Starts one worker process; runs on the housekeeper thread."""
    parent_conn, child_conn = self._ctx.Pipe(duplex=True)
    process = self._ctx.Process(target=pool_processes.worker_main, args=(child_conn, self._config),
                                name='verifier-worker', daemon=True)
    with pool_processes.main_module_hidden():
      process.start()
    child_conn.close()
    return _Worker(process, parent_conn)

  def _adopt(self) -> None:
    for born in self._housekeeper.adopt():
      self._pending_starts -= 1
      if isinstance(born, _Worker):
        self._workers.append(born)
        self._started += 1
      else:
        self._failed_starts += 1

  def _top_up(self) -> None:
    """Retires workers due for recycling and asks for replacements; never blocks."""
    self._adopt()
    for w in list(self._workers):
      if w.done >= self.recycle_after and not w.inflight:
        with contextlib.suppress(OSError):
          w.conn.send_bytes(b'')
        self._remove(w, 'recycle', graceful=True)
    # A worker that cannot even start (a broken install) would be respawned forever.
    missing = self.num_workers + self.spare_workers - len(self._workers) - self._pending_starts
    if missing > 0 and self._failed_starts <= self.MAX_FAILED_STARTS and not self._closed:
      self._pending_starts += missing
      self._housekeeper.request(missing)

  def _remove(self, w: _Worker, reason: str | None, *, graceful: bool) -> None:
    self._workers.remove(w)
    w.conn.close()
    if reason:
      self._stopped[reason] += 1
    self._housekeeper.add(w.process, graceful=graceful)

  def _abandon(self, w: _Worker, batch: _Batch, detail: str, reason: str) -> None:
    """Gives up on w's running item (timeout) and re-queues the ones behind it."""
    index = w.inflight.popleft()
    if index is not _STALE:
      batch.settle(index, dataclasses.replace(V.failure(V.TIMEOUT, detail),
                                              latency_s=time.monotonic() - w.head_since))
    self._requeue(w, batch)
    self._remove(w, reason, graceful=False)

  @staticmethod
  def _requeue(w: _Worker, batch: _Batch) -> None:
    """Puts the items queued behind w's head back at the front of the batch's queue."""
    batch.queue.extendleft(reversed([i for i in w.inflight
                                     if i is not _STALE and i not in w.stolen]))

  def _dispatch(self, batch: _Batch) -> None:
    """Round-robin, one item per ready worker per round, up to `prefetch` each.

    At most num_workers workers run at once; a spare takes work only while another
    worker is stuck, and is then already warm when that one is replaced.
    """
    now = time.monotonic()
    stuck = {w for w in self._workers if w.inflight and now - w.head_since > self.STUCK_S}
    busy = sum(bool(w.inflight) for w in self._workers) - len(stuck)
    progress = True
    while batch.queue and progress:
      progress = False
      for w in sorted(self._workers, key=lambda w: not w.inflight):
        if (not batch.queue or not w.ready or w in stuck or
            len(w.inflight) >= self.prefetch):
          continue
        if not w.inflight and busy >= self.num_workers:
          continue
        if w.done + len(w.inflight) >= self.recycle_after:
          continue
        index = batch.queue[0]
        if batch.results[index] is not None:  # a stolen item that its first worker finished.
          batch.queue.popleft()
          progress = True
          continue
        try:
          payload = pickle.dumps((batch.id, index, batch.names[index], batch.items[index]),
                                 protocol=pickle.HIGHEST_PROTOCOL)
        except Exception as e:  # pylint: disable=broad-except
          batch.queue.popleft()
          batch.settle(index, V.failure(V.INVALID_INPUT, f'item cannot be pickled: {e}'))
          progress = True
          continue
        if w.inflight and len(payload) > _PREFETCH_MAX_BYTES:
          continue  # a big payload could fill the socket and block us; wait until w is idle.
        try:
          w.conn.send_bytes(payload)
        except OSError:
          continue  # the worker died; _drain will see it.
        batch.queue.popleft()
        if not w.inflight:
          w.head_since = time.monotonic()
          busy += 1
        w.inflight.append(index)
        progress = True

  def _wait(self, deadline: float) -> None:
    # Workers still starting are not in `handles` yet: poll for their adoption.
    wake = min(deadline, time.monotonic() + 0.02) if self._pending_starts else deadline
    now = time.monotonic()
    for w in self._workers:
      if w.inflight:  # wake up to time it out, or to let a spare in once it is stuck.
        stuck_at = w.head_since + self.STUCK_S
        wake = min(wake, w.head_since + self.item_timeout_s, stuck_at if now < stuck_at else wake)
    handles = [w.conn for w in self._workers] + [w.process.sentinel for w in self._workers]
    mp_connection.wait(handles, timeout=max(0.0, wake - time.monotonic()))

  def _drain(self, w: _Worker, batch: _Batch | None) -> None:
    """Reads every message w has sent; handles its death."""
    dead = False
    try:
      while w.conn.poll():
        message = w.conn.recv()
        if message[0] == 'ready':
          w.ready, w.pid = True, message[1]
          self._with_jax += bool(message[2])
        elif batch is not None and message[1] == batch.id:
          _, _, index, (reward, status, components, detail), latency = message
          if index in w.inflight:
            w.inflight.remove(index)
          w.stolen.discard(index)
          w.done += 1
          w.head_since = time.monotonic()
          batch.settle(index, V.Verdict(reward, status, components, detail, latency))
        elif _STALE in w.inflight:  # an earlier batch's result, delivered by another worker.
          w.inflight.remove(_STALE)
          w.done += 1
          w.head_since = time.monotonic()
    except (EOFError, OSError):
      dead = True
    if dead or w.process.exitcode is not None:
      self._failed_starts += not w.ready
      if w.inflight and batch is not None:
        index = w.inflight.popleft()
        if index is not _STALE:
          code = w.process.exitcode
          batch.settle(index, V.failure(V.CRASH, f'worker died (exit code {code})'))
        self._requeue(w, batch)
        w.inflight.clear()
      self._remove(w, 'crash', graceful=False)
