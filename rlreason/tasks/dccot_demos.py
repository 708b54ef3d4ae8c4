"""DC-CoT's director demonstrations in the spawn format, and the subtasks a worker can be checked on.

DC-CoT (Divide-and-Conquer CoT) warm-starts a long-CoT model by SFT on a small curated set of
demonstrations in which the model acts as a director: it names the independent subtasks of
its reasoning, spawns one worker per subtask, reads their results and finishes. Ours, on
parallel_sums with a varying number of groups (task option `min_groups`): the director
spawns one worker per group when the problem has at least `spawn_min` groups, and otherwise
solves it in one chain, so WHETHER to spawn and HOW MANY workers depend on the prompt:

  'a:31='            -> 'a:34 +4 #### 4'                            (1 group: no spawn)
  'a:31 b:59 c:53='  -> '<a,b,c>' | workers 'a:'+'34', 'b:'+'54', 'c:'+'58' | '[34,54,58]+426 #### 6'

`director_teacher(example, rng, spawn_min=)` is an `sft.teacher` ('module:function'): one SFT
row per call, a plain solution string or one thread of the threaded solution
(parallel_sums.threaded_teacher's [text, trained] segments). The set's size is `sft.num_demos`
(rl/sft.py cycles over that many problems); `spawn_counts` is its distribution of workers.

`subtasks(example)` maps each subtask's header to the output its worker should write
(methods/dccot.py's spawn-validity and worker-correctness rewards); None for a task with no
checkable subtasks.

Not here: sampling (rollout/fork_join.py), the stage rewards (methods/dccot.py).
"""

import collections
from typing import Sequence

from rlreason.tasks import example as example_lib
from rlreason.tasks import parallel_sums


def num_subtasks(example: example_lib.Example) -> int:
  """Independent subtasks of a problem: its digit groups (parallel_sums)."""
  if example.task != parallel_sums.NAME:
    raise ValueError(f'dccot_demos: task {example.task!r} has no subtask structure; the '
                     f'director demonstrations are built for {parallel_sums.NAME!r}.')
  return len(example.meta['groups'])


def director_workers(example: example_lib.Example, *, spawn_min: int = 2) -> int:
  """The director's choice in the demonstrations: one worker per subtask, none below
  `spawn_min` subtasks (a single subtask gains nothing from a worker)."""
  k = num_subtasks(example)
  return k if k >= spawn_min else 0


def director_teacher(example: example_lib.Example, rng, *, spawn_min: int = 2):
  """One SFT row of the director demonstration: the sequential solution when it does not
  spawn, else one thread (parent or a worker, uniformly) of the threaded solution."""
  if not director_workers(example, spawn_min=spawn_min):
    return example.solution
  return parallel_sums.threaded_teacher(example, rng)


def spawn_counts(examples: Sequence[example_lib.Example], *,
                 spawn_min: int = 2) -> dict[int, int]:
  """How many demonstrations spawn k workers (k = 0: a plain chain), sorted by k."""
  counts = collections.Counter(director_workers(ex, spawn_min=spawn_min) for ex in examples)
  return dict(sorted(counts.items()))


def subtasks(example: example_lib.Example) -> dict[str, str] | None:
  """Header -> the output its worker should write (the group's running sums), or None."""
  if example.task != parallel_sums.NAME:
    return None
  _, workers, _ = parallel_sums.threaded_solution(example)
  return dict(workers)
