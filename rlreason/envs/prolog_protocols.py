"""Prolog-as-a-Tool's inference protocols as episodes, rewarded per episode by §20's terms.

  env = PrologEnvironment(protocol='agentic', tries=3, reward='structure')
  state = env.reset(example); step = env.step(state, turn_text)

Every turn is one program inside <answer>...</answer> (a turn ends at '</answer>', as the
paper's sampler stops there [C: aisilab/Prolog-as-a-Tool inference/*.py, stop=["</answer>"]]).
SWI-Prolog runs its solve(X) through verifiers/prolog.py (the sandbox, the paper's
components). The protocols [C: inference/singletry.py, multipletry.py, agentic_internal.py]:

  single     one program; the episode ends after it.
  multi_try  up to `tries` programs; the episode stops at the first whose solve(X) gives a
             number (multipletry.py's success test, right or wrong: gold is never consulted);
             a failed try is answered by RETRY, which says nothing about the failure.
  agentic    the same stop, but a failed try is answered by what running it gave (a syntax
             error, solve/1 missing, failing or unbound, an error, a timeout): the model reads
             its program's output and revises (agentic_internal.py feeds the run back into
             the dialogue; its tool printed swipl's last line or None, ours names the outcome).

Our formalisation [I]: the paper's multiple tries are independent samples of the same prompt;
here they are turns of one episode, so a later try sees the earlier ones (the RETRY line is all
that separates them). The paper's agentic loop also resets its context, shakes the
temperature on duplicates and injects a skeleton; none of that is here.

Reward, per episode, from the final program (the one that stopped the episode, or the last
try): Σ_c w_c · component_c with verifiers/prolog.py's components (correctness 2 / 1 / 0.5
[C: reward_suite_1.py], structure in [0, 2], syntax in [0, 1] [C: reward_suite_3.py]);
an episode whose final turn holds no program, or whose run was stopped (timeout, sandbox),
has every component 0 (the paper gives correctness 0.5 when no code is extracted).
REWARDS names two weightings: 'correctness' (the correctness term alone, suite 1's execution
reward) and 'structure' (+ 0.5 structure + 0.25 syntax: structure-rewarded, our weights [I];
suite 3 weights them by a curriculum, composition.PROLOG_CURRICULUM, over normalised terms).
Constant weights: the episode reward does not depend on training progress.

Not here: chat templates (the 'tags' text format only: `TextRenderer`), the semantic-
similarity term (it needs a sentence-embedding model), the teacher (prolog_traces.py).
"""

import collections
import dataclasses
import functools
from typing import Any, Mapping

from rlreason.envs import base
from rlreason.envs import formats
from rlreason.envs import render
from rlreason.verifiers import composition
from rlreason.verifiers import prolog

PROTOCOLS = ('single', 'multi_try', 'agentic')
REWARDS = {
    'correctness': {'correctness': 1.0},
    'structure': {'correctness': 1.0, 'structure': 0.5, 'syntax': 0.25},
}
OPTIONS = ('protocol', 'tries', 'reward')  # env.options
COMPONENTS = ('correctness', 'structure', 'syntax', 'parses', 'format')
DERIVED_SCORES = (0.8, 1.1, 1.4, 1.5)  # p = 1, 2, 3, >= 4 with c >= 1, not hard-coded
RETRY = 'no number; try again'
ANSWER_OPEN, ANSWER_CLOSE = '<answer>\n', '\n</answer>'


def _parse(text: str):
  del text  # Every turn is a program: the environment runs it, there is no tool call.
  return [], []


FORMAT = formats.Format('prolog', ANSWER_CLOSE.strip(), '', (), _parse)


@dataclasses.dataclass
class PrologState:
  """One episode: its example, tries so far, the last run's verdict."""
  example: Any
  turns: int = 0
  tool_calls: int = 0  # programs run
  errors: collections.Counter = dataclasses.field(default_factory=collections.Counter)
  done: bool = False
  truncated: bool = False
  reward: float = 0.0
  verdicts: list = dataclasses.field(default_factory=list)


def answer_text(program: str) -> str:
  return f'{ANSWER_OPEN}{program}{ANSWER_CLOSE}'


@functools.lru_cache(maxsize=1 << 14)
def run_program(turn_text: str, gold: str):
  """verify_prolog's verdict on one turn: its components ({} for no program or a stopped run).
  Cached: a group's episodes often write the same program, and a run is one swipl process."""
  return prolog.verify_prolog({'completion': turn_text, 'answer': gold})


def gave_number(verdict) -> bool:
  return not verdict.failed and verdict.detail.startswith('number')


