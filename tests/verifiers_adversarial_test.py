"""Hostile completions through the pool: each gets the default reward with the right reason,
leaves no process or file behind, and the pool answers the next batch within its deadline."""

import os
import pathlib
import tempfile
import time
import uuid

import pytest

from rlreason.verifiers import pool as pool_lib
from rlreason.verifiers import sandbox
from rlreason.verifiers import verdict as V

from verifiers_pool_test import settle
import verifiers_sandbox_escapes_test as escapes
from verifiers_sandbox_escapes_test import sandbox_dirs
from verifiers_sandbox_escapes_test import sandbox_processes

DEFAULT = -1.0
SECRET = 'RLREASON_ADVERSARIAL_SECRET'
TMP = pathlib.Path(tempfile.gettempdir())
OUTSIDE = TMP / f'rlreason-escape-{uuid.uuid4().hex}'
ADD_TESTS = ['assert add(1, 2) == 3']


def py(code, **extra):
  return {'completion': f'```python\n{code}\n```', 'tests': ADD_TESTS, 'cpu_s': 1, **extra}


def pl(code):
  return {'completion': f'<answer>\n{code}\n</answer>', 'answer': '1'}


CASES = {
    # name: (verifier, item, status, words expected in the detail)
    'infinite_loop': ('python_tests', py('while True:\n  pass'), V.TIMEOUT, 'CPU'),
    'sleep_forever': ('python_tests', py('import time\ntime.sleep(10**6)'), V.TIMEOUT, 'wall'),
    'fork_bomb': ('python_tests', py('import os\nwhile True:\n  os.fork()'),
                  V.SANDBOX_VIOLATION, 'os.fork'),
    'subprocess': ('python_tests', py('import subprocess\nsubprocess.run(["sh", "-c", "id"])'),
                   V.SANDBOX_VIOLATION, 'subprocess'),
    # bytes(n) maps zero pages without touching them, so only the address-space limit can
    # end this. bytearray(n) writes its 128 MiB: the CPU time of those page faults varies
    # with the host's memory pressure (0.26 s quiet here, 1.55 s beside two processes
    # churning 2 GiB each), and a loaded CI machine once reached the 3 s CPU limit first:
    # a race between two correct limits, not a change in how the memory limit trips.
    'memory_bomb': ('python_tests', py('x = [bytes(1 << 27) for _ in range(1000)]', cpu_s=3),
                    V.SANDBOX_VIOLATION, 'memory'),
    # Interpreter internals without audit events, state that outlives a run, a tree that
    # broke the recursive clean-up (verifiers_sandbox_escapes_test.py has the programs).
    'fork_exec': ('python_tests', py(escapes.FORK_EXEC), V.SANDBOX_VIOLATION, 'seccomp'),
    'subinterpreter': ('python_tests', py(escapes.SUBINTERPRETER), V.SANDBOX_VIOLATION,
                       '_xxsubinterpreters'),
    'shared_memory': ('python_tests', py(escapes.SHARED_MEMORY), V.SANDBOX_VIOLATION,
                      '_posixshmem'),
    'deep_tree': ('python_tests', py(escapes.DEEP_TREE + 'while True:\n  pass'), V.TIMEOUT,
                  'CPU'),
    'write_outside': ('python_tests', py(f'open({str(OUTSIDE)!r}, "w").write("x")'),
                      V.SANDBOX_VIOLATION, 'write'),
    'delete_outside': ('python_tests', py('import os\nos.remove("/etc/hostname")'),
                       V.SANDBOX_VIOLATION, 'os.remove'),
    'parent_environment': ('python_tests', py('print(open(f"/proc/{__import__(\'os\').getppid()}'
                                              '/environ").read())'),
                           V.SANDBOX_VIOLATION, 'environ'),
    'socket': ('python_tests', py('import socket\nsocket.create_connection(("1.1.1.1", 80))'),
               V.SANDBOX_VIOLATION, 'socket'),
    'ctypes': ('python_tests', py('import ctypes\nctypes.CDLL(None).fork()'),
               V.SANDBOX_VIOLATION, 'ctypes'),
    # cpu_s=3: the case is about the file-size limit; at 1 s, a CI run under load once hit
    # the CPU limit first (a timeout verdict).
    'huge_file': ('python_tests', py('open("big", "w").write("x" * (64 << 20))', cpu_s=3),
                  V.SANDBOX_VIOLATION, 'file size'),
    'syntax_error': ('python_tests', py('def add(a, b)\n  return a + b'),
                     V.PARSE_FAILURE, 'SyntaxError'),
    'prolog_loop': ('prolog', pl('solve(X) :- solve(X).'), V.TIMEOUT, 'limit'),
    'prolog_shell': ('prolog', pl("solve(1) :- shell('id')."), V.SANDBOX_VIOLATION, 'violation'),
    'prolog_write': ('prolog', pl(f"solve(1) :- open('{OUTSIDE}', write, S), close(S)."),
                     V.SANDBOX_VIOLATION, 'violation'),
    'huge_exponent': ('math', {'completion': '\\boxed{9^{9^{9^9}}}', 'answer': '1'},
                      V.PARSE_FAILURE, 'digits'),
    'huge_factorial': ('math', {'completion': '\\boxed{(10^{10})!}', 'answer': '1'},
                       V.PARSE_FAILURE, 'digits'),
    'nested_latex': ('math', {'completion': '\\boxed{' + '\\frac{1}{' * 40 + '2' + '}' * 41,
                              'answer': '1'}, V.PARSE_FAILURE, 'nested'),
    'box_flood': ('math', {'completion': '\\boxed{' * 25_000, 'answer': '1'},
                  V.PARSE_FAILURE, 'no final answer'),
    'invalid_utf8': ('math', {'completion': b'\\boxed{1} \xc3\x28 \xff', 'answer': '1'},
                     V.PARSE_FAILURE, 'UTF-8'),
    'lone_surrogate': ('python_tests', py('def add(a, b):\n  return a + b  # \udcff'),
                       V.PARSE_FAILURE, 'UTF-8'),
    'megabyte': ('math', {'completion': 'lorem ipsum ' * 90_000 + '\\boxed{1}', 'answer': '1'},
                 V.PARSE_FAILURE, 'too long'),
    'megabyte_code': ('python_tests', py('x = 1\n' * 180_000), V.PARSE_FAILURE, 'too long'),
    'empty': ('math', {'completion': '', 'answer': '1'}, V.PARSE_FAILURE, 'empty'),
    'missing_completion': ('math', {'answer': '1'}, V.INVALID_INPUT, 'completion'),
    'missing_answer': ('countdown', {'completion': '1+2', 'numbers': [1, 2]}, V.INVALID_INPUT,
                       'answer'),
    'missing_tests': ('python_tests', {'completion': 'x = 1'}, V.INVALID_INPUT, 'tests'),
    'not_a_mapping': ('math', ['completion'], V.INVALID_INPUT, 'mapping'),
}
NORMAL = [{'completion': 'so \\boxed{\\frac{1}{2}}', 'answer': '0.5'},
          {'completion': '```python\ndef add(a, b):\n  return a + b\n```', 'tests': ADD_TESTS}]


