"""prolog_arith: short arithmetic word problems a program can derive, with their Prolog.

A synthetic stand-in for GSM8K as Prolog-as-a-Tool (arXiv 2512.07407) uses it: the model
writes a program defining solve(X) inside <answer>...</answer>, SWI-Prolog runs it. Each
problem is one of four templates over numbers of `difficulty` digits at most:

  kind   question                                                    answer
  add    Ann has a apples and buys b more. How many apples?          a + b
  sub    Ann has a apples and gives away b. How many are left?       a - b
  mul    Ann buys a bags of b apples. How many apples?               a * b
  mix    Ann has a apples and buys b bags of c. How many apples?     a + b * c

meta['facts'] names each quantity ([['has', a], ['buys', b], ...]) and meta['expression'] the
formula over their variables; `program(example)` writes the derivation the paper's structured
prompts ask for (one fact per quantity, solve/1 as a clpq constraint over them), e.g.

  has(12).
  buys(3).
  solve(X) :- has(A), buys(B), {X = A+B}.

Not here: the episode protocols and rewards (prolog_protocols.py), the teacher
(prolog_traces.py). `_register()`, run on import (envs/tasks.py imports this module), adds
the task to rlreason.tasks.TASKS.
"""

import string

from rlreason import tasks as tasks_lib
from rlreason.tasks import example as example_lib

TASK = 'prolog_arith'
KINDS = ('add', 'sub', 'mul', 'mix')
# kind -> (question with {a} {b} {c}, fact names, expression over A B C)
_TEMPLATES = {
    'add': ('Ann has {a} apples and buys {b} more. How many apples?', ('has', 'buys'), 'A+B'),
    'sub': ('Ann has {a} apples and gives away {b}. How many are left?', ('has', 'gives'),
            'A-B'),
    'mul': ('Ann buys {a} bags of {b} apples. How many apples?', ('bags', 'each'), 'A*B'),
    'mix': ('Ann has {a} apples and buys {b} bags of {c}. How many apples?',
            ('has', 'bags', 'each'), 'A+B*C'),
}
_VALUE = {'add': lambda a, b: a + b, 'sub': lambda a, b: a - b, 'mul': lambda a, b: a * b,
          'mix': lambda a, b, c: a + b * c}
_VARS = 'ABC'


def prolog_arith(seed: int, index: int, *, difficulty: int = 2,
                 kinds: tuple[str, ...] = KINDS) -> example_lib.Example:
  """One word problem; `kinds` restricts the templates (data.task_options)."""
  unknown = [k for k in kinds if k not in _TEMPLATES]
  if unknown or not kinds:
    raise ValueError(f'{TASK}: kinds={kinds!r}; known: {KINDS}')
  if not 1 <= difficulty <= 4:
    raise ValueError(f'{TASK}: difficulty={difficulty} (digits) must be in [1, 4]')
  rng = example_lib.example_rng(TASK, seed, index, difficulty)
  kind = str(kinds[int(rng.integers(len(kinds)))])
  question, names, expression = _TEMPLATES[kind]
  top = 10**difficulty
  values = [int(rng.integers(2, top)) for _ in names]
  if kind == 'sub' and values[1] > values[0]:
    values.reverse()  # Nothing negative: Ann cannot give away more than she has.
  answer = _VALUE[kind](*values)
  meta = {'kind': kind, 'facts': [[n, v] for n, v in zip(names, values)],
          'expression': expression}
  return example_lib.Example(
      id=example_lib.example_id(TASK, seed, index, difficulty),
      prompt=question.format(**dict(zip('abc', values))), answer=str(answer),
      solution=program(meta), task=TASK, difficulty=difficulty, meta=meta)


def program(meta) -> str:
  """The derivation: a fact per quantity, solve/1 a clpq constraint over them."""
  facts = ''.join(f'{name}({value}).\n' for name, value in meta['facts'])
  goals = ', '.join(f'{name}({v})' for (name, _), v in zip(meta['facts'], _VARS))
  return f'{facts}solve(X) :- {goals}, {{X = {meta["expression"]}}}.'


def hardcoded(value: str) -> str:
  """A program that states a number instead of deriving it: not auditable."""
  return f'solve(X) :- {{X = {value}}}.'


def problem_key(example: example_lib.Example) -> str:
  return f'{example.meta["kind"]}:' + ','.join(str(v) for _, v in example.meta['facts'])


def _register() -> None:
  tasks_lib.register(tasks_lib.Task(name=TASK, generate=prolog_arith, problem_key=problem_key,
                                    default_difficulty=2, chars=string.printable))


_register()
