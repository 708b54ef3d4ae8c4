"""Assert tests judged in a trusted process; only the solution's own calls run in the sandbox.

  assert abs(area(2.0) - 12.566) < 1e-3
  # `area` is a name the solution defines: the sandbox calls it on 2.0 (evaluated here,
  # sent as plain data) and sends back what it returned as plain data; abs, -, < and
  # 1e-3 are evaluated here, on the decoded value.

The whole assert expression is evaluated here, in a child process of the verifier with a
CPU, memory and wall-clock budget (trusted_checks.py), never in the sandbox. A name in a test
resolves, in this order, to: the test's own bindings (its imports, comprehension variables,
lambda arguments); the builtins in BUILTINS; math and cmath; a name the solution binds by
importing a MODULES module, imported here again; a name the solution defines at top level
(def, class, assignment, ...), which becomes a `Ref`; anything else is a NameError. So a
solution that shadows `sorted`, `len`, `math.isclose` or a module it imports changes nothing
that is computed here.

A Ref stands for an object that lives in the sandbox. Calling it (with arguments evaluated
here: plain data, or other Refs) or reading an attribute that plain data does not have
(`Solution().twoSum`) records an *op*; the sandbox replays the ops in order and sends back
each result as plain data (plain_data), or marks it opaque (a function, a class instance).
A plain result is decoded and used here like any value: its comparisons, methods and
attributes are the real ones. An opaque Ref cannot be compared, hashed, iterated, indexed,
converted, or asked a plain-data attribute (`.startswith`, `.issubset`, `.keys`): that
raises here, so a solution object never answers a question whose answer is judged.
A test that needs a result whose op has not run yet is pending; python_tests repeats
sandbox runs (each replaying every op) until every test is decided, at most MAX_ROUNDS.

Supported test shapes: assert statements (several per test are one test) and imports of
MODULES. Other statements, and attributes or names starting with an underscore, raise
Unsupported: such tests can only run as free-form code inside the solution's process
(python_tests' test_mode='in_process').

Not here: the sandbox side (python_tests), or free-form tests.
"""

import ast
import builtins
import hashlib
import importlib
import json
import math
import resource
import sys
from typing import Any, Mapping

from rlreason.verifiers.plain_data import decode_value
from rlreason.verifiers.plain_data import encode_value

MAX_ROUNDS = 4
MEMORY_BYTES = 1 << 30
MODULES = frozenset(('bisect', 'cmath', 'collections', 'copy', 'datetime', 'decimal', 'fractions',
                     'functools', 'heapq', 'itertools', 'math', 'operator', 're', 'statistics',
                     'string', 'typing'))
ALWAYS = ('math', 'cmath')
BUILTINS = {name: getattr(builtins, name) for name in (
    'abs', 'all', 'any', 'ascii', 'bin', 'bool', 'bytes', 'callable', 'chr', 'complex', 'dict',
    'divmod', 'enumerate', 'filter', 'float', 'format', 'frozenset', 'hash', 'hex', 'int',
    'isinstance', 'issubclass', 'iter', 'len', 'list', 'map', 'max', 'min', 'next', 'oct', 'ord',
    'pow', 'range', 'repr', 'reversed', 'round', 'set', 'slice', 'sorted', 'str', 'sum', 'tuple',
    'type', 'zip', 'ArithmeticError', 'AssertionError', 'AttributeError', 'Exception',
    'IndexError', 'KeyError', 'LookupError', 'OverflowError', 'RuntimeError', 'StopIteration',
    'TypeError', 'ValueError', 'ZeroDivisionError')}
_PLAIN_TYPES = (type(None), bool, int, float, complex, str, bytes, list, tuple, dict, set,
                frozenset)
PLAIN_ATTRIBUTES = frozenset(name for t in _PLAIN_TYPES for name in dir(t))
_NESTED_SCOPES = (ast.Lambda, ast.ListComp, ast.SetComp, ast.DictComp, ast.GeneratorExp)


class Unsupported(ValueError):
  """A test that cannot be judged outside the solution's process."""


class Pending(BaseException):
  """The test needs the result of an op that has not run yet (BaseException: no builtin
  swallows it)."""


class ProbeFailed(Exception):
  """A call into the solution raised, or the run ended before it."""


def parse_test(source: str) -> list[ast.stmt]:
  """The test's statements, or Unsupported naming what cannot be judged here."""
  try:
    module = ast.parse(source)
  except (SyntaxError, ValueError) as e:
    raise Unsupported(f'test is not valid Python: {e}') from None
  except (RecursionError, MemoryError):
    raise Unsupported('test is nested too deeply') from None
  for statement in module.body:
    if isinstance(statement, ast.Import):
      modules = [alias.name for alias in statement.names]
    elif isinstance(statement, ast.ImportFrom):
      modules = [statement.module if statement.level == 0 and all(
          a.name != '*' for a in statement.names) else '(relative or *)']
    elif isinstance(statement, ast.Assert):
      continue
    else:
      raise Unsupported(f'{type(statement).__name__} statement (only assert and imports of '
                        'test_probes.MODULES can be judged here)')
    for name in modules:
      if name not in MODULES:
        raise Unsupported(f'import of {name!r} (not in test_probes.MODULES)')
  for node in ast.walk(module):
    if isinstance(node, ast.Attribute) and node.attr.startswith('_'):
      raise Unsupported(f'attribute {ast.unparse(node)!r} in a test')
    if isinstance(node, ast.Name) and node.id.startswith('__'):
      raise Unsupported(f'name {node.id!r} in a test')
  if not any(isinstance(s, ast.Assert) for s in module.body):
    raise Unsupported('test has no assert')
  return module.body


