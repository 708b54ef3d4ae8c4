"""Attacks on the sandbox's OS layer, through a direct call, the python tool and the CLI (the
pool: verifiers_adversarial_test.py). Each ends as a violation or a timeout (reward 0 through
the CLI), leaves no process, directory or IPC object on the host, and a good run after it
still works."""

import json
import os
import pathlib
import subprocess
import sys
import tempfile
import time
import uuid

import pytest

from rlreason.envs import base
from rlreason.envs import python_tool
from rlreason.verifiers import sandbox
from rlreason.verifiers import tree_removal
from rlreason.verifiers import verdict as V

NO_SECCOMP = 'the kernel refuses a seccomp filter here (check_isolation says so at start-up)'
needs_seccomp = pytest.mark.skipif(not sandbox.seccomp_works(), reason=NO_SECCOMP)
MARKER = f'rlreason-escape-{uuid.uuid4().hex[:12]}'
KEY = int(uuid.uuid4().hex[:7], 16) + 1  # a SysV IPC key no one else uses.
# Interpreter internals with no audit event: four children spinning in new sessions (each
# with its own RLIMIT_CPU, the budget x4), then the parent spins too.
FORK_EXEC = '''
import _posixsubprocess, os
r, w = os.pipe()
for _ in range(4):
  _posixsubprocess.fork_exec([b'/bin/sh', b'-c', b'while :; do :; done'], [b'/bin/sh'], True,
      (w,), None, None, -1, -1, -1, -1, -1, -1, r, w, False, True, -1, None, None, None, -1,
      None, False)
while True:
  pass
'''
# A sub-interpreter has no audit hook: ctypes there could leave 32 MiB of SysV shared memory.
SUBINTERPRETER = f'''
import _xxsubinterpreters as interpreters
interpreters.run_string(interpreters.create(),
                        'import ctypes; ctypes.CDLL(None).shmget({KEY}, 1 << 25, 0o1666)')
'''
SHARED_MEMORY = f'''
from multiprocessing import shared_memory
shared_memory.SharedMemory(name={MARKER!r}, create=True, size=1 << 20)
'''
# Deeper than the recursion limit and, in characters, than PATH_MAX.
DEEP_TREE = '''
import os
for _ in range(1100):
  os.mkdir('dddd')
  os.chdir('dddd')
print('deep')
'''
HOOKED = {  # name: (program, status, words in the detail)
    'fork_exec': (FORK_EXEC, 'violation', 'seccomp'),
    'subinterpreter': (SUBINTERPRETER, 'violation', '_xxsubinterpreters'),
    'shared_memory': (SHARED_MEMORY, 'violation', '_posixshmem'),
    'deep_tree': (DEEP_TREE, 'ok', ''),
}
# Programs no audit hook watches (as if it had been bypassed): only the kernel stops them.
UNHOOKED = {
    'sysv_shm': (f'import ctypes; print(ctypes.CDLL(None).shmget({KEY}, 1 << 25, 0o1666))',
                 'violation', 'seccomp'),
    'sysv_sem': (f'import ctypes; print(ctypes.CDLL(None).semget({KEY}, 1, 0o1666))',
                 'violation', 'seccomp'),
    'message_queue': (f'import ctypes, os; print(ctypes.CDLL(None).mq_open(b"/{MARKER}", '
                      'os.O_CREAT | os.O_RDWR, 0o666, None))', 'violation', 'seccomp'),
    'fork': ('import os; os.fork()', 'violation', 'seccomp'),
    'exec': ('import os; os.execv("/bin/sh", ["sh", "-c", "echo replaced"])', 'violation',
             'seccomp'),
}


def children_of(pid: int) -> set[int]:
  """All live descendants of pid, from /proc."""
  parents = {}
  for entry in os.listdir('/proc'):
    if entry.isdigit():
      try:
        with open(f'/proc/{entry}/stat') as f:
          fields = f.read().rsplit(')', 1)[1].split()
      except OSError:
        continue
      if fields[0] != 'Z':
        parents[int(entry)] = int(fields[1])
  found, frontier = set(), {pid}
  while frontier:
    frontier = {p for p, parent in parents.items() if parent in frontier} - found
    found |= frontier
  return found


TMP = pathlib.Path(tempfile.gettempdir())


