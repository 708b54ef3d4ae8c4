"""`python`: a per-episode Python interpreter whose every cell runs in the sandbox.

Nothing the model writes is executed in this process: each call is one `sandbox.run_python`,
with the same isolation as a verifier item (rlimits, a CPU budget for the whole process tree,
private temporary directory, no network, private IPC namespace, the seccomp filter and the
audit hook; see verifiers/sandbox.py), so no call leaves state (files, SysV or POSIX IPC
objects, processes) that a later call or another episode could read.
State persists by replay: the session keeps the cells that ran without raising, and each
call runs all of them again with their output suppressed, then the new cell with its
stdout and stderr captured. Consequences, accepted for isolation without a long-lived
process: a call costs O(cells) and its CPU/wall limits cover the replay too; a replayed
cell that reads the clock, draws random numbers or writes files sees a fresh world each
time (values can change between calls); the history holds at most MAX_CELLS cells, after
which cells still run but their state is not kept. Like a REPL, a cell whose last
statement is an expression prints that expression's repr.

Not here: packages outside the standard library (the sandbox hides site-packages),
stdin, files that outlive one call.
"""

import json
import secrets
from typing import Any, Mapping

from rlreason.envs import base
from rlreason.verifiers import sandbox

MAX_CELLS = 20
MAX_CELL_CHARS = 20_000
TRACEBACK_LINES = 6
LIMITS = sandbox.Limits(cpu_s=2, wall_s=4.0, output_bytes=16 << 10)
# The error classes CLEANER's rollback retries by default (rollout/rollback.py): the exception
# names its first author's code matches (github Tianshi-Xu/Open-AgentRL @85606f8,
# verl/verl/experimental/agent_loop/tool_agent_loop.py, `rollback_on_errors`).
ROLLBACK_ERRORS = ('ImportError', 'ModuleNotFoundError', 'SyntaxError', 'IndentationError',
                   'NameError')
_RAISED_EXIT, _REPLAY_EXIT = 3, 4

# Runs as the sandbox's main.py; cells.json holds {"history": [...], "cell": "..."}.
# %(nonce)s marks the driver's own stderr lines, so a cell printing look-alikes is ignored.
_DRIVER = r'''
import ast, io, json, linecache, os, sys

def _format(e):
  # By hand: importing the traceback module trips the sandbox's audit hook.
  lines = ['Traceback (most recent call last):']
  tb = e.__traceback__
  while tb is not None:
    name = tb.tb_frame.f_code.co_filename
    if name.startswith('<cell '):
      lines.append('  File "%%s", line %%d' %% (name, tb.tb_lineno))
      lines.append('    ' + linecache.getline(name, tb.tb_lineno).strip())
    tb = tb.tb_next
  if isinstance(e, SyntaxError):
    lines.append('  File "%%s", line %%s' %% (e.filename, e.lineno))
    lines.append('    ' + (e.text or '').strip())
    return '\n'.join(lines + ['%%s: %%s' %% (type(e).__name__, e.msg)]) + '\n'
  message = str(e)
  return '\n'.join(lines + [type(e).__name__ + (': ' + message if message else '')]) + '\n'

def _compile(source, name):
  linecache.cache[name] = (len(source), None, source.splitlines(True), name)
  tree = ast.parse(source, name)
  last = None
  if tree.body and isinstance(tree.body[-1], ast.Expr):
    last = compile(ast.Expression(tree.body.pop().value), name, 'eval')
  return compile(tree, name, 'exec'), last

def _run(source, name, namespace):
  body, last = _compile(source, name)
  exec(body, namespace)
  if last is not None:
    value = eval(last, namespace)
    if value is not None:
      print(repr(value))

with open('cells.json', encoding='utf-8') as f:
  _cells = json.load(f)
_namespace = {'__name__': '__main__', '__builtins__': __builtins__}
_stdout, _stderr = sys.stdout, sys.stderr
for _i, _source in enumerate(_cells['history']):
  sys.stdout = sys.stderr = io.StringIO()
  try:
    _run(_source, '<cell %%d>' %% (_i + 1), _namespace)
  except MemoryError:
    raise
  except BaseException as e:
    sys.stdout, sys.stderr = _stdout, _stderr
    print('\n%(nonce)s replay %%d %%s' %% (_i + 1, type(e).__name__), file=sys.stderr, flush=True)
    os._exit(%(replay)d)
sys.stdout, sys.stderr = _stdout, _stdout
try:
  _run(_cells['cell'], '<cell %%d>' %% (len(_cells['history']) + 1), _namespace)
except MemoryError:
  raise
except BaseException as e:
  sys.stdout.flush()
  _stderr.write('\n%(nonce)s traceback\n' + _format(e))
  _stderr.flush()
  os._exit(%(raised)d)
sys.stdout.flush()
'''


