"""Assert tests split at the trust boundary: probes run with the solution, checks run here.

  split_test('assert abs(area(2.0) - 12.566) < 1e-3')
  # probes ['area(2.0)']: evaluated in the sandbox, in the solution's namespace;
  # checks ['abs(__probe__[0] - 12.566) < 1e-3']: evaluated in the trusted parent.

A probe's value crosses the boundary as plain data (`encode_value`, which runs inside the
sandbox, and `decode_value` here): None, bool, int, float, complex, str, bytes, and lists,
tuples, dicts, sets and frozensets of them. Anything else (a class instance, a generator)
cannot cross and fails its test. Subclasses of the plain types are read through the base
type's own C-level accessors, so an object whose `__eq__`, `__iter__` or `__str__` lies is
seen as the data it stores. The expected values and the comparison operators stay in the
parent: the sandbox sees the probes (the solution's calls and their arguments) and nothing
of what they are compared with, so a solution that forges the report, ends early or reads the
harness's memory learns nothing it could not learn from its own arguments.

Supported test shapes: `assert EXPR[, msg]` statements (several per test are one test) and
`import math` / `import cmath`. EXPR is split recursively: comparisons, boolean and
arithmetic operators, conditional expressions, literal containers and calls to the plain
builtins in `PARENT_FUNCTIONS` (or `math.*`) are evaluated here; every maximal other
subexpression that mentions a name the solution defines becomes a probe. A probe may not
contain a comparison (it would be judged inside the sandbox). Other shapes (assignments,
loops, HumanEval's `def check(candidate)`) raise `Unsupported`: such tests can only run as
free-form code inside the solution's process (python_tests' test_mode='in_process').

Not here: running anything (python_tests.py), or free-form tests.
"""

import ast
import builtins
import cmath
import dataclasses
import math
from typing import Any

PROBE = '__probe__'
MODULES = {'math': math, 'cmath': cmath}
PARENT_FUNCTIONS = {
    name: getattr(builtins, name) for name in (
        'abs', 'all', 'any', 'bool', 'bytes', 'chr', 'complex', 'dict', 'divmod', 'enumerate',
        'filter', 'float', 'frozenset', 'hash', 'int', 'isinstance', 'len', 'list', 'map',
        'max', 'min', 'ord', 'pow', 'range', 'repr', 'reversed', 'round', 'set', 'sorted',
        'str', 'sum', 'tuple', 'type', 'zip')}
PARENT_NAMES = {**PARENT_FUNCTIONS, **MODULES, 'True': True, 'False': False, 'None': None,
                'ValueError': ValueError, 'TypeError': TypeError}
_OPERATORS = (ast.Compare, ast.BoolOp, ast.UnaryOp, ast.BinOp, ast.IfExp, ast.Tuple, ast.List,
              ast.Set, ast.Dict, ast.Starred)
# Node types that may appear in the part evaluated here (with names from PARENT_NAMES,
# the probe table, and names bound by its own lambdas and comprehensions).
_PARENT_NODES = (
    ast.Expression, ast.Constant, ast.Name, ast.Load, ast.Store, ast.Subscript, ast.Slice,
    ast.Call, ast.keyword, ast.Attribute, ast.Lambda, ast.arguments, ast.arg, ast.comprehension,
    ast.ListComp, ast.SetComp, ast.DictComp, ast.GeneratorExp, ast.JoinedStr,
    ast.FormattedValue, *_OPERATORS, ast.operator, ast.unaryop, ast.cmpop, ast.boolop)


class Unsupported(ValueError):
  """A test that cannot be split (it would have to run inside the solution's process)."""


@dataclasses.dataclass(frozen=True)
class SplitTest:
  probes: list[str]  # expression sources, evaluated in the solution's namespace
  checks: list[str]  # expressions over __probe__[i], evaluated here; all must be true


def _bound_names(tree: ast.AST) -> set[str]:
  bound = set()
  for node in ast.walk(tree):
    if isinstance(node, ast.arg):
      bound.add(node.arg)
    elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
      bound.add(node.id)
  return bound


def _mentions_solution(node: ast.AST, bound: set[str]) -> bool:
  return any(isinstance(n, ast.Name) and n.id not in PARENT_NAMES and n.id not in bound
             for n in ast.walk(node))


def _evaluated_here(node: ast.AST) -> bool:
  if isinstance(node, _OPERATORS):
    return True
  if isinstance(node, ast.Call):
    func = node.func
    return ((isinstance(func, ast.Name) and func.id in PARENT_FUNCTIONS) or
            (isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name) and
             func.value.id in MODULES))
  return False


class _Splitter(ast.NodeTransformer):

  def __init__(self, bound: set[str], probes: list[str]):
    self.bound, self.probes = bound, probes

  def visit(self, node):
    if not isinstance(node, ast.expr) or not _mentions_solution(node, self.bound):
      return node
    if _evaluated_here(node):
      if isinstance(node, ast.Call):  # the callee is ours; split its arguments only.
        node.args = [self.visit(a) for a in node.args]
        node.keywords = [ast.keyword(k.arg, self.visit(k.value)) for k in node.keywords]
        return node
      return self.generic_visit(node)
    if any(isinstance(n, ast.Compare) for n in ast.walk(node)):
      raise Unsupported(f'a comparison inside {ast.unparse(node)!r} would be judged '
                        'inside the sandbox')
    self.probes.append(ast.unparse(node))
    return ast.Subscript(ast.Name(PROBE, ast.Load()), ast.Constant(len(self.probes) - 1),
                         ast.Load())


