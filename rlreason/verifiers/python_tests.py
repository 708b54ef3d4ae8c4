"""`python_tests`: run model-written Python against unit tests, inside the sandbox.

Item: completion, and tests and/or io_cases:
  tests      assert statements (a list of strings, or one string of code; each string is one
             test) on the functions the solution defines (MBPP style);
  io_cases   [{"input": str, "output": str}, ...]: the solution runs as a script with that
             stdin; its stdout must equal `output` up to whitespace (APPS style).
Options: partial_credit (reward = pass fraction instead of all-or-nothing), cpu_s (> 0),
test_mode ('isolated', the default, or 'in_process').

Verdicts the solution cannot forge (test_mode='isolated'). Nothing the sandboxed process
can write decides a test on its own:
  * io_cases: one sandboxed run executes the script once per case on that case's input
    (the inputs arrive on a stdin pipe that is closed after use) and sends back each run's
    stdout; this process compares it with the expected output, which never enters the
    sandbox. A case whose output did not arrive, or whose run raised (sys.exit(0) aside),
    fails.
  * tests: test_probes.py splits each assert into probes (the solution's calls with their
    arguments) and checks (the comparisons, with the expected values). One sandboxed run
    evaluates the probes in the solution's namespace and returns their values as plain
    data; this process decodes them and evaluates the checks. A test counts only if every
    probe's value arrived; a probe that raised (SystemExit included) fails its test.
  So ending the process early loses tests, forging the report line only claims values the
  solution could have returned, reading the harness's frames or stdin finds no expected
  value, and objects whose comparisons always succeed cannot cross as plain data.
test_mode='in_process' runs free-form test code (loops, `def check(candidate)`) inside the
solution's process and trusts its report: a solution that introspects the interpreter can
forge it. Use it for trusted evaluation only, never as an RL reward; an isolated item
whose tests cannot be split is invalid_input, naming the test.

The code is the last ```python (or ```) fenced block, else the whole completion. It runs
with the standard library only (python -I -S).

Outcomes: correct (all pass); wrong (some fail); parse_failure (no code, or a SyntaxError);
timeout; sandbox_violation (a sandbox rule, the memory or the file-size limit);
invalid_input (no tests, a test that cannot be split, a bad option). Not here: other
languages, or pass@k.
"""

import inspect
import json
import secrets
from typing import Any, Mapping

from rlreason.verifiers import sandbox
from rlreason.verifiers import test_probes
from rlreason.verifiers import verdict as V

LIMITS = sandbox.Limits(cpu_s=3, wall_s=6.0)
MODES = ('isolated', 'in_process')
_CODE_TAGS = ('', 'python', 'py', 'python3')

# Every runner starts here: the spec from the stdin pipe (then closed), the solution
# compiled, `send` for tagged records, `fatal` for the limits the sandbox reports itself.
# The tag is not a secret that protects anything (the solution can read it): it only keeps
# the solution's own prints from being parsed as records.
_PREAMBLE = r'''
import contextlib, errno, io, json, os, sys
spec = json.loads(sys.stdin.read())
sys.stdin.close()
os.dup2(os.open(os.devnull, os.O_RDONLY), 0)
out = os.dup(1)

def send(**fields):
  os.write(out, ('\n' + spec['tag'] + ' ' + json.dumps(fields) + '\n').encode())

def fatal(e):
  # Resource limits end the run (the sandbox reports them); they are not test failures.
  return isinstance(e, MemoryError) or (isinstance(e, OSError) and e.errno == errno.EFBIG)

def described(e):
  return (type(e).__name__ + ': ' + str(e))[:200]

class Capped(io.StringIO):
  def write(self, s):
    return super().write(s) if self.tell() < 1 << 20 else len(s)

try:
  code = compile(spec['solution'], 'solution.py', 'exec')
except (SyntaxError, ValueError) as e:
  send(compile_error=str(e)[:300])
  sys.exit(0)
'''

# Evaluates the probes in the solution's namespace; one record per probe.
_PROBE_RUNNER = _PREAMBLE + inspect.getsource(test_probes.encode_value) + r'''
def quiet(fn, *args):
  with contextlib.redirect_stdout(Capped()):
    return fn(*args)

namespace = {'__name__': 'solution'}
try:
  quiet(exec, code, namespace)
except BaseException as e:
  if fatal(e):
    raise
  send(solution_error=described(e))
for i, source in enumerate(spec['probes']):
  try:
    send(i=i, value=encode_value(quiet(eval, compile(source, 'probe', 'eval'), namespace)))
  except BaseException as e:
    if fatal(e):
      raise
    send(i=i, error=described(e))
'''