@pytest.fixture(scope='module')
def pool():
  os.environ[SECRET] = 'hunter2'  # inherited by the workers; must not reach a sandbox.
  with pool_lib.VerifierPool(num_workers=2, spare_workers=1, item_timeout_s=20,
                             default_reward=DEFAULT) as p:
    yield p
  os.environ.pop(SECRET)


@pytest.mark.parametrize('case', sorted(CASES))
def test_adversarial_case(pool, case):
  verifier, item, status, words = CASES[case]
  escapes.skip_without_seccomp(words)
  before = set(sandbox_dirs())
  host_before = escapes.host_state()
  verdict, = pool.score([item], verifier=verifier, deadline_s=30)
  assert (verdict.status, verdict.reward) == (status, DEFAULT), verdict
  assert words.lower() in verdict.detail.lower(), verdict.detail
  assert not OUTSIDE.exists()
  assert not settle(pool)
  assert not sandbox_processes()
  assert set(sandbox_dirs()) <= before
  assert escapes.host_state() == host_before  # no IPC object, shm file or directory left.
  start = time.monotonic()
  verdicts = pool.score(NORMAL, verifier=['math', 'python_tests'], deadline_s=30)
  assert [v.status for v in verdicts] == [V.CORRECT, V.CORRECT]
  assert time.monotonic() - start < 30


