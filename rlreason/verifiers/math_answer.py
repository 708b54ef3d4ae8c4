"""`math`: is the completion's final answer equal to the gold answer, as mathematics?

Pipeline: extract the final answer (last \\boxed{}, else GSM8K's `####` line, else "The
answer is ..."), reject answers that would make sympy hang (guards below), parse it and the
gold answer with math-verify, compare with math-verify, and finally compare numerically
with a relative tolerance when both sides are non-integer numbers. Integers always compare
exactly. When both sides are plain decimals the comparison is done with exact rationals,
skipping sympy (same result, a hundred times faster).

Outcomes: correct / wrong; `parse_failure` when no answer is found or it does not parse
("unparseable" is counted apart from "wrong"); `timeout` when parsing or comparing used up
its CPU budget; `invalid_input` when the gold answer itself does not parse.

Guards: math-verify parses lazily (`9^{9^{9^9}}` parses in milliseconds) and only evaluates
during comparison, where it can take its whole alarm, or longer inside C big-integer code
that no signal interrupts. So the parsed tree is bounded before comparison: node count,
nesting depth, and an upper bound on the number of decimal digits of every numeric
subterm (towers, factorials, binomials). Answers beyond those bounds are unparseable: no
problem in GSM8K or MATH has a 10,000-digit answer. The pool's deadline stays the backstop.

Budgets are CPU time (ITIMER_PROF) instead of math-verify's wall-clock alarms, which on a
loaded machine fire on items that were only waiting for a core. A budget is a signal, so
it only applies in a process's main thread (the pool's workers run verifiers there);
elsewhere only the pool's deadline limits an item.

Deliberately not here: a fallback to the last number in the text (it rewards guessing),
or partial credit.
"""

import contextlib
import fractions
import logging
import math
import re
import signal
import threading
from typing import Any, Mapping

import math_verify
from math_verify import ExprExtractionConfig, LatexExtractionConfig
import sympy

from rlreason.verifiers import answer_extraction
from rlreason.verifiers import verdict as V

MAX_DEPTH = 24  # brackets of all kinds, in the extracted answer string
MAX_NODES = 2000  # sympy tree nodes
MAX_DIGITS = 10_000  # decimal digits of any numeric subterm
MAX_SYMBOLIC_POWER = 64  # (x + 1)^2000 makes sympy expand for minutes
_EXTRACTION = (LatexExtractionConfig(), ExprExtractionConfig())
_OPEN, _CLOSE = '{([', '})]'
# math-verify logs a warning per timed-out comparison; here a timeout is a status instead.
logging.getLogger('math_verify').setLevel(logging.ERROR)
_PLAIN_NUMBER = re.compile(r'[+-]?(?:\d+(?:\.\d*)?|\.\d+)')


def nesting_depth(text: str) -> int:
  depth = best = 0
  for c in text:
    if c in _OPEN:
      depth += 1
      best = max(best, depth)
    elif c in _CLOSE:
      depth = max(0, depth - 1)
  return best


def _digits(expr: Any, budget: list[int]) -> float:
  """Upper bound on log10(|value|) of a numeric term (0 for symbols); counts nodes."""
  budget[0] -= 1
  if budget[0] < 0:
    raise ValueError(f'more than {MAX_NODES} nodes')
  if isinstance(expr, sympy.MatrixBase):
    return max((_digits(e, budget) for e in expr), default=0.0)
  if not isinstance(expr, sympy.Basic):
    return 0.0
  if expr.is_Integer:
    return int(expr).bit_length() * 0.30103
  if expr.is_Rational:
    return max(expr.p.bit_length(), expr.q.bit_length()) * 0.30103
  if expr.is_Float:
    _, _, exponent, bits = expr._mpf_  # value = mantissa * 2^exponent, bits in mantissa.
    return abs(exponent + bits) * 0.30103
  args = expr.args
  if isinstance(expr, sympy.Pow):
    base, exponent = (_digits(a, budget) for a in args)
    if exponent > 8:
      return math.inf
    power = 10.0**exponent
    if not args[0].is_number and not args[0].is_Atom and power > MAX_SYMBOLIC_POWER:
      raise ValueError(f'symbolic power above {MAX_SYMBOLIC_POWER}')
    return max(base, 1.0) * power
  if isinstance(expr, (sympy.factorial, sympy.factorial2, sympy.subfactorial, sympy.gamma,
                       sympy.binomial, sympy.RisingFactorial, sympy.FallingFactorial)):
    n = max(_digits(a, budget) for a in args)
    return math.inf if n > 8 else 10.0**n * (n + 1)
  if isinstance(expr, sympy.Mul):
    return sum(_digits(a, budget) for a in args)
  children = [_digits(a, budget) for a in args]
  return max(children, default=0.0) + (math.log10(len(children)) if children else 0.0)


def check_size(expr: Any) -> str | None:
  """Why `expr` is too big to compare safely, or None."""
  try:
    digits = _digits(expr, [MAX_NODES])
  except ValueError as e:
    return str(e)
  return f'number with ~{digits:.3g} digits' if digits > MAX_DIGITS else None


GOLD_CPU_S = 5.0  # gold answers are trusted and cached: a generous budget.
_gold_cache: dict[str, tuple] = {}


