"""ARTIST's controller and reasoner roles on a synthetic rare-event-localisation task.

ARTIST (its abstract in /work/shared/seeds; no paper text or code here) casts time-series
reasoning as a sequential decision: a controller role selects the segments to inspect, a
reasoner role answers from the selected segments only, one policy plays both, and a
"hierarchical policy optimisation" trains each role. The abstract is all there is, so
everything below is our formalisation:

  task        ts_rare_event: a series of `segments` x `width` integers (baseline uniform in
              [2, 7]) with one rare event at a random index, a 'spike' (12-15) or a 'dip' (0);
              the question asks 'when' (the event's index) or 'what' (its kind). The gold
              segment is the one holding the event (meta['gold_segment']).
  controller  prompted with the question and a static summary of the whole series, each
              segment's range ('k:r', r = max - min capped at 9: a coarse view that hints at,
              but does not show, the event: a dip's segment can look like a plain one), it writes
              'seg k\\n'; the environment turns that into the `timeseries` tool's window call
              over [k * width, (k + 1) * width) and runs it (base.run_tool, with the series'
              timestamps, so the tool returns [index, value] pairs). A malformed action or a
              failed call ends the episode (reward 0, the error counted).
  reasoner    prompted with the question and the tool's output alone ('16:4 17:3 ...'), never
              the series or the summary, it writes its answer: the index, the kind, or 'none'
              when the segment holds no event.
  rewards     per role, in `role_rewards` = (controller, reasoner):
                controller  'segment' (default): 1 if the selected segment holds the event;
                            'success': the episode's success.
                reasoner    1 if its answer is right for the segment it was shown (the event's
                            index or kind if the segment holds it, else 'none'): it is judged
                            on its own decision, not on the controller's.
              The episode's reward (success) is 1 when the answer equals the gold answer.
  credit      'roles' (default): rollout/roles.py computes a group advantage per role (the
              G controller rows of a prompt among themselves, likewise the reasoner rows);
              'episode': plain GRPO, the episode's success advantage on both roles' rows.

Roles are told apart by the prompt alone ('ctl ' / 'rsn '), so one model serves both.
`teacher_trace` is a flawed scripted teacher for the warm start (the gold segment with
probability select_prob, the right answer with probability answer_prob), so RL has room in
both roles. Not here: the episode engine and advantages (rollout/roles.py), several
selections per episode, multi-segment evidence, any JAX.
"""

import collections
import dataclasses
import json
import re
import string
from typing import Any

from rlreason import tasks as tasks_lib
from rlreason.envs import base
from rlreason.envs import formats
from rlreason.envs import timeseries
from rlreason.tasks import example as example_lib

TASK = 'ts_rare_event'
KINDS = ('spike', 'dip')
QUESTIONS = ('when', 'what')
ROLES = ('controller', 'reasoner')
NONE = 'none'
CONTROLLER_REWARDS = ('segment', 'success')
CREDITS = ('roles', 'episode')
OPTIONS = ('controller_reward', 'credit')  # env.options
_SELECT = re.compile(r'\s*seg\s+(\d+)\s*')
_BASE_LOW, _BASE_HIGH = 2, 7  # baseline values, inclusive


def num_segments(difficulty: int) -> int:
  """2 + 2 * difficulty segments (difficulty 1-4: 4-10)."""
  if not 1 <= difficulty <= 4:
    raise ValueError(f'{TASK}: difficulty={difficulty} must be in [1, 4] (4-10 segments).')
  return 2 + 2 * difficulty


def ts_rare_event(seed: int, index: int, *, difficulty: int = 2,
                  width: int = 8) -> example_lib.Example:
  """One series with one rare event; deterministic per (seed, index, difficulty, width)."""
  if not 2 <= width <= timeseries.MAX_WINDOW:
    raise ValueError(f'{TASK}: width={width} must be in [2, {timeseries.MAX_WINDOW}].')
  segments = num_segments(difficulty)
  rng = example_lib.example_rng(TASK, seed, index, difficulty * 1000 + width)
  n = segments * width
  series = [int(v) for v in rng.integers(_BASE_LOW, _BASE_HIGH + 1, n)]
  event = int(rng.integers(n))
  kind = KINDS[int(rng.integers(len(KINDS)))]
  question = QUESTIONS[int(rng.integers(len(QUESTIONS)))]
  series[event] = int(rng.integers(12, 16)) if kind == 'spike' else 0
  gold = event // width
  meta = {'tools': ['timeseries'], 'series': series, 'timestamps': list(range(n)),
          'width': width, 'event': event, 'kind': kind, 'question': question,
          'gold_segment': gold,
          'gold_calls': [{'name': 'timeseries', 'arguments': window(gold, width)}]}
  return example_lib.Example(
      id=example_lib.example_id(TASK, seed, index, difficulty), prompt=f'{question}?',
      answer=str(event) if question == 'when' else kind, solution=None, task=TASK,
      difficulty=difficulty, meta=meta)


