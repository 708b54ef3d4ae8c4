"""What an environment and a tool are, and the one way a tool call is executed.

A tool is an object with a `spec` (name, description, JSON-schema parameters: what chat
templates take as `tools=[...]`), `new_session(context) -> session` (per-episode state from
the example's meta: a corpus, a graph, a time series, an interpreter's history) and
`call(session, arguments) -> str`, which raises ToolError(kind, message) for a failure the
model should see. `run_tool` is the only caller: it checks the arguments against the spec,
turns every failure (unknown tool, malformed or ill-typed arguments, a ToolError, a crash) into
an observation plus an error kind, and truncates long output with a marker. A tool call
never raises out of `run_tool`, and returns within a deadline (DEFAULT_DEADLINE_S): the
session is made and the call runs in a worker thread, and a call that has not returned by
then is a TIMEOUT observation. Python cannot kill a thread, so such a call is abandoned, not
stopped: its daemon thread runs on (holding whatever it holds) until it returns or the
process exits, and the tool's session is dropped so that the next call, on a fresh session,
never shares state with it. The sandboxed tools (python, prolog) kill their own programs at
their module's LIMITS, which end before the default deadline, so their more specific
TIMEOUT comes first; under a shorter deadline an abandoned call's program still dies there.

An environment turns a model's turn into an observation: `reset(example) -> state`,
`step(state, turn_text) -> Step`. Not here: parsing tool calls out of text (formats.py),
decoding on the device, stopping an in-process tool that runs past its deadline.
"""

import dataclasses
import threading
from typing import Any, Mapping, Protocol

# Error kinds, counted by the episode loop's metrics.
MALFORMED = 'malformed'  # the call could not be parsed (formats.py)
UNKNOWN_TOOL = 'unknown_tool'
BAD_ARGUMENTS = 'bad_arguments'
TIMEOUT = 'timeout'
CRASH = 'crash'
OVERSIZED = 'oversized'  # the output was truncated
SANDBOX_VIOLATION = 'sandbox_violation'
TOOL_FAILED = 'tool_failed'  # the tool ran and reported a failure (division by zero, no such entity)
ERROR_KINDS = (MALFORMED, UNKNOWN_TOOL, BAD_ARGUMENTS, TIMEOUT, CRASH, OVERSIZED,
               SANDBOX_VIOLATION, TOOL_FAILED)
MAX_OBSERVATION_CHARS = 4096
DEFAULT_DEADLINE_S = 10.0  # above the sandboxed tools' own limits (python 4s, prolog 6s wall)
_JSON_TYPES = {'string': str, 'integer': int, 'number': (int, float), 'boolean': bool,
               'array': list, 'object': dict}


class ToolError(Exception):
  """A failure the model should see as the tool's answer.

  error_class: the finer class a tool declares for it (the Python exception's name for the
  python tool, 'SyntaxError' for an expression the calculator cannot parse); a tool lists the
  classes it reports in its `rollback_errors` attribute, which rollout/rollback.py reads.
  """

  def __init__(self, kind: str, message: str, error_class: str | None = None):
    super().__init__(message)
    if kind not in ERROR_KINDS:
      raise ValueError(f'ToolError kind {kind!r}; known: {ERROR_KINDS}')
    self.kind, self.message, self.error_class = kind, message, error_class


@dataclasses.dataclass(frozen=True)
class ToolSpec:
  name: str
  description: str
  parameters: Mapping[str, Any]  # {'type': 'object', 'properties': {...}, 'required': [...]}

  def as_json_schema(self) -> dict:
    """The OpenAI-style function schema chat templates render (`tools=[...]`)."""
    return {'type': 'function', 'function': {'name': self.name, 'description': self.description,
                                             'parameters': dict(self.parameters)}}


@dataclasses.dataclass(frozen=True)
class ToolCall:
  name: str
  arguments: Mapping[str, Any]
  id: str = ''


@dataclasses.dataclass(frozen=True)
class ToolResult:
  content: str  # what the model sees
  error: str | None = None  # None, or one of ERROR_KINDS
  error_class: str | None = None  # the tool's finer class of the error (ToolError.error_class)


class Tool(Protocol):
  spec: ToolSpec

  def new_session(self, context: Mapping[str, Any]) -> Any:
    ...

  def call(self, session: Any, arguments: Mapping[str, Any]) -> str:
    ...


@dataclasses.dataclass(frozen=True)
class Step:
  observation: str  # text appended to the conversation (a tool message), '' when done
  reward: float  # this turn's reward contribution
  done: bool
  info: Mapping[str, Any] = dataclasses.field(default_factory=dict)


class Environment(Protocol):

  def reset(self, example: Any) -> Any:
    ...

  def step(self, state: Any, turn_text: str) -> Step:
    ...


