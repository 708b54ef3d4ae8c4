"""`python_tests`: run model-written Python against unit tests, inside the sandbox.

Item: completion, and tests and/or io_cases:
  tests      assert statements (a list of strings, or one string of code), run one by one
             in the namespace the solution defined (MBPP / HumanEval style);
  io_cases   [{"input": str, "output": str}, ...]: the solution runs as a script with that
             stdin; its stdout must equal `output` up to whitespace (APPS style).
Options: partial_credit (reward = pass fraction instead of all-or-nothing), cpu_s.

The code is the last ```python (or ```) fenced block, else the whole completion. It runs
with the standard library only (python -I -S), once per item, in one sandboxed process.
The runner takes the tests and a per-run nonce into memory and deletes their files before
the solution runs, so the solution cannot read the expected outputs or forge the nonce'd
report line without introspecting the interpreter.

Outcomes: correct (all pass); wrong (some fail, or the program exits before reporting);
parse_failure (no code, or a SyntaxError); timeout; sandbox_violation (a sandbox rule,
the memory or the file-size limit). Not here: other languages, or pass@k.
"""

import json
import re
import secrets
from typing import Any, Mapping

from rlreason.verifiers import sandbox
from rlreason.verifiers import verdict as V

LIMITS = sandbox.Limits(cpu_s=3, wall_s=6.0)
_FENCE = re.compile(r'```[ \t]*(?:python|py|python3)?[ \t]*\n(.*?)```', re.DOTALL | re.IGNORECASE)

_RUNNER = r'''
import contextlib, errno, io, json, os, sys
nonce = sys.stdin.readline().strip()
os.remove('.stdin')
with open('tests.json', encoding='utf-8') as f:
  spec = json.load(f)
os.remove('tests.json')
out = os.dup(1)

def report(**fields):
  os.write(out, ('\n' + nonce + ' ' + json.dumps(fields) + '\n').encode())

class Capped(io.StringIO):
  def write(self, s):
    return super().write(s) if self.tell() < 1 << 20 else len(s)

def fatal(e):
  # Resource limits end the run (the sandbox reports them); they are not test failures.
  return isinstance(e, MemoryError) or (isinstance(e, OSError) and e.errno == errno.EFBIG)

def run(code, namespace, stdin=''):
  sys.stdin = io.StringIO(stdin)
  buf = Capped()
  with contextlib.redirect_stdout(buf):
    try:
      exec(code, namespace)
    except SystemExit:
      pass
  return buf.getvalue()

try:
  code = compile(spec['solution'], 'solution.py', 'exec')
except (SyntaxError, ValueError) as e:
  report(compile_error=str(e)[:300])
  sys.exit(0)
passed, failures = 0, []
if spec['tests']:
  namespace = {'__name__': 'solution'}
  try:
    run(code, namespace)
  except BaseException as e:
    if fatal(e):
      raise
    failures.append('solution raised ' + repr(e)[:200])
  for test in spec['tests']:
    try:
      run(compile(test, 'test', 'exec'), namespace)
      passed += 1
    except BaseException as e:
      if fatal(e):
        raise
      failures.append((test[:100], repr(e)[:100]))
for case in spec['io_cases']:
  try:
    got = run(code, {'__name__': '__main__'}, case['input'])
    ok = got.split() == case['output'].split()
  except BaseException as e:
    if fatal(e):
      raise
    ok, got = False, repr(e)
  passed += ok
  if not ok:
    failures.append((case['input'][:50], got[:50]))
report(passed=passed, total=len(spec['tests']) + len(spec['io_cases']), failures=failures[:3])
'''


def extract_code(text: str) -> str:
  blocks = _FENCE.findall(text)
  return (blocks[-1] if blocks else text).strip()


def _tests(item: Mapping[str, Any]) -> tuple[list[str], list[dict[str, str]]]:
  tests = item.get('tests') or []
  if isinstance(tests, str):
    tests = [tests]
  cases = item.get('io_cases') or []
  if not isinstance(tests, list) or not all(isinstance(t, str) for t in tests):
    raise V.ItemError(V.INVALID_INPUT, 'tests: expected a list of strings')
  if not isinstance(cases, list) or not all(
      isinstance(c, dict) and isinstance(c.get('input'), str) and
      isinstance(c.get('output'), str) for c in cases):
    raise V.ItemError(V.INVALID_INPUT, 'io_cases: expected [{"input": str, "output": str}]')
  if not tests and not cases:
    raise V.ItemError(V.INVALID_INPUT, 'need tests or io_cases')
  return tests, cases


@V.verifier
def verify_python_tests(item: Mapping[str, Any]) -> V.Verdict:
  """Item: completion, tests and/or io_cases; optional partial_credit, cpu_s."""
  text = V.completion_text(item)
  tests, cases = _tests(item)
  code = extract_code(text)
  if not code:
    return V.failure(V.PARSE_FAILURE, 'no code')
  cpu_s = V.option(item, 'cpu_s', LIMITS.cpu_s, int)
  limits = sandbox.Limits(**{**LIMITS.__dict__, 'cpu_s': cpu_s, 'wall_s': cpu_s + 3.0})
  nonce = secrets.token_hex(16)
  spec = json.dumps({'solution': code, 'tests': tests, 'io_cases': cases})
  result = sandbox.run_python(_RUNNER, files={'tests.json': spec}, limits=limits,
                              stdin=nonce + '\n')
  if result.status == 'timeout':
    return V.failure(V.TIMEOUT, result.detail)
  if result.status in ('violation', 'memory'):
    return V.failure(V.SANDBOX_VIOLATION, f'{result.status}: {result.detail}')
  report = None
  for line in result.stdout.splitlines():
    if line.startswith(nonce + ' '):
      report = json.loads(line[len(nonce) + 1:])
  if report is None:
    return V.judged(False, detail=f'no test report ({result.detail}): {result.stderr[-200:]}')
  if 'compile_error' in report:
    return V.failure(V.PARSE_FAILURE, f'SyntaxError: {report["compile_error"]}')
  passed, total = report['passed'], report['total']
  rate = passed / total if total else 0.0
  partial = V.option(item, 'partial_credit', False, bool)
  return V.judged(passed == total, reward=rate if partial else float(passed == total),
                  components={'pass_rate': rate},
                  detail=f'{passed}/{total} passed {report["failures"]}')