def problem_key(example: example_lib.Example) -> str:
  return example.prompt + '\0' + json.dumps(example.meta['series'])


def window(segment: int, width: int) -> dict:
  """The timeseries tool's arguments that read segment `segment`."""
  return {'action': 'window', 'start': segment * width, 'end': (segment + 1) * width}


def overview(example: example_lib.Example) -> str:
  """The controller's static summary: 'k:r' per segment k, r its range (max - min) capped at
  9 (the segment's label before its range, as the reasoner's pairs put the index first)."""
  s, w = example.meta['series'], example.meta['width']
  return ' '.join(f'{k}:{min(max(s[i:i + w]) - min(s[i:i + w]), 9)}'
                  for k, i in enumerate(range(0, len(s), w)))


def controller_prompt(example: example_lib.Example) -> str:
  return f'ctl {example.prompt} ranges {overview(example)}\n'


def reasoner_prompt(example: example_lib.Example, observation: str) -> str:
  """The question and the tool's output (JSON [[index, value], ...]) as 'i:v' pairs: only the
  selected segment, nothing else about the series."""
  pairs = json.loads(observation)
  return f'rsn {example.prompt} ' + ' '.join(f'{t}:{v}' for t, v in pairs) + '\n'


def longest_prompt(difficulty: int, width: int) -> int:
  """An upper bound on either role's prompt in characters (a character tokenizer's tokens):
  the reasoner's, on the last segment, with a two-digit spike."""
  n = num_segments(difficulty) * width
  pairs = ' '.join(f'{t}:15' for t in range(n - width, n))
  return max(len(f'rsn when? {pairs}\n'),
             len('ctl when? ranges ' + ' '.join(f'{k}:9' for k in range(num_segments(difficulty)))
                 + '\n'))


def contains(example: example_lib.Example, segment: int) -> bool:
  return segment == example.meta['gold_segment']


def right_answer(example: example_lib.Example, segment: int) -> str:
  """What the reasoner should say when shown `segment`: the gold answer, or 'none'."""
  return example.answer if contains(example, segment) else NONE


def _parse(text: str):
  match = _SELECT.fullmatch(text)
  if not match:
    return [], [f'write "seg k", got {text.strip()[:40]!r}']
  return [base.ToolCall('timeseries', {'action': 'window', 'segment': int(match.group(1))})], []


# Turns end at a newline: the episode engine (rollout/roles.py) stops there.
FORMAT = formats.Format('artist', '\n', '', (), _parse)


@dataclasses.dataclass
class ArtistState:
  """One episode's host state (the counters rollout/episodes.py's metrics read, as
  EpisodeState), the selection and the per-role rewards."""
  example: Any
  segment: int | None = None
  observation: str = ''
  turns: int = 0
  tool_calls: int = 0
  errors: collections.Counter = dataclasses.field(default_factory=collections.Counter)
  done: bool = False
  truncated: bool = False
  reward: float = 0.0  # the episode's success
  role_rewards: list = dataclasses.field(default_factory=lambda: [0.0, 0.0])


