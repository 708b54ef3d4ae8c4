"""The first process inside a sandbox: lock the filesystem, drop privileges, run, report.

Run by sandbox.py as `python -I -S sandbox_init.py CONFIG_JSON`, as root inside fresh
pid/mount/network/IPC/UTS namespaces when the machine allows them (then this is pid 1, and
the kernel kills every process left in the namespace when it exits), else directly (then it
is a child subreaper, so whatever its tree starts, in a new session or not, stays its
descendant). It

  1. (namespaces) builds a private root: a tmpfs holding read-only bind mounts of the
     paths the program needs (the system's /usr and libraries, the interpreter's
     installation minus its site-packages, a few /dev nodes), the work directory
     (writable) and a fresh /proc of the new pid namespace, then pivots into it: the
     project, home, other users' files, /dev/shm and the host's /proc no longer exist;
  2. forks the target, which sets rlimits, drops to a throwaway uid, sets no_new_privs,
     (where the kernel has Landlock ABI >= 6) restricts itself to reading those paths and
     writing the work directory, sending no signal out of its domain and opening no TCP
     connection, installs the seccomp filter of syscall_filter.py and execs the target;
  3. waits under a wall-clock deadline, summing the CPU time of the whole tree (what it
     reaped plus every live descendant's, from /proc, every POLL_S): RLIMIT_CPU is per
     process, so children would multiply the budget; at the budget or the deadline it
     kills the tree. Then it writes a JSON report (exit code, signal, CPU time of the tree,
     which limit ended it) to the status pipe and kills whatever is left: every process
     of the namespace (namespaces), every descendant and (as root) every process of the
     throwaway uid (otherwise).

Standard library only, no imports from rlreason: it runs with -I -S (syscall_filter.py, a
standard-library module beside it, is loaded by path). Deliberately not here: deciding what
the outcome means (sandbox.py does that).
"""

import ctypes
import json
import os
import resource
import signal
import sys
import time

if __package__:  # imported by sandbox.py (for landlock_abi)
  from rlreason.verifiers import syscall_filter
else:  # the script, run with -I -S: its sibling by path, sys.path of no other process touched.
  sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
  import syscall_filter  # pylint: disable=import-error

POLL_S = 0.05

_MS_RDONLY, _MS_NOSUID, _MS_NODEV, _MS_REMOUNT, _MS_BIND, _MS_REC = 1, 2, 4, 32, 4096, 16384
_MS_NOEXEC, _MNT_DETACH = 8, 2
_PR_SET_NO_NEW_PRIVS, _PR_SET_CHILD_SUBREAPER = 38, 36
_SYS_PIVOT_ROOT = {'x86_64': 155, 'aarch64': 41}
# Landlock (linux/landlock.h): syscalls, access rights, the rule type, scopes.
_LL_CREATE, _LL_ADD_RULE, _LL_RESTRICT = 444, 445, 446
_LL_FS_ALL = (1 << 16) - 1  # EXECUTE .. IOCTL_DEV (ABI 5); masked down to the kernel's ABI
_LL_FS_READ = 1 | 4 | 8  # EXECUTE, READ_FILE, READ_DIR
_LL_FS_FILE = 1 | 2 | 4 | (1 << 14) | (1 << 15)  # the rights a rule on a file may hold
_LL_NET_TCP = 1 | 2  # BIND_TCP, CONNECT_TCP
_LL_SCOPE = 1 | 2  # ABSTRACT_UNIX_SOCKET, SIGNAL
LANDLOCK_MIN_ABI = 6  # signal scoping arrived in ABI 6 (Linux 6.12)


def _libc():
  return ctypes.CDLL(None, use_errno=True)


def _check(result, what):
  if result < 0:
    errno = ctypes.get_errno()
    raise OSError(errno, os.strerror(errno), what)
  return result


def _mount(libc, source, target, flags, fstype=None):
  _check(libc.mount(source and source.encode(), target.encode(),
                    fstype and fstype.encode(), flags, None), target)


def landlock_abi():
  """The kernel's Landlock ABI version, 0 where it has none."""
  libc = _libc()
  libc.syscall.restype = ctypes.c_long
  return max(0, libc.syscall(_LL_CREATE, None, ctypes.c_size_t(0), ctypes.c_uint32(1)))


class _RulesetAttr(ctypes.Structure):
  _fields_ = [('fs', ctypes.c_uint64), ('net', ctypes.c_uint64), ('scoped', ctypes.c_uint64)]


class _PathBeneath(ctypes.Structure):
  _pack_ = 1
  _fields_ = [('allowed', ctypes.c_uint64), ('parent_fd', ctypes.c_int32)]


