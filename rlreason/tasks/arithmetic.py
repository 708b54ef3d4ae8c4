"""Multi-digit addition with a column-by-column worked solution, and a flawed teacher.

Formats (difficulty = digits per operand, here 5):

  prompt    '12345+67890='
  solution  '5,0 3,1 2,1 0,1 8,0 #### 80235'   one 'digit,carry' pair per column, least
                                               significant column first, then ' #### ' and
                                               the sum
  answer    '80235'

This is the format rlreason.verifiers' `arithmetic` checker reads (the integer after '####').

The answer is the digits of the solution read backwards, preceded by '1' when the last column
carries. Both operands have exactly `difficulty` digits (no leading zero). `min_carries`
forces at least that many columns to carry, which is how the problems are made harder
without making them longer.

`flawed_solution` is a systematically imperfect teacher for the SFT-then-RL demo: in a
fraction of the columns whose sum lies in `sums` it writes the digit but drops the carry,
and continues consistently from its own wrong chain, so its final answer is wrong exactly
when it dropped a carry. SFT on it learns the flaw; only a reward on the answer removes it.

`verify_carry_chain` judges a final_answer=False chain against the true addition of the
operands, every digit and every carry flag.

Not here: tokenization (build a character vocabulary from `CHARS`), subtraction or
multiplication, checking the integer after '####' (rlreason.verifiers' `arithmetic`).
"""

import re

from rlreason.tasks import example as example_lib
from rlreason.verifiers import verdict

NAME = 'arithmetic'
DEFAULT_DIFFICULTY = 5
CHARS = ' #+,0123456789='  # Every character a prompt, solution or answer can contain.


def _column_digits(n: int, digits: int) -> list[int]:
  """The decimal digits of n, least significant first, zero-padded to `digits`."""
  return [int(c) for c in reversed(str(n).zfill(digits))]


def _write(pairs: list[tuple[int, int]]) -> tuple[str, str]:
  """Solution text and answer for a chain of (digit, carry) pairs, least significant first."""
  answer = ('1' if pairs[-1][1] else '') + ''.join(str(d) for d, _ in reversed(pairs))
  chain = ' '.join(f'{d},{c}' for d, c in pairs)
  return f'{chain}{example_lib.ANSWER_MARKER}{answer}', answer


def _chain(a: int, b: int, digits: int) -> list[tuple[int, int]]:
  pairs, carry = [], 0
  for x, y in zip(_column_digits(a, digits), _column_digits(b, digits)):
    s = x + y + carry
    carry = s // 10
    pairs.append((s % 10, carry))
  return pairs


def parse_solution(solution: str) -> tuple[list[tuple[int, int]], str]:
  """'5,0 3,1 #### 35' -> ([(5, 0), (3, 1)], '35'); raises ValueError on malformed text."""
  chain, sep, answer = solution.rpartition(example_lib.ANSWER_MARKER)
  if not sep:
    raise ValueError(f'no {example_lib.ANSWER_MARKER!r} in solution {solution!r}')
  pairs = []
  for column in chain.split():
    digit, carry = column.split(',')
    pairs.append((int(digit), int(carry)))
  return pairs, answer.strip()


def generate(seed: int, index: int, *, difficulty: int = DEFAULT_DIFFICULTY,
             min_carries: int = 0, layout: str = 'inline',
             final_answer: bool = True) -> example_lib.Example:
  """The (seed, index)-th addition of two `difficulty`-digit numbers with >= min_carries carries.

  layout='inline' writes the prompt '12345+67890='; layout='columns' writes the digit pairs
  column by column, least significant first, '5+0 4+9 3+8 2+7 1+6=', so that each column of
  the worked solution sits at a fixed distance from its digits (what a tiny model learns in
  a few hundred steps; the embedded demo uses it). final_answer=False ends the solution after
  the (digit, carry) chain, which then is the answer (verifier 'carry_chain').

  Columns are drawn least significant first, so the carry into each column is known when its
  digits are drawn: a column chosen to carry draws uniformly among digit pairs that carry,
  every other column uniformly among all pairs. With min_carries=0 the operands are uniform.
  """
  if difficulty < 1:
    raise ValueError(f'arithmetic difficulty (digits) must be >= 1, got {difficulty}.')
  if not 0 <= min_carries <= difficulty:
    raise ValueError(f'min_carries={min_carries} must be in [0, difficulty={difficulty}].')
  if layout not in ('inline', 'columns'):
    raise ValueError(f"arithmetic layout={layout!r}; known: 'inline', 'columns'.")
  rng = example_lib.example_rng(NAME, seed, index, difficulty)
  forced = set(rng.choice(difficulty, size=min_carries, replace=False).tolist())
  free = rng.integers(0, 10, size=(difficulty, 2)).tolist()
  free[-1] = rng.integers(1, 10, size=2).tolist()  # No leading zero.
  xs, ys, carry = [], [], 0
  for column in range(difficulty):
    if column in forced:
      low = 1 if column == difficulty - 1 else 0
      pairs = [(x, y) for x in range(low, 10) for y in range(low, 10) if x + y + carry >= 10]
      x, y = pairs[rng.integers(len(pairs))]
    else:
      x, y = free[column]
    carry = (x + y + carry) // 10
    xs.append(x)
    ys.append(y)
  a = int(''.join(str(d) for d in reversed(xs)))
  b = int(''.join(str(d) for d in reversed(ys)))
  pairs = _chain(a, b, difficulty)
  solution, answer = _write(pairs)
  if not final_answer:
    solution = solution.partition(example_lib.ANSWER_MARKER)[0]
  prompt = f'{a}+{b}=' if layout == 'inline' else ' '.join(f'{x}+{y}' for x, y in zip(xs, ys)) + '='
  return example_lib.Example(
      id=example_lib.example_id(NAME, seed, index, difficulty),
      prompt=prompt,
      answer=answer,
      solution=solution,
      task=NAME,
      difficulty=difficulty,
      meta={'operands': [a, b], 'carries': sum(c for _, c in pairs),
            **({} if final_answer else {'final_answer': False})},
  )


