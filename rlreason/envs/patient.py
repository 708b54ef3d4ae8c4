"""MIND's consultation environment: a simulated patient and the typed evidence state.

MIND (its abstract in /work/shared/seeds; reference code Lingxi-mental-health/MIND, mind_v2/)
conditions a consultation policy on a typed state E_t = (O, M, D, S, R) built each turn
(mind_v2/mind/evidence_state/state.py), instead of the raw dialogue history: observed evidence
(confirmed / negated), missing criterion checks (unknown or unclear), active differentials,
criterion-linked supports and reliability metadata; the same state scores information gain.
The reference works on psychiatric dialogues with an LLM patient and supports retrieved from
a case bank; here, on a synthetic bank, each field is our formalisation unless marked:

  bank        `num_conditions` conditions (A, B, ...) over `num_findings` findings (a, b, ...);
              condition c's criteria are the findings present in its profile (a distinct
              binary vector, >= 1 present), drawn from `bank_seed` and the difficulty only,
              so that the SFT, RL and held-out streams share one bank.
  patient     an example hides a condition; it answers 'ask x' with 'yes' / 'no' from the
              hidden profile, or 'unsure' for the findings it cannot report (each non-complaint
              finding with probability `unsure_prob`, fixed per example); the complaint is one
              present finding, stated in the prompt.
  actions     'ask x' (a question about finding x) or 'dx C' (conclude condition C), one per
              turn, ended by a newline.
  posterior   uniform over the conditions consistent with every certain answer (the answers
              are noiseless, an unsure one carries no information): H = log2 |consistent|.
  reward      'dx C': 1 if C is the hidden condition, else 0 (the episode ends; the reference's
              terminal weight is 5, mind_v2/mind/reward/aggregator.py). 'ask x': a gain term
              minus ask_cost, the gain by `gain`:
                'entropy' (our formalisation; the default): info_gain_coef * (H_before -
                  H_after) / log2(num_conditions), normalised so that resolving the whole
                  differential from the uniform prior sums to info_gain_coef. Over an episode it
                  telescopes to info_gain_coef * (H_0 - H_end) / log2 K: it pays for narrowing
                  the differential, not for the order of the questions.
                'resolved' (reference code, mind_v2/mind/reward/info_gain.py: lambda_gain x
                  |M_{t-1} minus M_t|, lambda 0.005 there): info_gain_coef x the number of
                  missing checks this turn resolved, i.e. 1 when x was a check and got a 'yes'
                  or 'no' ('unsure' leaves it unresolved, as the reference's 'unclear').
  typed state O: evidence (finding + yes, - no, ? unsure, in the order asked, the complaint
              first); M: checks (findings with no certain answer on which the active
              differentials disagree; the reference lists every unknown field, we keep the
              discriminating ones); D: differentials (the consistent conditions); S: supports
              (per differential: its criteria confirmed / its criteria, from the bank: the
              reference retrieves gated support cases instead); R: reliability (the unsure
              findings; the reference scores its retrieved supports). Five lines of text
              (`render_state`).

Raw mode (`RawRenderer`) is the conversation: the complaint, then 'ask x' turns and '= yes'
answers appended (rollout/episodes.py). Typed mode (rollout/typed_episodes.py) prompts each
turn with `render_state` alone. `teacher_trace` is the scripted expert for the warm start: it
asks the unasked finding of largest expected information gain over the differential (ties:
alphabetical) and concludes when one condition is left or no question can split the rest.

Not here: any JAX, the episode engines, an LLM patient, a retrieval bank of real cases.
"""

import collections
import dataclasses
import math
import re
import string
from typing import Any, Sequence

from rlreason import tasks as tasks_lib
from rlreason.envs import base
from rlreason.envs import formats
from rlreason.tasks import example as example_lib

TASK = 'patient_dx'
YES, NO, UNSURE = 'yes', 'no', 'unsure'
_MARK = {YES: '+', NO: '-', UNSURE: '?'}
_ACTION = re.compile(r'\s*(ask|dx)\s+(\S+)\s*')
STATES = ('raw', 'typed')
GAINS = ('entropy', 'resolved')
OPTIONS = ('info_gain_coef', 'ask_cost', 'gain')  # env.options


@dataclasses.dataclass(frozen=True)
class Bank:
  """Conditions, findings and each condition's criteria (its present findings)."""
  conditions: tuple[str, ...]
  findings: tuple[str, ...]
  criteria: tuple[frozenset, ...]  # per condition

  def present(self, condition: str, finding: str) -> bool:
    return finding in self.criteria[self.conditions.index(condition)]


