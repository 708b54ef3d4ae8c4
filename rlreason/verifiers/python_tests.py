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
  * tests: test_probes.py judges each assert expression in a trusted child process of
    this one (a CPU, memory and wall budget: a check on a huge value is a timeout, never a
    hang), with its own builtins and modules. Only names the solution defines run in the
    sandbox: their calls, on arguments evaluated in the child, are replayed there as ops
    whose results come back as plain data (or opaque: a solution object, which can be
    called but never compared or asked a plain-data question). A probe that raised
    (SystemExit included) or never reported fails its test.
  So ending the process early loses tests, forging the report line only claims values the
  solution could have returned, reading the harness's frames or stdin finds no expected
  value, shadowing a builtin or a module changes nothing judged, and objects whose
  comparisons or methods lie are never asked.
test_mode='in_process' runs free-form test code (loops, `def check(candidate)`) inside the
solution's process and trusts its report: a solution that introspects the interpreter can
forge it. Use it for trusted evaluation only, never as an RL reward; an isolated item
whose tests cannot be split is invalid_input, naming the test.

The code is the last ```python (or ```) fenced block, else the whole completion. It runs
with the standard library only (python -I -S).

Outcomes: correct (all pass); wrong (some fail); parse_failure (no code, or a SyntaxError);
timeout (also the trusted checks' budget); sandbox_violation (a sandbox rule, the memory or
the file-size limit); invalid_input (no tests, a test that cannot be split, a bad option);
crash (anything unforeseen, never an exception). Not here: other languages, or pass@k.
"""

import inspect
import json
import math
import secrets
import time
from typing import Any, Mapping

from rlreason.verifiers import plain_data
from rlreason.verifiers import sandbox
from rlreason.verifiers import test_probes
from rlreason.verifiers import trusted_checks
from rlreason.verifiers import verdict as V

LIMITS = sandbox.Limits(cpu_s=3, wall_s=6.0)
MAX_CPU_S = 600
_COLLECT_S = 2.0  # sandbox.run reads a run's pipes this long past its wall clock.
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

# Replays the ops of test_probes' trusted evaluator in the solution's namespace: a global's
# value, a call (arguments: plain data, or an earlier op's result), a non-plain attribute.
# One record per op: its result as plain data, `opaque` (not plain data: it stays here and
# can only be used by later ops), or the error it raised.
_OP_RUNNER = _PREAMBLE + inspect.getsource(plain_data) + r'''
def quiet(fn, *args, **kwargs):
  with contextlib.redirect_stdout(Capped()):
    return fn(*args, **kwargs)

FAILED = object()
results = []

def argument(a):
  if 'ref' not in a:
    return decode_value(a['v'])
  value = results[a['ref']]
  if value is FAILED:
    raise RuntimeError('an argument is a result that failed')
  try:
    return decode_value(encode_value(value))  # the plain copy the trusted side sees.
  except (TypeError, ValueError):
    return value  # the solution's own object.

namespace = {'__name__': 'solution'}
try:
  quiet(exec, code, namespace)
except BaseException as e:
  if fatal(e):
    raise
  send(solution_error=described(e))
for i, op in enumerate(spec['ops']):
  value = FAILED
  try:
    if op['kind'] == 'global':
      if op['name'] not in namespace:
        raise NameError('name ' + repr(op['name']) + ' is not defined')
      value = namespace[op['name']]
    else:
      target = results[op['target']]
      if target is FAILED:
        raise RuntimeError('it uses a result that failed')
      if op['kind'] == 'getattr':
        value = quiet(getattr, target, op['name'])
      else:
        value = quiet(target, *[argument(a) for a in op['args']],
                      **{k: argument(a) for k, a in op['kwargs']})
    try:
      send(i=i, value=encode_value(value))
    except TypeError:
      send(i=i, opaque=True)
  except BaseException as e:
    if fatal(e):
      raise
    send(i=i, error=described(e))
  results.append(value)
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


def _run_ops(code: str, ops: list, keys: list[str], results: dict[str, list],
             limits: sandbox.Limits, deadline: float) -> tuple[V.Verdict | None, list]:
  """One sandboxed run replays `ops`; each result lands in `results` (the first one wins)."""
  remaining = deadline - time.monotonic() - _COLLECT_S
  if remaining < 0.5:
    return V.failure(V.TIMEOUT, f'the item ran past its budget ({limits.wall_s:g}s)'), []
  limits = sandbox.Limits(**{**limits.__dict__, 'wall_s': min(limits.wall_s, remaining),
                             'cpu_s': max(1, min(limits.cpu_s, math.ceil(remaining)))})
  tag = secrets.token_hex(8)
  result = sandbox.run_python(_OP_RUNNER, limits=limits,
                              stdin=json.dumps({'solution': code, 'ops': ops, 'tag': tag}))
  failed = _sandbox_failure(result)
  if failed:
    return failed, []
  got, notes = {}, []
  for record in _records(result.stdout, tag):
    if 'compile_error' in record:
      return V.failure(V.PARSE_FAILURE, f'SyntaxError: {record["compile_error"]}'), []
    if 'solution_error' in record:
      notes = [f'solution raised {str(record["solution_error"])[:150]}']
    i = record.get('i')
    if type(i) is not int or not 0 <= i < len(ops) or i in got:  # the first record counts.
      continue
    if 'value' in record:
      got[i] = ['value', record['value']]
    elif record.get('opaque') is True:
      got[i] = ['opaque']
    else:
      got[i] = ['error', str(record.get('error', 'no value'))[:150]]
  ended = ['error', f'no result (the run ended early: {result.detail or result.status} '
                    f'{result.stderr[-100:]})']
  for i, key in enumerate(keys):
    results.setdefault(key, got.get(i, ended))
  return None, notes


def _run_probes(code: str, tests: list[str], limits: sandbox.Limits
                ) -> tuple[V.Verdict | None, list[bool], list]:
  """Judges the tests in test_probes' trusted child; runs the solution's calls in sandboxed
  rounds until every test is decided (or MAX_ROUNDS), all by the item's deadline."""
  deadline = time.monotonic() + limits.wall_s + _COLLECT_S
  for number, test in enumerate(tests):
    try:
      test_probes.parse_test(test)
    except test_probes.Unsupported as e:
      raise V.ItemError(V.INVALID_INPUT, f'tests[{number}] {test[:80]!r} cannot be checked '
                        f"outside the solution's process: {e}; test_mode='in_process' runs "
                        'it as trusted code') from None
  results, notes = {}, []
  try:
    with trusted_checks.TrustedChecks(deadline=deadline) as checks:
      for rounds in range(test_probes.MAX_ROUNDS + 1):
        outcomes = (reply := checks.evaluate(tests, code, results))['outcomes']
        if rounds and (rounds == test_probes.MAX_ROUNDS or
                       all(o[0] != 'pending' for o in outcomes)):
          break
        failed, notes = _run_ops(code, reply['ops'], reply['keys'], results, limits, deadline)
        if failed:
          return failed, [], []
  except trusted_checks.OutOfTime as e:
    return V.failure(V.TIMEOUT, f'trusted checks: {e}'), [], []
  failures = [(test[:100], f'undecided after {rounds} runs' if o[0] == 'pending' else o[1])
              for test, o in zip(tests, outcomes) if o[0] != 'pass']
  return None, [o[0] == 'pass' for o in outcomes], notes + failures


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
  """Item: completion, tests and/or io_cases; optional partial_credit, cpu_s, test_mode.

  Never raises: a malformed item is invalid_input, anything unforeseen a crash verdict."""
  try:
    return _verify(item)
  except (V.ItemError, RecursionError):
    raise  # V.verifier turns these into verdicts.
  except Exception as e:  # pylint: disable=broad-except
    return V.failure(V.CRASH, f'python_tests: {type(e).__name__}: {e}')


