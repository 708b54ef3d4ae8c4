"""Synthetic verifiable tasks, generated deterministically from (seed, index, difficulty).

Every task is a `Task` in `TASKS`: `generate(seed, index, *, difficulty, **options)` returns an
`Example` (prompt, gold answer, worked solution, JSON-able `meta` for the verifier), and
`problem_key(example)` is the canonical form of the problem that decides its split
(`split_of`). `chars` lists every character the task can emit, for character-level
tokenizers. Prompts, answers and `meta` follow the item formats of the rlreason.verifiers
checker of the same name, so `{'completion': text, 'answer': ex.answer, **ex.meta}` is a
verifier item and `ex.solution` scores 1 as a completion.

  task               prompt                   solution                          difficulty
  arithmetic         '12345+67890='           '5,0 3,1 2,1 0,1 8,0 #### 80235'  digits
  countdown          numbers and a target     '30+93-100'                       numbers
  group_composition  'S3: [2 1 3] [1 3 2] ='  '[2 1 3] [3 1 2] #### [3 1 2]'    k
  policy_recall      a customer request       rules, then <policies>ids</policies>  facts
  parallel_sums      'a:3141 b:5926='         'a:3489 b:5473 +92 #### 2'        digits
  chat_arithmetic    'What is 42 + 23? ...'   '42 + 23 = 65'                    digits

Not here: streaming, batching, sharding (data.py); answer checking (verifiers/).
"""

import dataclasses
from typing import Callable

from rlreason.tasks import arithmetic
from rlreason.tasks import chat_arithmetic
from rlreason.tasks import countdown
from rlreason.tasks import example as example_lib
from rlreason.tasks import group_composition
from rlreason.tasks import parallel_sums
from rlreason.tasks import policy_recall
from rlreason.tasks.example import Example
from rlreason.tasks.example import HELD_OUT
from rlreason.tasks.example import HELD_OUT_FRACTION
from rlreason.tasks.example import TRAIN


@dataclasses.dataclass(frozen=True)
class Task:
  """A synthetic task: how to draw a problem and how to name it canonically."""
  name: str
  generate: Callable[..., Example]  # (seed, index, *, difficulty, **options) -> Example
  problem_key: Callable[[Example], str]
  default_difficulty: int
  chars: str
  behaviour_mode: Callable[[str], int] | None = None  # IFPO's mode of a completion, if any


TASKS = {
    module.NAME: Task(name=module.NAME, generate=module.generate, problem_key=module.problem_key,
                      default_difficulty=module.DEFAULT_DIFFICULTY, chars=module.CHARS,
                      behaviour_mode=getattr(module, 'behaviour_mode', None))
    for module in (arithmetic, chat_arithmetic, countdown, group_composition, parallel_sums, policy_recall)
}


def register(task: Task) -> None:
  """Adds a task defined outside this package: rlreason.envs.tasks registers its tool-use
  tasks when imported (this package must not import rlreason.envs)."""
  if task.name in TASKS and TASKS[task.name] != task:
    raise ValueError(f'task {task.name!r} is already registered')
  TASKS[task.name] = task


def behaviour_mode_fn(task: str) -> Callable[[str], int] | None:
  """The synthetic task's `behaviour_mode(completion) -> int` (IFPO's modes), or None."""
  return TASKS[task].behaviour_mode if task in TASKS else None


def get_task(name: str) -> Task:
  try:
    return TASKS[name]
  except KeyError:
    raise KeyError(f'unknown task {name!r}; known tasks: {", ".join(sorted(TASKS))}.') from None


def split_of(example: Example, *, held_out_fraction: float = HELD_OUT_FRACTION) -> str:
  """TRAIN or HELD_OUT for a synthetic example, by a hash of its canonical problem."""
  return example_lib.split_of_key(example.task, get_task(example.task).problem_key(example),
                                  held_out_fraction=held_out_fraction)


__all__ = ['Example', 'HELD_OUT', 'HELD_OUT_FRACTION', 'TASKS', 'TRAIN', 'Task', 'get_task',
           'register',
           'split_of']
