"""Running model-written programs: own process, resource limits, no network, private files.

  result = sandbox.run_python('print(sum(range(10)))')
  result.status, result.stdout  # ('ok', '45\\n')

Each run gets a fresh private directory (removed afterwards without recursion, however
deep the tree the program left, also when the pool kills the worker mid-run), a scrubbed
environment (PATH, HOME, LANG only), its input on a stdin pipe that is closed once written,
rlimits on address space, processes, file size and open files, a CPU budget for the whole
process tree (sandbox_init.py sums it; RLIMIT_CPU is per process), and the seccomp filter
of syscall_filter.py (no new processes unless `new_processes=True`, no exec, no SysV IPC or
message queues, no socket(), no ptrace, namespaces or mounts); the output it keeps is
capped. Three isolation levels, chosen once per process by `isolation()`:

  'namespaces' (root, and `unshare` works, as on rlreason's machines and CI): new pid,
      mount, network, IPC and UTS namespaces (no interface but a down loopback: no network
      at all; IPC objects die with the namespace);
      a private root holding only read-only binds of the system (/usr, the libraries, the
      interpreter's installation without its site-packages, /dev/null and friends) and the
      writable private directory, so nothing else of the host can be read or written; the
      program runs under a throwaway uid, so RLIMIT_NPROC binds and nothing outside can be
      signalled; when the program's first process exits, the kernel kills all the rest.
      Landlock is added where the kernel has it.
  'landlock' (not root, Linux >= 6.12): the program's process restricts itself with
      Landlock to reading the same system paths and writing its private directory, no
      signals out of its domain, no abstract unix sockets out, no TCP; the seccomp filter
      refuses every socket (UDP, host unix sockets such as ssh-agent's) and SysV IPC;
      sandbox_init is a child subreaper that kills every descendant, also one started in
      a new session. Weaker: it shares the host's pid namespace (other processes are
      listed) and, where the kernel refuses seccomp, UDP and unix sockets are open.
  'rlimits' (anything else): rlimits, a new session killed as a group and the Python audit
      hook below; nothing at the OS level stops reads of host files, signals to the user's
      processes, or files created by C code (os.mkfifo has no audit event). This level is
      refused unless RLREASON_SANDBOX_WEAK=allow (WEAK_ENV) is set: `check_isolation`
      says so once, loudly, at start-up; `run` refuses each call with status 'refused'.

Python programs (`run_python`) also run under the audit hook of audit_hook.py, which
names the cause of a violation (exit 86); the OS layer enforces. The private directory is
removed by tree_removal.py.
Statuses: ok, timeout (wall clock or CPU), memory, violation (rule, seccomp or file-size
limit), error (nonzero exit or a crash), refused (weak isolation not allowed).

Deliberately not here: judging the program's output (python_tests.py, prolog.py).
"""

import dataclasses
import functools
import glob
import json
import os
import pathlib
import random
import selectors
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from typing import Mapping, Sequence

from rlreason.verifiers import audit_hook
from rlreason.verifiers import sandbox_init
from rlreason.verifiers import syscall_filter
from rlreason.verifiers import tree_removal

_INIT = str(pathlib.Path(__file__).with_name('sandbox_init.py'))
WEAK_ENV = 'RLREASON_SANDBOX_WEAK'
_DIR_PREFIX = 'rlreason-sandbox-'
VIOLATION_EXIT, MEMORY_EXIT = audit_hook.VIOLATION_EXIT, audit_hook.MEMORY_EXIT
_NAMESPACES = ('unshare', '--net', '--mount', '--pid', '--ipc', '--uts', '--fork', '--kill-child',
               '--mount-proc')


@dataclasses.dataclass(frozen=True)
class Limits:
  cpu_s: int = 3
  wall_s: float = 5.0
  memory_bytes: int = 512 << 20
  processes: int = 16
  file_bytes: int = 1 << 20
  open_files: int = 64
  output_bytes: int = 64 << 10


@dataclasses.dataclass(frozen=True)
class SandboxResult:
  status: str  # ok | timeout | memory | violation | error | refused
  exit_code: int | None  # negative: killed by that signal
  stdout: str
  stderr: str
  truncated: bool
  detail: str
  wall_s: float
  isolation: str
  cpu_s: float = 0.0  # of the whole process tree


@functools.cache
def isolation() -> str:
  """'namespaces', 'landlock' or 'rlimits' (see the module docstring); RLREASON_SANDBOX_ISOLATION
  may ask for a weaker level than the machine allows (for tests of the weaker levels)."""
  asked = os.environ.get('RLREASON_SANDBOX_ISOLATION', '')
  levels = ('namespaces', 'landlock', 'rlimits')
  if asked and asked not in levels:
    raise ValueError(f'RLREASON_SANDBOX_ISOLATION={asked!r}; expected one of {levels}')
  if asked != 'landlock' and asked != 'rlimits' and _namespaces_work():
    return 'namespaces'
  if asked != 'rlimits' and sandbox_init.landlock_abi() >= sandbox_init.LANDLOCK_MIN_ABI:
    return 'landlock'
  return 'rlimits'


