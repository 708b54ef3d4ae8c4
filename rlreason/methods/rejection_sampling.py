"""Referenced Rejection Sampling (KBQA-R1, arXiv 2512.10999): keep a trace only if the
actions it executes are the gold action sequence.

  verdict = replay(env, example, turn_texts)     # execute a trace's turns in a fresh episode
  keep = FILTERS['rrs'](verdict.actions, gold_actions(example), verdict.correct)
  solutions = FilteredTeacher(env, teacher, rule='rrs', tries=4)   # for rl/sft.py's sft_loop

KBQA-R1's cold start [S: abstract; project page sunxin000.github.io/KBQA-R1, Figure 2]:
"RRS constructs high-quality SFT data by filtering trajectories that match ground-truth
logical forms", "strictly aligning reasoning traces with ground-truth action sequences",
then GRPO on execution feedback. The paper's text beyond that was not read; the rest is our
formalisation [I]:
  * A trace's executed action sequence is every tool call of its turns, in order, each as
    `canonical_action` (tool, then arguments with every list read as a set: all of the kb
    tool's lists are sets, so intersection([A], [B]) and intersection([B], [A]) are one
    action). The gold sequence is the example's meta['gold_calls'] with their '$k'
    references resolved (envs.tasks.resolved_gold_calls).
  * 'rrs' keeps a trace whose sequence equals the gold one, none of whose calls failed or was
    malformed, and whose final answer the environment's verifier accepts. A different order,
    a different argument, an extra or a missing call, or a right answer reached by another
    path is rejected.
  * 'answer' (outcome rejection sampling, the baseline RRS refines) keeps any trace with a
    correct final answer; 'unfiltered' keeps every trace.
  * Sampling: a teacher (or any trace source) is asked up to `tries` times per problem, and
    the first kept trace is the problem's SFT target; a problem with none is skipped
    (sft_loop fills its batch by cycling the kept rows).

Not here: the teacher (envs/kb_traces.py), the SFT step (rl/sft.py), GRPO (rl/train.py).
"""

import dataclasses
from typing import Any, Callable, Sequence

import numpy as np

from rlreason.envs import base
from rlreason.envs import tasks as env_tasks

Action = tuple


def _canonical(value: Any) -> Any:
  if isinstance(value, list):
    return tuple(sorted({_canonical(v) for v in value}, key=repr))
  if isinstance(value, dict):
    return tuple(sorted((k, _canonical(v)) for k, v in value.items()))
  return value


def canonical_action(call: base.ToolCall) -> Action:
  """(tool name, sorted (argument, value) pairs), lists as sorted sets (see the docstring)."""
  return (call.name, _canonical(dict(call.arguments)))


def gold_actions(example) -> tuple[Action, ...]:
  """The example's reference action sequence: its gold calls, references resolved."""
  if 'gold_calls' not in example.meta:
    raise ValueError(f'rejection sampling: example {example.id} (task {example.task}) has no '
                     "meta['gold_calls'], the reference action sequence RRS compares with")
  return tuple(canonical_action(c) for c in env_tasks.resolved_gold_calls(example))


@dataclasses.dataclass(frozen=True)
class Replay:
  """What a trace did when executed: its actions, failed or malformed calls, and answer."""
  actions: tuple[Action, ...]
  failed_calls: int
  correct: bool
  reward: float


def replay(env, example, turn_texts: Sequence[str]) -> Replay:
  """Executes a trace's turns in a fresh episode of `env` (envs.environment.ToolEnvironment):
  each turn's calls (parsed by the env's format) run in order, the turn without calls is the
  final answer. A trace that stops before its final answer is not correct."""
  state, actions, failed, status = env.reset(example), [], 0, None
  for text in turn_texts:
    if state.done:
      break
    calls, _ = env.format.parse_calls(text)
    actions += [canonical_action(c) for c in calls]
    step = env.step(state, text)
    failed += int(step.info.get('failed', 0))
    status = step.info.get('status')
  correct = bool(state.done and not state.truncated and status == 'correct')
  return Replay(actions=tuple(actions), failed_calls=failed, correct=correct,
                reward=float(state.reward))


def keep_rrs(actions: Sequence[Action], gold: Sequence[Action], correct: bool,
             failed_calls: int = 0) -> bool:
  """Referenced: the executed sequence is the gold one, no call failed, the answer is right."""
  return tuple(actions) == tuple(gold) and failed_calls == 0 and correct


