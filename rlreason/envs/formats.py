"""Tool-call formats per chat-template family: calls out of a turn's text, results back in.

A `Format` is pure text: `parse_calls(turn_text)` finds every tool call in one assistant
turn and returns an error string (never an exception) for each one it cannot read, which the
episode loop turns into a MALFORMED observation; `call_end` is the stop string that closes a
call; `tool_message(result, call)` is the chat message for a tool's answer, which the chat
template renders. `assistant_message_with_calls` builds the assistant message transformers'
templates expect when a conversation is rendered again; `tool_schemas` is their `tools=`.

Families, and the template each follows:
  qwen    Qwen2.5-Instruct and Qwen3 (tokenizer_config.json in shared/data/qwen_tokenizer):
          `<tool_call>\\n{"name": ..., "arguments": {...}}\\n</tool_call>`, several per turn
          (parallel calls; the turn ends at <|im_end|>); Qwen3 reasoning before `</think>` is
          skipped. A call's JSON is read as JSON, so a string argument may hold the text
          `</tool_call>`; a turn that stops at the call's end (tool_calls_per_turn='one')
          stops there even inside a string, and that call is malformed (its error says to
          write `<\\/tool_call>`, the JSON escape).
  llama3  Llama 3.x-Instruct JSON tool calling, as read in copies of the Llama-3.3-70B and
          Llama-3.2-1B-Instruct tokenizer_config.json templates (Llama 3.1's own file was not
          at hand; its tool-call part is the one 3.3 reuses):
          the whole turn is `{"name": ..., "parameters": {...}}` ending in <|eot_id|>, optionally
          after <|python_tag|>. The template renders one call per turn (it raises on more); the
          parser also reads `;`-separated objects, as vLLM's llama3_json parser does. The
          template writes a string tool result through `tojson` (a Jinja string `is iterable`),
          so the model sees it quoted: that is the template's doing, not this module's.
  tags    a minimal format for tiny models with no tool template: `<call>name: {json}</call>`,
          tools listed one per line by `render_system_prompt`.

Not here: rendering whole conversations (the tokenizer's chat template does that), checking
arguments against a tool's schema (base.run_tool), and Llama's builtin tools
(`brave_search.call(query=...)`), which are not JSON calls.
"""

import dataclasses
import json
import re
from typing import Any, Callable, Mapping, Sequence

from rlreason.envs import base

Parsed = tuple[list[base.ToolCall], list[str]]
Items = list[tuple[base.ToolCall | None, str]]  # per call, in turn order: (call, '') or (None, error)

_TAGS_CALL = re.compile(r'<call>(.*?)(</call>|\Z)', re.DOTALL)
_TAGS_BODY = re.compile(r'\s*([A-Za-z_][\w.-]*)\s*:?(.*)', re.DOTALL)
_LLAMA_PREFIX = '<|python_tag|>'
_LLAMA_TURN_ENDS = ('<|eot_id|>', '<|eom_id|>')


def _call_from_object(obj: Any, args_key: str, where: str) -> tuple[base.ToolCall | None, str]:
  """A ToolCall from a decoded {"name", args_key} object, or an error string."""
  if not isinstance(obj, dict):
    return None, f'{where}: expected a JSON object, got {type(obj).__name__}'
  name = obj.get('name')
  if not isinstance(name, str) or not name.strip():
    return None, f'{where}: missing "name" (a non-empty string)'
  arguments = obj.get(args_key, {})
  if not isinstance(arguments, dict):
    return None, (f'{where}: "{args_key}" of {name} must be a JSON object, got '
                  f'{type(arguments).__name__}')
  return base.ToolCall(name.strip(), arguments), ''


def _loads(text: str, where: str) -> tuple[Any, str]:
  try:
    return json.loads(text), ''
  except json.JSONDecodeError as e:
    return None, f'{where}: invalid JSON ({e.msg} at line {e.lineno} column {e.colno})'
  except (RecursionError, ValueError) as e:  # nesting, or an integer over 4300 digits
    return None, f'{where}: unreadable JSON ({type(e).__name__}: {str(e)[:80]})'


def _collected(parse: Callable[[str], Items]) -> Callable[[str], Parsed]:
  return lambda text: _collect(parse(text))


def _collect(items) -> Parsed:
  calls, errors = [], []
  for call, error in items:
    if call is not None:
      calls.append(call)
    else:
      errors.append(error)
  return calls, errors


def _after_reasoning(text: str) -> str:
  # A call written while thinking is not a call; Qwen3's template drops that text too.
  return text.rsplit('</think>', 1)[-1]


_QWEN_OPEN, _QWEN_CLOSE = '<tool_call>', '</tool_call>'