def _namespaces_work() -> bool:
  if os.geteuid() != 0 or not (shutil.which('unshare') and shutil.which('setpriv')):
    return False
  try:
    probe = subprocess.run([*_NAMESPACES, 'true'], capture_output=True, timeout=30)
  except (OSError, subprocess.TimeoutExpired):
    return False
  return probe.returncode == 0


WEAKER = {
    'landlock': 'Landlock without namespaces: host processes are visible',
    'rlimits': 'rlimits and a Python audit hook only: sandboxed code can read host files, '
               'signal your processes and create files from C code',
}
NO_SECCOMP = ('no seccomp filter on this machine: fork/exec through interpreter internals, '
              'SysV IPC and message queues (state that outlives a run), ptrace and sockets '
              '(UDP, host unix sockets unless in namespaces) are NOT refused by the kernel; '
              'only the Python audit hook stops them')


@functools.cache
def seccomp_works() -> bool:
  """Whether sandbox_init can install syscall_filter's filter here (probed once, in a child)."""
  if not syscall_filter.supported():
    return False
  try:
    probe = subprocess.run([python_interpreter(), '-I', '-S', syscall_filter.__file__],
                           capture_output=True, timeout=30)
  except (OSError, subprocess.TimeoutExpired):
    return False
  return probe.returncode == 0


def weak_allowed() -> bool:
  return os.environ.get(WEAK_ENV, '') == 'allow'


def check_isolation(*, allow_weak: bool | None = None, what: str = 'model-written code') -> str:
  """At start-up: says loudly what is weaker than 'namespaces'; raises if 'rlimits' is refused.

  allow_weak=True also sets WEAK_ENV, so the verifier pool's workers inherit the decision.
  """
  level = isolation()
  if allow_weak:
    os.environ[WEAK_ENV] = 'allow'
  if not seccomp_works():
    print(f'*** rlreason sandbox for {what}: {NO_SECCOMP}. ***', file=sys.stderr, flush=True)
  if level != 'namespaces':
    banner = f'*** rlreason sandbox for {what}: isolation {level!r}: {WEAKER[level]}. ***'
    if level == 'rlimits' and not weak_allowed():
      raise RuntimeError(f'{banner} Refused: run as root where `unshare` works (namespaces), '
                         f'on Linux >= 6.12 (Landlock), or accept it explicitly with '
                         f'{WEAK_ENV}=allow (config: verifier.allow_weak_sandbox=True, CLI: '
                         '--allow-weak-sandbox).')
    print(banner, file=sys.stderr, flush=True)
  return level


@functools.cache
def _system_paths(argv0: str) -> tuple[tuple[str, ...], tuple[str, ...]]:
  """Read-only paths a program needs (system, its installation) and site-packages to hide.

  Cached per program: the globs would otherwise run on every sandboxed call."""
  paths = ['/usr', '/bin', '/sbin', '/lib', '/lib32', '/lib64', '/libx32', '/etc/ld.so.cache',
           '/etc/localtime']
  for exe in (python_interpreter(), os.path.realpath(argv0)):
    prefix = os.path.dirname(os.path.dirname(exe))
    if prefix not in ('/', '/usr') and not any(prefix.startswith(p + '/') for p in paths):
      paths.append(prefix)
  hidden = set()
  for base in paths:
    for pattern in ('lib/python3*/*-packages', 'local/lib/python3*/*-packages'):
      hidden.update(glob.glob(os.path.join(base, pattern)))
  return tuple(paths), tuple(sorted(hidden))


_DEVICES = ['/dev/null', '/dev/zero', '/dev/urandom', '/dev/random']


def _world_executable(path: str) -> bool:
  parts = pathlib.Path(path).parents
  return os.stat(path).st_mode & 0o001 != 0 and all(os.stat(p).st_mode & 0o001 for p in parts)


@functools.cache
def python_interpreter() -> str:
  """A Python 3 that a throwaway uid can run (pyenv builds under /root are not)."""
  for candidate in (sys.executable, getattr(sys, '_base_executable', ''), '/usr/bin/python3',
                    shutil.which('python3') or ''):
    if candidate and os.path.exists(candidate):
      real = os.path.realpath(candidate)
      if _world_executable(real):
        return real
  return os.path.realpath(sys.executable)