def test_sandbox_environment_is_scrubbed(pool):
  code = 'import os\ndef add(a, b):\n  return a + b\nLEAK = dict(os.environ)'
  item = py(code, tests=[f'assert {SECRET!r} not in LEAK', 'assert set(LEAK) <= '
                         "{'PATH', 'HOME', 'TMPDIR', 'LANG', 'LC_CTYPE'}"])
  verdict, = pool.score([item], verifier='python_tests', deadline_s=30)
  assert verdict.status == V.CORRECT, verdict.detail


def test_a_batch_of_mixed_adversarial_items_meets_its_deadline(pool):
  names, items = zip(*[(v, i) for v, i, _, _ in CASES.values()])
  start = time.monotonic()
  verdicts = pool.score(list(items) + NORMAL, verifier=list(names) + ['math', 'python_tests'],
                        deadline_s=8.0)
  assert time.monotonic() - start < 8.0 + pool.OVERRUN_SLACK_S
  assert all(v.reward == DEFAULT for v in verdicts[:len(items)])
  assert pool.stats().deadline_overruns == 0
  assert not settle(pool) and not sandbox_processes()


@pytest.mark.skipif(sandbox.isolation() != 'namespaces', reason='needs root and unshare')
def test_os_layer_contains_what_the_python_hook_cannot_see():
  sh = '/bin/sh'
  # A shell fork bomb whose first process stays (a builtin loop: no fork it could be refused):
  # RLIMIT_NPROC caps it, the wall clock ends it, the pid namespace takes it all down. (With
  # `wait` the first shell may exit at once, before any fork fails: then the kernel kills the
  # rest, which is contained too but shows nothing about the cap.)
  bomb = sandbox.run([sh, '-c', 'b() { b | b & }; b; while :; do :; done'],
                     limits=sandbox.Limits(wall_s=3.0), new_processes=True)
  # The first shell itself may be refused a fork for its own `b | b &` and exit 2 (dash):
  # either way RLIMIT_NPROC said no ('Cannot fork') and nothing is left.
  assert bomb.status in ('timeout', 'error') and 'Cannot fork' in bomb.stderr, bomb
  assert not sandbox_processes()
  orphans = sandbox.run([sh, '-c', 'b() { b | b & }; b'], limits=sandbox.Limits(wall_s=3.0),
                        new_processes=True)
  assert orphans.status in ('ok', 'error', 'timeout'), orphans  # error: refused a fork
  assert not sandbox_processes()
  net = sandbox.run([sandbox.python_interpreter(), '-I', '-S', '-c',
                     'import socket; socket.create_connection(("1.1.1.1", 80), timeout=2)'])
  # No route at all (network namespace), or refused earlier by Landlock's TCP rule.
  assert net.status == 'error' and ('unreachable' in net.stderr.lower() or
                                    'permission denied' in net.stderr.lower()), net
  write = sandbox.run([sh, '-c', f'echo x > {OUTSIDE}; echo y > /etc/pwned'], new_processes=True)
  assert 'Read-only file system' in write.stderr and not OUTSIDE.exists()
  env = sandbox.run([sh, '-c', 'cat /proc/*/environ; echo $' + SECRET], new_processes=True)
  assert 'hunter2' not in env.stdout
  assert not sandbox_processes()
