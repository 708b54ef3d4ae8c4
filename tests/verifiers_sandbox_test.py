"""The sandbox (statuses, limits, cleanup) and the `python_tests` verifier on top of it."""

import os
import pathlib
import tempfile

import pytest

from rlreason.verifiers import python_tests
from rlreason.verifiers import sandbox
from rlreason.verifiers import verdict as V

FAST = sandbox.Limits(cpu_s=1, wall_s=3.0)


def leftovers():
  # Only this process's: other test processes may be running sandboxes right now.
  return list(pathlib.Path(tempfile.gettempdir()).glob(f'rlreason-sandbox-{os.getpid()}-*'))


@pytest.mark.parametrize('code, status, detail', [
    ('print(6 * 7)', 'ok', ''),
    ('while True: pass', 'timeout', 'CPU'),
    ('import time; time.sleep(60)', 'timeout', 'wall'),
    ('x = bytearray(1 << 34)', 'memory', 'address space'),
    ('import os; os.fork()', 'violation', 'os.fork'),
    ('import socket; socket.socket()', 'violation', 'socket'),
    ('open("/tmp/rlreason-sandbox-escape", "w")', 'violation', 'write'),
    ('open("f", "w").write("x" * (4 << 20))', 'violation', 'file size'),
    ('import sys; sys.exit(3)', 'error', 'exit code 3'),
    ('raise ValueError("no")', 'error', 'exit code 1'),
])
def test_statuses(code, status, detail):
  result = sandbox.run_python(code, limits=FAST)
  assert (result.status, detail in result.detail) == (status, True), result
  assert not leftovers() and not os.path.exists('/tmp/rlreason-sandbox-escape')


def test_files_stdin_cwd_and_output_cap():
  result = sandbox.run_python(
      'import os, sys\nprint(open("data.txt").read(), sys.stdin.read(), os.getcwd() == os.environ["HOME"])\n'
      'print("x" * 100000)', files={'data.txt': 'hello'}, stdin='from stdin',
      limits=sandbox.Limits(output_bytes=1000))
  assert result.status == 'ok' and result.truncated
  assert result.stdout.startswith('hello from stdin True\n') and len(result.stdout) == 1000


def test_private_directory_is_private_and_removed():
  code = 'import os\nopen("mine.txt", "w").write("x")\nprint(os.getcwd())'
  first = sandbox.run_python(code).stdout.strip()
  second = sandbox.run_python('import os; print(os.listdir("."))').stdout
  assert 'mine.txt' not in second and not os.path.exists(first)


def test_file_names_must_stay_inside():
  with pytest.raises(ValueError, match='inside'):
    sandbox.run_python('pass', files={'../escape.txt': 'x'})
  assert not leftovers()


@pytest.mark.skipif(sandbox.isolation() != 'namespaces', reason='needs root and unshare')
def test_runs_as_a_throwaway_uid_without_network():
  result = sandbox.run([sandbox.python_interpreter(), '-I', '-S', '-c',
                        'import os, socket; print(os.getuid(), os.getpid()); '
                        'print(socket.if_nameindex())'])
  uid, pid = result.stdout.split('\n')[0].split()
  assert int(uid) >= 1 << 20 and int(pid) == 2  # pid 1 is sandbox_init in the new namespace.
  assert "'lo'" in result.stdout.split('\n')[1] and 'eth' not in result.stdout


ADD = ['assert add(1, 2) == 3', 'assert add(-1, 1) == 0']


@pytest.mark.parametrize('completion, status, reward', [
    ('```python\ndef add(a, b):\n  return a + b\n```', V.CORRECT, 1.0),
    ('Here:\n```\ndef add(a, b):\n  return a + b\n```\nDone.', V.CORRECT, 1.0),
    ('def add(a, b):\n  return a + b', V.CORRECT, 1.0),
    ('```python\ndef add(a, b):\n  return 3\n```', V.WRONG, 0.0),
    ('```python\ndef add(a, b)\n```', V.PARSE_FAILURE, 0.0),
    ('```python\nimport os\nos._exit(0)\n```', V.WRONG, 0.0),
])
def test_python_tests(completion, status, reward):
  v = python_tests.verify_python_tests({'completion': completion, 'tests': ADD})
  assert (v.status, v.reward) == (status, reward), v


def test_python_tests_partial_credit_io_cases_and_forgery():
  half = python_tests.verify_python_tests({'completion': 'def add(a, b):\n  return 3',
                                           'tests': ADD, 'partial_credit': True})
  assert (half.status, half.reward) == (V.WRONG, 0.5)
  io = python_tests.verify_python_tests({
      'completion': 'a, b = map(int, input().split())\nprint(a + b)',
      'io_cases': [{'input': '1 2', 'output': '3'}, {'input': '5 5\n', 'output': ' 10\n'}]})
  assert (io.status, io.components['pass_rate']) == (V.CORRECT, 1.0)
  # Reading the tests or printing a report line without the nonce gets nothing.
  forged = python_tests.verify_python_tests({'completion': (
      'print(open("tests.json").read())\n'
      'print("0" * 32 + " {\\"passed\\": 2, \\"total\\": 2, \\"failures\\": []}")'), 'tests': ADD})
  assert forged.status == V.WRONG and 'No such file' in forged.detail
  assert python_tests.verify_python_tests({'completion': 'x'}).status == V.INVALID_INPUT