def bank_size(difficulty: int) -> tuple[int, int]:
  """(conditions, findings) at a difficulty: 2 + 2d conditions over 4 + 2d findings."""
  if not 1 <= difficulty <= 12:
    raise ValueError(f'{TASK}: difficulty={difficulty} must be in [1, 12] (at most 26 '
                     'conditions and findings, one letter each).')
  return 2 + 2 * difficulty, 4 + 2 * difficulty


def make_bank(difficulty: int, bank_seed: int = 0) -> Bank:
  """The criteria bank: distinct random profiles with at least one present finding each."""
  k, f = bank_size(difficulty)
  rng = example_lib.example_rng(TASK + '/bank', bank_seed, 0, difficulty)
  findings = tuple(string.ascii_lowercase[:f])
  seen, criteria = set(), []
  while len(criteria) < k:
    profile = frozenset(x for x, bit in zip(findings, rng.integers(0, 2, f)) if bit)
    if profile and profile not in seen:
      seen.add(profile)
      criteria.append(profile)
  return Bank(tuple(string.ascii_uppercase[:k]), findings, tuple(criteria))


def patient_dx(seed: int, index: int, *, difficulty: int = 2, bank_seed: int = 0,
               unsure_prob: float = 0.2) -> example_lib.Example:
  """A patient with a hidden condition; the prompt is its complaint ('complaint c')."""
  if not 0.0 <= unsure_prob < 1.0:
    raise ValueError(f'{TASK}: unsure_prob={unsure_prob} must be in [0, 1).')
  bank = make_bank(difficulty, bank_seed)
  rng = example_lib.example_rng(TASK, seed, index, difficulty)
  condition = bank.conditions[int(rng.integers(len(bank.conditions)))]
  present = sorted(bank.criteria[bank.conditions.index(condition)])
  complaint = present[int(rng.integers(len(present)))]
  unsure = [x for x in bank.findings if x != complaint and rng.random() < unsure_prob]
  answers = {x: UNSURE if x in unsure else YES if bank.present(condition, x) else NO
             for x in bank.findings}
  meta = {'condition': condition, 'complaint': complaint, 'answers': answers,
          'bank_seed': bank_seed}
  return example_lib.Example(id=example_lib.example_id(TASK, seed, index, difficulty),
                             prompt=f'complaint {complaint}', answer=condition,
                             solution=f'dx {condition}', task=TASK, difficulty=difficulty,
                             meta=meta)


def problem_key(example: example_lib.Example) -> str:
  m = example.meta
  unsure = ''.join(x for x, a in sorted(m['answers'].items()) if a == UNSURE)
  return f'{m["bank_seed"]}:{m["condition"]}:{m["complaint"]}:{unsure}'


def bank_of(example: example_lib.Example) -> Bank:
  return make_bank(example.difficulty, example.meta['bank_seed'])


# --- the evidence state (our formalisation of MIND's five fields) ---------------------------

Evidence = Sequence[tuple[str, str]]  # (finding, yes|no|unsure), the complaint first


def consistent(bank: Bank, evidence: Evidence) -> tuple[str, ...]:
  """The active differentials: conditions whose profile agrees with every certain answer."""
  return tuple(c for c in bank.conditions
               if all(bank.present(c, x) == (a == YES) for x, a in evidence if a != UNSURE))


def entropy_bits(bank: Bank, evidence: Evidence) -> float:
  """H of the uniform posterior over the consistent conditions, log2 |consistent|."""
  return math.log2(max(len(consistent(bank, evidence)), 1))


def checks(bank: Bank, evidence: Evidence) -> tuple[str, ...]:
  """Unresolved criterion checks: findings without a certain answer ('unsure' ones are asked
  but not resolved) on which the active differentials disagree."""
  asked = {x for x, a in evidence if a != UNSURE}
  active = consistent(bank, evidence)
  return tuple(x for x in bank.findings if x not in asked and
               0 < sum(bank.present(c, x) for c in active) < len(active))


def supports(bank: Bank, evidence: Evidence) -> tuple[tuple[str, int, int], ...]:
  """Per active differential: (condition, its criteria confirmed by a 'yes', its criteria)."""
  confirmed = {x for x, a in evidence if a == YES}
  return tuple((c, len(bank.criteria[i] & confirmed), len(bank.criteria[i]))
               for i, c in enumerate(bank.conditions) if c in consistent(bank, evidence))


