"""A seccomp filter for sandboxed programs: the system calls no checked program needs.

The Python audit hook (sandbox.py) names what a program tried, but interpreter internals
raise no audit event (`_posixsubprocess.fork_exec`, a sub-interpreter, which has no hook at
all) and a program that is not Python has no hook. This filter is the kernel's version of
the rules that matter across runs, installed by sandbox_init.py in the target process just
before it execs the program, and inherited by everything it starts:

  * no new processes (unless asked for): fork, vfork and clone without CLONE_THREAD end
    the process (SIGSYS: sandbox.py reports a violation); threads are fine; clone3, whose
    flags the filter cannot read, says ENOSYS, so libc falls back to clone;
  * no exec, except the one that starts the program: execve is allowed only with the exact
    filename and argv pointers sandbox_init passes (a program cannot choose its pointers
    without raw memory access, which ctypes is refused for); execveat never;
  * never, also with processes allowed: SysV IPC and POSIX message queues (objects that
    outlive the run on the host), ptrace and process_vm_*, pidfd_getfd, namespaces and
    mounts, keyrings, bpf, perf events, userfaultfd (these end the process); io_uring
    (ENOSYS: its operations bypass this filter); socket() (EACCES: no UDP, no host unix
    socket, whatever the isolation level; socketpair stays, it reaches nothing).
  * another architecture's system-call ABI (i386, x32 on x86_64) ends the process.

Standard library only (sandbox_init.py loads it with -I -S). Supported: x86_64, aarch64;
`supported()` is False elsewhere, and sandbox.check_isolation says so at start-up.
"""

import ctypes
import errno
import os
import struct

_AUDIT_ARCH = {'x86_64': 0xC000003E, 'aarch64': 0xC00000B7}
_X32_BIT = 0x40000000
_CLONE_THREAD = 0x00010000
_CLONE_NEW_ANY = 0x7E020080  # NEWNS, NEWCGROUP, NEWUTS, NEWIPC, NEWUSER, NEWPID, NEWNET, NEWTIME
_NR = {  # name: (x86_64, aarch64); None where the architecture has no such call.
    'fork': (57, None), 'vfork': (58, None), 'clone': (56, 220), 'clone3': (435, 435),
    'execve': (59, 221), 'execveat': (322, 281), 'ptrace': (101, 117),
    'process_vm_readv': (310, 270), 'process_vm_writev': (311, 271), 'socket': (41, 198),
    'shmget': (29, 194), 'shmat': (30, 196), 'shmctl': (31, 195), 'shmdt': (67, 197),
    'semget': (64, 190), 'semop': (65, 193), 'semctl': (66, 191), 'semtimedop': (220, 192),
    'msgget': (68, 186), 'msgsnd': (69, 189), 'msgrcv': (70, 188), 'msgctl': (71, 187),
    'mq_open': (240, 180), 'mq_unlink': (241, 181), 'mq_timedsend': (242, 182),
    'mq_timedreceive': (243, 183), 'mq_notify': (244, 184), 'mq_getsetattr': (245, 185),
    'unshare': (272, 97), 'setns': (308, 268), 'mount': (165, 40), 'umount2': (166, 39),
    'pivot_root': (155, 41), 'chroot': (161, 51), 'keyctl': (250, 219), 'add_key': (248, 217),
    'request_key': (249, 218), 'bpf': (321, 280), 'perf_event_open': (298, 241),
    'userfaultfd': (323, 282), 'io_uring_setup': (425, 425), 'io_uring_enter': (426, 426),
    'io_uring_register': (427, 427), 'open_tree': (428, 428), 'move_mount': (429, 429),
    'fsopen': (430, 430), 'fsconfig': (431, 431), 'fsmount': (432, 432), 'fspick': (433, 433),
    'pidfd_getfd': (438, 438),
}
_FATAL = ('ptrace', 'process_vm_readv', 'process_vm_writev', 'pidfd_getfd', 'shmget', 'shmat',
          'shmctl', 'shmdt', 'semget', 'semop', 'semctl', 'semtimedop', 'msgget', 'msgsnd',
          'msgrcv', 'msgctl', 'mq_open', 'mq_unlink', 'mq_timedsend', 'mq_timedreceive',
          'mq_notify', 'mq_getsetattr', 'unshare', 'setns', 'mount', 'umount2', 'pivot_root',
          'chroot', 'keyctl', 'add_key', 'request_key', 'bpf', 'perf_event_open',
          'userfaultfd', 'open_tree', 'move_mount', 'fsopen', 'fsconfig', 'fsmount', 'fspick')
_REFUSED = {'io_uring_setup': errno.ENOSYS, 'io_uring_enter': errno.ENOSYS,
            'io_uring_register': errno.ENOSYS, 'socket': errno.EACCES}
# seccomp return values and classic BPF opcodes (linux/seccomp.h, linux/filter.h).
_KILL, _ALLOW, _ERRNO = 0x80000000, 0x7FFF0000, 0x00050000
_LD_ABS, _JEQ, _JGE, _JSET, _RET = 0x20, 0x15, 0x35, 0x45, 0x06
_PR_SET_SECCOMP, _SECCOMP_MODE_FILTER = 22, 2