def _module_scope(node: ast.AST):
  """The nodes of `node` that bind names in the module's scope (not in functions' bodies)."""
  yield node
  for child in ast.iter_child_nodes(node):
    if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
      yield child  # its name is bound here; `global` inside binds here too.
      yield from (n for n in ast.walk(child) if isinstance(n, ast.Global))
    elif not isinstance(child, _NESTED_SCOPES):
      yield from _module_scope(child)


def solution_bindings(code: str) -> tuple[frozenset[str], dict[str, tuple[str, str | None]]]:
  """Names the solution defines at top level, and those it binds by importing a MODULES
  module: name -> (module, attribute or None); a star import maps '*module' -> (module, '*')."""
  defined, imported = set(), {}
  for node in _module_scope(ast.parse(code)):
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
      defined.add(node.name)
    elif isinstance(node, ast.Global):
      defined.update(node.names)
    elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
      defined.add(node.id)
    elif isinstance(node, (ast.ExceptHandler, ast.MatchAs, ast.MatchStar)) and node.name:
      defined.add(node.name)
    elif isinstance(node, ast.MatchMapping) and node.rest:
      defined.add(node.rest)
    elif isinstance(node, ast.Import):
      for alias in node.names:
        module = alias.name if alias.asname else alias.name.partition('.')[0]
        name = alias.asname or module
        (imported.__setitem__(name, (module, None)) if module in MODULES else defined.add(name))
    elif isinstance(node, ast.ImportFrom):
      for alias in node.names:
        if node.level == 0 and node.module in MODULES:
          imported[alias.asname or alias.name if alias.name != '*' else '*' + node.module] = (
              node.module, alias.name)
        elif alias.name != '*':
          defined.add(alias.asname or alias.name)
  return frozenset(defined), imported


class Ref:
  """A solution object in the sandbox: it can be called or asked a non-plain attribute;
  anything that would judge it here raises (Pending while its op has not run)."""
  __slots__ = ('_session', '_key', '_state', '_detail')

  def __init__(self, session, key: str, state: str | None, detail: str = ''):
    self._session, self._key, self._state, self._detail = session, key, state, detail

  def _refuse(self, what: str):
    if self._state is None:
      raise Pending()
    if self._state == 'error':
      raise ProbeFailed(self._detail)
    raise TypeError(f'{what} of an object the solution returned: only plain data is judged')

  def __getattr__(self, name: str):
    if name.startswith('_'):
      raise AttributeError(name)
    if self._state == 'error' or name in PLAIN_ATTRIBUTES:
      self._refuse(f'attribute {name!r}')
    return self._session.op('getattr', self, name)

  def __call__(self, *args, **kwargs):
    if self._state == 'error':
      self._refuse('a call')
    return self._session.op('call', self, None, args, kwargs)

  def __repr__(self) -> str:
    return '<solution object>'


def _refusal(what: str):
  return lambda self, *args: self._refuse(what)  # pylint: disable=protected-access


for _name in ('eq', 'ne', 'lt', 'le', 'gt', 'ge', 'bool', 'len', 'iter', 'reversed', 'contains',
              'getitem', 'hash', 'index', 'int', 'float', 'complex', 'str', 'bytes', 'format',
              'round', 'abs', 'neg', 'pos', 'invert', 'trunc', 'floor', 'ceil'):
  setattr(Ref, f'__{_name}__', _refusal(_name))
for _name in ('add', 'sub', 'mul', 'matmul', 'truediv', 'floordiv', 'mod', 'divmod', 'pow',
              'lshift', 'rshift', 'and', 'or', 'xor'):
  setattr(Ref, f'__{_name}__', _refusal(_name))
  setattr(Ref, f'__r{_name}__', _refusal(_name))


def _argument(value: Any, index: Mapping[str, int]) -> tuple[Any, Any]:
  """An argument for the sandbox and for the op's key: a Ref by index, else plain data."""
  if isinstance(value, Ref):
    if value._state == 'error':  # pylint: disable=protected-access
      value._refuse('an argument')  # pylint: disable=protected-access
    key = value._key  # pylint: disable=protected-access
    return {'ref': index[key]}, {'ref': key}
  try:
    data = encode_value(value)
  except (TypeError, ValueError) as e:
    raise TypeError(f'an argument for the solution is not plain data: {e}') from None
  return {'v': data}, {'v': data}