class CpuBudgetExceeded(BaseException):
  """Raised by SIGPROF; a BaseException so that math-verify's `except Exception` lets it by."""


@contextlib.contextmanager
def cpu_budget(seconds: float):
  """Raises CpuBudgetExceeded once this process has used `seconds` more CPU time."""
  if threading.current_thread() is not threading.main_thread():
    yield
    return

  def expire(signum, frame):
    del signum, frame
    raise CpuBudgetExceeded()

  previous = signal.signal(signal.SIGPROF, expire)
  signal.setitimer(signal.ITIMER_PROF, seconds)
  try:
    yield
  finally:
    signal.setitimer(signal.ITIMER_PROF, 0)
    signal.signal(signal.SIGPROF, previous)


def _parse(latex: str) -> list:
  return math_verify.parse(f'${latex}$', _EXTRACTION, parsing_timeout=None)


def _parse_gold(gold: str) -> tuple:
  # A GRPO group scores G completions against one gold answer: parse it once. Failures are
  # not cached, so a parse cut short by the budget is retried next time.
  if gold not in _gold_cache:
    with cpu_budget(GOLD_CPU_S):
      parsed = tuple(_parse(gold))
    if not parsed:
      return parsed
    if len(_gold_cache) >= 4096:
      _gold_cache.pop(next(iter(_gold_cache)))
    _gold_cache[gold] = parsed
  return _gold_cache[gold]


def _number(expr: Any) -> float | None:
  if (isinstance(expr, sympy.Basic) and expr.is_number and not expr.free_symbols
      and check_size(expr) is None):
    try:
      value = complex(sympy.N(expr, 30))
    except (TypeError, ValueError, ArithmeticError):
      return None
    return value.real if value.imag == 0 and math.isfinite(value.real) else None
  return None


def _close(gold: Any, pred: Any, rel_tol: float) -> bool:
  """Numeric equality up to rel_tol, except that two integers must match exactly."""
  if getattr(gold, 'is_Integer', False) and getattr(pred, 'is_Integer', False):
    return False  # math-verify already compared them exactly.
  g, p = _number(gold), _number(pred)
  return g is not None and p is not None and abs(g - p) <= rel_tol * max(1.0, abs(g))


@V.verifier
def verify_math(item: Mapping[str, Any]) -> V.Verdict:
  """Item: completion, answer (LaTeX or a number); optional rel_tol (default 1e-6),
  cpu_s (CPU budget for parsing plus comparing, default 2), guards (default true; false
  only to test what the pool does with a hanging parser)."""
  text = V.completion_text(item)
  gold = answer_extraction.strip_thousands(V.gold_text(item).strip())
  rel_tol = V.option(item, 'rel_tol', 1e-6, float)
  cpu_s = V.positive_option(item, 'cpu_s', 2.0, float)
  guards = V.option(item, 'guards', True, bool)

  answer, where = answer_extraction.final_answer(text, tags=())
  if answer is None:
    return V.failure(V.PARSE_FAILURE, 'no final answer (\\boxed{}, ####, "answer is")')
  answer = answer_extraction.strip_thousands(answer)
  if len(answer) > answer_extraction.MAX_ANSWER_CHARS:
    return V.failure(V.PARSE_FAILURE, f'answer too long ({len(answer)} chars)')
  if guards and nesting_depth(answer) > MAX_DEPTH:
    return V.failure(V.PARSE_FAILURE, f'answer nested deeper than {MAX_DEPTH}')

  if _PLAIN_NUMBER.fullmatch(gold) and _PLAIN_NUMBER.fullmatch(answer):
    # Most RL math data (GSM8K-like) has decimal answers: exact rationals decide them in
    # microseconds, with the same semantics as the sympy path below.
    g, p = fractions.Fraction(gold), fractions.Fraction(answer)
    ok = g == p or (g.denominator * p.denominator != 1
                    and abs(g - p) <= rel_tol * max(1, abs(g)))
    return V.judged(ok, detail=f'from {where}: {answer[:80]}')

  try:
    gold_parsed = _parse_gold(gold)
  except CpuBudgetExceeded:
    return V.failure(V.TIMEOUT, f'gold answer took over {GOLD_CPU_S:g}s CPU to parse')
  if not gold_parsed:
    return V.failure(V.INVALID_INPUT, f'gold answer does not parse: {gold[:80]!r}')

  try:
    with cpu_budget(cpu_s):
      pred_parsed = _parse(answer)
      if not pred_parsed:
        return V.failure(V.PARSE_FAILURE, f'answer from {where} does not parse: {answer[:80]!r}')
      for expr in pred_parsed if guards else ():
        problem = check_size(expr)
        if problem:
          return V.failure(V.PARSE_FAILURE, f'answer too large to compare: {problem}')
      # float_rounding=12 keeps math-verify from rounding floats to 6 places: rel_tol decides.
      ok = math_verify.verify(list(gold_parsed), pred_parsed, float_rounding=12,
                              timeout_seconds=None)
      if not ok:
        ok = _close(gold_parsed[0], pred_parsed[0], rel_tol)
  except CpuBudgetExceeded:
    return V.failure(V.TIMEOUT, f'parsing and comparing took over {cpu_s:g}s CPU')
  return V.judged(ok, detail=f'from {where}: {answer[:80]}')
