"""Sums of independent digit groups: a task whose sub-problems can run as parallel threads.

Formats (difficulty = digits per group, here 4; `groups` = 3 groups labelled a, b, c):

  prompt      'a:3141 b:5926 c:5358='
  solution    'a:3489 b:5473 c:5831 +951 #### 1'   (sequential: one thread)
  answer      '1'

Group k's line is the running sum mod 10 of its digits (3, 3+1=4, 4+4=8, 8+1=9): its last digit
v_k is the group's value. After '+' come the running sums mod 10 of v_a, v_b, ... and the
answer is the last of them, (Σ_k Σ digits) mod 10, read by the `arithmetic` verifier after
' #### '.

The threaded solution (rollout/fork_join.py's spawn format, `THREAD_MARKERS`) solves each group
in its own worker:
  parent      '<a,b,c>'                          spawn block: one header per group
  worker a    'a:' (given) then '3489'            the group's running sums, then EOS
  join        '[3489,5473,5831]'                 the workers' outputs, prefilled
  parent      '+951 #### 1'                      as the sequential solution ends
`threaded_solution` returns these pieces, `threaded_text` the parent's whole text, and
`threaded_teacher` one thread of it as an SFT row.

Every sub-problem needs the same work in both formats; the threaded parent writes the short
spawn block instead of the groups' lines, so its critical path is about spawn + one group + the
ending, against all groups + the ending sequentially.

`STEP_PARSER` cuts the sequential solution into steps for tasks/thread_rewrite.py (stage 1 of
ThreadWeaver's two-stage rewrite into threads).

Not here: tokenization (a character vocabulary from `CHARS`), the sampler (rollout/fork_join.py).
"""

import string

from rlreason.tasks import example as example_lib
from rlreason.tasks import thread_rewrite

NAME = 'parallel_sums'
DEFAULT_DIFFICULTY = 4
DEFAULT_GROUPS = 3
MAX_GROUPS = 8
CHARS = 'abcdefgh:0123456789 =+#<>,[]'
# spawn, sep, end, worker_open, join_open, join_sep, join_close (fork_join.SpawnFormat).
THREAD_MARKERS = dict(spawn='<', sep=',', end='>', worker_open=':', join_open='[',
                      join_sep=',', join_close=']')


def _running(digits) -> str:
  out, s = [], 0
  for d in digits:
    s = (s + d) % 10
    out.append(str(s))
  return ''.join(out)


def generate(seed: int, index: int, *, difficulty: int = DEFAULT_DIFFICULTY,
             groups: int = DEFAULT_GROUPS, min_groups: int = 0) -> example_lib.Example:
  """The (seed, index)-th problem: `groups` groups of `difficulty` random digits, or, with
  `min_groups` >= 1, a number of groups drawn uniformly from [min_groups, groups] (DC-CoT's
  director then has a varying number of subtasks to spawn: methods/dccot.py)."""
  if not 1 <= groups <= MAX_GROUPS or difficulty < 1 or not 0 <= min_groups <= groups:
    raise ValueError(f'parallel_sums: groups={groups} must be in [1, {MAX_GROUPS}], '
                     f'min_groups={min_groups} in [0, groups] and difficulty={difficulty} >= 1.')
  rng = example_lib.example_rng(NAME, seed, index, difficulty * 16 + groups)
  count = int(rng.integers(min_groups, groups + 1)) if min_groups else groups
  digits = rng.integers(0, 10, size=(count, difficulty)).tolist()
  labels = string.ascii_lowercase[:count]
  prompt = ' '.join(f'{l}:{"".join(map(str, d))}' for l, d in zip(labels, digits)) + '='
  lines = [_running(d) for d in digits]
  values = [int(line[-1]) for line in lines]
  ending = f'+{_running(values)}{example_lib.ANSWER_MARKER}{sum(values) % 10}'
  solution = ' '.join(f'{l}:{line}' for l, line in zip(labels, lines)) + ' ' + ending
  return example_lib.Example(
      id=example_lib.example_id(NAME, seed, index, difficulty), prompt=prompt,
      answer=str(sum(values) % 10), solution=solution, task=NAME, difficulty=difficulty,
      meta={'groups': digits})


