"""`countdown`: does the completion's expression use each given number once and hit the target?

Answer format (what task generators should prompt for): an arithmetic expression over the
given numbers with + - * / and parentheses, in <answer>...</answer> (else \\boxed{}, else
the last line), e.g. `<answer>(100 - 93) + 30</answer>` for numbers 30,100,93 and target 37.
A trailing or leading `= <target>` is allowed. Every number must be used exactly once (as a
multiset); evaluation is exact (fractions), so 7/2*2 is 7. Unary minus, exponentiation
and concatenating digits are not allowed.

Outcomes: correct; wrong (numbers not used exactly once, other value, division by zero);
parse_failure (no expression, or not a valid one). Not here: partial credit for format
(compose a `format` reward for that).
"""

import ast
import fractions
import itertools
from typing import Any, Iterable, Mapping

from rlreason.verifiers import answer_extraction
from rlreason.verifiers import verdict as V

_MAX_EXPRESSION_CHARS = 200
_OPS = {ast.Add: lambda a, b: a + b, ast.Sub: lambda a, b: a - b,
        ast.Mult: lambda a, b: a * b, ast.Div: lambda a, b: a / b}
_SYMBOLS = {'×': '*', '\\times': '*', '\\cdot': '*', '÷': '/', '\\div': '/', '−': '-'}


def _evaluate(node: ast.AST, used: list[int]) -> fractions.Fraction:
  if isinstance(node, ast.Constant) and type(node.value) is int:  # pylint: disable=unidiomatic-typecheck
    used.append(node.value)
    return fractions.Fraction(node.value)
  if isinstance(node, ast.BinOp) and type(node.op) in _OPS:
    left, right = _evaluate(node.left, used), _evaluate(node.right, used)
    return _OPS[type(node.op)](left, right)
  raise ValueError(f'{type(node).__name__} is not allowed')


def evaluate(expression: str) -> tuple[fractions.Fraction, list[int]]:
  """Exact value and the numbers used; raises ValueError/SyntaxError/ZeroDivisionError."""
  for symbol, op in _SYMBOLS.items():
    expression = expression.replace(symbol, op)
  expression = expression.replace('\\left', '').replace('\\right', '').replace('{', '(')
  expression = expression.replace('}', ')')
  used = []
  value = _evaluate(ast.parse(expression.strip(), mode='eval').body, used)
  return value, used


def _expression(text: str) -> str | None:
  found = answer_extraction.last_tag(text, 'answer') or answer_extraction.last_boxed(text)
  if not found:
    lines = [line for line in text.strip().splitlines() if line.strip()]
    found = lines[-1] if lines else None
  if not found:
    return None
  # "expr = 37" or "37 = expr": keep the side that is not a bare number.
  sides = [s.strip() for s in found.split('=') if s.strip()]
  candidates = [s for s in sides if not s.lstrip('-').isdigit()]
  return candidates[0] if len(candidates) == 1 else (sides[0] if len(sides) == 1 else None)


def parse_numbers(value: Any) -> list[int]:
  if isinstance(value, str):
    value = [v for v in value.replace(' ', '').split(',') if v]
  try:
    numbers = [int(v) for v in value]
  except (TypeError, ValueError):
    raise V.ItemError(V.INVALID_INPUT, f'numbers: expected integers, got {value!r}') from None
  if not numbers:
    raise V.ItemError(V.INVALID_INPUT, 'numbers: empty')
  return numbers


@V.verifier
def verify_countdown(item: Mapping[str, Any]) -> V.Verdict:
  """Item: completion, answer (the target), numbers (list or "30,100,93")."""
  text = V.completion_text(item)
  if 'numbers' not in item:
    raise V.ItemError(V.INVALID_INPUT, 'missing field: numbers')
  numbers = parse_numbers(item['numbers'])
  try:
    target = fractions.Fraction(V.gold_text(item).strip())
  except ValueError:
    return V.failure(V.INVALID_INPUT, f'answer is not a number: {item["answer"]!r}')
  expression = _expression(text)
  if not expression:
    return V.failure(V.PARSE_FAILURE, 'no expression found')
  if len(expression) > _MAX_EXPRESSION_CHARS:
    return V.failure(V.PARSE_FAILURE, f'expression longer than {_MAX_EXPRESSION_CHARS} chars')
  try:
    value, used = evaluate(expression)
  except ZeroDivisionError:
    return V.judged(False, detail='division by zero')
  except (SyntaxError, ValueError, TypeError, MemoryError, RecursionError) as e:
    return V.failure(V.PARSE_FAILURE, f'not an arithmetic expression: {e}')
  if sorted(used) != sorted(numbers):
    return V.judged(False, detail=f'uses {sorted(used)}, must use {sorted(numbers)} once each')
  return V.judged(value == target, detail=f'{expression} = {value}')


def solve(numbers: Iterable[int], target: int) -> str | None:
  """An expression using every number once that equals target, or None (exhaustive search)."""
  target = fractions.Fraction(target)

  def expressions(terms):
    if len(terms) == 1:
      yield str(terms[0]), fractions.Fraction(terms[0])
      return
    for split in range(1, len(terms)):
      for left_terms in set(itertools.combinations(terms, split)):
        right_terms = list(terms)
        for t in left_terms:
          right_terms.remove(t)
        for (ls, lv), (rs, rv) in itertools.product(expressions(list(left_terms)),
                                                    list(expressions(right_terms))):
          yield f'({ls} + {rs})', lv + rv
          yield f'({ls} - {rs})', lv - rv
          yield f'({ls} * {rs})', lv * rv
          if rv:
            yield f'({ls} / {rs})', lv / rv

  for expression, value in expressions(sorted(numbers)):
    if value == target:
      return expression[1:-1] if expression.startswith('(') else expression
  return None