def supported() -> bool:
  """Whether this machine's architecture is in the table (the kernel may still lack seccomp)."""
  return os.uname().machine in _AUDIT_ARCH


def _op(code, k, jt=0, jf=0):
  return struct.pack('HBBI', code, jt, jf, k)


def _arg(i, high=False):  # offset of seccomp_data.args[i] (little endian: low word first).
  return 16 + 8 * i + (4 if high else 0)


def program(*, new_processes: bool, exec_pointers: tuple[int, int] | None) -> bytes:
  """The filter as packed sock_filter instructions.

  exec_pointers: (filename, argv) addresses of the one allowed execve; None refuses every
  execve. With new_processes, fork/clone/exec are allowed (namespace flags still are not).
  """
  machine = os.uname().machine
  column = list(_AUDIT_ARCH).index(machine)
  nr = {name: pair[column] for name, pair in _NR.items() if pair[column] is not None}
  out = [_op(_LD_ABS, 4), _op(_JEQ, _AUDIT_ARCH[machine], 1, 0), _op(_RET, _KILL),
         _op(_LD_ABS, 0)]
  if machine == 'x86_64':
    out += [_op(_JGE, _X32_BIT, 0, 1), _op(_RET, _KILL)]

  def rule(name, action):
    if name in nr:
      out.extend([_op(_JEQ, nr[name], 0, 1), _op(_RET, action)])

  for name in _FATAL:
    rule(name, _KILL)
  for name, code in _REFUSED.items():
    rule(name, _ERRNO | code)
  rule('clone3', _ERRNO | errno.ENOSYS)
  # clone: threads always; processes only if asked, and never into new namespaces.
  out += [_op(_JEQ, nr['clone'], 0, 6), _op(_LD_ABS, _arg(0)),
          _op(_JSET, _CLONE_NEW_ANY, 3, 0)]
  out += ([_op(_RET, _ALLOW)] * 3 if new_processes else
          [_op(_JSET, _CLONE_THREAD, 0, 1), _op(_RET, _ALLOW), _op(_RET, _KILL)])
  out += [_op(_RET, _KILL)]
  if not new_processes:
    for name in ('fork', 'vfork', 'execveat'):
      rule(name, _KILL)
    if exec_pointers is None:
      rule('execve', _KILL)
    else:  # execve with exactly these filename and argv pointers, else the end.
      checks = []
      for i, pointer in enumerate(exec_pointers):
        for high in (False, True):
          checks.append((_arg(i, high), (pointer >> 32) if high else pointer & 0xFFFFFFFF))
      out.append(_op(_JEQ, nr['execve'], 0, 2 * len(checks) + 2))
      for j, (offset, value) in enumerate(checks):
        out += [_op(_LD_ABS, offset), _op(_JEQ, value, 0, 2 * (len(checks) - j) - 1)]
      out += [_op(_RET, _ALLOW), _op(_RET, _KILL)]
  out.append(_op(_RET, _ALLOW))
  return b''.join(out)


class _Prog(ctypes.Structure):
  _fields_ = [('len', ctypes.c_ushort), ('filter', ctypes.c_void_p)]


def install(code: bytes) -> None:
  """Applies `code` to this process and all it starts (needs no_new_privs or CAP_SYS_ADMIN)."""
  libc = ctypes.CDLL(None, use_errno=True)
  buf = ctypes.create_string_buffer(code, len(code))
  prog = _Prog(len(code) // 8, ctypes.addressof(buf))
  if libc.prctl(_PR_SET_SECCOMP, _SECCOMP_MODE_FILTER, ctypes.byref(prog), 0, 0) != 0:
    e = ctypes.get_errno()
    raise OSError(e, f'seccomp filter not installed: {os.strerror(e)}')


def execve(path: str, argv: list[str], env: dict[str, str], *, new_processes: bool) -> None:
  """Installs the filter, then execs path (the one execve the filter allows); raises on failure."""
  libc = ctypes.CDLL(None, use_errno=True)
  path_buf = ctypes.create_string_buffer(path.encode())
  args = [ctypes.create_string_buffer(a.encode()) for a in argv]
  envs = [ctypes.create_string_buffer(f'{k}={v}'.encode()) for k, v in env.items()]
  argv_arr = (ctypes.c_char_p * (len(args) + 1))(*[ctypes.addressof(a) for a in args], None)
  envp_arr = (ctypes.c_char_p * (len(envs) + 1))(*[ctypes.addressof(e) for e in envs], None)
  pointers = (ctypes.addressof(path_buf), ctypes.addressof(argv_arr))
  install(program(new_processes=new_processes, exec_pointers=pointers))
  libc.execve(path_buf, argv_arr, envp_arr)
  e = ctypes.get_errno()
  raise OSError(e, f'execve {path}: {os.strerror(e)}')


if __name__ == '__main__':  # the probe sandbox.py runs once: can a filter be installed here?
  libc_ = ctypes.CDLL(None, use_errno=True)
  if libc_.prctl(38, 1, 0, 0, 0) != 0:  # PR_SET_NO_NEW_PRIVS
    raise SystemExit(2)
  install(program(new_processes=False, exec_pointers=None))
  import socket  # pylint: disable=import-outside-toplevel
  try:
    socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
  except PermissionError:
    raise SystemExit(0) from None
  raise SystemExit(3)