def problem_key(example: example_lib.Example) -> str:
  return example.prompt


def threaded_solution(example: example_lib.Example) -> tuple[str, list[tuple[str, str]], str]:
  """(spawn block, [(worker header, worker output)], ending) of the threaded teacher."""
  m = THREAD_MARKERS
  labels = string.ascii_lowercase[:len(example.meta['groups'])]
  spawn = m['spawn'] + m['sep'].join(labels) + m['end']
  workers = [(l, _running(d)) for l, d in zip(labels, example.meta['groups'])]
  ending = example.solution.split(' ')[-3:]  # '+951', '####', '1'
  return spawn, workers, ' '.join(ending)


def threaded_text(example: example_lib.Example) -> str:
  """The threaded parent's whole text: spawn block, join block, ending."""
  m = THREAD_MARKERS
  spawn, workers, ending = threaded_solution(example)
  join = m['join_open'] + m['join_sep'].join(out for _, out in workers) + m['join_close']
  return spawn + join + ending


def threaded_teacher(example: example_lib.Example, rng) -> list[list]:
  """One thread of the threaded solution as an SFT row (rl/sft.py's [text, trained] segments),
  drawn uniformly among the parent and the workers, so SFT sees every kind of thread:
    parent    [spawn block, trained], [join block, not trained], [ending, trained]
    worker k  [spawn block + header_k + ':', not trained], [its output, trained]
  (the loop appends a trained EOS to both, as the sampler's threads end)."""
  m = THREAD_MARKERS
  spawn, workers, ending = threaded_solution(example)
  k = int(rng.integers(0, len(workers) + 1))
  if k == 0:
    join = m['join_open'] + m['join_sep'].join(out for _, out in workers) + m['join_close']
    return [[spawn, True], [join, False], [ending, True]]
  header, out = workers[k - 1]
  return [[spawn + header + m['worker_open'], False], [out, True]]


def _parse_steps(example: example_lib.Example, text: str):
  """thread_rewrite's stage 1 on a sequential solution 'a:3489 b:5473 c:5831 +951 #### 1':
  one step per group line (independent: it reads the prompt only), the '+' line (reads every
  group's value), and the tail ' #### 1'; None if the text is not of that shape."""
  at = text.rfind(example_lib.ANSWER_MARKER)
  if at < 0:
    return None
  labels = string.ascii_lowercase[:len(example.meta['groups'])]
  parts = text[:at].split(' ')
  if len(parts) != len(labels) + 1 or not parts[-1].startswith('+'):
    return None
  steps = []
  for label, part in zip(labels, parts):
    head, _, digits = part.partition(':')
    if head != label or not digits.isdigit():
      return None
    steps.append(thread_rewrite.Step(label, digits, (), part))
  total = parts[-1][1:]
  if not total.isdigit():
    return None
  steps.append(thread_rewrite.Step('+', total, tuple(labels), parts[-1]))
  return steps, text[at:]


def _check_step(example: example_lib.Example, step, results) -> bool:
  """A group's line from its digits in the prompt; the '+' line from the groups' values."""
  if step.label == '+':
    values = [results[label][-1:] for label in step.inputs]
    return all(v.isdigit() for v in values) and step.result == _running(map(int, values))
  index = string.ascii_lowercase.index(step.label)
  return step.result == _running(example.meta['groups'][index])


def _verify_parent(example: example_lib.Example, text: str) -> bool:
  from rlreason.verifiers import synthetic_tasks
  return synthetic_tasks.verify_arithmetic({'completion': text,
                                            'answer': example.answer}).reward == 1.0


# thread_rewrite's parser of the sequential solution (two-stage threaded SFT data).
STEP_PARSER = thread_rewrite.StepParser(parse=_parse_steps, check=_check_step,
                                        verify=_verify_parent, markers=THREAD_MARKERS)