def _qwen_bodies(text: str):
  """(body, closed) per call: a body that is one JSON object runs to its end (its strings may
  hold '</tool_call>'), anything else to the first '</tool_call>' or the end of the text."""
  decoder, pos = json.JSONDecoder(), 0
  while (start := text.find(_QWEN_OPEN, pos)) >= 0:
    body = start + len(_QWEN_OPEN)
    end = -1
    first = len(text) - len(text[body:].lstrip())
    if text.startswith('{', first):
      try:
        after = decoder.raw_decode(text, first)[1]
        after = len(text) - len(text[after:].lstrip())
        end = after if text.startswith(_QWEN_CLOSE, after) else -1
      except (ValueError, RecursionError):  # read again below, for its error message
        pass
    if end < 0:
      end = text.find(_QWEN_CLOSE, body)
    if end < 0:
      yield text[body:], False
      return
    yield text[body:end], True
    pos = end + len(_QWEN_CLOSE)


def _parse_qwen(text: str) -> Items:

  def one(i, body, closed):
    where = f'tool call {i + 1}'
    if not closed:
      return None, f'{where}: <tool_call> is not closed by </tool_call>'
    obj, error = _loads(body.strip(), where)
    if error.startswith(f'{where}: invalid JSON (Unterminated string'):
      error += ('; a "</tool_call>" inside a JSON string ends the call when a turn stops at '
                'the call\'s end: write it as "<\\/tool_call>"')
    return _call_from_object(obj, 'arguments', where) if not error else (None, error)

  bodies = _qwen_bodies(_after_reasoning(text))
  return [one(i, body, closed) for i, (body, closed) in enumerate(bodies)]


def _parse_llama3(text: str) -> Items:
  body = text.strip()
  for end in _LLAMA_TURN_ENDS:
    body = body.removesuffix(end).rstrip()
  body = body.removeprefix(_LLAMA_PREFIX).lstrip()
  if not body.startswith('{'):
    return []  # A plain answer: Llama writes a call as the whole turn.
  decoder, items, start = json.JSONDecoder(), [], 0
  while start < len(body):
    where = f'tool call {len(items) + 1}'
    try:
      obj, end = decoder.raw_decode(body, start)
    except json.JSONDecodeError as e:
      items.append((None, f'{where}: invalid JSON ({e.msg} at line {e.lineno} column '
                    f'{e.colno})'))
      break
    except (RecursionError, ValueError) as e:  # nesting, or an integer over 4300 digits
      items.append((None, f'{where}: unreadable JSON ({type(e).__name__}: {str(e)[:80]})'))
      break
    # Llama 3.1 names the arguments "parameters"; some fine-tunes write "arguments".
    key = 'parameters' if isinstance(obj, dict) and 'parameters' in obj else 'arguments'
    items.append(_call_from_object(obj, key, where))
    start = end
    while start < len(body) and (body[start].isspace() or body[start] == ';'):
      start += 1
  return items


def _parse_tags(text: str) -> Items:

  def one(i, m):
    where = f'tool call {i + 1}'
    if not m.group(2):
      return None, f'{where}: <call> is not closed by </call>'
    head = _TAGS_BODY.fullmatch(m.group(1))
    if head is None:
      return None, f'{where}: missing tool name; write <call>name: {{"arg": value}}</call>'
    args_text = head.group(2).strip()
    if not args_text:
      return base.ToolCall(head.group(1), {}), ''
    obj, error = _loads(args_text, where)
    if error:
      return None, error
    if not isinstance(obj, dict):
      return None, (f'{where}: arguments of {head.group(1)} must be a JSON object, got '
                    f'{type(obj).__name__}')
    return base.ToolCall(head.group(1), obj), ''

  matches = list(_TAGS_CALL.finditer(_after_reasoning(text)))
  return [one(i, m) for i, m in enumerate(matches)]