def keep_answer(actions, gold, correct: bool, failed_calls: int = 0) -> bool:
  del actions, gold, failed_calls
  return correct


def keep_all(actions, gold, correct, failed_calls=0) -> bool:
  del actions, gold, correct, failed_calls
  return True


FILTERS: dict[str, Callable[..., bool]] = {
    'unfiltered': keep_all, 'answer': keep_answer, 'rrs': keep_rrs}


def check_filter(name: str) -> None:
  if name not in FILTERS:
    raise ValueError(f'sft.filter={name!r}; known: {sorted(FILTERS)}')


def turn_texts(trace) -> list[str]:
  """A teacher trace's turns: its trained segments ([text, trained] lists), in order."""
  if isinstance(trace, str):
    return [trace]
  return [text for text, trained in trace if trained]


def judge(env, example, trace, *, rule: str) -> tuple[bool, Replay]:
  """(kept by the filter named `rule`, the replay) for one trace."""
  check_filter(rule)
  result = replay(env, example, turn_texts(trace))
  keep = FILTERS[rule](result.actions, gold_actions(example), result.correct,
                         result.failed_calls)
  return keep, result


def action_match_N(env, examples: Sequence[Any], turns_N: Sequence[Sequence[str]],
                   group_size: int = 1) -> np.ndarray:
  """Per episode (prompt-major, `group_size` per example): whether its executed action
  sequence is the gold one with no failed call (the answer is not required)."""
  out = []
  for n, turns in enumerate(turns_N):
    example = examples[n // group_size]
    result = replay(env, example, turns)
    out.append(result.actions == gold_actions(example) and result.failed_calls == 0)
  return np.array(out, bool)


def episode_turns(episodes) -> list[list[str]]:
  """Each episode's sampled turn texts, from rollout.episodes' transcripts."""
  return [[entry['text'] for entry in transcript] for transcript in episodes.transcripts]


class FilteredTeacher:
  """A `solutions(examples, rng)` function for sft_loop: per problem, up to `tries` teacher
  traces, the first one the filter named `rule` keeps (None if none). Counts what it saw."""

  def __init__(self, env, teacher: Callable, *, rule: str, tries: int):
    check_filter(rule)
    if tries < 1:
      raise ValueError(f'sft.filter_tries={tries} must be >= 1')
    if env is None and rule != 'unfiltered':
      raise ValueError(f"sft.filter={rule!r} executes the teacher's traces in the run's "
                       'environment: set env.enabled (and env.tools)')
    self.env, self.teacher, self.rule, self.tries = env, teacher, rule, tries
    self.counts = {'traces': 0, 'kept': 0, 'problems': 0, 'problems_kept': 0,
                   'gold_match': 0, 'correct': 0}

  def __call__(self, examples, rng) -> list:
    out = []
    for example in examples:
      self.counts['problems'] += 1
      chosen = None
      for _ in range(self.tries):
        trace = self.teacher(example, rng)
        self.counts['traces'] += 1
        if self.rule == 'unfiltered':
          chosen = trace
          break
        keep, result = judge(self.env, example, trace, rule=self.rule)
        self.counts['gold_match'] += int(keep_rrs(result.actions, gold_actions(example),
                                                  True, result.failed_calls))
        self.counts['correct'] += int(result.correct)
        if keep:
          self.counts['kept'] += 1
          chosen = trace
          break
      self.counts['problems_kept'] += int(chosen is not None)
      out.append(chosen)
    return out

  def metrics(self) -> dict[str, float]:
    """sft/filter_* : kept traces per trace sampled, problems with a kept trace."""
    c = self.counts
    if self.rule == 'unfiltered':
      return {}
    return {'sft/filter_accept_frac': c['kept'] / max(c['traces'], 1),
            'sft/filter_problems_kept_frac': c['problems_kept'] / max(c['problems'], 1),
            'sft/filter_gold_match_frac': c['gold_match'] / max(c['traces'], 1),
            'sft/filter_correct_frac': c['correct'] / max(c['traces'], 1)}


def build(run):
  """The SFT teacher's filter under sft.filter != 'unfiltered' (rl/extensions.py), or None."""
  return SftFilter() if run.config.sft.filter != 'unfiltered' else None


class SftFilter:

  def sft_solutions(self, run, teacher):
    s = run.config.sft
    return FilteredTeacher(run.env, teacher, rule=s.filter, tries=s.filter_tries)