def landlock(read_paths, write_paths):
  """Restricts this process (and what it execs) to these paths, no signals out, no TCP."""
  abi = landlock_abi()
  if abi < LANDLOCK_MIN_ABI:
    raise OSError(f'Landlock ABI {abi} < {LANDLOCK_MIN_ABI}')
  fs = _LL_FS_ALL & ~((1 << 15) if abi < 5 else 0)
  libc = _libc()
  libc.syscall.restype = ctypes.c_long
  attr = _RulesetAttr(fs, _LL_NET_TCP, _LL_SCOPE)
  ruleset = _check(libc.syscall(_LL_CREATE, ctypes.byref(attr), ctypes.c_size_t(24),
                                ctypes.c_uint32(0)), 'landlock_create_ruleset')
  try:
    for paths, rights in ((read_paths, _LL_FS_READ), (write_paths, fs)):
      for path in paths:
        try:
          fd = os.open(path, os.O_PATH | os.O_CLOEXEC)
        except OSError:
          continue  # absent here: nothing to allow.
        try:
          allowed = rights if os.path.isdir(path) else rights & _LL_FS_FILE
          rule = _PathBeneath(allowed, fd)
          _check(libc.syscall(_LL_ADD_RULE, ruleset, 1, ctypes.byref(rule), 0), path)
        finally:
          os.close(fd)
    _check(libc.syscall(_LL_RESTRICT, ruleset, 0), 'landlock_restrict_self')
  finally:
    os.close(ruleset)


def _mkpoint(path, like):
  if os.path.isdir(like):
    os.makedirs(path, exist_ok=True)
  else:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    open(path, 'a').close()  # pylint: disable=consider-using-with


def private_root(newroot, workdir, read_paths, hidden):
  """Pivots into a tmpfs holding read-only binds of read_paths and the writable workdir."""
  libc = _libc()
  _mount(libc, 'tmpfs', newroot, _MS_NOSUID | _MS_NODEV, 'tmpfs')
  for path in read_paths:
    target = newroot + path
    if os.path.islink(path):  # /bin -> usr/bin on merged-/usr systems.
      os.makedirs(os.path.dirname(target), exist_ok=True)
      os.symlink(os.readlink(path), target)
      continue
    if not os.path.exists(path):
      continue
    _mkpoint(target, path)
    _mount(libc, path, target, _MS_BIND | _MS_REC)
    device = path.startswith('/dev/')
    _mount(libc, None, target, _MS_REMOUNT | _MS_BIND | _MS_RDONLY | _MS_NOSUID |
           (0 if device else _MS_NODEV))
  for path in hidden:  # site-packages: the project may be installed there.
    if os.path.isdir(newroot + path):
      _mount(libc, 'tmpfs', newroot + path, _MS_RDONLY | _MS_NOSUID | _MS_NODEV, 'tmpfs')
  _mkpoint(newroot + workdir, workdir)
  _mount(libc, workdir, newroot + workdir, _MS_BIND)
  _mount(libc, None, newroot + workdir, _MS_REMOUNT | _MS_BIND | _MS_NOSUID | _MS_NODEV)
  os.makedirs(newroot + '/proc', exist_ok=True)
  _mount(libc, 'proc', newroot + '/proc', _MS_NOSUID | _MS_NODEV | _MS_NOEXEC, 'proc')
  _mount(libc, None, newroot, _MS_REMOUNT | _MS_RDONLY | _MS_NOSUID | _MS_NODEV)
  os.chdir(newroot)
  libc.syscall.restype = ctypes.c_long
  _check(libc.syscall(_SYS_PIVOT_ROOT[os.uname().machine], b'.', b'.'), 'pivot_root')
  _check(libc.umount2(b'.', _MNT_DETACH), 'umount old root')
  os.chdir('/')


def _exec_target(config):
  signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGCHLD})  # the mask survives exec.
  os.chdir(config['workdir'])
  for name, (soft, hard) in config['rlimits'].items():
    resource.setrlimit(getattr(resource, 'RLIMIT_' + name), (soft, hard))
  if config['uid'] is not None:
    os.setgroups([])
    os.setresgid(config['uid'], config['uid'], config['uid'])
    os.setresuid(config['uid'], config['uid'], config['uid'])
  _check(_libc().prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), 'no_new_privs')
  if config['landlock']:
    try:
      landlock(config['read_paths'], [config['workdir']] + config['device_paths'])
    except OSError as e:
      if config['require_landlock']:
        raise
      os.write(2, f'sandbox_init: Landlock not applied: {e}\n'.encode())
  os.umask(0o077)
  if config['seccomp']:  # sandbox.py's probe says the kernel has it: failing here is fatal.
    syscall_filter.execve(config['argv'][0], config['argv'], config['env'],
                          new_processes=config['new_processes'])
  os.execve(config['argv'][0], config['argv'], config['env'])


def _processes(candidates):
  """{pid: (parent pid, CPU seconds with what it reaped)} of the live, non-zombie processes."""
  tick = os.sysconf('SC_CLK_TCK')
  out = {}
  for entry in candidates:
    if not entry.isdigit():
      continue
    try:
      with open(f'/proc/{entry}/stat', 'rb') as f:
        fields = f.read().rsplit(b')', 1)[1].split()
    except (OSError, ValueError):
      continue
    if fields[0] not in (b'Z', b'X'):  # utime, stime, cutime, cstime are fields 14-17.
      out[int(entry)] = (int(fields[1]), sum(int(x) for x in fields[11:15]) / tick)
  return out