def observation(verdict) -> str:
  """What running a program gave, as the agentic protocol shows it (one short line)."""
  if verdict.failed:
    return {'parse_failure': 'no <answer> program'}.get(verdict.status, verdict.status)
  outcome, _, value = verdict.detail.partition(' ')
  if outcome == 'number':
    return f'X = {value}'
  syntax = 'syntax error; ' if verdict.components.get('parses', 1.0) < 1 else ''
  return syntax + {'no_solve': 'no solve/1', 'failed': 'solve(X) failed',
                   'unbound': 'X unbound', 'error': 'solve(X) raised an error',
                   'non_numeric': 'X is not a number'}.get(outcome, outcome)


def components(verdict) -> dict[str, float]:
  """Every COMPONENTS entry: the verdict's, 0 where it has none (a failed run)."""
  return {name: float(verdict.components.get(name, 0.0)) for name in COMPONENTS}


def episode_reward(verdict, weights: Mapping[str, float]) -> float:
  """Σ_c w_c · component_c of the final program (composition.RewardComposition)."""
  mix = composition.RewardComposition(weights=dict(weights))
  rewards, _ = mix.combine([components(verdict)], progress=0.0)
  return rewards[0]


def derived(verdict) -> bool:
  """Auditable: solve/1 derives X through a constraint over other clauses, not a stated
  number: singletry.py's check_structure_correctness (>= 1 predicate besides solve/1 and
  >= 1 constraint) and not hard-coded (which the structure reward multiplies by 0.2).
  Read off the structure score min(0.3 p, 1) + min(0.5 c, 0.5): with p >= 1, c >= 1 and no
  hard-coding it is one of DERIVED_SCORES; every other (p, c, hard-coded) gives another value."""
  score = round(float(verdict.components.get('structure', 0.0)), 6)
  return not verdict.failed and score in DERIVED_SCORES


class PrologEnvironment:
  """base.Environment over prolog_arith (or any number-answer) examples; see the docstring."""

  def __init__(self, *, protocol: str = 'single', tries: int = 1, reward: str = 'correctness'):
    if protocol not in PROTOCOLS:
      raise ValueError(f'env.options.protocol={protocol!r}; known: {PROTOCOLS}')
    if not isinstance(tries, int) or tries < 1 or (protocol == 'single' and tries != 1):
      raise ValueError(f'env.options.tries={tries!r} must be an integer >= 1, and 1 with '
                       "protocol='single'")
    if reward not in REWARDS:
      raise ValueError(f'env.options.reward={reward!r}; known: {sorted(REWARDS)}')
    self.protocol, self.tries, self.reward, self.weights = protocol, tries, reward, REWARDS[reward]
    self.max_turns = tries
    self.format = FORMAT

  def reset(self, example) -> PrologState:
    return PrologState(example=example)

  def step(self, state: PrologState, turn_text: str) -> base.Step:
    if state.done:
      raise ValueError('step() on a finished episode')
    state.turns += 1
    verdict = run_program(turn_text, state.example.answer)
    state.verdicts.append(verdict)
    if not (verdict.failed and verdict.status == 'parse_failure'):
      state.tool_calls += 1
    if not gave_number(verdict):
      kind = base.TOOL_FAILED if not verdict.failed else verdict.status
      state.errors[kind] += 1
    info = {'status': verdict.status, 'detail': verdict.detail, 'derived': derived(verdict),
            **{f'c_{k}': v for k, v in components(verdict).items()}}
    if gave_number(verdict) or state.turns >= self.tries:
      state.done = True
      state.reward = episode_reward(verdict, self.weights)
      return base.Step(observation='', reward=state.reward, done=True,
                       info={**info, 'truncated': False})
    text = RETRY if self.protocol == 'multi_try' else observation(verdict)
    return base.Step(observation=text, reward=0.0, done=False,
                     info={**info, 'truncated': False, 'messages': [{'content': text}]})


def renderer(prompt_template: str = '{prompt}') -> render.TextRenderer:
  """The prompt as data.prompt_template writes it; an observation as <result>...</result>."""
  return render.TextRenderer(prompt_template=prompt_template)


def make_environment(config):
  """(PrologEnvironment, renderer) from config.env (kind 'prolog'; options: OPTIONS)."""
  options = dict(config.env.options)
  unknown = sorted(set(options) - set(OPTIONS))
  if unknown:
    raise ValueError(f"env.options {unknown} unknown for env.kind='prolog'; known: {OPTIONS}")
  return PrologEnvironment(**options), renderer(config.data.prompt_template)
