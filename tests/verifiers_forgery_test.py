"""Solutions that try to earn a test's reward without solving it, or to read the host.

Each attack runs through the direct call, the pool and the offline CLI, and must score 0,
leave no file outside its sandbox and no process behind. The attack classes: ending the
process or a test's frame early, reading a harness channel back (stdin, files, the report
line), walking the harness's frames and globals, returning objects whose comparisons lie,
and reading the project's, the shared data's or other processes' files.
"""

import json
import os
import pathlib
import subprocess
import sys
import tempfile
import uuid

import pytest

import rlreason
from rlreason.verifiers import pool as pool_lib
from rlreason.verifiers import python_tests
from rlreason.verifiers import sandbox
from rlreason.verifiers import test_probes
from rlreason.verifiers import verdict as V

from verifiers_adversarial_test import sandbox_dirs
from verifiers_adversarial_test import sandbox_processes

ADD = ['assert add(1, 2) == 3', 'assert add(-1, 1) == 0']
SENTINEL = 'EXPECTED-SENTINEL-' + '5172'
PROJECT = pathlib.Path(rlreason.__file__).resolve().parents[1]
SHARED = PROJECT.parent / 'shared' / 'design.md'
OUTSIDE = pathlib.Path(tempfile.gettempdir()) / f'rlreason-forgery-{uuid.uuid4().hex}'

# Looks everywhere a solution can reach for the sentinel: the frames above it and their
# globals, every loaded module, stdin (seeking back), the files in its directory, its fds.
_SEARCH = r'''
import os, sys
def _search():
  seen = []
  frame = sys._getframe()
  while frame is not None:
    for scope in (frame.f_globals, frame.f_locals):
      seen.append(repr(scope))
    frame = frame.f_back
  for module in list(sys.modules.values()):
    seen.append(repr(getattr(module, '__dict__', {})))
  for fd in range(0, 64):
    try:
      os.lseek(fd, 0, 0)
      seen.append(os.read(fd, 1 << 20).decode('utf-8', 'replace'))
    except OSError:
      pass
  for name in os.listdir('.'):
    try:
      seen.append(open(name, errors='replace').read())
    except OSError:
      pass
  text = ' '.join(seen)
  at = text.find('EXPECTED-SENTINEL-' + '5')
  return text[at:at + 22] if at >= 0 else 'not found'
'''

