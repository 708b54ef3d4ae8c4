"""The 'calculator' tool: exact arithmetic on one expression, parsed with `ast`, never eval'd.

Grammar: numbers (integers of any base Python writes, decimals, '1e5'), + - * / // % **, unary
+ and -, parentheses. Arithmetic is exact (fractions.Fraction), so '0.1+0.2' is '0.3'.

Output: an integer result is printed exactly, every digit; a non-integer as a decimal rounded
to 12 significant digits ('1/3' -> '0.333333333333', '1/4' -> '0.25'), in scientific notation
outside [1e-6, 1e12). A non-integer exponent ('2**0.5') is computed in floating point, so its
result is rounded like any other non-integer.

Bounds, so that one call costs milliseconds: every value, intermediate or final, has at most
MAX_DIGITS decimal digits (numerator and denominator alike); a power is refused before it is
computed when its result would be larger; the expression is at most MAX_EXPRESSION_CHARS long.
Python's parser refuses integer literals over 4300 digits, and an expression nested or
chained ('1+1+...') past the recursion limit, about 900 operators, is BAD_ARGUMENTS. A result
near MAX_DIGITS is longer than an observation, so run_tool truncates it (OVERSIZED).

Not here: names, functions (sqrt, log), comparisons, variables between calls (the session is
None).
"""

import ast
import decimal
import fractions
import math
import re
from typing import Any, Mapping

from rlreason.envs import base

MAX_DIGITS = 10_000
MAX_BITS = math.ceil(MAX_DIGITS * math.log2(10))
MAX_EXPRESSION_CHARS = 20_000
SIGNIFICANT_DIGITS = 12
_CHUNK = 10**1000  # str() of a chunk stays under Python's 4300-digit conversion limit.
_DECIMAL = re.compile(r'(\d*)(?:\.(\d*))?(?:[eE]([+-]?\d+))?')  # one parse per text: linear

_BINARY = {
    ast.Add: lambda a, b: a + b,
    ast.Sub: lambda a, b: a - b,
    ast.Mult: lambda a, b: a * b,
    ast.Div: lambda a, b: a / b,
    ast.FloorDiv: lambda a, b: fractions.Fraction(a // b),
    ast.Mod: lambda a, b: a % b,
}


def _check_size(x: fractions.Fraction) -> fractions.Fraction:
  if x.numerator.bit_length() > MAX_BITS or x.denominator.bit_length() > MAX_BITS:
    raise base.ToolError(base.TOOL_FAILED, f'calculator: a value exceeds {MAX_DIGITS} digits')
  return x


def _literal(node: ast.Constant, source: str) -> fractions.Fraction:
  value = node.value
  if isinstance(value, bool) or not isinstance(value, (int, float)):
    raise base.ToolError(base.BAD_ARGUMENTS,
                         f'calculator: {type(value).__name__} literal {value!r} is not a number')
  if isinstance(value, int):
    return _check_size(fractions.Fraction(value))
  # A float literal is re-read from its text so that '0.1' is exactly 1/10.
  text = (ast.get_source_segment(source, node) or repr(value)).replace('_', '')
  match = _DECIMAL.fullmatch(text)
  if not match:
    raise base.ToolError(base.BAD_ARGUMENTS, f'calculator: cannot read the number {text!r}')
  # Checked before Fraction() builds 10**exponent, which '1e999999999' would make slow.
  if abs(int(match.group(3) or 0)) > MAX_DIGITS:
    raise base.ToolError(base.TOOL_FAILED, f'calculator: {text} exceeds {MAX_DIGITS} digits')
  return _check_size(fractions.Fraction(text))


def _power(a: fractions.Fraction, b: fractions.Fraction) -> fractions.Fraction:
  if b.denominator != 1:
    if a < 0:
      raise base.ToolError(base.TOOL_FAILED, 'calculator: fractional power of a negative number')
    try:
      return _check_size(fractions.Fraction(float(a)**float(b)))
    except OverflowError:
      raise base.ToolError(base.TOOL_FAILED,
                           f'calculator: power result exceeds {MAX_DIGITS} digits') from None
  n = abs(b.numerator)
  if a == 0 and b < 0:
    raise base.ToolError(base.TOOL_FAILED, 'calculator: division by zero (0 to a negative power)')
  # (bit_length - 1) * n bits is a lower bound on the result's size, so this refuses
  # 10**100000 before computing it, and lets 1**100000 through.
  widest = max(a.numerator.bit_length(), a.denominator.bit_length()) - 1
  if a not in (0, 1, -1) and widest * n > MAX_BITS:
    raise base.ToolError(base.TOOL_FAILED, f'calculator: power result exceeds {MAX_DIGITS} digits')
  if a in (1, -1):
    n %= 2  # (+-1)**n without n multiplications.
  return _check_size(a**(n if b >= 0 else -n))


def _evaluate(node: ast.AST, source: str) -> fractions.Fraction:
  if isinstance(node, ast.Expression):
    return _evaluate(node.body, source)
  if isinstance(node, ast.Constant):
    return _literal(node, source)
  if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.UAdd, ast.USub)):
    value = _evaluate(node.operand, source)
    return -value if isinstance(node.op, ast.USub) else value
  if isinstance(node, ast.BinOp) and (type(node.op) in _BINARY or isinstance(node.op, ast.Pow)):
    a, b = _evaluate(node.left, source), _evaluate(node.right, source)
    if isinstance(node.op, ast.Pow):
      return _power(a, b)
    if b == 0 and isinstance(node.op, (ast.Div, ast.FloorDiv, ast.Mod)):
      raise base.ToolError(base.TOOL_FAILED, 'calculator: division by zero')
    return _check_size(_BINARY[type(node.op)](a, b))
  if isinstance(node, ast.Name):
    what = f'the name {node.id!r}'
  elif isinstance(node, ast.Call):
    what = 'a function call'
  elif isinstance(node, ast.Attribute):
    what = f'the attribute .{node.attr}'
  elif isinstance(node, (ast.BinOp, ast.UnaryOp)):
    what = f'the operator {type(node.op).__name__}'  # '^', '~', '<<', ...
  else:
    what = f'a {type(node).__name__}'
  raise base.ToolError(base.BAD_ARGUMENTS,
                       f'calculator: {what} is not arithmetic; use numbers, + - * / // % ** '
                       'and parentheses')