def remove_worker_dirs(pid: int) -> None:
  """Removes the private directories a (dead) worker process left behind."""
  for path in glob.glob(os.path.join(tempfile.gettempdir(), f'{_DIR_PREFIX}{pid}-*')):
    tree_removal.remove_tree(path)


def _write_files(workdir: str, files: Mapping[str, str | bytes], uid: int | None) -> None:
  for name, content in files.items():
    if os.path.isabs(name) or '..' in pathlib.PurePosixPath(name).parts:
      raise ValueError(f'sandbox file name must be relative and inside: {name!r}')
    path = os.path.join(workdir, name)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, 'wb') as f:
      f.write(content.encode('utf-8') if isinstance(content, str) else content)
  if uid is not None:
    for root, dirs, names in os.walk(workdir):
      for name in [*dirs, *names, '']:
        os.chown(os.path.join(root, name), uid, uid)


def _collect(proc: subprocess.Popen, stdin: bytes | None, deadline: float,
             cap: int) -> tuple[bytes, bytes, bool, bool]:
  """Feeds stdin (then closes it) and reads both pipes until EOF or the deadline, keeping at
  most `cap` bytes of each."""
  bufs = {proc.stdout.fileno(): bytearray(), proc.stderr.fileno(): bytearray()}
  truncated = timed_out = False
  pending = memoryview(stdin or b'')
  with selectors.DefaultSelector() as sel:
    for fd in bufs:
      sel.register(fd, selectors.EVENT_READ)
    if proc.stdin is not None:
      os.set_blocking(proc.stdin.fileno(), False)
      sel.register(proc.stdin.fileno(), selectors.EVENT_WRITE)
    while any(key.fd in bufs for key in sel.get_map().values()):
      remaining = deadline - time.monotonic()
      if remaining <= 0:
        timed_out = True
        break
      for key, _ in sel.select(min(remaining, 0.5)):
        if key.fd not in bufs:  # stdin: write what fits, close at the end (or if refused).
          try:
            pending = pending[os.write(key.fd, pending[:1 << 16]):]
          except (BrokenPipeError, BlockingIOError) as e:
            pending = pending[:0] if isinstance(e, BrokenPipeError) else pending
          if not pending:
            sel.unregister(key.fd)
            proc.stdin.close()
          continue
        chunk = os.read(key.fd, 1 << 16)
        if not chunk:
          sel.unregister(key.fd)
          continue
        buf = bufs[key.fd]
        keep = max(0, cap - len(buf))
        buf += chunk[:keep]
        truncated |= len(chunk) > keep
  if proc.stdin is not None and not proc.stdin.closed:
    proc.stdin.close()
  return bytes(bufs[proc.stdout.fileno()]), bytes(bufs[proc.stderr.fileno()]), truncated, timed_out


def _classify(report: dict | None, stderr: bytes, timed_out: bool, limits: Limits) -> tuple[str, str]:
  if timed_out or report is None:
    return ('timeout', 'wall clock') if timed_out else ('error', 'sandbox_init gave no report')
  sig, code = report.get('signal'), report.get('exit_code')
  if report['wall_timeout']:
    return 'timeout', f'wall clock over {limits.wall_s:g}s'
  if report.get('cpu_limit'):
    return 'timeout', f'CPU time over {limits.cpu_s}s (all processes of the run together)'
  if sig == signal.SIGXCPU or (sig == signal.SIGKILL and report['cpu_s'] >= limits.cpu_s - 0.05):
    return 'timeout', f'CPU time over {limits.cpu_s}s'
  if sig == signal.SIGSYS:
    return 'violation', 'SANDBOX_VIOLATION a forbidden system call (seccomp: new process, exec, ' \
                        'IPC, ptrace, namespace or mount)'
  if code == VIOLATION_EXIT or b'SANDBOX_VIOLATION' in stderr[-4096:]:
    line = stderr[stderr.rfind(b'SANDBOX_VIOLATION'):].split(b'\n', 1)[0]
    return 'violation', line.decode('utf-8', 'replace') or 'sandbox rule'
  if sig == signal.SIGXFSZ or b'File too large' in stderr[-4096:]:
    return 'violation', f'file size over {limits.file_bytes} bytes'
  if code == MEMORY_EXIT or b'MemoryError' in stderr[-4096:] or b'out of memory' in stderr[-4096:]:
    return 'memory', f'address space over {limits.memory_bytes} bytes'
  if sig is not None:
    return 'error', f'killed by signal {signal.Signals(sig).name}'
  return ('ok', '') if code == 0 else ('error', f'exit code {code}')