def check_arguments(spec: ToolSpec, arguments: Any) -> None:
  """Raises ToolError(BAD_ARGUMENTS) unless `arguments` fit the spec's JSON schema (flat)."""
  if not isinstance(arguments, Mapping):
    raise ToolError(BAD_ARGUMENTS, f'{spec.name}: arguments must be an object, got '
                    f'{type(arguments).__name__}')
  properties = spec.parameters.get('properties', {})
  missing = [k for k in spec.parameters.get('required', []) if k not in arguments]
  if missing:
    raise ToolError(BAD_ARGUMENTS, f'{spec.name}: missing argument(s) {", ".join(missing)}')
  for key, value in arguments.items():
    if key not in properties:
      raise ToolError(BAD_ARGUMENTS, f'{spec.name}: unknown argument {key!r}; '
                      f'takes {", ".join(properties) or "none"}')
    kind = properties[key].get('type')
    expected = _JSON_TYPES.get(kind)
    if expected and (not isinstance(value, expected) or
                     (isinstance(value, bool) and kind in ('integer', 'number'))):
      raise ToolError(BAD_ARGUMENTS, f'{spec.name}: {key} must be {kind}, got '
                      f'{type(value).__name__}')


def truncate(text: str, max_chars: int) -> tuple[str, bool]:
  if len(text) <= max_chars:
    return text, False
  return text[:max_chars] + f'\n...[truncated {len(text) - max_chars} characters]', True


def _open_and_call(tool: Tool, sessions: dict[str, Any], call: ToolCall,
                   context: Mapping[str, Any]) -> Any:
  if call.name not in sessions:
    sessions[call.name] = tool.new_session(context)
  return tool.call(sessions[call.name], call.arguments)


def _call_with_deadline(tool: Tool, sessions: dict[str, Any], call: ToolCall,
                        context: Mapping[str, Any], deadline_s: float) -> Any:
  """_open_and_call in a daemon thread, on its own copy of the tool's session entry: merged
  back if it returns in time, dropped (with a TIMEOUT) if not."""
  own = {call.name: sessions[call.name]} if call.name in sessions else {}
  outcome = {}

  def work():
    try:
      outcome['content'] = _open_and_call(tool, own, call, context)
    except BaseException as e:  # pylint: disable=broad-except  (re-raised by the caller)
      outcome['error'] = e

  worker = threading.Thread(target=work, name=f'tool-{call.name}', daemon=True)
  worker.start()
  worker.join(deadline_s)
  if worker.is_alive():
    sessions.pop(call.name, None)  # the abandoned call may still change that session.
    raise ToolError(TIMEOUT, f'{call.name} did not return within the {deadline_s:g}s deadline; '
                    'the call was abandoned and the tool\'s state for this episode reset')
  sessions.update(own)
  if 'error' in outcome:
    raise outcome['error']
  return outcome['content']


def run_tool(tools: Mapping[str, Tool], sessions: dict[str, Any], call: ToolCall, *,
             context: Mapping[str, Any], max_chars: int = MAX_OBSERVATION_CHARS,
             deadline_s: float | None = DEFAULT_DEADLINE_S) -> ToolResult:
  """Executes one call: never raises; a failure is an observation plus an error kind.

  `sessions` holds this episode's session per tool, created on first use from `context`.
  Making the session and the call must take at most `deadline_s` seconds (None: no deadline,
  and no thread); past it the result is TIMEOUT and the tool's session is dropped. Only a
  non-positive deadline, the caller's mistake, raises (ValueError).
  """
  if deadline_s is not None and not deadline_s > 0:
    raise ValueError(f'deadline_s={deadline_s} must be > 0, or None for no deadline')
  tool = tools.get(call.name)
  if tool is None:
    return ToolResult(f'Error: unknown tool {call.name!r}; available: {", ".join(sorted(tools))}',
                      UNKNOWN_TOOL)
  try:
    check_arguments(tool.spec, call.arguments)
    if deadline_s is None:
      content = _open_and_call(tool, sessions, call, context)
    else:
      content = _call_with_deadline(tool, sessions, call, context, deadline_s)
    if not isinstance(content, str):
      raise ToolError(CRASH, f'{call.name} returned {type(content).__name__}, not text')
  except ToolError as e:
    text, _ = truncate(f'Error: {e.message}', max_chars)
    return ToolResult(text, e.kind, e.error_class)
  except Exception as e:  # pylint: disable=broad-except
    text, _ = truncate(f'Error: {call.name} crashed: {type(e).__name__}: {e}', max_chars)
    return ToolResult(text, CRASH)
  text, cut = truncate(content, max_chars)
  return ToolResult(text, OVERSIZED if cut else None)