def _int_text(n: int) -> str:
  """Every digit of n, including past Python's 4300-digit str() limit."""
  sign, n = ('-' if n < 0 else ''), abs(n)
  chunks = []
  while n >= _CHUNK:
    n, low = divmod(n, _CHUNK)
    chunks.append(str(low).zfill(1000))
  return sign + str(n) + ''.join(reversed(chunks))


def format_number(x: fractions.Fraction) -> str:
  """The text the model sees: integers exactly, others rounded to 12 significant digits."""
  if x.denominator == 1:
    return _int_text(x.numerator)
  context = decimal.Context(prec=SIGNIFICANT_DIGITS, Emax=10 * MAX_DIGITS, Emin=-10 * MAX_DIGITS)
  d = context.divide(decimal.Decimal(x.numerator), decimal.Decimal(x.denominator))
  if decimal.Decimal('1e-6') <= abs(d) < decimal.Decimal('1e12'):
    return format(d.normalize(), 'f')
  return str(d)  # Not normalized: '1.00000000000E+20' shows that digits were rounded away.


def evaluate(expression: str) -> str:
  """The formatted value of `expression`, or a ToolError."""
  if len(expression) > MAX_EXPRESSION_CHARS:
    raise base.ToolError(base.BAD_ARGUMENTS,
                         f'calculator: expression over {MAX_EXPRESSION_CHARS} characters')
  try:
    tree = ast.parse(expression.strip(), mode='eval')
  except SyntaxError as e:
    raise base.ToolError(base.BAD_ARGUMENTS, f'calculator: cannot parse: {e.msg}',
                         error_class='SyntaxError') from None
  except (RecursionError, MemoryError, ValueError):
    raise base.ToolError(base.BAD_ARGUMENTS, 'calculator: cannot parse the expression') from None
  try:
    return format_number(_evaluate(tree, expression.strip()))
  except RecursionError:
    raise base.ToolError(base.BAD_ARGUMENTS, 'calculator: expression nested too deeply') from None


class Calculator:
  """Stateless: `new_session` returns None. An expression Python cannot parse is its one
  declared error class, 'SyntaxError' (CLEANER's rollback retries it, rollout/rollback.py)."""

  rollback_errors = ('SyntaxError',)

  spec = base.ToolSpec(
      name='calculator',
      description=('Evaluates an arithmetic expression exactly: numbers, + - * / // % ** and '
                   'parentheses. Integers are printed in full; other results to 12 '
                   'significant digits.'),
      parameters={
          'type': 'object',
          'properties': {'expression': {'type': 'string',
                                        'description': "e.g. '123456789 * 987654321'"}},
          'required': ['expression'],
      })

  def new_session(self, context: Mapping[str, Any]) -> None:
    del context
    return None

  def call(self, session: None, arguments: Mapping[str, Any]) -> str:
    del session
    return evaluate(arguments['expression'])


TOOL = Calculator()
