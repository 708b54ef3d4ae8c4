"""The first process inside a sandbox: lock the filesystem, drop privileges, run, report.

Run by sandbox.py as `python -I -S sandbox_init.py CONFIG_JSON`, as root inside fresh
pid/mount/network namespaces when the machine allows them (then this is pid 1, and the
kernel kills every process left in the namespace when it exits), else directly. It

  1. (namespaces) bind-mounts the work directory and remounts every other mount
     read-only and nosuid, so the only writable place is the work directory;
  2. forks the target, which sets rlimits, drops to a throwaway uid, sets no_new_privs
     and execs the target command;
  3. waits under a wall-clock alarm, writes a JSON report (exit code, signal, CPU time)
     to the status pipe, and (no namespaces, but root) kills whatever the throwaway uid
     still runs.

Standard library only, no imports from rlreason: it runs with -I -S. Deliberately not
here: deciding what the outcome means (sandbox.py does that).
"""

import ctypes
import json
import os
import resource
import signal
import sys

_MS_RDONLY, _MS_NOSUID, _MS_NODEV, _MS_REMOUNT, _MS_BIND = 1, 2, 4, 32, 4096
_PR_SET_NO_NEW_PRIVS = 38


def _mount(libc, source, target, flags):
  if libc.mount(source and source.encode(), target.encode(), None, flags, None) != 0:
    errno = ctypes.get_errno()
    raise OSError(errno, os.strerror(errno), target)


def _mount_points():
  with open('/proc/self/mountinfo', encoding='utf-8') as f:
    for line in f:
      # Field 5 is the mount point, with spaces and the like written as octal escapes.
      yield line.split()[4].encode().decode('unicode_escape')


def lock_filesystem(workdir):
  """Makes everything but workdir read-only; returns the mounts that could not be locked."""
  libc = ctypes.CDLL(None, use_errno=True)
  _mount(libc, workdir, workdir, _MS_BIND)
  _mount(libc, None, workdir, _MS_REMOUNT | _MS_BIND | _MS_NOSUID | _MS_NODEV)
  errors = []
  for point in sorted(set(_mount_points())):
    if point == workdir or point == '/proc' or point.startswith('/proc/'):
      continue
    try:
      _mount(libc, None, point, _MS_REMOUNT | _MS_BIND | _MS_RDONLY | _MS_NOSUID)
    except OSError as e:
      errors.append(f'{point}: {e.strerror}')
  return errors


def _exec_target(config):
  os.chdir(config['workdir'])
  stdin = os.open(config['stdin'] or os.devnull, os.O_RDONLY)
  os.dup2(stdin, 0)
  for name, (soft, hard) in config['rlimits'].items():
    resource.setrlimit(getattr(resource, 'RLIMIT_' + name), (soft, hard))
  if config['uid'] is not None:
    os.setgroups([])
    os.setresgid(config['uid'], config['uid'], config['uid'])
    os.setresuid(config['uid'], config['uid'], config['uid'])
  ctypes.CDLL(None).prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0)
  os.umask(0o077)
  os.execve(config['argv'][0], config['argv'], config['env'])


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


def main():
  config = json.loads(sys.argv[1])
  status_fd = config['status_fd']
  report = {'mount_errors': [], 'wall_timeout': False}
  if config['namespaces']:
    report['mount_errors'] = lock_filesystem(config['workdir'])
  pid = os.fork()
  if pid == 0:
    try:
      os.close(status_fd)
      _exec_target(config)
    except BaseException as e:  # pylint: disable=broad-except
      os.write(2, f'sandbox_init: cannot start {config["argv"][0]}: {e}\n'.encode())
    os._exit(127)

  def on_alarm(*_):
    report['wall_timeout'] = True
    os.kill(pid, signal.SIGKILL)

  signal.signal(signal.SIGALRM, on_alarm)
  signal.setitimer(signal.ITIMER_REAL, config['wall_s'])
  _, status, usage = os.wait4(pid, 0)
  signal.setitimer(signal.ITIMER_REAL, 0)
  report['exit_code'] = os.WEXITSTATUS(status) if os.WIFEXITED(status) else None
  report['signal'] = os.WTERMSIG(status) if os.WIFSIGNALED(status) else None
  report['cpu_s'] = usage.ru_utime + usage.ru_stime
  report['max_rss_kib'] = usage.ru_maxrss
  if not config['namespaces'] and config['uid'] is not None:
    _kill_uid(config['uid'])
  os.write(status_fd, json.dumps(report).encode())
  os._exit(0)


if __name__ == '__main__':
  main()