def _verify(item: Mapping[str, Any]) -> V.Verdict:
  text = V.completion_text(item)
  tests, cases = _tests(item)
  mode = V.option(item, 'test_mode', 'isolated', str)
  if mode not in MODES:
    raise V.ItemError(V.INVALID_INPUT, f'test_mode: {mode!r}, expected one of {MODES}')
  cpu_s = V.positive_option(item, 'cpu_s', LIMITS.cpu_s, int)
  if cpu_s > MAX_CPU_S:
    raise V.ItemError(V.INVALID_INPUT, f'cpu_s: {cpu_s} is over {MAX_CPU_S}')
  partial = V.option(item, 'partial_credit', False, bool)
  code = extract_code(text)
  if not code:
    return V.failure(V.PARSE_FAILURE, 'no code')
  try:
    compile(code, 'solution.py', 'exec')
  except (SyntaxError, ValueError) as e:
    return V.failure(V.PARSE_FAILURE, f'SyntaxError: {e}')
  limits = sandbox.Limits(**{**LIMITS.__dict__, 'cpu_s': cpu_s, 'wall_s': cpu_s + 3.0})
  passed, failures, runs = [], [], []
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
  return V.judged(all(passed), reward=rate if partial else float(all(passed)),
                  components={'pass_rate': rate},
                  detail=f'{sum(passed)}/{len(passed)} passed {failures[:3]}')