class ArtistEnvironment:
  """The two roles' turns over ts_rare_event examples; see the module docstring."""

  def __init__(self, *, controller_reward: str = 'segment', credit: str = 'roles'):
    if controller_reward not in CONTROLLER_REWARDS:
      raise ValueError(f'env.options.controller_reward={controller_reward!r}; known: '
                       f'{CONTROLLER_REWARDS}')
    if credit not in CREDITS:
      raise ValueError(f'env.options.credit={credit!r}; known: {CREDITS}')
    self.controller_reward, self.credit = controller_reward, credit
    self.format = FORMAT
    self.tools = {'timeseries': timeseries.TOOL}

  def reset(self, example) -> ArtistState:
    if example.task != TASK:
      raise ValueError(f'ArtistEnvironment: example {example.id} is a {example.task!r} '
                       f'problem; data.task must be {TASK!r}.')
    return ArtistState(example=example)

  def controller_prompt(self, state: ArtistState) -> str:
    return controller_prompt(state.example)

  def reasoner_prompt(self, state: ArtistState) -> str:
    return reasoner_prompt(state.example, state.observation)

  def select(self, state: ArtistState, turn_text: str) -> base.Step:
    """The controller's turn: 'seg k' -> the timeseries tool's window over segment k."""
    if state.turns:
      raise ValueError('select() after the controller\'s turn')
    state.turns = 1
    calls, errors = FORMAT.parse_calls(turn_text)
    info = {'role': 'controller', 'action': turn_text.strip()}
    if errors:
      state.errors[base.MALFORMED] += 1
      return self._end(state, info, errors[0])
    segment = calls[0].arguments['segment']
    call = base.ToolCall('timeseries', window(segment, state.example.meta['width']))
    state.tool_calls += 1
    result = base.run_tool(self.tools, {}, call, context=state.example.meta, deadline_s=None)
    if result.error:
      state.errors[result.error] += 1
      return self._end(state, info, result.content)
    state.segment, state.observation = segment, result.content
    hit = contains(state.example, segment)
    state.role_rewards[0] = float(hit)  # 'success' overwrites it after the answer.
    return base.Step(result.content, 0.0, False, {**info, 'segment': segment, 'contains': hit,
                                                 'truncated': False})

  def answer(self, state: ArtistState, turn_text: str) -> base.Step:
    """The reasoner's turn: its answer, judged for its segment and against the gold answer."""
    if state.done or state.segment is None:
      raise ValueError('answer() needs a selected segment and a live episode')
    state.turns += 1
    text, ex = turn_text.strip(), state.example
    success = text == ex.answer
    state.role_rewards[1] = float(text == right_answer(ex, state.segment))
    if self.controller_reward == 'success':
      state.role_rewards[0] = float(success)
    state.reward, state.done = float(success), True
    return base.Step('', state.reward, True, {
        'role': 'reasoner', 'action': text, 'status': 'correct' if success else 'wrong',
        'reasoner_right': bool(state.role_rewards[1]), 'truncated': False})

  def _end(self, state: ArtistState, info: dict, message: str) -> base.Step:
    state.done = True
    return base.Step(message, 0.0, True, {**info, 'segment': None, 'contains': False,
                                          'status': 'wrong', 'error': message,
                                          'truncated': False})


@dataclasses.dataclass(frozen=True)
class RoleRenderer:
  """Each row carries its own role prompt (rollout/roles.py), so the shared prompt text is
  empty; the transcript shows the tool's output between the two turns."""

  def prompt_text(self, example) -> str:
    del example
    return ''

  def observation_text(self, messages, ended: bool) -> str:
    del ended
    return ''.join(f'= {m["content"]}\n' for m in messages)


def make_environment(config):
  """(ArtistEnvironment, renderer) from config.env (kind 'artist'; options: OPTIONS)."""
  options = dict(config.env.options)
  unknown = set(options) - set(OPTIONS)
  if unknown:
    raise ValueError(f'env.options {sorted(unknown)} unknown for env.kind="artist"; known: '
                     f'{OPTIONS}')
  return ArtistEnvironment(**options), RoleRenderer()


def _wrong(example, segment: int, right: str, rng) -> str:
  """A wrong answer for `segment`: another index of it, the other kind, or 'none'."""
  w = example.meta['width']
  options = [str(i) for i in range(segment * w, (segment + 1) * w)] if (
      example.meta['question'] == 'when') else list(KINDS)
  options = [o for o in options + [NONE] if o != right]
  return options[int(rng.integers(len(options)))]


def teacher_trace(example: example_lib.Example, rng, *, select_prob: float = 0.5,
                  answer_prob: float = 0.7) -> list[list]:
  """A flawed scripted teacher: one row of one role, drawn uniformly, as [prompt, False],
  [action, True] (each role's turn is its own row). The controller selects the gold segment
  with probability `select_prob`, else another at random; the reasoner is shown the gold
  segment or another (evenly) and answers right for it with probability `answer_prob`."""
  if not (0 <= select_prob <= 1 and 0 <= answer_prob <= 1):
    raise ValueError(f'teacher_trace: select_prob={select_prob} and answer_prob={answer_prob} '
                     'must be in [0, 1] (sft.teacher_options).')
  segments, gold = len(example.meta['series']) // example.meta['width'], \
      example.meta['gold_segment']
  other = lambda: [s for s in range(segments) if s != gold][int(rng.integers(segments - 1))]
  if rng.integers(2) == 0:
    segment = gold if rng.random() < select_prob else other()
    return [[controller_prompt(example), False], [f'seg {segment}\n', True]]
  segment = gold if rng.integers(2) == 0 else other()
  args = window(segment, example.meta['width'])
  pairs = [[i, example.meta['series'][i]] for i in range(args['start'], args['end'])]
  right = right_answer(example, segment)
  text = right if rng.random() < answer_prob else _wrong(example, segment, right, rng)
  return [[reasoner_prompt(example, json.dumps(pairs)), False], [text + '\n', True]]


def _register() -> None:
  tasks_lib.register(tasks_lib.Task(name=TASK, generate=ts_rare_event, problem_key=problem_key,
                                    default_difficulty=2, chars=string.printable))


_register()