def sandbox_processes(timeout_s: float = 10.0) -> list[int]:
  """Sandbox processes (throwaway uid >= 2^20) that are ours or orphaned, after settling.

  Another test process on the machine may be running sandboxes right now; its processes
  descend from it, so only our descendants and orphans (parent pid 1) count. Killed
  processes take a moment to disappear on a loaded machine, hence the wait.
  """
  deadline = time.monotonic() + timeout_s
  while True:
    ours = children_of(os.getpid())
    found = []
    for entry in os.listdir('/proc'):
      try:
        with open(f'/proc/{entry}/status') as f:
          fields = dict(line.split(':', 1) for line in f if ':' in line)
        uid, ppid = int(fields['Uid'].split()[0]), int(fields['PPid'])
      except (OSError, KeyError, ValueError):
        continue
      if uid >= 1 << 20 and (int(entry) in ours or ppid == 1) and 'zombie' not in fields['State']:
        found.append(int(entry))
    if not found or time.monotonic() > deadline:
      return found
    time.sleep(0.1)


def sandbox_dirs() -> list[str]:
  """Sandbox directories of our processes, or of processes that no longer exist."""
  ours = children_of(os.getpid()) | {os.getpid()}
  names = []
  for p in TMP.glob('rlreason-sandbox-*'):
    pid = int(p.name.split('-')[2])
    if pid in ours or not os.path.exists(f'/proc/{pid}'):
      names.append(p.name)
  return names + [p.name for p in TMP.glob('rlreason-escape-*')]


def host_state() -> dict:
  """What a run could leave behind: SysV objects with KEY, MARKER in /dev/shm or /dev/mqueue,
  sandbox directories, sandbox processes."""
  state = {}
  for kind in ('shm', 'msg', 'sem'):
    with open(f'/proc/sysvipc/{kind}') as f:
      state[kind] = [line.split()[0] for line in f.readlines()[1:] if int(line.split()[0]) == KEY]
  for folder in ('/dev/shm', '/dev/mqueue'):
    state[folder] = [n for n in (os.listdir(folder) if os.path.isdir(folder) else [])
                     if MARKER in n]
  state['dirs'] = sorted(sandbox_dirs())
  return state


def assert_nothing_left(before: dict) -> None:
  assert not sandbox_processes()
  assert host_state() == before


def good_run_still_works() -> None:
  result = sandbox.run_python('print(6 * 7)')
  assert (result.status, result.stdout) == ('ok', '42\n'), result


def skip_without_seccomp(words: str) -> None:
  if words == 'seccomp' and not sandbox.seccomp_works():
    pytest.skip(NO_SECCOMP)


@pytest.mark.parametrize('name', sorted(HOOKED))
def test_hooked_attack_through_a_direct_call(name):
  program, status, words = HOOKED[name]
  skip_without_seccomp(words)
  before = host_state()
  result = sandbox.run_python(program, limits=sandbox.Limits(cpu_s=2, wall_s=20.0))
  assert result.status == status and words in result.detail, result
  assert_nothing_left(before)
  good_run_still_works()


@needs_seccomp
@pytest.mark.parametrize('name', sorted(UNHOOKED))
def test_what_no_hook_sees_is_stopped_by_the_kernel(name):
  program, status, words = UNHOOKED[name]
  before = host_state()
  result = sandbox.run([sandbox.python_interpreter(), '-I', '-S', '-c', program])
  assert result.status == status and words in result.detail, result
  assert 'replaced' not in result.stdout
  assert_nothing_left(before)
  good_run_still_works()


def test_the_cpu_budget_covers_every_process_of_a_run():
  # Four spinning children: with RLIMIT_CPU alone each had its own second, and the shell
  # exited 0 once they were killed. The wall clock (30 s) is not what ends it.
  before = host_state()
  result = sandbox.run(['/bin/sh', '-c', 'for i in 1 2 3 4; do (while :; do :; done) & done; wait'],
                       limits=sandbox.Limits(cpu_s=1, wall_s=30.0), new_processes=True)
  assert result.status == 'timeout' and 'all processes' in result.detail, result
  assert 1.0 <= result.cpu_s < 3.0, result  # not 4 x the budget (polling overshoot aside)
  assert_nothing_left(before)
  good_run_still_works()


def test_a_new_session_does_not_outlive_the_run():
  before = host_state()
  result = sandbox.run(['/bin/sh', '-c', f'setsid sh -c "sleep 30; echo {MARKER}" & sleep 0.2'],
                       new_processes=True)
  assert result.status == 'ok', result
  assert_nothing_left(before)