def render_state(bank: Bank, evidence: Evidence) -> str:
  """The typed state as five lines; '-' marks an empty field."""
  show = lambda items: ' '.join(items) or '-'
  lines = [
      'ev ' + show(f'{x}{_MARK[a]}' for x, a in evidence),
      'chk ' + show(checks(bank, evidence)),
      'dif ' + show(consistent(bank, evidence)),
      'sup ' + show(f'{c}{m}/{n}' for c, m, n in supports(bank, evidence)),
      'low ' + show(x for x, a in evidence if a == UNSURE),
  ]
  return '\n'.join(lines) + '\n'


def expected_gain(bank: Bank, evidence: Evidence, finding: str) -> float:
  """Expected entropy reduction (bits) of asking `finding`, answers taken as certain."""
  active = consistent(bank, evidence)
  yes = sum(bank.present(c, finding) for c in active)
  parts = [n for n in (yes, len(active) - yes) if n]
  return math.log2(len(active)) - sum(n / len(active) * math.log2(n) for n in parts)


def teacher_action(bank: Bank, evidence: Evidence) -> str:
  """The scripted expert: the most informative check not asked yet (an unsure answer would
  only repeat), or 'dx' with the first active differential when none is left."""
  asked = {x for x, _ in evidence}
  options = [x for x in checks(bank, evidence) if x not in asked]
  if not options:
    return f'dx {consistent(bank, evidence)[0]}'
  return 'ask ' + max(options, key=lambda x: (expected_gain(bank, evidence, x), -ord(x)))


def initial_evidence(example: example_lib.Example) -> list[tuple[str, str]]:
  return [(example.meta['complaint'], YES)]


# --- the environment -----------------------------------------------------------------------


@dataclasses.dataclass
class PatientState:
  """One consultation's host state (the fields rollout/episodes.py reads, as EpisodeState)."""
  example: Any
  bank: Bank
  evidence: list
  turns: int = 0
  tool_calls: int = 0  # questions asked
  errors: collections.Counter = dataclasses.field(default_factory=collections.Counter)
  done: bool = False
  truncated: bool = False
  reward: float = 0.0
  info_gain: float = 0.0  # bits, summed over the episode


def _parse(text: str):
  match = _ACTION.fullmatch(text)
  if not match:
    return [], [f'write "ask x" or "dx X", got {text.strip()[:40]!r}']
  return [base.ToolCall(match.group(1), {'target': match.group(2)})], []


# Turns end at a newline: the episode engines stop there.
FORMAT = formats.Format('patient', '\n', '', (), _parse)


class PatientEnvironment:
  """base.Environment over patient_dx examples; see the module docstring."""

  def __init__(self, *, max_turns: int = 6, info_gain_coef: float = 0.0, ask_cost: float = 0.0,
               gain: str = 'entropy'):
    if max_turns < 1:
      raise ValueError(f'env.max_turns={max_turns} must be >= 1')
    if info_gain_coef < 0 or ask_cost < 0:
      raise ValueError(f'env.options: info_gain_coef={info_gain_coef} and ask_cost={ask_cost} '
                       'must be >= 0')
    if gain not in GAINS:
      raise ValueError(f'env.options: gain={gain!r}; known: {GAINS}')
    self.max_turns, self.info_gain_coef, self.ask_cost = max_turns, info_gain_coef, ask_cost
    self.gain = gain
    self.format = FORMAT

  def reset(self, example) -> PatientState:
    if example.task != TASK:
      raise ValueError(f'PatientEnvironment: example {example.id} is a {example.task!r} '
                       f'problem; data.task must be {TASK!r}.')
    return PatientState(example=example, bank=bank_of(example),
                        evidence=initial_evidence(example))

  def state_text(self, state: PatientState) -> str:
    """The typed evidence state the next turn is prompted with."""
    return render_state(state.bank, state.evidence)

  def step(self, state: PatientState, turn_text: str) -> base.Step:
    if state.done:
      raise ValueError('step() on a finished episode')
    state.turns += 1
    calls, errors = FORMAT.parse_calls(turn_text)
    info = {'action': turn_text.strip(), 'info_gain': 0.0}
    known = {'ask': state.bank.findings, 'dx': state.bank.conditions}
    if errors or calls[0].arguments['target'] not in known[calls[0].name]:
      state.errors[base.MALFORMED] += 1  # Not a question: tool_calls counts questions only.
      answer, reward = 'error', 0.0
    elif calls[0].name == 'dx':
      right = calls[0].arguments['target'] == state.example.answer
      state.done, reward = True, float(right)
      state.reward += reward
      return base.Step('', reward, True, {**info, 'status': 'correct' if right else 'wrong',
                                          'truncated': False})
    else:
      finding = calls[0].arguments['target']
      state.tool_calls += 1
      before, missing = entropy_bits(state.bank, state.evidence), checks(state.bank,
                                                                          state.evidence)
      answer = state.example.meta['answers'][finding]
      if finding not in {x for x, _ in state.evidence}:  # A repeat changes nothing.
        state.evidence.append((finding, answer))
      gain = before - entropy_bits(state.bank, state.evidence)
      resolved = int(finding in missing and answer != UNSURE)
      state.info_gain += gain
      info.update(info_gain=gain, resolved=resolved)
      term = (gain / math.log2(len(state.bank.conditions)) if self.gain == 'entropy'
              else resolved)
      reward = self.info_gain_coef * term - self.ask_cost
    if state.turns >= self.max_turns:
      state.done = state.truncated = True
    state.reward += reward
    message = {'role': 'tool', 'content': answer}
    return base.Step(answer, reward, state.done,
                     {**info, 'messages': [message], 'calls': 1, 'failed': int(answer == 'error'),
                      'truncated': state.truncated})


