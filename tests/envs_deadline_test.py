"""The deadline on every tool call: base.run_tool and ToolEnvironment, with a slow fake tool."""

import threading
import time

import pytest

from rlreason.envs import base
from rlreason.envs import calculator
from rlreason.envs import environment
from rlreason.envs import prolog_tool
from rlreason.envs import python_tool
from rlreason.envs import registry
from rlreason.envs import tasks

DEADLINE_S = 0.2
MARGIN_S = 0.5  # thread start and join overhead is milliseconds; this is for a loaded CI box.


class _Slow:
  """Sleeps `seconds` per call (until `release` is set); counts its sessions."""

  spec = base.ToolSpec('slow', 'test double', {'type': 'object', 'properties': {
      'seconds': {'type': 'number'}}, 'required': ['seconds']})

  def __init__(self):
    self.release = threading.Event()
    self.sessions = 0

  def new_session(self, context):
    del context
    self.sessions += 1
    return {'calls': 0}

  def call(self, session, arguments):
    session['calls'] += 1
    self.release.wait(arguments['seconds'])
    return f'slept; call {session["calls"]} of this session'


@pytest.fixture
def slow(monkeypatch):
  tool = _Slow()
  monkeypatch.setattr(registry, 'TOOLS', {**registry.TOOLS, 'slow': f'{__name__}:SLOW'})
  monkeypatch.setitem(globals(), 'SLOW', tool)
  yield tool
  tool.release.set()  # lets the abandoned threads finish.


def _run(tool, sessions, deadline_s, **arguments):
  start = time.monotonic()
  result = base.run_tool({'slow': tool}, sessions, base.ToolCall('slow', arguments), context={},
                         deadline_s=deadline_s)
  return result, time.monotonic() - start


def test_a_slow_call_times_out_at_the_deadline(slow):
  sessions = {}
  result, seconds = _run(slow, sessions, DEADLINE_S, seconds=30)
  assert DEADLINE_S <= seconds < DEADLINE_S + MARGIN_S
  assert result.error == base.TIMEOUT
  assert result.content == ('Error: slow did not return within the 0.2s deadline; the call was '
                            "abandoned and the tool's state for this episode reset")
  assert sessions == {}  # The abandoned call still holds its session; the next gets a new one.
  result, _ = _run(slow, sessions, DEADLINE_S, seconds=0)
  assert result == base.ToolResult('slept; call 1 of this session')
  assert slow.sessions == 2


def test_fast_calls_keep_their_session_and_are_unaffected(slow):
  sessions = {}
  for n in (1, 2):
    result, seconds = _run(slow, sessions, DEADLINE_S, seconds=0)
    assert result == base.ToolResult(f'slept; call {n} of this session')
    assert seconds < DEADLINE_S
  assert slow.sessions == 1 and sessions['slow'] == {'calls': 2}
  # Without a deadline the call runs in this thread, however long.
  result, seconds = _run(slow, sessions, None, seconds=DEADLINE_S + 0.1)
  assert result == base.ToolResult('slept; call 3 of this session')
  assert seconds >= DEADLINE_S + 0.1


def test_failures_inside_the_deadline_keep_their_kinds():
  # A ToolError or a crash in the worker thread is reported as without a deadline, and the
  # session made for the failed call is kept.
  sessions = {}
  run = lambda expression: base.run_tool(
      {'calculator': calculator.TOOL}, sessions, base.ToolCall('calculator',
                                                                {'expression': expression}),
      context={}, deadline_s=DEADLINE_S)
  assert run('1/0').error == base.TOOL_FAILED
  assert 'calculator' in sessions
  assert run('6*7') == base.ToolResult('42')


def test_environment_counts_a_timeout(slow):
  env = environment.ToolEnvironment(tools=['slow', 'calculator'], family='tags',
                                    deadline_s=DEADLINE_S)
  state = env.reset(tasks.calc_multiply(0, 0))
  start = time.monotonic()
  step = env.step(state, '<call>slow: {"seconds": 30}</call>\n'
                         '<call>calculator: {"expression": "2+2"}</call>')
  assert time.monotonic() - start < DEADLINE_S + MARGIN_S
  assert dict(state.errors) == {'timeout': 1} and step.info['failed'] == 1
  assert [m['content'] for m in step.info['messages']] == [
      'Error: slow did not return within the 0.2s deadline; the call was abandoned and the '
      "tool's state for this episode reset", '4']
  assert not step.done


def test_deadline_must_be_positive():
  for deadline_s in (0, -1.0):
    with pytest.raises(ValueError, match='deadline_s'):
      environment.ToolEnvironment(tools=['calculator'], deadline_s=deadline_s)
    with pytest.raises(ValueError, match='deadline_s'):
      base.run_tool({}, {}, base.ToolCall('calculator', {}), context={}, deadline_s=deadline_s)
  assert environment.ToolEnvironment(tools=['calculator']).deadline_s == base.DEFAULT_DEADLINE_S
  assert environment.ToolEnvironment(tools=['calculator'], deadline_s=None).deadline_s is None


@pytest.mark.parametrize('module', [python_tool, prolog_tool])
def test_sandboxed_tools_stop_their_programs_before_the_default_deadline(module):
  # sandbox.run kills a program at wall_s and stops waiting for its output 2s later; the
  # tool's own TIMEOUT (which keeps the episode's state) must come before the deadline's.
  assert module.LIMITS.wall_s + 2.0 < base.DEFAULT_DEADLINE_S
  assert module.LIMITS.cpu_s <= module.LIMITS.wall_s