ATTACKS = {
    # name: (item fields besides the completion, solution code)
    'exit_at_import': ({}, 'import os\nos._exit(0)'),
    'sys_exit_in_a_test': ({}, 'import sys\ndef add(a, b):\n  sys.exit(0)'),
    'raise_system_exit': ({}, 'def add(a, b):\n  raise SystemExit(0)'),
    'keyboard_interrupt': ({}, 'def add(a, b):\n  raise KeyboardInterrupt'),
    'kill_itself': ({}, 'import os, signal\ndef add(a, b):\n  os.kill(os.getpid(), 9)'),
    'close_report_fds': ({}, 'import os\nfor fd in range(1, 64):\n  try:\n    os.close(fd)\n'
                             '  except OSError:\n    pass\ndef add(a, b):\n  return 3'),
    'old_report_line': ({}, 'import sys\nline = sys.stdin.readline()\n'
                            'print(line.strip() + " " + \'{"passed": 2, "total": 2, '
                            '"failures": []}\')\ndef add(a, b):\n  return 3'),
    'frames_and_globals': ({'tests': [f'assert add(1, 2) == {SENTINEL!r}']},
                           _SEARCH + 'def add(a, b):\n  return _search()'),
    'forge_records_from_frames': ({}, (
        'import sys, json\n'
        'def add(a, b):\n'
        '  f = sys._getframe()\n'
        '  while f is not None:\n'
        '    g = f.f_globals\n'
        '    if "send" in g and "spec" in g:\n'
        '      for i in range(len(g["spec"]["probes"])):\n'
        '        g["send"](i=i, value=True)\n'
        '        g["send"](i=i, value={"int": "3"})\n'
        '      g["send"](passed=2, total=2, failures=[])\n'
        '    f = f.f_back\n'
        '  return 3\n')),
    'patched_encoder': ({}, ('import json\n_dumps = json.dumps\n'
                             'json.dumps = lambda *a, **k: _dumps({"i": 0, "value": True})\n'
                             'def add(a, b):\n  return 3')),
    'always_equal': ({}, ('class A:\n  def __eq__(self, other): return True\n'
                          '  def __ne__(self, other): return False\n  __hash__ = None\n'
                          'def add(a, b):\n  return A()')),
    'int_subclass': ({}, ('class I(int):\n  def __eq__(self, other): return True\n'
                          '  __hash__ = int.__hash__\ndef add(a, b):\n  return I(7)')),
    'fake_class': ({}, ('class F:\n  __class__ = int\n  def __eq__(self, other): return True\n'
                        '  def __index__(self): return 3\ndef add(a, b):\n  return F()')),
    'lying_list': ({'tests': ['assert add([1], [2]) == [1, 2]']},
                   ('class L(list):\n  def __eq__(self, other): return True\n'
                    '  def __iter__(self): return iter([1, 2])\n'
                    'def add(a, b):\n  return L([9])')),
    'gc_switches_hook_off': ({}, ('import gc\nfor o in gc.get_objects():\n'
                                  '  if type(o) is list and o == [False]:\n    o[0] = True\n'
                                  'import os\nos.fork()\ndef add(a, b):\n  return a + b')),
    'io_exit_early': ({'tests': None, 'io_cases': [{'input': '1 2', 'output': '3'}]},
                      'import os\nos._exit(0)'),
    'io_reads_expected': ({'tests': None, 'io_cases': [{'input': '1 2', 'output': SENTINEL}]},
                          _SEARCH + 'print(_search())'),
    'read_project_file': ({'tests': ['assert add(1, 2) == 1']},
                          f'def add(a, b):\n  return len(open({str(PROJECT / "setup.py")!r})'
                          '.read()) > 0'),
    'read_shared_data': ({'tests': ['assert add(1, 2) == 1']},
                         f'def add(a, b):\n  return len(open({str(SHARED)!r}).read()) > 0'),
    'read_parent_cmdline': ({'tests': ['assert add(1, 2) == 1']},
                            f'def add(a, b):\n  return len(open("/proc/{os.getpid()}/cmdline")'
                            '.read()) > 0'),
    'write_outside': ({}, f'open({str(OUTSIDE)!r}, "w").write("x")\n'
                          'def add(a, b):\n  return a + b'),
    # C code creating files: os.mkfifo raises no audit event, so only the OS layer stops it.
    'mkfifo_outside': ({}, f'import os\nos.mkfifo({str(OUTSIDE)!r})\n'
                           'def add(a, b):\n  return a + b'),
    'sqlite_outside': ({}, f'import sqlite3\nsqlite3.connect({str(OUTSIDE)!r}).execute('
                           '"create table t (x)")\ndef add(a, b):\n  return a + b'),
}


def item(name):
  fields, code = ATTACKS[name]
  out = {'completion': f'```python\n{code}\n```', 'tests': ADD, 'cpu_s': 2, **fields}
  return {k: v for k, v in out.items() if v is not None}


def test_a_real_solution_passes_every_form():
  good = {'completion': 'def add(a, b):\n  return a + b', 'tests': ADD}
  assert python_tests.verify_python_tests(good).reward == 1.0
  io = {'completion': 'a, b = map(int, input().split())\nprint(a + b)',
        'io_cases': [{'input': '1 2', 'output': '3'}, {'input': '5 5', 'output': '10'}]}
  assert python_tests.verify_python_tests(io).reward == 1.0


@pytest.mark.parametrize('name', sorted(ATTACKS))
def test_direct_call_scores_zero(name):
  before = set(sandbox_dirs())
  verdict = python_tests.verify_python_tests(item(name))
  assert verdict.reward == 0.0, (name, verdict)
  assert verdict.status != V.CORRECT
  assert not OUTSIDE.exists()
  assert not sandbox_processes() and set(sandbox_dirs()) <= before


@pytest.fixture(scope='module')
def pool():
  with pool_lib.VerifierPool(num_workers=2, item_timeout_s=30, default_reward=0.0) as p:
    yield p


def test_pool_scores_zero(pool):
  names = sorted(ATTACKS)
  verdicts = pool.score([item(n) for n in names], verifier='python_tests', deadline_s=120)
  assert {n: v.reward for n, v in zip(names, verdicts)} == {n: 0.0 for n in names}, [
      (n, v.status, v.detail) for n, v in zip(names, verdicts) if v.reward]
  assert not OUTSIDE.exists() and not sandbox_processes()


def test_cli_scores_zero(tmp_path):
  names = sorted(ATTACKS)
  source = tmp_path / 'in.jsonl'
  source.write_text(''.join(json.dumps(item(n)) + '\n' for n in names))
  out = tmp_path / 'out.jsonl'
  run = subprocess.run([sys.executable, '-m', 'rlreason.verifiers', 'score', '--verifier',
                        'python_tests', '--input', str(source), '--output', str(out),
                        '--item-timeout-s', '30'], capture_output=True, text=True, timeout=300)
  assert run.returncode == 0, run.stderr
  rewards = [json.loads(line)['reward'] for line in out.read_text().splitlines()]
  assert dict(zip(names, rewards)) == {n: 0.0 for n in names}
  assert not OUTSIDE.exists() and not sandbox_processes()