# Runs the script once per io case, in a fresh namespace, and sends back what it printed.
_IO_RUNNER = _PREAMBLE + r'''
for i, stdin in enumerate(spec['inputs']):
  sys.stdin = io.StringIO(stdin)
  buf, error = Capped(), None
  with contextlib.redirect_stdout(buf):
    try:
      exec(code, {'__name__': '__main__'})
    except SystemExit as e:
      if e.code not in (None, 0):
        error = 'exit code ' + str(e.code)[:50]
    except BaseException as e:
      if fatal(e):
        raise
      error = described(e)
  send(i=i, stdout=buf.getvalue(), error=error)
'''

# test_mode='in_process': free-form tests in the solution's namespace (trusted; see above).
_IN_PROCESS_RUNNER = _PREAMBLE + r'''
namespace = {'__name__': 'solution'}
passed, failures = 0, []
with contextlib.redirect_stdout(Capped()):
  try:
    exec(code, namespace)
  except BaseException as e:
    if fatal(e):
      raise
    failures.append('solution raised ' + described(e))
  for test in spec['tests']:
    try:
      exec(compile(test, 'test', 'exec'), namespace)
      passed += 1
    except BaseException as e:
      if fatal(e):
        raise
      failures.append((test[:100], described(e)[:100]))
send(passed=passed, failures=failures[:3])
'''


def extract_code(text: str) -> str:
  """The last ```python / ``` fenced block, else the whole text (a linear scan, no regex)."""
  parts = text.split('```')
  blocks, i = [], 1
  while i < len(parts) - 1:  # parts[i] follows an opening fence; parts[i + 1] its closing one.
    head, newline, body = parts[i].partition('\n')
    if newline and head.strip().lower() in _CODE_TAGS:
      blocks.append(body)
    i += 2
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


def _records(stdout: str, tag: str) -> list[dict]:
  records = []
  for line in stdout.splitlines():
    if line.startswith(tag + ' '):
      try:
        record = json.loads(line[len(tag) + 1:])
      except (ValueError, RecursionError):
        continue
      if isinstance(record, dict):
        records.append(record)
  return records


def _sandbox_failure(result: sandbox.SandboxResult) -> V.Verdict | None:
  if result.status == 'timeout':
    return V.failure(V.TIMEOUT, result.detail)
  if result.status in ('violation', 'memory'):
    return V.failure(V.SANDBOX_VIOLATION, f'{result.status}: {result.detail}')
  if result.status == 'refused':
    return V.failure(V.CRASH, result.detail)
  return None


def _run_probes(code: str, tests: list[str], limits: sandbox.Limits
                ) -> tuple[V.Verdict | None, list[bool], list]:
  """Splits the tests, runs their probes in one sandbox, checks the values here."""
  splits = []
  for number, test in enumerate(tests):
    try:
      splits.append(test_probes.split_test(test))
    except test_probes.Unsupported as e:
      raise V.ItemError(V.INVALID_INPUT, f'tests[{number}] {test[:80]!r} cannot be checked '
                        f"outside the solution's process: {e}; test_mode='in_process' runs "
                        'it as trusted code') from None
  sources = [p for s in splits for p in s.probes]
  tag = secrets.token_hex(8)
  spec = json.dumps({'solution': code, 'probes': sources, 'tag': tag})
  result = sandbox.run_python(_PROBE_RUNNER, limits=limits, stdin=spec)
  failed = _sandbox_failure(result)
  if failed:
    return failed, [], []
  values, errors, raised = {}, {}, []
  for record in _records(result.stdout, tag):
    if 'compile_error' in record:
      return V.failure(V.PARSE_FAILURE, f'SyntaxError: {record["compile_error"]}'), [], []
    if 'solution_error' in record:
      raised = [f'solution raised {str(record["solution_error"])[:150]}']
    i = record.get('i')
    if not isinstance(i, int) or i in values or i in errors:
      continue  # the first record of a probe counts.
    try:
      values[i] = test_probes.decode_value(record['value'])
    except (KeyError, ValueError, TypeError, RecursionError):
      errors[i] = str(record.get('error', 'no value'))[:100]
  passed, failures, offset = [], [], 0
  for test, split in zip(tests, splits):
    ids = range(offset, offset + len(split.probes))
    offset += len(split.probes)
    missing = [i for i in ids if i not in values]
    ok = not missing and all(test_probes.run_check(check, [values[i] for i in ids])
                             for check in split.checks)
    passed.append(ok)
    if not ok:
      why = errors.get(missing[0], 'no result (the run ended early)') if missing else 'false'
      failures.append((test[:100], why))
  if not values and not errors and result.status != 'ok':
    raised.append(f'run ended: {result.detail} {result.stderr[-150:]}')
  return None, passed, raised + failures


