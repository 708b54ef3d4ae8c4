"""The sandbox (statuses, limits, cleanup) and the `python_tests` verifier on top of it."""

import json
import os
import pathlib
import shutil
import subprocess
import sys
import tempfile

import pytest

from rlreason.verifiers import python_tests
from rlreason.verifiers import sandbox
from rlreason.verifiers import sandbox_init
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
  # The CPU case gets a wall clock that cannot end it first: at a load of 17 on 2 cores the
  # loop got 0.7 s of CPU in 3 s of wall clock.
  limits = sandbox.Limits(cpu_s=1, wall_s=30.0) if detail == 'CPU' else FAST
  result = sandbox.run_python(code, limits=limits)
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
  # No socket at all (the seccomp filter), inside a network namespace without interfaces.
  result = sandbox.run([sandbox.python_interpreter(), '-I', '-S', '-c',
                        'import os, socket; print(os.getuid(), os.getpid())\n'
                        'for family in (socket.AF_INET, socket.AF_UNIX, socket.AF_NETLINK):\n'
                        '  try:\n    socket.socket(family, socket.SOCK_DGRAM)\n'
                        '  except PermissionError:\n    print("refused")'])
  uid, pid = result.stdout.split('\n')[0].split()
  assert int(uid) >= 1 << 20 and int(pid) == 2  # pid 1 is sandbox_init in the new namespace.
  assert result.stdout.split('\n')[1:] == ['refused'] * 3 + [''], result


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
  # No file holds the tests, and a report line in the old format counts for nothing.
  forged = python_tests.verify_python_tests({'completion': (
      'print(open("tests.json").read())\n'
      'print("0" * 32 + " {\\"passed\\": 2, \\"total\\": 2, \\"failures\\": []}")'), 'tests': ADD})
  assert forged.status == V.WRONG and 'No such file' in forged.detail
  assert python_tests.verify_python_tests({'completion': 'x'}).status == V.INVALID_INPUT


PROJECT = pathlib.Path(__file__).resolve().parents[1]
HOST_FILES = [PROJECT / 'setup.py', PROJECT / 'rlreason' / '__init__.py',
              PROJECT.parent / 'shared' / 'design.md', pathlib.Path.home() / '.bashrc',
              pathlib.Path(f'/proc/{os.getpid()}/environ'),
              pathlib.Path(f'/proc/{os.getpid()}/cmdline'), pathlib.Path('/etc/hostname')]


def test_no_host_file_is_readable_at_the_os_level():
  # A shell is not under the Python hook: only the OS layer stands between it and the host.
  paths = [str(p) for p in HOST_FILES if p.exists()]
  assert len(paths) >= 4
  result = sandbox.run(['/bin/sh', '-c', 'for f in "$@"; do cat "$f"; done; ls -a / /tmp /proc',
                        'sh', *paths], new_processes=True)
  assert result.status in ('ok', 'error'), result
  for path in paths:
    content = pathlib.Path(path).read_bytes()[:200].decode('utf-8', 'replace').strip()
    if len(content) >= 8:
      assert content[:60] not in result.stdout, path
  assert 'rlreason-sandbox' not in result.stdout or sandbox.isolation() != 'namespaces'
  assert str(os.getpid()) not in result.stdout.split()


def test_the_standard_library_still_works():
  result = sandbox.run_python('import json, re, math, fractions, collections, decimal, heapq\n'
                              'import datetime, itertools, functools, random, string, time\n'
                              'import dataclasses, typing, enum, inspect, traceback, logging\n'
                              'import statistics, pprint, asyncio, unittest, bisect, copy\n'
                              'print(json.dumps(sorted(collections.Counter("abca").items())))\n'
                              'print(random.random() < 1, time.localtime().tm_year > 2000)')
  assert result.status == 'ok', result
  assert result.stdout.splitlines() == ['[["a", 2], ["b", 1], ["c", 1]]', 'True True']


_WEAK_LEVEL = r'''
import json, os, pathlib, signal, sys, types
# Load sandbox.py without the package's __init__ (whose imports a bare interpreter lacks).
root = pathlib.Path(sys.argv[1])
for name, path in (('rlreason', root / 'rlreason'), ('rlreason.verifiers', root / 'rlreason/verifiers')):
  module = types.ModuleType(name)
  module.__path__ = [str(path)]
  sys.modules[name] = module
from rlreason.verifiers import sandbox
out = {'isolation': sandbox.isolation(), 'uid': os.getuid()}
try:
  sandbox.check_isolation()
  out['check'] = 'passed'
except RuntimeError as e:
  out['check'] = str(e)
parent = os.getpid()  # same uid as the sandboxed code when run as a user
code = (f'import os\ntry:\n  os.kill({parent}, 0)\n  print("signalled")\nexcept OSError as e:\n'
        f'  print("no signal", e.errno)\n'
        f'for p in ["/proc/{parent}/environ", {str(root / "setup.py")!r}]:\n'
        '  try:\n    print(open(p).read()[:30])\n  except OSError as e:\n    print("no read", e.errno)\n')
r = sandbox.run([sandbox.python_interpreter(), '-I', '-S', '-c', code])
out['run'] = [r.status, r.stdout, r.stderr[-300:]]
# UDP and a host unix socket (ssh-agent, tmux): the seccomp filter refuses socket() itself.
sockets = ('import socket\nfor f, t in ((socket.AF_INET, socket.SOCK_DGRAM), '
           '(socket.AF_UNIX, socket.SOCK_STREAM)):\n  try:\n    socket.socket(f, t)\n'
           '    print("socket")\n  except PermissionError:\n    print("refused")')
r = sandbox.run([sandbox.python_interpreter(), '-I', '-S', '-c', sockets])
out['sockets'] = r.stdout.split()
# A process in a new session, still running when the run ends, must not survive it.
marker = '31.%d' % os.getpid()
r = sandbox.run(['/bin/sh', '-c', f'setsid sh -c "sleep {marker}" </dev/null >/dev/null 2>&1 & '
                 'sleep 0.3'], new_processes=True)
out['setsid'] = [r.status]
for pid in filter(str.isdigit, os.listdir('/proc')):
  try:
    if marker.encode() in open(f'/proc/{pid}/cmdline', 'rb').read():
      out['setsid'].append(int(pid))
      os.kill(int(pid), signal.SIGKILL)
  except OSError:
    pass
print(json.dumps(out))
'''