class Session:
  """The episode's successful cells, replayed before each new one."""

  def __init__(self):
    self.history: list[str] = []


def _traceback(stderr: str, nonce: str) -> str:
  marker = f'{nonce} traceback\n'
  text = stderr[stderr.rfind(marker) + len(marker):] if marker in stderr else stderr
  lines = [l for l in text.splitlines() if l.strip()]
  return '\n'.join(lines[-TRACEBACK_LINES:])


def exception_name(traceback_text: str) -> str | None:
  """The raised exception's class name: what precedes ':' on the traceback's last line."""
  lines = traceback_text.strip().splitlines()
  name = lines[-1].split(':', 1)[0].strip() if lines else ''
  return name if name.isidentifier() else None


def _with_note(stdout: str, truncated: bool) -> str:
  return stdout + (f'\n...[output cut at {LIMITS.output_bytes} bytes]' if truncated else '')


class PythonTool:
  """Runs one cell per call; see the module docstring for how state survives between calls."""

  rollback_errors = ROLLBACK_ERRORS

  spec = base.ToolSpec(
      name='python',
      description='Runs Python code (standard library only) in a sandboxed interpreter that '
                  'keeps variables between calls during this episode; returns what it prints '
                  '(and the value of a final expression), or the traceback.',
      parameters={'type': 'object', 'properties': {
          'code': {'type': 'string', 'description': 'Python statements to run'}},
                  'required': ['code']})

  def new_session(self, context: Mapping[str, Any]) -> Session:
    del context  # every episode starts from an empty interpreter.
    return Session()

  def call(self, session: Session, arguments: Mapping[str, Any]) -> str:
    code = arguments['code']
    if not code.strip():
      raise base.ToolError(base.BAD_ARGUMENTS, 'python: code is empty')
    if len(code) > MAX_CELL_CHARS:
      raise base.ToolError(base.BAD_ARGUMENTS,
                           f'python: code is {len(code)} characters; at most {MAX_CELL_CHARS}')
    nonce = 'RLR' + secrets.token_hex(8)
    driver = _DRIVER % {'nonce': nonce, 'replay': _REPLAY_EXIT, 'raised': _RAISED_EXIT}
    cells = json.dumps({'history': session.history, 'cell': code})
    result = sandbox.run_python(driver, files={'cells.json': cells}, limits=LIMITS)
    if result.status == 'timeout':
      raise base.ToolError(base.TIMEOUT, f'python: {result.detail} (CPU limit {LIMITS.cpu_s}s, '
                           f'wall limit {LIMITS.wall_s:g}s, earlier cells included)')
    if result.status in ('violation', 'memory'):
      raise base.ToolError(base.SANDBOX_VIOLATION, f'python: {result.detail}')
    if result.status == 'refused':
      raise base.ToolError(base.CRASH, f'python: sandbox refused: {result.detail}')
    if result.status == 'error' and result.exit_code == _RAISED_EXIT:
      out = _with_note(result.stdout, result.truncated)
      trace = _traceback(result.stderr, nonce)
      raise base.ToolError(base.TOOL_FAILED, (out.rstrip() + '\n' if out.strip() else '') + trace,
                           error_class=exception_name(trace))
    if result.status == 'error' and result.exit_code == _REPLAY_EXIT:
      line = result.stderr[result.stderr.rfind(f'{nonce} replay'):].split('\n', 1)[0]
      session.history.clear()
      raise base.ToolError(base.TOOL_FAILED, 'python: replaying an earlier cell failed this '
                           f'time ({line[len(nonce) + 1:]}); the state is lost')
    if result.status != 'ok':
      raise base.ToolError(base.TOOL_FAILED, f'python: the interpreter failed ({result.detail}): '
                           f'{result.stderr[-300:].strip()}')
    out = _with_note(result.stdout, result.truncated)
    if len(session.history) < MAX_CELLS:
      session.history.append(code)
    else:
      out += f'\n[note: history full ({MAX_CELLS} cells); this cell\'s state is not kept]'
    return out if out.strip() else '(no output)'


TOOL = PythonTool()