@dataclasses.dataclass(frozen=True)
class RawRenderer:
  """The raw history: 'complaint x', then each turn and its answer ('= yes')."""

  def prompt_text(self, example) -> str:
    return example.prompt + '\n'

  def observation_text(self, messages, ended: bool) -> str:
    del ended  # Turns end at their newline, which the model samples.
    return ''.join(f'= {m["content"]}\n' for m in messages)


# The longest answer as the raw conversation shows it ('= unsure\n'): env.max_observation_tokens
# must hold it (in characters, an upper bound on tokens), or the episode ends truncated there.
LONGEST_OBSERVATION = len(RawRenderer().observation_text([{'content': UNSURE}], True))


@dataclasses.dataclass(frozen=True)
class TypedRenderer:
  """Typed mode: a turn's prompt is the state alone, so the shared prompt text is empty (the
  warm start's rows are the state, untrained, then the action)."""

  def prompt_text(self, example) -> str:
    del example
    return ''

  def observation_text(self, messages, ended: bool) -> str:
    """The answers as the raw mode shows them: never prompted in typed mode, only written in
    the episode's transcript (rollout/typed_episodes.py's `conversation`)."""
    return RawRenderer().observation_text(messages, ended)


def make_environment(config):
  """(PatientEnvironment, renderer) from config.env (kind 'patient'; options: OPTIONS)."""
  e = config.env
  options = dict(e.options)
  unknown = set(options) - set(OPTIONS)
  if unknown:
    raise ValueError(f'env.options {sorted(unknown)} unknown for env.kind="patient"; known: '
                     f'{OPTIONS}')
  env = PatientEnvironment(max_turns=e.max_turns, **options)
  return env, TypedRenderer() if e.state == 'typed' else RawRenderer()


def teacher_trace(example: example_lib.Example, rng, *, state: str = 'raw') -> list[list]:
  """The scripted expert's consultation as SFT segments ([text, trained]).

  raw: the whole conversation (turns trained, answers not). typed: one turn drawn uniformly,
  as its state (not trained) and the action (trained), since each typed turn is its own row.
  """
  if state not in STATES:
    raise ValueError(f'teacher_trace: state={state!r}; known: {STATES}')
  bank, evidence, turns = bank_of(example), initial_evidence(example), []
  while True:
    action = teacher_action(bank, evidence)
    turns.append((render_state(bank, evidence), action))
    if action.startswith('dx'):
      break
    finding = action.split()[1]
    evidence.append((finding, example.meta['answers'][finding]))
  if state == 'typed':
    text, action = turns[int(rng.integers(len(turns)))]
    return [[text, False], [action + '\n', True]]
  out = []
  for i, (_, action) in enumerate(turns):
    out.append([action + '\n', True])
    if i < len(turns) - 1:
      out.append([f'= {example.meta["answers"][action.split()[1]]}\n', False])
  return out


def _register() -> None:
  tasks_lib.register(tasks_lib.Task(name=TASK, generate=patient_dx, problem_key=problem_key,
                                    default_difficulty=2, chars=string.printable))


_register()
