"""The trusted side of python_tests' tests, run in a child process that ends by a deadline.

  with TrustedChecks(deadline=time.monotonic() + 6.0) as checks:
    reply = checks.evaluate(tests, solution, results)  # test_probes.evaluate, in the child

A check may compute on whatever the solution returned (`sum(range(f(1)))` with f(1) =
10**12, `f(1) ** 10**9`), inside C code where no signal or timer reaches; so the checks run
in one child per item (python -I -S: standard library only) that sets its own CPU and
address-space limits, answers one request per line across the item's rounds, and is killed
at the deadline: `OutOfTime`, never a hang. The child imports test_probes and plain_data by
path, under stand-ins for their packages, whose __init__ imports the whole verifier registry.

Not here: what is evaluated (test_probes), the sandbox (python_tests).
"""

import json
import os
import selectors
import signal
import subprocess
import sys
import time
from typing import Mapping

_BOOT = r'''
import sys, types
for name, path in %r:
  module = types.ModuleType(name)
  module.__path__ = [path]
  sys.modules[name] = module
from rlreason.verifiers import test_probes
test_probes.main()
''' % ([('rlreason', os.path.dirname(os.path.dirname(os.path.abspath(__file__)))),
        ('rlreason.verifiers', os.path.dirname(os.path.abspath(__file__)))],)


class OutOfTime(Exception):
  """The checks ran past the item's deadline or CPU budget."""


class TrustedChecks:
  """One evaluator child for one item; `evaluate` may be called once per round."""

  def __init__(self, *, deadline: float):
    self.deadline = deadline
    remaining = deadline - time.monotonic()
    if remaining <= 0:
      raise OutOfTime('no time left for the checks')
    self.child = subprocess.Popen(
        [sys.executable, '-I', '-S', '-c', _BOOT, repr(remaining)], stdin=subprocess.PIPE,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        env={'PATH': '/usr/bin:/bin', 'LANG': 'C.UTF-8'})

  def __enter__(self):
    return self

  def __exit__(self, *exc):
    self.close()

  def close(self) -> None:
    if self.child.poll() is None:
      self.child.kill()
    self.child.wait()
    for pipe in (self.child.stdin, self.child.stdout, self.child.stderr):
      pipe.close()

  def evaluate(self, tests: list[str], solution: str, results: Mapping[str, list]) -> dict:
    """test_probes.evaluate(tests, solution, results), answered by the deadline."""
    request = json.dumps({'tests': tests, 'solution': solution, 'results': results})
    try:
      self.child.stdin.write(request.encode() + b'\n')
      self.child.stdin.flush()
    except BrokenPipeError:
      self._ended()
    line = bytearray()
    with selectors.DefaultSelector() as selector:
      selector.register(self.child.stdout, selectors.EVENT_READ)
      while not line.endswith(b'\n'):
        remaining = self.deadline - time.monotonic()
        if remaining <= 0:
          self.close()
          raise OutOfTime('the checks ran past the deadline')
        if selector.select(remaining):
          chunk = os.read(self.child.stdout.fileno(), 1 << 20)
          if not chunk:
            self._ended()
          line += chunk
    return json.loads(line)

  def _ended(self):
    self.child.wait()
    code = self.child.returncode
    if code in (-signal.SIGXCPU, -signal.SIGKILL):
      raise OutOfTime('the checks ran past their CPU budget')
    raise RuntimeError(f'checks exited with {code}: '
                       f'{self.child.stderr.read().decode(errors="replace")[-200:]}')