def _check_parent_part(tree: ast.Expression, bound: set[str]) -> None:
  for node in ast.walk(tree):
    if not isinstance(node, _PARENT_NODES):
      raise Unsupported(f'{type(node).__name__} in a check')
    if isinstance(node, ast.Attribute) and (
        not isinstance(node.value, ast.Name) or node.value.id not in MODULES or
        node.attr.startswith('_')):
      raise Unsupported(f'attribute {ast.unparse(node)!r} in a check')
    if isinstance(node, ast.Name) and node.id not in PARENT_NAMES and node.id not in bound \
        and node.id != PROBE:
      raise Unsupported(f'name {node.id!r} in a check')


def split_test(source: str) -> SplitTest:
  """Splits one test (assert statements, math imports) into probes and checks."""
  try:
    module = ast.parse(source)
  except SyntaxError as e:
    raise Unsupported(f'test is not valid Python: {e.msg}') from None
  probes, checks = [], []
  for statement in module.body:
    if isinstance(statement, (ast.Import, ast.ImportFrom)) and all(
        alias.name in MODULES and alias.asname is None for alias in statement.names) and \
        not isinstance(statement, ast.ImportFrom):
      continue
    if not isinstance(statement, ast.Assert):
      raise Unsupported(f'{type(statement).__name__} statement (only assert and '
                        'import math/cmath can be split)')
    bound = _bound_names(statement.test)
    tree = ast.Expression(_Splitter(bound, probes).visit(statement.test))
    _check_parent_part(tree, bound)
    checks.append(ast.unparse(tree))
  if not checks:
    raise Unsupported('test has no assert')
  return SplitTest(probes, checks)


def run_check(check: str, probe_values: list[Any]) -> bool:
  """Evaluates one check over decoded probe values; any exception is a failed check."""
  try:
    code = compile(check, 'check', 'eval')
    return bool(eval(code, {'__builtins__': {}, **PARENT_NAMES, PROBE: probe_values}))  # pylint: disable=eval-used
  except Exception:  # pylint: disable=broad-except
    return False


def encode_value(value, _depth=0, _budget=None):
  """Plain data as JSON-able tagged data; runs inside the sandbox (shipped as source).

  Self-contained on purpose: python_tests sends this function's source into the sandbox.
  """
  budget = [100_000] if _budget is None else _budget
  budget[0] -= 1
  if budget[0] < 0 or _depth > 64:
    raise ValueError('value too large or too deeply nested to cross the sandbox boundary')
  enc = lambda v: encode_value(v, _depth + 1, budget)  # pylint: disable=unnecessary-lambda-assignment
  if value is None or value is True or value is False:
    return value
  if isinstance(value, int):
    return {'int': int.__repr__(int.__index__(value))}
  if isinstance(value, float):
    return {'float': float.__repr__(float.__float__(value))}
  if isinstance(value, complex):
    c = complex.__complex__(value)
    return {'complex': [float.__repr__(c.real), float.__repr__(c.imag)]}
  if isinstance(value, str):
    return str.__str__(value)
  if isinstance(value, bytes):
    return {'bytes': bytes.hex(bytes.__bytes__(value))}
  if isinstance(value, list):
    return [enc(v) for v in list.__iter__(value)]
  if isinstance(value, tuple):
    return {'tuple': [enc(v) for v in tuple.__iter__(value)]}
  if isinstance(value, frozenset):
    return {'frozenset': [enc(v) for v in frozenset.__iter__(value)]}
  if isinstance(value, set):
    return {'set': [enc(v) for v in set.__iter__(value)]}
  if isinstance(value, dict):
    return {'dict': [[enc(k), enc(v)] for k, v in dict.items(value)]}
  raise TypeError(f'a {type(value).__name__} cannot cross the sandbox boundary '
                  '(plain data only)')


_DECODERS = {
    'int': int, 'float': float, 'bytes': bytes.fromhex,
    'complex': lambda parts: complex(float(parts[0]), float(parts[1])),
}
_CONTAINERS = {'tuple': tuple, 'set': set, 'frozenset': frozenset}


def decode_value(data: Any) -> Any:
  """The inverse of encode_value, from untrusted JSON; malformed data raises ValueError."""
  if data is None or isinstance(data, (bool, str)):
    return data
  if isinstance(data, list):
    return [decode_value(v) for v in data]
  if not isinstance(data, dict) or len(data) != 1:
    raise ValueError(f'malformed value {str(data)[:80]}')
  (tag, body), = data.items()
  try:
    if tag in _DECODERS:
      return _DECODERS[tag](body)
    if tag in _CONTAINERS:
      return _CONTAINERS[tag](decode_value(v) for v in body)
    if tag == 'dict':
      return {decode_value(k): decode_value(v) for k, v in body}
  except (TypeError, ValueError, OverflowError) as e:
    raise ValueError(f'malformed {tag}: {e}') from None
  raise ValueError(f'unknown tag {tag!r}')