def problem_key(example: example_lib.Example) -> str:
  # Sorted, so that a+b and b+a are one problem: a model that saw one has seen the answer.
  a, b = sorted(example.meta['operands'])
  return f'{a}+{b}'


def flawed_solution(example: example_lib.Example, *, rng, drop_carry_prob: float = 0.75,
                    sums: tuple[int, ...] = (10, 11, 12)) -> str:
  """The worked solution of a teacher that drops the carry in some columns.

  In each column whose sum (digits plus the teacher's own incoming carry) is in `sums`, the
  carry is dropped with probability `drop_carry_prob` (one draw from the numpy Generator
  `rng` per such column, none elsewhere). Every dropped carry takes 10**(column + 1) off the
  teacher's answer, so the answer is wrong if and only if at least one carry was dropped.
  """
  if not 0.0 <= drop_carry_prob <= 1.0:
    raise ValueError(f'drop_carry_prob={drop_carry_prob} must be in [0, 1].')
  a, b = example.meta['operands']
  pairs, carry = [], 0
  for x, y in zip(_column_digits(a, example.difficulty), _column_digits(b, example.difficulty)):
    s = x + y + carry
    carry = s // 10
    if s in sums and rng.random() < drop_carry_prob:
      carry = 0
    pairs.append((s % 10, carry))
  solution = _write(pairs)[0]
  if not example.meta.get('final_answer', True):
    solution = solution.partition(example_lib.ANSWER_MARKER)[0]
  return solution


_COLUMN = re.compile(r'[0-9],[01]')  # One column: exactly one ASCII digit, a comma, 0 or 1.


@verdict.verifier
def verify_carry_chain(item) -> verdict.Verdict:
  """Verifier 'rlreason.tasks.arithmetic:verify_carry_chain' for final_answer=False solutions.

  Item: completion (a 'digit,carry' chain, least significant column first), answer (the sum),
  operands ([a, b], from the example's meta). Correct iff the chain is, column for column,
  the true addition of a and b: every digit and every carry flag, one pair per column of the
  longer operand, no more, no fewer. So a wrong intermediate carry is wrong even when the
  digits (and so the number the chain spells) are right; the answer is checked against the
  operands as a guard on the item, and the chain's number against the answer.

  Statuses: parse_failure when a column is not exactly 'd,c' (d an ASCII digit, c 0 or 1)
  or the completion is empty; wrong for a well-formed chain with a wrong digit, a wrong
  carry, or too few or too many columns; invalid_input when operands are missing or do not
  sum to the answer.
  """
  text = verdict.completion_text(item).strip()
  columns = text.split()
  bad = [c for c in columns if not _COLUMN.fullmatch(c)]
  if bad:
    return verdict.failure(verdict.PARSE_FAILURE, f'not a digit,carry column: {bad[0]!r}')
  pairs = [(int(c[0]), int(c[2])) for c in columns]
  gold = verdict.gold_text(item).strip()
  operands = item.get('operands')
  if (not isinstance(operands, (list, tuple)) or len(operands) != 2
      or any(type(x) is not int or x < 0 for x in operands)):
    return verdict.failure(verdict.INVALID_INPUT, f'operands: expected [a, b], got {operands!r}')
  a, b = operands
  if str(a + b) != gold:
    return verdict.failure(verdict.INVALID_INPUT, f'operands {a}+{b} do not sum to {gold!r}')
  truth = _chain(a, b, max(len(str(a)), len(str(b))))
  if len(pairs) != len(truth):
    return verdict.judged(False, detail=f'{len(pairs)} columns, expected {len(truth)}')
  wrong = [n for n, (p, t) in enumerate(zip(pairs, truth)) if p != t]
  if wrong:
    return verdict.judged(False, detail=f'column {wrong[0]} (least significant is 0) is '
                                        f'{pairs[wrong[0]]}, expected {truth[wrong[0]]}')
  # Implied by the columns matching a+b == answer; kept so the verdict never rests on _chain.
  return verdict.judged(_write(pairs)[1] == gold)
