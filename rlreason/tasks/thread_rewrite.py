"""Two-stage generation of parallel trajectories for SFT, from sequential solutions.

  parser = parallel_sums.STEP_PARSER
  out = thread_rewrite.rewrite(example, example.solution, parser)
  out.status            # 'kept' | 'unparsed' | 'sequential' | 'wrong_step' | 'wrong_answer'
  out.parent_text()     # '<a,b,c>[3489,5473,5831]+951 #### 1' (the spawn format)

ThreadWeaver (arXiv 2512.07843) builds its SFT data in two stages: take sequential solutions,
find the sub-steps that do not depend on each other, rewrite them as parallel threads, and keep
only the rewrites that still verify. Ours, without an LLM rewriter [F]:

  stage 1  `split`: the task's StepParser cuts a solution into steps (label, result, the labels
           of the other steps whose results it reads, its text) and a tail (the answer line);
           a step is independent when it reads no other step's result.
  stage 2  `rewrite`: one thread per independent step (header = its label, output = its
           result), the join (their results in step order), and the parent's ending: the
           dependent steps in their original order, then the tail. With fewer than two
           independent steps there is nothing to run in parallel ('sequential', not rewritten).
           Kept only if every step recomputes (`StepParser.check`: an independent step from
           the problem alone, i.e. the thread's result equals what the step computes without
           the other threads; a dependent step from its inputs' results) and the task's
           verifier accepts the parent's text. A slipped step fails its check, a slipped
           answer the verifier: noisy traces are dropped, not rewritten.

The output is the spawn format of rollout/fork_join.py (markers as parallel_sums.THREAD_MARKERS):
parent `spawn h_1 sep .. h_k end`, workers `h_k worker_open out_k`, join
`join_open out_1 join_sep .. join_close`, then the ending. `teacher` returns one thread of
a kept rewrite as SFT segments (rl/sft.py), or None (the SFT loop skips the row).

Provenance: the two-stage pipeline and the verify-and-keep filter are ThreadWeaver's [P]; the
parser-based dependency analysis and deterministic rewrite stand in for its LLM rewriter [F].
"""

import dataclasses
import importlib
from typing import Callable

import numpy as np


@dataclasses.dataclass(frozen=True)
class Step:
  """One step of a sequential solution: it defines `label` as `result`, reading the results
  of the steps named in `inputs`; `text` is how the solution writes it."""
  label: str
  result: str
  inputs: tuple[str, ...]
  text: str


@dataclasses.dataclass(frozen=True)
class StepParser:
  """What a task supplies.

  parse(example, text) -> (steps, tail) or None if the text is not a solution of its shape.
  check(example, step, results) -> bool: the step's result is right, from the problem (an
    independent step) or from `results` (label -> result) of its inputs.
  verify(example, parent_text) -> bool: the task's verifier on the rewritten parent.
  markers: the spawn format's one-character markers (fork_join.SpawnFormat's names).
  step_sep: what joins steps (and the dependent steps of the ending) in the text.
  """
  parse: Callable
  check: Callable
  verify: Callable
  markers: dict
  step_sep: str = ' '


@dataclasses.dataclass(frozen=True)
class Rewrite:
  """A rewrite's outcome; workers and ending are empty unless status is 'kept'."""
  status: str
  workers: tuple[tuple[str, str], ...] = ()  # (header, output) per thread
  ending: str = ''
  markers: dict = dataclasses.field(default_factory=dict)

  @property
  def kept(self) -> bool:
    return self.status == 'kept'

  def spawn_block(self) -> str:
    m = self.markers
    return m['spawn'] + m['sep'].join(h for h, _ in self.workers) + m['end']

  def join_block(self) -> str:
    m = self.markers
    return m['join_open'] + m['join_sep'].join(o for _, o in self.workers) + m['join_close']

  def parent_text(self) -> str:
    return self.spawn_block() + self.join_block() + self.ending


def split(steps) -> tuple[list[Step], list[Step]]:
  """Stage 1's dependency analysis: (independent, dependent) steps, each in solution order.
  A step is dependent when it reads another step's result (an input naming a step's label)."""
  labels = {s.label for s in steps}
  independent = [s for s in steps if not set(s.inputs) & (labels - {s.label})]
  dependent = [s for s in steps if s not in independent]
  return independent, dependent