def _run_in_process(code: str, tests: list[str], limits: sandbox.Limits
                    ) -> tuple[V.Verdict | None, list[bool], list]:
  tag = secrets.token_hex(16)
  result = sandbox.run_python(_IN_PROCESS_RUNNER, limits=limits,
                              stdin=json.dumps({'solution': code, 'tests': tests, 'tag': tag}))
  failed = _sandbox_failure(result)
  if failed:
    return failed, [], []
  records = _records(result.stdout, tag)
  if records and 'compile_error' in records[-1]:
    return V.failure(V.PARSE_FAILURE, f'SyntaxError: {records[-1]["compile_error"]}'), [], []
  passed = records[-1].get('passed') if records else None
  if not isinstance(passed, int):
    return None, [False] * len(tests), [f'no test report ({result.detail})']
  passed = min(max(passed, 0), len(tests))
  return None, [True] * passed + [False] * (len(tests) - passed), records[-1].get('failures', [])


def _run_io_cases(code: str, cases: list[dict[str, str]], limits: sandbox.Limits
                  ) -> tuple[V.Verdict | None, list[bool], list]:
  """One sandboxed run prints every case's output; the outputs are compared here."""
  tag = secrets.token_hex(8)
  spec = json.dumps({'solution': code, 'inputs': [c['input'] for c in cases], 'tag': tag})
  room = 2 * sum(len(c['output']) + 200 for c in cases)  # the outputs travel back as records.
  limits = sandbox.Limits(**{**limits.__dict__, 'output_bytes': limits.output_bytes + room})
  result = sandbox.run_python(_IO_RUNNER, limits=limits, stdin=spec)
  failed = _sandbox_failure(result)
  if failed:
    return failed, [], []
  outputs = {}
  for record in _records(result.stdout, tag):
    i = record.get('i')
    if isinstance(i, int) and i not in outputs:  # the first record of a case counts.
      outputs[i] = record
  passed, failures = [], []
  for i, case in enumerate(cases):
    record = outputs.get(i, {'error': f'no output (the run ended early: {result.detail})'})
    got = record.get('stdout')
    ok = record.get('error') is None and isinstance(got, str) and (
        got.split() == case['output'].split())
    passed.append(ok)
    if not ok:
      failures.append((case['input'][:50], str(record.get('error') or got)[:50]))
  return None, passed, failures


@V.verifier
def verify_python_tests(item: Mapping[str, Any]) -> V.Verdict:
  """Item: completion, tests and/or io_cases; optional partial_credit, cpu_s, test_mode."""
  text = V.completion_text(item)
  tests, cases = _tests(item)
  mode = V.option(item, 'test_mode', 'isolated', str)
  if mode not in MODES:
    raise V.ItemError(V.INVALID_INPUT, f'test_mode: {mode!r}, expected one of {MODES}')
  cpu_s = V.positive_option(item, 'cpu_s', LIMITS.cpu_s, int)
  code = extract_code(text)
  if not code:
    return V.failure(V.PARSE_FAILURE, 'no code')
  try:
    compile(code, 'solution.py', 'exec')
  except (SyntaxError, ValueError) as e:
    return V.failure(V.PARSE_FAILURE, f'SyntaxError: {e}')
  limits = sandbox.Limits(**{**LIMITS.__dict__, 'cpu_s': cpu_s, 'wall_s': cpu_s + 3.0})
  passed, failures = [], []
  runs = []
  if tests:
    runs.append((_run_probes if mode == 'isolated' else _run_in_process, tests))
  if cases:
    runs.append((_run_io_cases, cases))
  for run, what in runs:
    failed, ok, why = run(code, what, limits)
    if failed:
      return failed
    passed += ok
    failures += why
  rate = sum(passed) / len(passed)
  partial = V.option(item, 'partial_credit', False, bool)
  return V.judged(all(passed), reward=rate if partial else float(all(passed)),
                  components={'pass_rate': rate},
                  detail=f'{sum(passed)}/{len(passed)} passed {failures[:3]}')