def run(argv: Sequence[str], *, files: Mapping[str, str | bytes] = {},  # pylint: disable=dangerous-default-value
        limits: Limits = Limits(), stdin: str | bytes | None = None,
        env: Mapping[str, str] | None = None, new_processes: bool = False) -> SandboxResult:
  """Runs argv (argv[0] an absolute path) in a private directory holding `files`.

  new_processes=True lets the program fork and exec (a shell script); their CPU time counts
  against limits.cpu_s together, and every one of them is killed at the end.
  """
  start = time.monotonic()
  mode = isolation()
  if mode == 'rlimits' and not weak_allowed():
    return SandboxResult('refused', None, '', '', False,
                         f'isolation {mode!r} refused ({WEAKER[mode]}); set {WEAK_ENV}=allow '
                         'to accept it', 0.0, mode)
  root = os.geteuid() == 0
  uid = random.SystemRandom().randrange(1 << 20, 1 << 30) if root else None
  if uid is not None and not _world_executable(argv[0]):
    uid = None  # the throwaway uid could not even start it; stay as we are.
  workdir = tempfile.mkdtemp(prefix=f'{_DIR_PREFIX}{os.getpid()}-')
  newroot = workdir + '.root'  # the private root's mount point (namespaces only).
  proc = None
  status_r, status_w = os.pipe()
  try:
    _write_files(workdir, files, uid)
    read_paths, hidden = _system_paths(argv[0])
    if mode == 'namespaces':
      os.mkdir(newroot, 0o700)
    config = {
        'namespaces': mode == 'namespaces', 'workdir': workdir, 'uid': uid,
        'argv': list(argv), 'status_fd': status_w, 'wall_s': limits.wall_s,
        'newroot': newroot, 'read_paths': list(read_paths), 'hidden_paths': list(hidden),
        'cpu_s': limits.cpu_s, 'new_processes': new_processes, 'seccomp': seccomp_works(),
        'device_paths': _DEVICES, 'landlock': mode != 'rlimits',
        'require_landlock': mode == 'landlock',
        'env': {'PATH': '/usr/local/bin:/usr/bin:/bin', 'HOME': workdir, 'TMPDIR': workdir,
                'LANG': 'C.UTF-8', **(env or {})},
        'rlimits': {
            'CPU': (limits.cpu_s, limits.cpu_s + 1),
            'AS': (limits.memory_bytes,) * 2,
            'NPROC': (limits.processes,) * 2,
            'FSIZE': (limits.file_bytes,) * 2,
            'NOFILE': (limits.open_files,) * 2,
            'CORE': (0, 0),
        },
    }
    command = [python_interpreter(), '-I', '-S', _INIT, json.dumps(config)]
    # setpriv: if this process dies (the pool killed it), the sandbox dies with it.
    prefix = (['setpriv', '--pdeathsig', 'KILL', '--', *_NAMESPACES]
              if mode == 'namespaces' else [])
    proc = subprocess.Popen([*prefix, *command],
                            stdin=subprocess.DEVNULL if stdin is None else subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            pass_fds=(status_w,), env={'PATH': '/usr/bin:/bin'},
                            start_new_session=True)
    os.close(status_w)
    status_w = -1
    data = stdin.encode('utf-8') if isinstance(stdin, str) else stdin
    stdout, stderr, truncated, timed_out = _collect(
        proc, data, start + limits.wall_s + 2.0, limits.output_bytes)
    if timed_out:
      os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    raw = os.read(status_r, 1 << 16)
    report = json.loads(raw) if raw else None
    status, detail = _classify(report, stderr, timed_out, limits)
    code = None if report is None else (report.get('exit_code') if report.get('signal') is None
                                        else -report['signal'])
    return SandboxResult(status, code, stdout.decode('utf-8', 'replace'),
                         stderr.decode('utf-8', 'replace'), truncated, detail,
                         time.monotonic() - start, mode,
                         0.0 if report is None else float(report.get('cpu_s', 0.0)))
  finally:
    if proc is not None and proc.poll() is None:
      try:
        os.killpg(proc.pid, signal.SIGKILL)
      except ProcessLookupError:
        pass
      proc.wait()
    for fd in (status_r, status_w):
      if fd >= 0:
        os.close(fd)
    tree_removal.remove_tree(workdir)
    tree_removal.remove_tree(newroot)


def run_python(source: str, *, files: Mapping[str, str | bytes] = {},  # pylint: disable=dangerous-default-value
               limits: Limits = Limits(), stdin: str | bytes | None = None) -> SandboxResult:
  """Runs `source` as main.py with -I -S (standard library only) and the audit hook."""
  return run([python_interpreter(), '-I', '-S', '-B', '-X', 'utf8', '-c', audit_hook.BOOTSTRAP],
             files={**files, 'main.py': source}, limits=limits, stdin=stdin)