def rewrite(example, text: str, parser: StepParser) -> Rewrite:
  """Both stages for one sequential solution `text` of `example`; see the module docstring."""
  parsed = parser.parse(example, text)
  if parsed is None:
    return Rewrite('unparsed')
  steps, tail = parsed
  independent, dependent = split(steps)
  if len(independent) < 2:
    return Rewrite('sequential')
  results = {s.label: s.result for s in steps}
  if not all(parser.check(example, s, results) for s in steps):
    return Rewrite('wrong_step')
  out = Rewrite('kept', workers=tuple((s.label, s.result) for s in independent),
                ending=parser.step_sep.join(s.text for s in dependent) + tail,
                markers=dict(parser.markers))
  if not parser.verify(example, out.parent_text()):
    return Rewrite('wrong_answer')
  return out


def slip(text: str, rng: np.random.Generator) -> str:
  """`text` with one digit, drawn uniformly among its digits, replaced by another digit (a
  calculation slip); unchanged if it has none."""
  where = [i for i, ch in enumerate(text) if ch.isdigit()]
  if not where:
    return text
  i = where[int(rng.integers(len(where)))]
  new = str((int(text[i]) + int(rng.integers(1, 10))) % 10)
  return text[:i] + new + text[i + 1:]


def thread_rows(out: Rewrite, k: int) -> list[list]:
  """Thread k of a kept rewrite as SFT segments ([text, trained]): k = 0 the parent (spawn
  block and ending trained, the join block context), k >= 1 worker k (the spawn block and its
  header context, its output trained)."""
  if k == 0:
    return [[out.spawn_block(), True], [out.join_block(), False], [out.ending, True]]
  header, output = out.workers[k - 1]
  return [[out.spawn_block() + header + out.markers['worker_open'], False], [output, True]]


def parser_for(task: str) -> StepParser:
  """The task module's STEP_PARSER (rlreason.tasks.<task>); the error names the task."""
  module = importlib.import_module(f'rlreason.tasks.{task}')
  if not hasattr(module, 'STEP_PARSER'):
    raise ValueError(f'thread_rewrite: task {task!r} supplies no STEP_PARSER '
                     f'(rlreason/tasks/{task}.py).')
  return module.STEP_PARSER


def teacher(example, rng: np.random.Generator, *, slip_rate: float = 0.0):
  """An SFT teacher (sft.teacher='rlreason.tasks.thread_rewrite:teacher'): the example's
  sequential solution, slipped with probability `slip_rate` (noisy sources), rewritten; one
  thread of it, uniformly among the parent and the workers, or None when the rewrite is
  dropped (the SFT loop skips the row)."""
  text = example.solution
  if slip_rate and rng.random() < slip_rate:
    text = slip(text, rng)
  out = rewrite(example, text, parser_for(example.task))
  if not out.kept:
    return None
  return thread_rows(out, int(rng.integers(0, len(out.workers) + 1)))


def kept_fraction(examples, *, slip_rate: float, seed: int) -> dict[str, float]:
  """Stage 2's filter on noisy sources: each example's solution slipped with probability
  slip_rate; the fraction kept overall, of the clean and of the slipped sources, and the
  fraction of statuses."""
  rng = np.random.default_rng(seed)
  clean, slipped, statuses = [], [], []
  for ex in examples:
    noisy = rng.random() < slip_rate
    text = slip(ex.solution, rng) if noisy else ex.solution
    out = rewrite(ex, text, parser_for(ex.task))
    (slipped if noisy else clean).append(out.kept)
    statuses.append(out.status)
  mean = lambda xs: float(np.mean(xs)) if xs else float('nan')
  stats = {'kept': mean(clean + slipped), 'kept_clean': mean(clean),
           'kept_slipped': mean(slipped), 'slipped': len(slipped) / max(len(examples), 1)}
  stats.update({f'status_{s}': statuses.count(s) / len(statuses) for s in sorted(set(statuses))})
  return stats
