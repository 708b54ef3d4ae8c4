"""Scoring an episode's final answer within a deadline, from the episode loop's threads.

  verdicts = pool_scorer(items, 'math', deadline_s=10.0)   # any thread; batched

A verifier can hang in C with the GIL held (sympy on 9^(9^9)), where no thread deadline helps,
so answers are scored in a verifier process (verifiers/pool.py): an item past its deadline is
a timeout verdict (reward 0) and its worker is killed. One pool serves the process's
environments, started at the first answer and stopped by `close_pool` (or at exit). The pool is
not thread-safe and the episode loop steps its rows in a thread each, so calls are batched:
a thread whose items are not yet scored waits for the running batch, then scores everything
queued meanwhile in one `pool.score`; a turn whose answers all hang costs about two deadlines,
not one per answer.

The pool has two workers and a spare: items queued behind a hung one move to another worker
after the pool's STUCK_S, so one hung answer does not time out the good ones of its batch
(as many hung answers as workers can). An item also stops at the pool's item_timeout_s (10 s),
whatever a longer deadline says.

The string checks in INLINE_VERIFIERS (linear in the completion, which the turn budget bounds)
run in the calling thread: `inline_scorer`.
"""

import atexit
import concurrent.futures
import threading

from rlreason.verifiers import pool as pool_lib
from rlreason.verifiers import registry as verifier_registry
from rlreason.verifiers import verdict as verdict_lib

# Verifiers that only compare strings, in time linear in the completion: scored inline.
INLINE_VERIFIERS = frozenset({'exact', 'format'})

_POOL: list[pool_lib.VerifierPool] = []  # The process's scoring pool, once started.
_RUN_LOCK = threading.Lock()  # held while a batch is scored (and while the pool starts/stops)
_QUEUE_LOCK = threading.Lock()
_QUEUE: list[tuple[dict, str, float, concurrent.futures.Future]] = []


def inline_scorer(items: list[dict], verifier: str,
                  deadline_s: float) -> list[verdict_lib.Verdict]:
  """Verdicts computed in the calling thread (for INLINE_VERIFIERS only: no deadline)."""
  del deadline_s
  return [verifier_registry.get_verifier(verifier)(item) for item in items]


def pool_scorer(items: list[dict], verifier: str, deadline_s: float) -> list[verdict_lib.Verdict]:
  """Verdicts from the process's shared verifier pool, each within about `deadline_s` of its
  batch's start (a batch takes the smallest deadline among its items)."""
  futures = [concurrent.futures.Future() for _ in items]
  with _QUEUE_LOCK:
    _QUEUE.extend((item, verifier, deadline_s, f) for item, f in zip(items, futures))
  with _RUN_LOCK:
    if not all(f.done() for f in futures):
      with _QUEUE_LOCK:
        batch = list(_QUEUE)
        _QUEUE.clear()
      try:
        verdicts = _pool().score([b[0] for b in batch], verifier=[b[1] for b in batch],
                                 deadline_s=min(b[2] for b in batch))
        for (_, _, _, future), verdict in zip(batch, verdicts):
          future.set_result(verdict)
      except Exception as e:  # Every waiting caller sees it, not only this one.
        for *_, future in batch:
          future.set_exception(e)
  return [f.result() for f in futures]


def close_pool() -> None:
  """Stops the shared scoring pool, if started (the next answer starts a new one)."""
  with _RUN_LOCK:
    while _POOL:
      _POOL.pop().close()


def _pool() -> pool_lib.VerifierPool:
  if not _POOL:  # Under _RUN_LOCK.
    _POOL.append(pool_lib.VerifierPool(num_workers=2, spare_workers=1, start_method='forkserver'))
    atexit.register(close_pool)
  return _POOL[0]