class _Session:
  """One evaluation pass over all tests: the ops it records, the results it already has."""

  def __init__(self, results: Mapping[str, list]):
    self.results, self.ops, self.keys, self.index = results, [], [], {}
    self.test, self.counts, self.pending = 0, {}, False

  def start(self, test: int) -> None:
    self.test, self.counts, self.pending = test, {}, False

  def op(self, kind: str, target: Ref | None, name: str | None, args=(), kwargs=None):
    sent, keyed = zip(*[_argument(a, self.index) for a in args]) if args else ((), ())
    named = [[k, *_argument(v, self.index)] for k, v in (kwargs or {}).items()]
    target_key = None if target is None else target._key  # pylint: disable=protected-access
    base = json.dumps([self.test, kind, target_key, name, keyed, [[k, w] for k, _, w in named]])
    count = self.counts[base] = self.counts.get(base, -1) + 1  # the n-th same op in this test
    key = hashlib.sha256(f'{base}#{count}'.encode()).hexdigest()[:32]
    if key not in self.index:
      self.index[key] = len(self.ops)
      self.keys.append(key)
      self.ops.append({'kind': kind, 'name': name, 'args': list(sent),
                       'kwargs': [[k, s] for k, s, _ in named],
                       'target': None if target is None else self.index[target_key]})
    result = self.results.get(key)
    if not isinstance(result, list) or not result:
      self.pending = True
      return Ref(self, key, None)
    if result[0] == 'value':
      return decode_value(result[1])  # a fresh copy each time: a check may mutate it.
    if result[0] == 'opaque':
      return Ref(self, key, 'opaque')
    detail = str(result[1] if len(result) > 1 else 'failed')[:150]
    if kind == 'global':
      return Ref(self, key, 'error', detail)  # a NameError only where the test uses it.
    raise ProbeFailed(detail)


def _namespace(statements, session: _Session, defined, imported) -> dict:
  names = sorted({n.id for s in statements for n in ast.walk(s) if isinstance(n, ast.Name)})
  namespace = {'__builtins__': BUILTINS}
  stars = [importlib.import_module(m) for k, (m, _) in sorted(imported.items()) if k[0] == '*']
  for name in names:
    starred = [m for m in stars if not name.startswith('_') and hasattr(m, name)]
    if name in BUILTINS:
      continue
    if name in ALWAYS:
      namespace[name] = importlib.import_module(name)
    elif name in imported:
      module, attribute = imported[name]
      value = importlib.import_module(module)
      if attribute is None or hasattr(value, attribute):
        namespace[name] = value if attribute is None else getattr(value, attribute)
    elif starred:  # `from math import *` in the solution: the module's names, from here.
      namespace[name] = getattr(starred[0], name)
    elif name in defined:
      namespace[name] = session.op('global', None, name)
  return namespace


def _judge(statements, namespace: dict) -> bool:
  for statement in statements:
    if isinstance(statement, ast.Import):
      for alias in statement.names:
        namespace[alias.asname or alias.name.partition('.')[0]] = importlib.import_module(
            alias.name if alias.asname else alias.name.partition('.')[0])
    elif isinstance(statement, ast.ImportFrom):
      for alias in statement.names:
        namespace[alias.asname or alias.name] = getattr(
            importlib.import_module(statement.module), alias.name)
    else:
      code = compile(ast.Expression(statement.test), 'test', 'eval')
      if not eval(code, namespace):  # pylint: disable=eval-used
        return False
  return True


def evaluate(tests: list[str], solution: str, results: Mapping[str, list]) -> dict:
  """One pass: every test judged with the results so far; the ops the next sandbox run needs.

  outcomes[i] is ['pass' | 'fail' | 'pending', why]; ops[j] is for the sandbox, keys[j] names
  its result in `results`."""
  defined, imported = solution_bindings(solution)
  session = _Session(results)
  outcomes = []
  for number, source in enumerate(tests):
    session.start(number)
    try:
      statements = parse_test(source)
      outcome = ['pass' if _judge(statements, _namespace(statements, session, defined, imported))
                 else 'fail', 'false']
    except Pending:
      outcome = ['pending', '']
    except Exception as e:  # pylint: disable=broad-except
      outcome = ['fail', f'{type(e).__name__}: {e}'[:150]]
    outcomes.append(['pending', ''] if session.pending else outcome)
  return {'ops': session.ops, 'keys': session.keys, 'outcomes': outcomes}


def main() -> None:
  """The evaluator child (trusted_checks): limits itself, then answers one request per line."""
  cpu_s = max(1, math.ceil(float(sys.argv[1])))
  resource.setrlimit(resource.RLIMIT_CPU, (cpu_s, cpu_s + 1))
  resource.setrlimit(resource.RLIMIT_AS, (MEMORY_BYTES, MEMORY_BYTES))
  for line in sys.stdin.buffer:
    request = json.loads(line)
    reply = evaluate(request['tests'], request['solution'], request['results'])
    sys.stdout.buffer.write(json.dumps(reply).encode() + b'\n')
    sys.stdout.buffer.flush()
