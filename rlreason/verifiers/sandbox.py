"""Running model-written programs: own process, resource limits, no network, private files.

  result = sandbox.run_python('print(sum(range(10)))')
  result.status, result.stdout  # ('ok', '45\\n')

Each run gets a fresh private directory (removed afterwards, also when the pool kills
the worker mid-run), a scrubbed environment (PATH, HOME, LANG only), stdin from a file,
and rlimits on CPU time, address space, processes, file size and open files; the output
it keeps is capped. Two isolation levels, chosen once per process by `isolation()`:

  'namespaces' (root, and `unshare` works, as on rlreason's machines and CI): new pid,
      mount and network namespaces (no interface but a down loopback: no network at all);
      every mount but the private directory is read-only; the program runs under a
      throwaway uid, so RLIMIT_NPROC binds and the parent's /proc entries are invisible;
      when the program's first process exits, the kernel kills all the rest.
  'rlimits' (anything else): rlimits, a new session killed as a group, and the Python
      audit hook below only.

Python programs also run under an audit hook that ends the process (exit 86, status
'violation') on fork/exec/subprocess, socket creation, ctypes, writes outside the private
directory and reads of /proc/*/environ: the OS layer enforces, the hook names the cause.
Statuses: ok, timeout (wall clock or CPU), memory, violation (rule or file-size limit),
error (nonzero exit or a crash).

Deliberately not here: judging the program's output (python_tests.py, prolog.py), or a
seccomp filter. The hook is bypassable by code that introspects the interpreter; the OS
layer is what contains such code.
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

_INIT = str(pathlib.Path(__file__).with_name('sandbox_init.py'))
_DIR_PREFIX = 'rlreason-sandbox-'
VIOLATION_EXIT, MEMORY_EXIT = 86, 87
_NAMESPACES = ('unshare', '--net', '--mount', '--pid', '--fork', '--kill-child', '--mount-proc')


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
  status: str  # ok | timeout | memory | violation | error
  exit_code: int | None  # negative: killed by that signal
  stdout: str
  stderr: str
  truncated: bool
  detail: str
  wall_s: float
  isolation: str


@functools.cache
def isolation() -> str:
  """'namespaces' where this process may create them (and is root), else 'rlimits'."""
  if os.geteuid() != 0 or not (shutil.which('unshare') and shutil.which('setpriv')):
    return 'rlimits'
  try:
    probe = subprocess.run([*_NAMESPACES, 'true'], capture_output=True, timeout=30)
  except (OSError, subprocess.TimeoutExpired):
    return 'rlimits'
  return 'namespaces' if probe.returncode == 0 else 'rlimits'


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
    shutil.rmtree(path, ignore_errors=True)


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


def _collect(proc: subprocess.Popen, deadline: float, cap: int) -> tuple[bytes, bytes, bool, bool]:
  """Reads both pipes until EOF or the deadline, keeping at most `cap` bytes of each."""
  bufs = {proc.stdout.fileno(): bytearray(), proc.stderr.fileno(): bytearray()}
  truncated = timed_out = False
  with selectors.DefaultSelector() as sel:
    for fd in bufs:
      sel.register(fd, selectors.EVENT_READ)
    while sel.get_map():
      remaining = deadline - time.monotonic()
      if remaining <= 0:
        timed_out = True
        break
      for key, _ in sel.select(min(remaining, 0.5)):
        chunk = os.read(key.fd, 1 << 16)
        if not chunk:
          sel.unregister(key.fd)
          continue
        buf = bufs[key.fd]
        keep = max(0, cap - len(buf))
        buf += chunk[:keep]
        truncated |= len(chunk) > keep
  return bytes(bufs[proc.stdout.fileno()]), bytes(bufs[proc.stderr.fileno()]), truncated, timed_out


def _classify(report: dict | None, stderr: bytes, timed_out: bool, limits: Limits) -> tuple[str, str]:
  if timed_out or report is None:
    return ('timeout', 'wall clock') if timed_out else ('error', 'sandbox_init gave no report')
  sig, code = report.get('signal'), report.get('exit_code')
  if report['wall_timeout']:
    return 'timeout', f'wall clock over {limits.wall_s:g}s'
  if sig == signal.SIGXCPU or (sig == signal.SIGKILL and report['cpu_s'] >= limits.cpu_s - 0.05):
    return 'timeout', f'CPU time over {limits.cpu_s}s'
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
        env: Mapping[str, str] | None = None) -> SandboxResult:
  """Runs argv (argv[0] an absolute path) in a private directory holding `files`."""
  start = time.monotonic()
  mode = isolation()
  root = os.geteuid() == 0
  uid = random.SystemRandom().randrange(1 << 20, 1 << 30) if root else None
  if uid is not None and not _world_executable(argv[0]):
    uid = None  # the throwaway uid could not even start it; stay as we are.
  workdir = tempfile.mkdtemp(prefix=f'{_DIR_PREFIX}{os.getpid()}-')
  proc = None
  status_r, status_w = os.pipe()
  try:
    all_files = dict(files)
    if stdin is not None:
      all_files['.stdin'] = stdin
    _write_files(workdir, all_files, uid)
    config = {
        'namespaces': mode == 'namespaces', 'workdir': workdir, 'uid': uid,
        'argv': list(argv), 'status_fd': status_w, 'wall_s': limits.wall_s,
        'stdin': os.path.join(workdir, '.stdin') if stdin is not None else None,
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
    proc = subprocess.Popen([*prefix, *command], stdin=subprocess.DEVNULL,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            pass_fds=(status_w,), env={'PATH': '/usr/bin:/bin'},
                            start_new_session=True)
    os.close(status_w)
    status_w = -1
    stdout, stderr, truncated, timed_out = _collect(
        proc, start + limits.wall_s + 2.0, limits.output_bytes)
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
                         time.monotonic() - start, mode)
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
    shutil.rmtree(workdir, ignore_errors=True)


# Runs main.py from the private directory under an audit hook; see the module docstring.
_PYTHON_BOOTSTRAP = r'''
import os, sys
def _sandbox_rules():
  root = os.getcwd()
  spawn = {'os.fork', 'os.forkpty', 'os.posix_spawn', 'os.spawn', 'os.exec', 'os.system',
           'subprocess.Popen', 'pty.spawn', 'socket.__new__', 'socket.socketpair',
           'ctypes.dlopen', 'ctypes.dlsym', 'ctypes.cdata', 'os.startfile'}
  mutate = {'os.remove', 'os.rename', 'os.rmdir', 'os.mkdir', 'os.symlink', 'os.link',
            'os.chmod', 'os.chown', 'os.truncate', 'os.utime', 'shutil.rmtree'}
  writing = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND
  busy = [False]
  def stop(what):
    os.write(2, ('\nSANDBOX_VIOLATION ' + what + '\n').encode('utf-8', 'replace'))
    os._exit(%d)
  def inside(path):
    if isinstance(path, int) or path is None:
      return True
    p = os.path.realpath(os.path.join(root, os.fsdecode(os.fspath(path))))
    return p == root or p.startswith(root + '/') or p in ('/dev/null', '/dev/zero')
  def hook(event, args):
    if busy[0]:
      return
    busy[0] = True
    try:
      if event in spawn:
        stop(event)
      elif event == 'import' and args[0].split('.')[0] in ('ctypes', '_ctypes', 'cffi'):
        stop('import ' + args[0])
      elif event == 'open':
        path, mode, flags = args[0], args[1] or '', args[2] if args[2] and args[2] > 0 else 0
        text = str(path)
        if text.startswith('/proc') and text.endswith('environ'):
          stop('read ' + text)
        if (any(c in mode for c in 'wax+') or flags & writing) and not inside(path):
          stop('write ' + text)
      elif event in mutate:
        targets = [a for a in args[:2] if isinstance(a, (str, bytes, os.PathLike))]
        for t in (targets if event in ('os.rename', 'os.link', 'os.symlink') else targets[:1]):
          if not inside(t):
            stop(event + ' ' + str(t))
    finally:
      busy[0] = False
  sys.addaudithook(hook)
_sandbox_rules()
del _sandbox_rules
sys.path.insert(0, os.getcwd())
sys.argv = ['main.py']
with open('main.py', encoding='utf-8') as _f:
  _code = compile(_f.read(), 'main.py', 'exec')
try:
  exec(_code, {'__name__': '__main__', '__builtins__': __builtins__})
except MemoryError:
  os.write(2, b'\nMemoryError\n')
  os._exit(%d)
''' % (VIOLATION_EXIT, MEMORY_EXIT)


def run_python(source: str, *, files: Mapping[str, str | bytes] = {},  # pylint: disable=dangerous-default-value
               limits: Limits = Limits(), stdin: str | bytes | None = None) -> SandboxResult:
  """Runs `source` as main.py with -I -S (standard library only) and the audit hook."""
  return run([python_interpreter(), '-I', '-S', '-B', '-X', 'utf8', '-c', _PYTHON_BOOTSTRAP],
             files={**files, 'main.py': source}, limits=limits, stdin=stdin)
