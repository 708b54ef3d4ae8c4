"""The Python programs' audit hook: the bootstrap that sandbox.run_python runs with -c.

It installs a hook that ends the process (exit VIOLATION_EXIT, 'SANDBOX_VIOLATION <what>' on
stderr) on fork/exec/subprocess, signals, socket creation, ctypes, sqlite, sub-interpreters,
tracing, gc's object walks (the only way to reach the hook), writes outside the private
directory and reads outside it and the standard library (and any /proc/<pid>), then runs
main.py from the private directory; a MemoryError ends it with MEMORY_EXIT. The OS layer
(sandbox.py, sandbox_init.py, syscall_filter.py) enforces; the hook names the cause.
Interpreter internals raise no audit event (`_posixsubprocess.fork_exec`), and a
sub-interpreter starts without the hook: the seccomp filter ends any fork or exec whatever
raised it, and the hook refuses the sub-interpreter modules.
"""

VIOLATION_EXIT, MEMORY_EXIT = 86, 87

# The hook keeps no mutable state (a switch in a list or a set could be flipped through gc
# or a frame's locals), never calls methods of its arguments (a str subclass or a PathLike
# could run code inside it), and refuses the introspection that could reach it.
BOOTSTRAP = r'''
import os, sys
def _sandbox_rules():
  root = os.getcwd()
  me = '/proc/%%d/' %% os.getpid()
  readable = tuple(sorted({os.path.realpath(p) + '/' for p in sys.path if p} |
                          {root + '/', '/dev/null', '/dev/zero', '/dev/urandom', '/proc/self/',
                           me}))
  writable = (root + '/', '/dev/null', '/dev/zero')
  forbidden = frozenset((
      'os.fork', 'os.forkpty', 'os.posix_spawn', 'os.spawn', 'os.exec', 'os.system',
      'subprocess.Popen', 'pty.spawn', 'socket.__new__', 'socket.socketpair', 'ctypes.dlopen',
      'ctypes.dlsym', 'ctypes.cdata', 'os.startfile', 'os.kill', 'os.killpg',
      'signal.pthread_kill', 'sqlite3.connect', 'gc.get_objects', 'gc.get_referrers',
      'gc.get_referents', 'sys.settrace', 'sys.setprofile', 'sys._current_frames',
      'sys._current_exceptions', 'sys.addaudithook'))
  mutate = frozenset(('os.remove', 'os.rename', 'os.rmdir', 'os.mkdir', 'os.symlink', 'os.link',
                      'os.chmod', 'os.chown', 'os.truncate', 'os.utime', 'shutil.rmtree'))
  pairs = frozenset(('os.rename', 'os.link', 'os.symlink'))
  # Sub-interpreters start without this hook; the _test* modules reach C internals;
  # _posixshmem's segments outlive the run where /dev/shm is the host's.
  blocked_modules = frozenset(('ctypes', '_ctypes', 'cffi', 'sqlite3', '_sqlite3',
                               '_xxsubinterpreters', '_interpreters', '_xxinterpchannels',
                               '_interpchannels', '_interpqueues', '_testcapi',
                               '_testinternalcapi', '_testmultiphase', '_testsinglephase',
                               '_testbuffer', '_testimportmultiple', '_testclinic',
                               '_posixshmem'))
  writing = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND
  realpath, join, write, exit_now = os.path.realpath, os.path.join, os.write, os._exit
  def stop(what):
    write(2, ('\nSANDBOX_VIOLATION ' + what + '\n').encode('utf-8', 'replace'))
    exit_now(%d)
  def resolve(path):
    if type(path) is bytes:
      path = path.decode('utf-8', 'replace')
    if type(path) is not str:
      stop('a path of type ' + type(path).__name__)
    return realpath(join(root, path))
  def under(path, places):
    p = path + '/'
    for place in places:
      if p.startswith(place) or path == place:
        return True
    return False
  def hook(event, args):
    if event in forbidden:
      stop(event)
    elif event == 'import':
      name = args[0]
      if type(name) is not str or name.partition('.')[0] in blocked_modules:
        stop('import ' + str.__str__(name) if type(name) is str else 'import')
    elif event == 'open':
      path, mode, flags = args[0], args[1], args[2]
      if type(path) is int or path is None:
        return
      p = resolve(path)
      mode = mode if type(mode) is str else ''
      flags = flags if type(flags) is int and flags > 0 else 0
      if any(c in mode for c in 'wax+') or flags & writing:
        if not under(p, writable):
          stop('write ' + p)
      elif not under(p, readable):
        stop('read ' + p)
    elif event in mutate:
      targets = [a for a in args[:2] if type(a) in (str, bytes)]
      for t in (targets if event in pairs else targets[:1]):
        if not under(resolve(t), writable):
          stop(event + ' ' + resolve(t))
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
