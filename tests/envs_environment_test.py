"""ToolEnvironment: scripted turns through real tools, formats and verifiers."""

import json

import pytest

from rlreason.envs import base
from rlreason.envs import environment
from rlreason.envs import tasks


def qwen_call(name, **arguments):
  return f'<tool_call>\n{json.dumps({"name": name, "arguments": arguments})}\n</tool_call>'


@pytest.fixture
def example():
  return tasks.calc_multiply(0, 3, difficulty=10)


def test_a_tool_turn_then_the_right_answer_scores_one(example):
  env = environment.ToolEnvironment(tools=['calculator'], family='qwen', verifier='exact')
  state = env.reset(example)
  step = env.step(state, 'Let me compute.\n' + qwen_call('calculator', **example.meta[
      'gold_calls'][0]['arguments']))
  assert not step.done and step.reward == 0.0 and step.info['calls'] == 1
  assert step.observation == example.answer, step.observation
  assert step.info['messages'] == [{'role': 'tool', 'content': example.answer}]
  final = env.step(state, f'<answer>{example.answer}</answer>')
  assert final.done and final.reward == 1.0 and state.reward == 1.0
  assert (state.turns, state.tool_calls, sum(state.errors.values())) == (2, 1, 0)
  with pytest.raises(ValueError, match='finished'):
    env.step(state, 'more')


def test_a_wrong_answer_scores_zero(example):
  env = environment.ToolEnvironment(tools=['calculator'], family='qwen')
  state = env.reset(example)
  assert env.step(state, '<answer>12</answer>').reward == 0.0 and state.done


@pytest.mark.parametrize('turn, kind', [
    ('<tool_call>\n{"name": "calculator", "arguments": {"expression": \n</tool_call>',
     base.MALFORMED),
    (qwen_call('search', query='x'), base.UNKNOWN_TOOL),
    (qwen_call('calculator', expression=5), base.BAD_ARGUMENTS),
    (qwen_call('calculator', expression='1/0'), base.TOOL_FAILED),
    (qwen_call('calculator', expression='__import__("os")'), base.BAD_ARGUMENTS),
])
def test_failed_calls_are_observations_and_counted(example, turn, kind):
  env = environment.ToolEnvironment(tools=['calculator'], family='qwen', error_penalty=0.1)
  state = env.reset(example)
  step = env.step(state, turn)
  assert not step.done and step.observation.startswith('Error')
  assert dict(state.errors) == {kind: 1} and step.reward == pytest.approx(-0.1)


def test_max_turns_truncates(example):
  env = environment.ToolEnvironment(tools=['calculator'], family='tags', max_turns=2)
  state = env.reset(example)
  call = '<call>calculator: {"expression": "2+2"}</call>'
  assert env.step(state, call).observation == '4' and not state.done
  last = env.step(state, call)
  assert last.done and last.info['truncated'] and state.truncated and state.reward == 0.0


def test_start_up_errors_name_the_tool_the_verifier_and_the_corpus(tmp_path):
  with pytest.raises(ValueError, match="unknown tool 'abacus'"):
    environment.ToolEnvironment(tools=['calculator', 'abacus'])
  with pytest.raises(ValueError, match='unknown verifier'):
    environment.ToolEnvironment(tools=['calculator'], verifier='nope')
  with pytest.raises(ValueError, match='max_turns'):
    environment.ToolEnvironment(tools=['calculator'], max_turns=0)
  env = environment.ToolEnvironment(tools=['search'])
  missing = tmp_path / 'corpus.jsonl'
  with pytest.raises(ValueError, match='corpus.jsonl'):
    env.check_context({'corpus_path': str(missing)})


def test_parallel_calls_answer_in_the_order_written(example):
  """A malformed call between two good ones: three tool messages, in the turn's order (the
  template renders the responses in that order)."""
  env = environment.ToolEnvironment(tools=['calculator'], family='qwen', verifier='exact')
  turn = (qwen_call('calculator', expression='2*3') + '\n<tool_call>\n{"name": \n</tool_call>\n'
          + qwen_call('calculator', expression='4+5'))
  step = env.step(env.reset(example), turn)
  contents = [m['content'] for m in step.info['messages']]
  assert contents[0] == '6' and contents[2] == '9' and 'malformed' in contents[1]
  assert step.info['calls'] == 2 and step.info['failed'] == 1


def test_a_tool_echoing_a_lone_surrogate_gives_valid_unicode(example, monkeypatch):
  """A tool whose output holds a lone surrogate (say, echoed from the call's JSON "\\ud800"):
  the observation and the error classes (written to transcripts as UTF-8) hold U+FFFD."""
  monkeypatch.setattr(base, 'run_tool', lambda *a, **k: base.ToolResult(
      'Error: no \ud800x', 'bad_arguments'))
  env = environment.ToolEnvironment(tools=['calculator'], family='qwen', verifier='exact')
  step = env.step(env.reset(example), qwen_call('calculator', expression='1'))
  assert step.info['messages'][0]['content'] == 'Error: no \ufffdx'
  json.dumps(step.info, ensure_ascii=False).encode('utf-8')  # raised UnicodeEncodeError