def deep_tree(top: str, link_to: pathlib.Path) -> None:
  """Under `top`: 1100 levels (a RecursionError for shutil.rmtree, > PATH_MAX characters),
  links to `link_to`, and a locked directory holding a read-only file."""
  fd = os.open(top, os.O_RDONLY)
  for _ in range(1100):
    os.mkdir('dddd', dir_fd=fd)
    below = os.open('dddd', os.O_RDONLY, dir_fd=fd)
    os.close(fd)
    fd = below
  os.symlink(link_to, 'link', dir_fd=fd)
  os.symlink(link_to, 'dirlink', target_is_directory=True, dir_fd=fd)
  os.mkdir('locked', 0o700, dir_fd=fd)
  with open(os.open('locked/ro', os.O_WRONLY | os.O_CREAT, 0o400, dir_fd=fd), 'w') as f:
    f.write('x')
  os.chmod('locked', 0, dir_fd=fd)
  os.close(fd)


def remove_by_rm(path: str) -> None:
  """Test-side safety net (GNU rm walks iteratively): a tree left in /tmp breaks other
  runs' clean-up, pytest's own included."""
  if os.path.lexists(path):
    subprocess.run(['rm', '-rf', path], check=False)


def test_the_iterative_clean_up_removes_deep_locked_and_linked_trees(tmp_path):
  canary = tmp_path / 'canary'
  canary.mkdir()
  (canary / 'keep').write_text('k')
  top = tempfile.mkdtemp(prefix='rlreason-test-tree-')
  try:
    deep_tree(top, canary)
    assert tree_removal.remove_tree(top) and not os.path.lexists(top)
    assert (canary / 'keep').read_text() == 'k'  # links removed, never followed.
    assert tree_removal.remove_tree(top)  # already gone: fine.
  finally:
    remove_by_rm(top)


@pytest.mark.parametrize('name', sorted(set(HOOKED) - {'deep_tree'}))  # the tool classes.
def test_hooked_attack_through_the_python_tool(name):
  program, status, words = HOOKED[name]
  skip_without_seccomp(words)
  before = host_state()
  sessions = {}
  result = base.run_tool({'python': python_tool.TOOL}, sessions,
                         base.ToolCall('python', {'code': program}), context={})
  assert result.error == base.SANDBOX_VIOLATION and words in result.content, result
  assert_nothing_left(before)
  # The next episode starts clean and works.
  result = base.run_tool({'python': python_tool.TOOL}, {},
                         base.ToolCall('python', {'code': '6 * 7'}), context={})
  assert (result.error, result.content) == (None, '42\n'), result


@needs_seccomp
def test_attacks_through_the_cli_score_zero_and_good_items_after_them_score(tmp_path):
  tests = ['assert add(1, 2) == 3']
  good = {'completion': 'def add(a, b):\n  return a + b', 'tests': tests}
  attacks = [{'completion': program, 'tests': tests, 'cpu_s': 1}
             for program, _, _ in HOOKED.values()]
  source = tmp_path / 'in.jsonl'
  source.write_text(''.join(json.dumps(item) + '\n' for item in [*attacks, good, good]))
  before = host_state()
  run = subprocess.run([sys.executable, '-m', 'rlreason.verifiers', 'score', '--verifier',
                        'python_tests', '--input', str(source), '--output',
                        str(tmp_path / 'out.jsonl'), '--workers', '1', '--item-timeout-s', '20'],
                       capture_output=True, text=True, timeout=300)
  assert run.returncode == 0, run.stderr
  rows = [json.loads(line) for line in (tmp_path / 'out.jsonl').read_text().splitlines()]
  statuses = [row['status'] for row in rows]
  assert statuses == [V.SANDBOX_VIOLATION] * 3 + [V.WRONG, V.CORRECT, V.CORRECT], rows
  assert [row['reward'] for row in rows] == [0.0] * 4 + [1.0, 1.0]
  assert_nothing_left(before)


def test_start_up_says_loudly_what_is_not_enforced_without_seccomp(monkeypatch, capsys):
  monkeypatch.setattr(sandbox, 'seccomp_works', lambda: False)
  sandbox.check_isolation(what='test code')
  err = capsys.readouterr().err
  assert 'no seccomp filter' in err and 'SysV IPC' in err and 'NOT refused' in err