@dataclasses.dataclass(frozen=True)
class Format:
  """How one template family writes tool calls and tool results.

  Attributes:
    family: 'qwen', 'llama3' or 'tags'.
    call_end: the text that closes one call; a sampler that stops there gets one call per
      turn, and the episode loop appends `turn_end`. '' where the call is the whole turn
      (llama3), so the end-of-turn token is the stop.
    turn_end: what the template writes after an assistant turn's text (the EOS the model
      samples), '' where the tokenizer's template decides (tags).
    tool_keys: the message keys, beyond role and content, that the template reads.
    calls_per_turn: the family's natural turn: 'many' (calls until the turn's EOS: qwen) or
      'one' (the turn stops at `call_end`: tags; llama3's template renders one per turn).
  """
  family: str
  call_end: str
  turn_end: str
  tool_keys: tuple[str, ...]
  _parse: Callable[[str], Parsed] = dataclasses.field(repr=False)
  calls_per_turn: str = 'one'
  _items: Callable[[str], Items] | None = dataclasses.field(default=None, repr=False)

  def parse_calls(self, turn_text: str) -> Parsed:
    """Every tool call in one assistant turn, and an error string per unreadable one."""
    return self._parse(turn_text)

  def parse_items(self, turn_text: str) -> Items:
    """The turn's calls in the order written: (call, '') or (None, error) each (a format
    built from a `_parse` alone: its errors first, then its calls)."""
    if self._items is not None:
      return self._items(turn_text)
    calls, errors = self._parse(turn_text)
    return [(None, e) for e in errors] + [(c, '') for c in calls]

  def assistant_message(self, turn_text: str) -> dict[str, Any]:
    """The message that re-renders a sampled turn (its well-formed calls, for transcripts).

    qwen: the prose before the first call (reasoning included; Qwen3's template splits it
    off). llama3: no prose when the turn is a call. tags: the text as written, since a tags
    template knows no `tool_calls`.
    """
    calls, _ = self.parse_calls(turn_text)
    if self.family == 'tags' or not calls:
      return {'role': 'assistant', 'content': turn_text}
    if self.family == 'llama3':
      return assistant_message_with_calls('', calls)
    reasoning, _, answer = turn_text.rpartition('</think>')
    prose = reasoning + '</think>' * bool(reasoning) + answer.split('<tool_call>')[0]
    return assistant_message_with_calls(prose.rstrip('\n'), calls)

  def tool_message(self, result_text: str, call: base.ToolCall) -> dict[str, Any]:
    """The chat message carrying `call`'s result."""
    message = {'role': 'tool', 'content': result_text}
    if 'name' in self.tool_keys:
      message['name'] = call.name
    if 'tool_call_id' in self.tool_keys and call.id:
      message['tool_call_id'] = call.id
    return message


FORMATS = {
    # Qwen templates render a tool message's content only.
    'qwen': Format('qwen', '</tool_call>', '<|im_end|>', (), _collected(_parse_qwen), 'many',
                   _parse_qwen),
    'llama3': Format('llama3', '', '<|eot_id|>', (), _collected(_parse_llama3), 'one',
                     _parse_llama3),
    'tags': Format('tags', '</call>', '', ('name', 'tool_call_id'), _collected(_parse_tags), 'one',
                   _parse_tags),
}
CALLS_PER_TURN = ('one', 'many')


def calls_per_turn(fmt: Format, setting: str = '') -> str:
  """'one' or 'many': `setting` (env.tool_calls_per_turn), or the format's default for ''
  and 'family'."""
  if setting in ('', 'family'):
    return fmt.calls_per_turn
  if setting not in CALLS_PER_TURN:
    raise ValueError(f'env.tool_calls_per_turn={setting!r}; known: "one", "many", "family".')
  return setting


def get(family: str) -> Format:
  if family not in FORMATS:
    raise ValueError(f'Unknown tool-call format {family!r}; known: {", ".join(FORMATS)}')
  return FORMATS[family]


def render_system_prompt(tools: Sequence[base.ToolSpec], family: str = 'tags') -> str:
  """The system-prompt text that teaches the 'tags' format, one line per tool.

  qwen and llama3 templates render `tools=[spec.as_json_schema()]` themselves.
  """
  if family != 'tags':
    raise ValueError(f'{family}: pass tools=[spec.as_json_schema()] to the chat template; '
                     'only the tags format renders its own system prompt.')
  lines = ['To call a tool, write <call>name: {"argument": value}</call>; its result comes '
           'back in the next message. Tools:']
  for spec in tools:
    props = spec.parameters.get('properties', {})
    required = set(spec.parameters.get('required', ()))
    args = ', '.join(f'{k}{"" if k in required else "?"}: {v.get("type", "any")}'
                     for k, v in props.items())
    lines.append(f'{spec.name}({args}) - {spec.description}')
  return '\n'.join(lines)


def assistant_message_with_calls(text: str, calls: Sequence[base.ToolCall]) -> dict[str, Any]:
  """The assistant message, in transformers' shape, that re-renders a tool-calling turn.

  `text` is the turn's prose without the calls (Qwen3 reasoning included, which its template
  splits off itself). Arguments stay dicts: the templates apply `tojson` to them.
  """
  message: dict[str, Any] = {'role': 'assistant', 'content': text}
  if calls:
    message['tool_calls'] = [_tool_call_dict(c) for c in calls]
  return message


def _tool_call_dict(call: base.ToolCall) -> dict[str, Any]:
  d: dict[str, Any] = {'type': 'function',
                       'function': {'name': call.name, 'arguments': dict(call.arguments)}}
  if call.id:
    d['id'] = call.id
  return d


def tool_schemas(tools: Sequence[base.ToolSpec]) -> list[Mapping[str, Any]]:
  """`tools=` for qwen/llama3 chat templates."""
  return [spec.as_json_schema() for spec in tools]
