"""The flawed calculator teacher writes what the environment would show, token for token."""

import numpy as np
import pytest

from rlreason.envs import environment as environment_lib
from rlreason.envs import render
from rlreason.envs import tasks as env_tasks


def _env():
  env = environment_lib.ToolEnvironment(tools=('calculator',), family='tags', verifier='exact',
                                        max_turns=2)
  return env, render.TextRenderer(prompt_template='{prompt}\n')


def _replay(env, renderer, example, segments):
  """Runs the trace's trained segments through the environment; returns its observations and
  the final reward."""
  state, observations, reward = env.reset(example), [], 0.0
  for text, trained in segments:
    if not trained:
      continue
    step = env.step(state, text)
    reward += step.reward
    if not step.done:
      observations.append(renderer.observation_text(step.info['messages'], False))
  return observations, reward, state


@pytest.mark.parametrize('wrong_tool', ['', 'calculater'])
def test_traces_replay_through_the_environment(wrong_tool):
  env, renderer = _env()
  rng = np.random.default_rng(0)
  kinds = set()
  for index in range(40):
    example = env_tasks.calc_multiply(0, index, difficulty=4)
    segments = env_tasks.calculator_trace(example, rng, call_prob=0.3, answer_prefix='#### ',
                                          spaced=True, right_align=True, wrong_tool=wrong_tool)
    observations, reward, state = _replay(env, renderer, example, segments)
    # The untrained segments are exactly the observations the environment renders.
    assert [t for t, trained in segments if not trained] == observations
    called_right = segments[0][0].startswith('<call>calculator:')
    kinds.add((called_right, len(segments)))
    assert reward == (1.0 if called_right else 0.0), segments
    if wrong_tool and not called_right:
      assert segments[0][0] == segments[0][0].replace('calculator', wrong_tool)
      assert state.errors['unknown_tool'] == 1 and state.tool_calls == 1
      assert f"unknown tool '{wrong_tool}'" in observations[0]
  # Both branches occur; with wrong_tool every trace calls (3 segments), at the same length.
  assert kinds == ({(True, 3), (False, 3)} if wrong_tool else {(True, 3), (False, 1)})


def test_wrong_tool_traces_copy_the_operands_at_the_same_place():
  rng = np.random.default_rng(1)
  example = env_tasks.calc_multiply(0, 3, difficulty=4)
  calls = {env_tasks.calculator_trace(example, rng, call_prob=0.5, spaced=True,
                                      wrong_tool='calculater')[0][0] for _ in range(30)}
  assert len(calls) == 2
  right, wrong = sorted(calls)
  assert len(right) == len(wrong)
  assert [i for i, (a, b) in enumerate(zip(right, wrong)) if a != b] == [14]  # '<call>calculat' then 'o' / 'e'
