"""Verifiers that misbehave on purpose, to test the pool: hang, crash, ignore SIGTERM.

Shipped in the package (not in tests/) because the pool's workers import verifiers by
name ("rlreason.verifiers.faults:sleep"), and a spawned worker must be able to import
them without pytest. Never registered in registry.VERIFIERS.
"""

import os
import signal
import time
from typing import Any, Mapping

from rlreason.verifiers import verdict as V


def echo(item: Mapping[str, Any]) -> V.Verdict:
  """Returns item['status'] (default correct) with item['reward'] (default 1.0)."""
  return V.Verdict(float(item.get('reward', 1.0)), item.get('status', V.CORRECT))


def worker_pid(item: Mapping[str, Any]) -> V.Verdict:
  del item
  return V.judged(True, components={'pid': float(os.getpid())})


def sleep(item: Mapping[str, Any]) -> V.Verdict:
  time.sleep(float(item.get('seconds', 3600)))
  return V.judged(True)


def spin(item: Mapping[str, Any]) -> V.Verdict:
  del item
  while True:
    pass


def big_power(item: Mapping[str, Any]) -> V.Verdict:
  """Hangs inside C big-integer code, where no Python signal handler runs."""
  return V.judged(pow(9, 9**int(item.get('exponent', 9))) > 0)


def ignore_sigterm(item: Mapping[str, Any]) -> V.Verdict:
  signal.signal(signal.SIGTERM, signal.SIG_IGN)
  time.sleep(float(item.get('seconds', 3600)))
  return V.judged(True)


def exit_process(item: Mapping[str, Any]) -> V.Verdict:
  os._exit(int(item.get('code', 3)))


def segfault(item: Mapping[str, Any]) -> V.Verdict:
  del item
  os.kill(os.getpid(), signal.SIGSEGV)
  time.sleep(10)
  return V.judged(True)


def raise_error(item: Mapping[str, Any]) -> V.Verdict:
  raise RuntimeError(f'verifier failed on purpose: {item.get("message", "boom")}')


def not_a_verdict(item: Mapping[str, Any]) -> Any:
  """Neither a Verdict nor a number (a number is a reward: registry._as_verdict)."""
  del item
  return 'forty-two'


def memory_hog(item: Mapping[str, Any]) -> V.Verdict:
  """Allocates until the worker's address-space limit raises MemoryError."""
  chunks = []
  while True:
    chunks.append(bytearray(int(item.get('chunk_bytes', 1 << 28))))