def _descendants(processes):
  me, found, frontier = os.getpid(), set(), {os.getpid()}
  while frontier:
    frontier = {p for p, (parent, _) in processes.items() if parent in frontier} - found - {me}
    found |= frontier
  return found


class _Exits:
  """What reaping found: the CPU time of every reaped process and each one's wait status."""

  def __init__(self):
    self.cpu_s, self.status = 0.0, {}

  def reap(self):
    while True:
      try:
        pid, code, usage = os.wait4(-1, os.WNOHANG)
      except ChildProcessError:
        return
      if pid == 0:
        return
      self.cpu_s += usage.ru_utime + usage.ru_stime
      self.status[pid] = code


def _kill_tree(config, exits):
  """Kills every descendant (orphans come back to this subreaper) until none is left."""
  for _ in range(100):
    if config['namespaces']:  # as pid 1: everything in the namespace but this process.
      try:
        os.kill(-1, signal.SIGKILL)
      except ProcessLookupError:
        pass
    tree = _descendants(_processes(os.listdir('/proc')))
    if not tree:
      return
    for pid in tree:
      try:
        os.kill(pid, signal.SIGKILL)
      except ProcessLookupError:
        pass
    exits.reap()
    time.sleep(0.002)


def _kill_uid(uid):
  """Kills every process of `uid` (a throwaway uid, so only sandbox processes)."""
  for _ in range(3):  # a fork bomb may fork while kill(-1) walks the process table.
    pid = os.fork()
    if pid == 0:
      try:
        os.setresuid(uid, uid, uid)
        os.kill(-1, signal.SIGKILL)  # as uid: every process this uid may signal.
      except OSError:
        pass
      os._exit(0)
    os.waitpid(pid, 0)


def _supervise(pid, config, report, exits):
  """Waits for the target under the wall-clock deadline and the tree's CPU budget."""
  deadline = time.monotonic() + config['wall_s']
  while True:
    exits.reap()
    if pid in exits.status:
      break
    # Without new processes (the seccomp filter) the tree is the target alone.
    live = _processes(os.listdir('/proc') if config['new_processes'] else [str(pid)])
    tree = _descendants(live) if config['new_processes'] else set(live)
    report['cpu_s'] = exits.cpu_s + sum(live[p][1] for p in tree)
    now = time.monotonic()
    if report['cpu_s'] >= config['cpu_s'] and not report['cpu_limit']:
      report['cpu_limit'] = True
      _kill_tree(config, exits)
    elif now >= deadline and not report['wall_timeout']:
      report['wall_timeout'] = True
      _kill_tree(config, exits)
    elif not report['cpu_limit'] and not report['wall_timeout']:
      signal.sigtimedwait({signal.SIGCHLD}, max(0.001, min(POLL_S, deadline - now)))
    else:  # killed: its status is due any moment.
      signal.sigtimedwait({signal.SIGCHLD}, 0.01)
  report['cpu_s'] = max(report['cpu_s'], exits.cpu_s)
  return exits.status[pid]


def main():
  config = json.loads(sys.argv[1])
  status_fd = config['status_fd']
  report = {'mount_errors': [], 'wall_timeout': False, 'cpu_limit': False, 'cpu_s': 0.0}
  if config['namespaces']:
    try:
      private_root(config['newroot'], config['workdir'],
                   config['read_paths'] + config['device_paths'], config['hidden_paths'])
    except OSError as e:  # no report: sandbox.py counts the run as an error, nothing ran.
      os.write(2, f'sandbox_init: cannot build the private root: {e}\n'.encode())
      os._exit(1)
  else:
    _check(_libc().prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0), 'child subreaper')
  # SIG_IGN (inheritable from whoever started us) would make the kernel reap the target
  # before wait4 sees its status; blocked, SIGCHLD wakes sigtimedwait.
  signal.signal(signal.SIGCHLD, signal.SIG_DFL)
  signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGCHLD})
  pid = os.fork()
  if pid == 0:
    try:
      os.close(status_fd)
      _exec_target(config)
    except BaseException as e:  # pylint: disable=broad-except
      os.write(2, f'sandbox_init: cannot start {config["argv"][0]}: {e}\n'.encode())
    os._exit(127)
  exits = _Exits()
  status = _supervise(pid, config, report, exits)
  report['exit_code'] = os.WEXITSTATUS(status) if os.WIFEXITED(status) else None
  report['signal'] = os.WTERMSIG(status) if os.WIFSIGNALED(status) else None
  _kill_tree(config, exits)
  if not config['namespaces'] and config['uid'] is not None:
    _kill_uid(config['uid'])
  os.write(status_fd, json.dumps(report).encode())
  os._exit(0)


if __name__ == '__main__':
  main()
