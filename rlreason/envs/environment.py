"""A tool-using environment: calls out of the model's turns, their results back, a scored answer.

  env = ToolEnvironment(tools=['calculator'], family='qwen', verifier='exact', max_turns=4)
  state = env.reset(example)
  step = env.step(state, turn_text)  # tool messages to append, or the final reward and done

A turn with tool calls gets one tool message per call (in the order the calls were written,
as the template renders their responses; a call that could not be parsed, named an unknown tool or failed gets an error message instead, counted
by kind in `state.errors`; info['error_classes'] lists (tool, the tool's error class or None,
the message) per failed call, for CLEANER's rollback), and the episode goes on. A turn
without any call (or anything that looked like one) is the final answer: the verifier scores it against the example's
gold answer, and the episode is done. An episode that reaches `max_turns` turns of calls
ends truncated with reward 0. The reward is the final answer's only: per-call shaping is
`error_penalty` per failed call, 0 by default. Every call has `deadline_s` seconds
(base.run_tool: past it, a 'timeout' error and the call's thread abandoned; None: no deadline).
The final answer is scored in a verifier process (answer_scoring.py: one pool shared by the
process's environments, `close_pool` stops it) within `score_deadline_s`: a verifier that
hangs, even in C holding the GIL (sympy on 9^(9^9)), gives reward 0 with a timeout verdict by
then, and never stalls the episode loop; the string checks in INLINE_VERIFIERS run in the
calling thread; `scorer` replaces both.

Deliberately not here: rendering messages to tokens (the chat template, on the episode
loop's side), running tools concurrently across a batch (the episode loop hands calls to the
verifier pool), or any JAX.
"""

import collections
import dataclasses
import sys
from typing import Any, Callable, Sequence

from rlreason.envs import answer_scoring
from rlreason.envs import base
from rlreason.envs import formats
from rlreason.envs import registry
from rlreason.envs import render
from rlreason.verifiers import registry as verifier_registry
from rlreason.verifiers import verdict as verdict_lib

# (items, verifier name, deadline_s) -> verdicts, within the deadline (answer_scoring.py).
Scorer = Callable[[list[dict], str, float], list[verdict_lib.Verdict]]


@dataclasses.dataclass
class EpisodeState:
  """One episode's host state: the example, its tool sessions and its counters."""
  example: Any
  sessions: dict[str, Any] = dataclasses.field(default_factory=dict)
  turns: int = 0
  tool_calls: int = 0
  errors: collections.Counter = dataclasses.field(default_factory=collections.Counter)
  done: bool = False
  truncated: bool = False
  reward: float = 0.0


class ToolEnvironment:
  """base.Environment over named tools, one chat-template family and a verifier."""

  def __init__(self, *, tools: Sequence[str], family: str = 'qwen', verifier: str = 'exact',
               max_turns: int = 4, error_penalty: float = 0.0,
               max_observation_chars: int = base.MAX_OBSERVATION_CHARS,
               deadline_s: float | None = base.DEFAULT_DEADLINE_S,
               score_deadline_s: float = base.DEFAULT_DEADLINE_S, scorer: Scorer | None = None):
    if max_turns < 1:
      raise ValueError(f'max_turns={max_turns} must be >= 1')
    if deadline_s is not None and not deadline_s > 0:
      raise ValueError(f'deadline_s={deadline_s} must be > 0, or None for no deadline')
    if not score_deadline_s > 0:
      raise ValueError(f'score_deadline_s={score_deadline_s} must be > 0')
    self.tools = registry.get_tools(tools)  # an unknown name fails here, at start-up.
    self.format = formats.get(family)
    verifier_registry.check_name(verifier)
    self.verifier, self.score_deadline_s = verifier, score_deadline_s
    self.scorer = scorer or (answer_scoring.inline_scorer if verifier in
                             answer_scoring.INLINE_VERIFIERS else answer_scoring.pool_scorer)
    self.max_turns, self.error_penalty = max_turns, error_penalty
    self.max_observation_chars, self.deadline_s = max_observation_chars, deadline_s

  def verify(self, item) -> verdict_lib.Verdict:
    """`item` scored by the environment's verifier, within score_deadline_s."""
    return self.scorer([item], self.verifier, self.score_deadline_s)[0]

  def specs(self) -> list[base.ToolSpec]:
    return [tool.spec for tool in self.tools.values()]

  def check_context(self, context) -> None:
    """Raises ValueError naming what an example's tool context lacks (a corpus file...)."""
    for tool in self.tools.values():
      module = sys.modules[type(tool).__module__]
      check = getattr(module, 'check_context', None)  # tools that read files define one.
      if check is not None:
        check(context)

  def reset(self, example) -> EpisodeState:
    return EpisodeState(example=example)

  def step(self, state: EpisodeState, turn_text: str) -> base.Step:
    if state.done:
      raise ValueError('step() on a finished episode')
    state.turns += 1
    items = self.format.parse_items(turn_text)
    if not items:
      return self._finish(state, turn_text)
    messages, failed, classes, calls = [], 0, [], 0
    for call, error in items:  # One message per call, in the order the calls were written.
      if call is None:
        state.errors[base.MALFORMED] += 1
        failed += 1
        text = render.valid_unicode(f'Error: malformed tool call: {error}')
        messages.append(self.format.tool_message(text, base.ToolCall('', {})))
        continue
      calls += 1
      state.tool_calls += 1
      result = base.run_tool(self.tools, state.sessions, call, context=state.example.meta,
                             max_chars=self.max_observation_chars, deadline_s=self.deadline_s)
      # A tool may echo a lone surrogate from the call's JSON ("\ud800"): no encoder takes it.
      content = render.valid_unicode(result.content)
      if result.error:
        state.errors[result.error] += 1
        failed += 1
        classes.append((call.name, result.error_class, content))
      messages.append(self.format.tool_message(content, call))
    reward = -self.error_penalty * failed
    if state.turns >= self.max_turns:
      state.done = state.truncated = True
    state.reward += reward
    return base.Step(observation='\n'.join(m['content'] for m in messages), reward=reward,
                     done=state.done, info={'messages': messages, 'calls': calls,
                                            'failed': failed, 'truncated': state.truncated,
                                            'error_classes': classes})

  def _finish(self, state: EpisodeState, turn_text: str) -> base.Step:
    verdict = self.verify({'completion': turn_text, 'answer': state.example.answer})
    reward = 0.0 if verdict.failed else float(verdict.reward)
    state.done = True
    state.reward += reward
    return base.Step(observation='', reward=reward, done=True,
                     info={'status': verdict.status, 'detail': verdict.detail,
                           'truncated': False})
