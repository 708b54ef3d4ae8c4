"""Countdown: combine given numbers with + - * / and parentheses to reach a target.

Problems are built backwards, so each has a solution: draw `difficulty` numbers, combine them
in a random order with random operators (exact division only, subtraction only when positive,
so every intermediate value is a positive integer) and keep the result as the target when it
lies in [1, max_target]. The reference solution is that expression, written with the fewest
parentheses; it uses every number exactly once, which is the rule.

Formats (difficulty 3; the d1 file ../shared/data/countdown has {"input": "30,100,93",
"output": "23"}, i.e. numbers and the target as answer):

  prompt    'Using the numbers [30, 100, 93], write an expression that equals 23. Use + - * /
             and parentheses, and each number exactly once.'   (one line)
  answer    '23'            the target
  solution  '30+93-100'     one correct completion (the expression is the work)
  meta      {'numbers': [30, 100, 93]}

These are the item fields of rlreason.verifiers' `countdown` checker (answer = target,
numbers; it reads the expression from <answer></answer>, \\boxed{} or the last line).

Not here: expression checking (verifiers/); the search in `solve` is exhaustive and meant
for the small problems of the data file (3-4 numbers), not for generation.
"""

import fractions
import itertools

from rlreason.tasks import example as example_lib

NAME = 'countdown'
DEFAULT_DIFFICULTY = 3
_MAX_TRIES = 1000
_PREC = {'+': 1, '-': 1, '*': 2, '/': 2}
_ATOM = 3
_PROMPT = ('Using the numbers [{numbers}], write an expression that equals {target}. '
           'Use + - * / and parentheses, and each number exactly once.')
CHARS = ''.join(sorted(set(_PROMPT + '0123456789()')))


def _combine(left, op, right):
  """(value, text, precedence) of `left op right`, parenthesising only where needed."""
  (a, a_text, a_prec), (b, b_text, b_prec) = left, right
  prec = _PREC[op]
  if a_prec < prec:
    a_text = f'({a_text})'
  # a-(b+c) and a/(b*c) need the parentheses; a+(b-c) and a*(b/c) do not.
  if b_prec < prec or (b_prec == prec and op in '-/'):
    b_text = f'({b_text})'
  value = {'+': a + b, '-': a - b, '*': a * b, '/': a / b if b else None}[op]  # Fractions.
  return value, f'{a_text}{op}{b_text}', prec


def _example(numbers: list[int], target: int, expression: str, *, example_id: str,
             difficulty: int) -> example_lib.Example:
  return example_lib.Example(
      id=example_id,
      prompt=_PROMPT.format(numbers=', '.join(map(str, numbers)), target=target),
      answer=str(target),
      solution=expression,
      task=NAME,
      difficulty=difficulty,
      meta={'numbers': list(numbers)},
  )


def generate(seed: int, index: int, *, difficulty: int = DEFAULT_DIFFICULTY,
             max_number: int = 100, max_target: int = 100) -> example_lib.Example:
  """The (seed, index)-th problem with `difficulty` numbers in [1, max_number]."""
  if difficulty < 2:
    raise ValueError(f'countdown difficulty (numbers) must be >= 2, got {difficulty}.')
  rng = example_lib.example_rng(NAME, seed, index, difficulty)
  for _ in range(_MAX_TRIES):
    numbers = [int(v) for v in rng.integers(1, max_number + 1, size=difficulty)]
    pool = [(fractions.Fraction(n), str(n), _ATOM) for n in numbers]
    while len(pool) > 1:
      i, j = (int(v) for v in rng.choice(len(pool), size=2, replace=False))
      left, right = pool[i], pool[j]
      if left[0] < right[0]:
        left, right = right, left  # Larger first, so that '-' stays positive.
      ops = ['+', '*'] + (['-'] if left[0] > right[0] else []) + (
          ['/'] if left[0] % right[0] == 0 else [])
      pool = [x for k, x in enumerate(pool) if k not in (i, j)]
      pool.append(_combine(left, ops[rng.integers(len(ops))], right))
    (target, expression, _), = pool
    if 1 <= target <= max_target:
      break
  else:
    raise ValueError(f'no countdown target in [1, {max_target}] after {_MAX_TRIES} tries '
                     f'(difficulty={difficulty}, max_number={max_number}); raise max_target.')
  return _example(numbers, int(target), expression,
                  example_id=example_lib.example_id(NAME, seed, index, difficulty),
                  difficulty=difficulty)


def solve(numbers: list[int], target: int) -> str | None:
  """An expression using each number once that equals `target` (exact rationals), or None.

  Exhaustive: intermediate values may be negative or fractional, as the rules allow.
  """
  target = fractions.Fraction(target)

  def search(pool):
    if len(pool) == 1:
      return pool[0][1] if pool[0][0] == target else None
    for i, j in itertools.permutations(range(len(pool)), 2):
      rest = [x for k, x in enumerate(pool) if k not in (i, j)]
      for op in '+-*/':
        if (op in '+*' and i > j) or (op == '/' and pool[j][0] == 0):
          continue  # One order is enough for + and *; x/0 is undefined.
        found = search(rest + [_combine(pool[i], op, pool[j])])
        if found is not None:
          return found
    return None

  return search([(fractions.Fraction(n), str(n), _ATOM) for n in numbers])


def from_record(numbers: list[int], target: int, *, example_id: str) -> example_lib.Example:
  """An Example for a given problem (e.g. a line of the d1 file), with a solution by search."""
  expression = solve(numbers, target)
  if expression is None:
    raise ValueError(f'countdown problem {example_id}: no expression over {numbers} '
                     f'equals {target}.')
  return _example(numbers, target, expression, example_id=example_id, difficulty=len(numbers))


def problem_key(example: example_lib.Example) -> str:
  # The order in which the numbers are listed does not change the problem.
  return f'{sorted(example.meta["numbers"])}->{example.answer}'