def _weak_level(level, *, user=None, allow=False):
  env = {'PATH': '/usr/bin:/bin', 'RLREASON_SANDBOX_ISOLATION': level,
         **({sandbox.WEAK_ENV: 'allow'} if allow else {})}
  prefix = ['setpriv', f'--reuid={user}', f'--regid={user}', '--clear-groups'] if user else []
  run = subprocess.run([*prefix, sandbox.python_interpreter(), '-I', '-c', _WEAK_LEVEL,
                        str(PROJECT)], capture_output=True, text=True, env=env, timeout=60)
  assert run.returncode == 0, run.stderr
  return json.loads(run.stdout.splitlines()[-1]), run.stderr


def test_rlimits_level_is_refused_unless_allowed_and_says_so():
  out, _ = _weak_level('rlimits')
  assert out['isolation'] == 'rlimits'
  assert 'Refused' in out['check'] and sandbox.WEAK_ENV in out['check']
  assert out['run'][0] == 'refused'
  allowed, stderr = _weak_level('rlimits', allow=True)
  assert allowed['check'] == 'passed' and "isolation 'rlimits'" in stderr
  assert allowed['run'][0] == 'ok'
  assert allowed['setsid'] == ['ok'], allowed
  if sandbox.seccomp_works():
    assert allowed['sockets'] == ['refused', 'refused'], allowed


@pytest.mark.skipif(os.geteuid() != 0 or not shutil.which('setpriv') or
                    sandbox_init.landlock_abi() < sandbox_init.LANDLOCK_MIN_ABI,
                    reason='needs root (to become another user) and Landlock ABI >= 6')
@pytest.mark.parametrize('user', [None, 65534])
def test_landlock_level_blocks_signals_and_host_reads(user):
  if user and not _world_readable(PROJECT):
    pytest.skip('the project is not readable by other users here')
  out, stderr = _weak_level('landlock', user=user)
  assert out['isolation'] == 'landlock' and out['check'] == 'passed'
  assert "isolation 'landlock'" in stderr
  status, stdout, err = out['run']
  assert status == 'ok', err
  lines = stdout.splitlines()
  assert lines[0].startswith('no signal'), lines  # EPERM under Landlock's signal scope.
  assert lines[1].startswith('no read') and lines[2].startswith('no read'), lines
  if sandbox.seccomp_works():  # else check_isolation said at start-up that they are open.
    assert out['sockets'] == ['refused', 'refused'], out  # no UDP, no host unix socket.
  assert out['setsid'] == ['ok'], out  # nothing of the run survives it, as root or not.


def _world_readable(path):
  return all(os.stat(p).st_mode & 0o005 == 0o005 for p in [path, *path.parents])


_START_UP = r'''
import sys
from rlreason import config as config_lib
c = config_lib.default()
c.verifier.name = 'python_tests'
c.verifier.allow_weak_sandbox = sys.argv[1] == 'allow'
try:
  config_lib.validate(c, num_devices=1)
except ValueError as e:
  print(e)
'''


@pytest.mark.parametrize('allow', [False, True])
def test_weak_isolation_is_refused_at_start_up_unless_allowed(tmp_path, allow):
  env = {**os.environ, 'RLREASON_SANDBOX_ISOLATION': 'rlimits'}
  env.pop(sandbox.WEAK_ENV, None)
  run = subprocess.run([sys.executable, '-c', _START_UP, 'allow' if allow else 'refuse'],
                       capture_output=True, text=True, env=env, timeout=300)
  assert ('verifier.allow_weak_sandbox=False' in run.stdout) is not allow, run.stdout
  assert "isolation 'rlimits'" in run.stdout + run.stderr
  source = tmp_path / 'in.jsonl'
  source.write_text('{"completion": "def f():\\n  return 1", "tests": ["assert f() == 1"]}\n')
  cli = subprocess.run([sys.executable, '-m', 'rlreason.verifiers', 'score', '--verifier',
                        'python_tests', '--input', str(source), '--output',
                        str(tmp_path / 'out.jsonl'), *(['--allow-weak-sandbox'] if allow else [])],
                       capture_output=True, text=True, env=env, timeout=300)
  assert cli.returncode == (0 if allow else 2), cli.stderr
  assert ('Refused' in cli.stderr) is not allow
  if allow:
    assert json.loads((tmp_path / 'out.jsonl').read_text())['reward'] == 1.0