@pytest.mark.parametrize('test, calls', [
    ('assert f(1) == 2', [('f', [1])]),
    ('assert abs(f(2.0) - 1.41) < 1e-2', [('f', [2.0])]),
    ('import math\nassert math.isclose(g(1), 0.5)\nassert not h()', [('g', [1])]),
    ('assert set(f([1, 2])) == {1, 2}', [('f', [[1, 2]])]),
    ('assert [f(i) for i in range(3)] == [0, 1, 4]', [('f', [0]), ('f', [1]), ('f', [2])]),
    ('assert sorted(f(7), key=lambda t: t[1]) == []', [('f', [7])]),
])
def test_the_sandbox_gets_the_calls_and_their_arguments_only(test, calls):
  # The first pass knows no result yet: it records the solution's calls (the name looked up,
  # then called on arguments evaluated here) and stops at the first value it needs.
  reply = test_probes.evaluate([test], 'def f(x):\n  return x\ng = h = f', {})
  names = {i: op['name'] for i, op in enumerate(reply['ops']) if op['kind'] == 'global'}
  got = [(names[op['target']], [test_probes.decode_value(a['v']) for a in op['args']])
         for op in reply['ops'] if op['kind'] == 'call']
  assert got == calls and reply['outcomes'] == [['pending', '']]


@pytest.mark.parametrize('test, why', [
    ('x = f(1)\nassert x == 2', 'Assign'),
    ('assert f.__class__ == int', 'attribute'),
    ('import os\nassert f(1)', 'import'),
    ('for i in range(3):\n  assert f(i)', 'For'),
    ('def check(candidate):\n  assert candidate(1) == 2', 'FunctionDef'),
    ('assert (1).__class__ == int', 'attribute'),
    ('f(1)', 'Expr'),
])
def test_tests_that_cannot_be_split_are_named(test, why):
  with pytest.raises(test_probes.Unsupported, match=why):
    test_probes.parse_test(test)
  verdict = python_tests.verify_python_tests({'completion': 'def f(x):\n  return x',
                                              'tests': [test]})
  assert verdict.status == V.INVALID_INPUT and 'in_process' in verdict.detail


def test_in_process_mode_runs_free_form_tests():
  code = 'def add(a, b):\n  return a + b'
  tests = ['for i in range(3):\n  assert add(i, i) == 2 * i',
           'def check(candidate):\n  assert candidate(2, 2) == 4\ncheck(add)']
  verdict = python_tests.verify_python_tests({'completion': code, 'tests': tests,
                                              'test_mode': 'in_process'})
  assert verdict.status == V.CORRECT
  bad = python_tests.verify_python_tests({'completion': 'def add(a, b):\n  raise SystemExit',
                                          'tests': tests, 'test_mode': 'in_process'})
  assert bad.reward == 0.0


@pytest.mark.parametrize('value', [
    None, True, 0, -3, 2 ** 100, 1.5, float('inf'), 1 + 2j, 'é\n', b'\x00\xff', [1, [2]],
    (1, (2, 'a')), {1, 2}, frozenset({3}), {'a': [1], 2: (3,)}, []])
def test_plain_values_cross_unchanged(value):
  decoded = test_probes.decode_value(json.loads(json.dumps(test_probes.encode_value(value))))
  assert decoded == value and type(decoded) is type(value)


def test_objects_that_are_not_plain_data_cannot_cross():
  class Lying(list):
    def __iter__(self):
      return iter([1, 2])
  assert test_probes.encode_value(Lying([9])) == [{'int': '9'}]  # the stored data, not the lie
  for value in (object(), iter([1]), type('F', (), {'__class__': int})()):
    with pytest.raises(TypeError):
      test_probes.encode_value(value)
  nested = []
  nested.append(nested)
  with pytest.raises(ValueError):
    test_probes.encode_value(nested)


@pytest.mark.parametrize('cpu_s', [0, -1])
def test_a_zero_or_negative_cpu_budget_is_invalid_input(cpu_s):
  verdict = python_tests.verify_python_tests({'completion': 'def add(a, b):\n  return a + b',
                                              'tests': ADD, 'cpu_s': cpu_s})
  assert verdict.status == V.INVALID_INPUT and 'cpu_s' in verdict.detail
