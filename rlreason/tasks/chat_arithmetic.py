"""Arithmetic asked in words, for pretrained chat models: 'What is 42 + 23? Answer with just
the number.'

Formats (difficulty = digits per operand, default 2):

  prompt    'What is 42 + 23? Answer with just the number.'
  solution  '42 + 23 = 65'
  answer    '65'

The question is plain English so that a chat model's own template (data.prompt_template, or
the tokenizer's chat template) wraps it; nothing in it is tuned to a tokenizer. Options:
`op` ('+', '-' or '*'; '-' puts the larger operand first, so answers are >= 0) and
`instruction` (the sentence after the question). Operands have exactly `difficulty` digits.

The answer a completion gives is the number it ends with (`final_number`): '65', '42 + 23 = 65'
and 'The answer is 65.' all give 65, while prose that stops mid-sentence or ends in words gives
none. `verify_final_number` (verifier 'rlreason.tasks.chat_arithmetic:verify_final_number')
is correct iff that number equals the gold answer, and a parse failure when there is none, so
the verifier's parse-failure rate is the format-violation rate: a demo can tell an accuracy
gain that comes from answering correctly apart from one that comes from answering at all.

Not here: reasoning chains (GSM8K, ../shared/data), the chat template itself (model/).
"""

import re

from rlreason.tasks import example as example_lib
from rlreason.verifiers import verdict

NAME = 'chat_arithmetic'
DEFAULT_DIFFICULTY = 2
CHARS = '0123456789+-*=?.,: abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ'
INSTRUCTION = 'Answer with just the number.'
OPS = {'+': lambda a, b: a + b, '-': lambda a, b: a - b, '*': lambda a, b: a * b}

# The number a completion ends with: optional markdown/LaTeX dressing and a final period after.
_FINAL_NUMBER = re.compile(r'(-?\d[\d,]*)\s*(?:\*\*|\$)?\s*\.?\s*$')


def generate(seed: int, index: int, *, difficulty: int = DEFAULT_DIFFICULTY, op: str = '+',
             instruction: str = INSTRUCTION) -> example_lib.Example:
  """Problem `index` of `seed`: two `difficulty`-digit operands and `op`."""
  if op not in OPS:
    raise ValueError(f'chat_arithmetic: op={op!r}; known ops: {", ".join(OPS)}.')
  if not 1 <= difficulty <= 9:
    raise ValueError(f'chat_arithmetic: difficulty={difficulty} digits must be in [1, 9].')
  rng = example_lib.example_rng(NAME, seed, index, difficulty)
  a, b = (int(x) for x in rng.integers(10 ** (difficulty - 1), 10 ** difficulty, size=2))
  if op == '-' and b > a:
    a, b = b, a
  result = OPS[op](a, b)
  question = f'What is {a} {op} {b}?'
  return example_lib.Example(
      id=example_lib.example_id(NAME, seed, index, difficulty),
      prompt=f'{question} {instruction}'.strip(), answer=str(result),
      solution=f'{a} {op} {b} = {result}', task=NAME, difficulty=difficulty,
      meta={'operands': [a, b], 'op': op})


def problem_key(example: example_lib.Example) -> str:
  a, b = example.meta['operands']
  return f'{a}{example.meta["op"]}{b}'


# An answer is far shorter; matching on the tail keeps the search linear in the completion
# (the pattern anchored at the end is quadratic on a long run of digits).
_TAIL_CHARS = 128


def final_number(text: str) -> str | None:
  """The integer a completion ends with (thousands commas removed), or None (also for a
  number longer than the tail, which is no answer)."""
  text = text.strip()
  tail = text[-_TAIL_CHARS:]
  match = _FINAL_NUMBER.search(tail)
  if match is None or (match.start() == 0 and len(text) > len(tail)):
    return None
  return match.group(1).replace(',', '')


@verdict.verifier
def verify_final_number(item) -> verdict.Verdict:
  """Item: completion, answer (an integer as text). Correct iff the completion ends with that
  number; parse_failure when it ends with no number (prose, or cut off mid-sentence)."""
  text = verdict.completion_text(item)
  gold = verdict.gold_text(item).strip()
  if not re.fullmatch(r'-?\d+', gold):
    return verdict.failure(verdict.INVALID_INPUT, f'answer: expected an integer, got {gold!r}')
  given = final_number(text)
  if given is None:
    return verdict.failure(verdict.PARSE_FAILURE, 'the completion does not end with a number')
  return verdict.judged(int(given) == int(gold))
