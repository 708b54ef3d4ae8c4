"""A tool-using environment: calls out of the model's turns, their results back, a scored answer.

  env = ToolEnvironment(tools=['calculator'], family='qwen', verifier='exact', max_turns=4)
  state = env.reset(example)
  step = env.step(state, turn_text)  # tool messages to append, or the final reward and done

A turn with tool calls gets one tool message per call (results in call order; a call that
could not be parsed, named an unknown tool or failed gets an error message instead, counted
by kind in `state.errors`; info['error_classes'] lists (tool, the tool's error class or None,
the message) per failed call, for CLEANER's rollback), and the episode goes on. A turn
without any call (or anything that looked like one) is the final answer: the verifier scores it against the example's
gold answer, and the episode is done. An episode that reaches `max_turns` turns of calls
ends truncated with reward 0. The reward is the final answer's only: per-call shaping is
`error_penalty` per failed call, 0 by default. Every call has `deadline_s` seconds
(base.run_tool: past it, a 'timeout' error and the call's thread abandoned; None: no deadline).

Deliberately not here: rendering messages to tokens (the chat template, on the episode
loop's side), running tools concurrently across a batch (the episode loop hands calls to the
verifier pool), or any JAX.
"""

import collections
import dataclasses
import sys
from typing import Any, Sequence

from rlreason.envs import base
from rlreason.envs import formats
from rlreason.envs import registry
from rlreason.verifiers import registry as verifier_registry


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
               deadline_s: float | None = base.DEFAULT_DEADLINE_S):
    if max_turns < 1:
      raise ValueError(f'max_turns={max_turns} must be >= 1')
    if deadline_s is not None and not deadline_s > 0:
      raise ValueError(f'deadline_s={deadline_s} must be > 0, or None for no deadline')
    self.tools = registry.get_tools(tools)  # an unknown name fails here, at start-up.
    self.format = formats.get(family)
    verifier_registry.check_name(verifier)
    self.verify = verifier_registry.get_verifier(verifier)
    self.max_turns, self.error_penalty = max_turns, error_penalty
    self.max_observation_chars, self.deadline_s = max_observation_chars, deadline_s

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
    calls, errors = self.format.parse_calls(turn_text)
    if not calls and not errors:
      return self._finish(state, turn_text)
    messages, failed, classes = [], 0, []
    for error in errors:
      state.errors[base.MALFORMED] += 1
      failed += 1
      messages.append(self.format.tool_message(f'Error: malformed tool call: {error}',
                                               base.ToolCall('', {})))
    for call in calls:
      state.tool_calls += 1
      result = base.run_tool(self.tools, state.sessions, call, context=state.example.meta,
                             max_chars=self.max_observation_chars, deadline_s=self.deadline_s)
      if result.error:
        state.errors[result.error] += 1
        failed += 1
        classes.append((call.name, result.error_class, result.content))
      messages.append(self.format.tool_message(result.content, call))
    reward = -self.error_penalty * failed
    if state.turns >= self.max_turns:
      state.done = state.truncated = True
    state.reward += reward
    return base.Step(observation='\n'.join(m['content'] for m in messages), reward=reward,
                     done=state.done, info={'messages': messages, 'calls': len(calls),
                                            'failed': failed, 'truncated': state.truncated,
                                            'error_classes': classes})

  def _finish(self, state: EpisodeState, turn_text: str) -> base.Step:
    item = {'completion': turn_text, 'answer': state.example.answer}
    verdict = self.verify(item)
    reward = 0.0 if verdict.failed else float(verdict.reward)
    state.done = True
    state.reward += reward
    return base.Step(observation='', reward=reward, done=True,
                     info={'status': verdict.status, 'detail': verdict.detail,
                           'truncated': False})
