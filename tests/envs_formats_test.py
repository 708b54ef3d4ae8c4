"""Tests for envs/formats.py: parsing per family, and token-in/token-out against transformers.

The template checks use the real Qwen2.5 and Qwen3 tokenizer configs in shared/data. Qwen3's
directory holds only its tokenizer_config.json, so it is loaded from a temporary directory
that links Qwen's vocab.json and merges.txt beside it (the README says they are shared).
"""

import os
from pathlib import Path

import pytest

from rlreason.envs import base, formats
from rlreason.model import tokenizer as rl_tokenizer

transformers = pytest.importorskip('transformers')

QWEN_DIR = Path(__file__).resolve().parents[2] / 'shared' / 'data' / 'qwen_tokenizer'

ADD = base.ToolSpec('add', 'Adds two integers.', {
    'type': 'object', 'properties': {'a': {'type': 'integer'}, 'b': {'type': 'integer'}},
    'required': ['a', 'b']})
LOOKUP = base.ToolSpec('lookup', 'Looks up a key.', {
    'type': 'object', 'properties': {'key': {'type': 'string'}}, 'required': ['key']})
QWEN_CALLS = ('<tool_call>\n{"name": "add", "arguments": {"a": 2, "b": 3}}\n</tool_call>\n'
              '<tool_call>\n{"name": "lookup", "arguments": {"key": "café"}}\n</tool_call>')
TWO_CALLS = [base.ToolCall('add', {'a': 2, 'b': 3}), base.ToolCall('lookup', {'key': 'café'})]


# --- parsing, by hand ---------------------------------------------------------------------


def test_qwen_parses_one_and_two_calls():
  qwen = formats.get('qwen')
  one = 'Sure.\n<tool_call>\n{"name": "add", "arguments": {"a": 2, "b": 3}}\n</tool_call>'
  assert qwen.parse_calls(one) == ([TWO_CALLS[0]], [])
  assert qwen.parse_calls(QWEN_CALLS) == (TWO_CALLS, [])


def test_qwen_errors_do_not_raise_and_keep_the_good_calls():
  qwen = formats.get('qwen')
  text = ('<tool_call>\n{"name": "add", "arguments": {"a": 2,}}\n</tool_call>\n'  # bad JSON
          '<tool_call>\n{"arguments": {"a": 1}}\n</tool_call>\n'  # no name
          '<tool_call>\n{"name": "add", "arguments": [1, 2]}\n</tool_call>\n'  # list args
          '<tool_call>\n["add"]\n</tool_call>\n'  # not an object
          '<tool_call>\n{"name": "lookup", "arguments": {"key": "x"}}\n</tool_call>\n'
          '<tool_call>\n{"name": "add"')  # cut off
  calls, errors = qwen.parse_calls(text)
  assert calls == [base.ToolCall('lookup', {'key': 'x'})]
  assert len(errors) == 5
  assert errors[0].startswith('tool call 1: invalid JSON (')
  assert errors[1] == 'tool call 2: missing "name" (a non-empty string)'
  assert errors[2] == 'tool call 3: "arguments" of add must be a JSON object, got list'
  assert errors[3] == 'tool call 4: expected a JSON object, got list'
  assert errors[4] == 'tool call 6: <tool_call> is not closed by </tool_call>'


def test_qwen_no_call_missing_arguments_and_reasoning():
  qwen = formats.get('qwen')
  assert qwen.parse_calls('The answer is 5.') == ([], [])
  assert qwen.parse_calls('<tool_call>{"name": "now"}</tool_call>') == (
      [base.ToolCall('now', {})], [])
  # A call written while thinking is not made (Qwen3 drops the reasoning on re-render).
  thought = '<think>\nmaybe <tool_call>\n{"name": "x"}\n</tool_call>?\n</think>\n\nNo call.'
  assert qwen.parse_calls(thought) == ([], [])


def test_llama3_parses_the_template_form():
  llama = formats.get('llama3')
  # What the Llama 3.1 template renders for an assistant tool call.
  turn = '{"name": "add", "parameters": {"a": 2, "b": 3}}<|eot_id|>'
  assert llama.parse_calls(turn) == ([TWO_CALLS[0]], [])
  assert llama.parse_calls('<|python_tag|>{"name": "add", "arguments": {"a": 2, "b": 3}}') == (
      [TWO_CALLS[0]], [])
  two = ('{"name": "add", "parameters": {"a": 2, "b": 3}}; '
         '{"name": "lookup", "parameters": {"key": "café"}}')
  assert llama.parse_calls(two) == (TWO_CALLS, [])
  assert llama.parse_calls('The answer is {5}.') == ([], [])


def test_llama3_errors():
  llama = formats.get('llama3')
  calls, errors = llama.parse_calls('{"name": "add", "parameters": {"a": 2,')
  assert calls == [] and errors[0].startswith('tool call 1: invalid JSON (')
  assert llama.parse_calls('{"parameters": {"a": 2}}') == (
      [], ['tool call 1: missing "name" (a non-empty string)'])
  assert llama.parse_calls('{"name": "add", "parameters": "a=2"}') == (
      [], ['tool call 1: "parameters" of add must be a JSON object, got str'])
  # The good call before a broken one is kept.
  calls, errors = llama.parse_calls('{"name": "now", "parameters": {}}; {"name": ')
  assert calls == [base.ToolCall('now', {})] and len(errors) == 1


def test_tags_parses_and_reports():
  tags = formats.get('tags')
  assert tags.call_end == '</call>'
  assert tags.parse_calls('<call>add: {"a": 2, "b": 3}</call>') == ([TWO_CALLS[0]], [])
  text = 'First <call>add: {"a": 2, "b": 3}</call> then <call> lookup {"key": "café"}</call>'
  assert tags.parse_calls(text) == (TWO_CALLS, [])
  assert tags.parse_calls('<call>now</call>') == ([base.ToolCall('now', {})], [])
  assert tags.parse_calls('no call here') == ([], [])
  _, errors = tags.parse_calls('<call>add: {"a": 2</call><call>{"a": 1}</call>'
                               '<call>add: [1, 2]</call><call>add: {}')
  assert errors[0].startswith('tool call 1: invalid JSON (')
  assert errors[1].startswith('tool call 2: missing tool name')
  assert errors[2] == 'tool call 3: arguments of add must be a JSON object, got list'
  assert errors[3] == 'tool call 4: <call> is not closed by </call>'


def test_tags_system_prompt_and_messages():
  prompt = formats.render_system_prompt([ADD, LOOKUP], 'tags')
  assert prompt.splitlines()[1:] == ['add(a: integer, b: integer) - Adds two integers.',
                                     'lookup(key: string) - Looks up a key.']
  with pytest.raises(ValueError):
    formats.render_system_prompt([ADD], 'qwen')
  call = base.ToolCall('add', {'a': 2, 'b': 3}, id='c1')
  assert formats.get('tags').tool_message('5', call) == {
      'role': 'tool', 'content': '5', 'name': 'add', 'tool_call_id': 'c1'}
  assert formats.get('qwen').tool_message('5', call) == {'role': 'tool', 'content': '5'}
  assert formats.assistant_message_with_calls('Hi', [call]) == {
      'role': 'assistant', 'content': 'Hi', 'tool_calls': [
          {'type': 'function', 'id': 'c1', 'function': {'name': 'add',
                                                        'arguments': {'a': 2, 'b': 3}}}]}
  with pytest.raises(ValueError):
    formats.get('hermes')


# --- token in, token out against transformers -----------------------------------------------


@pytest.fixture(scope='module', params=['qwen2.5', 'qwen3'])
def qwen_pair(request, tmp_path_factory):
  """(name, transformers tokenizer, rlreason tokenizer) for one Qwen config."""
  if request.param == 'qwen2.5':
    directory = QWEN_DIR
  else:
    directory = tmp_path_factory.mktemp('qwen3')
    for name in ('vocab.json', 'merges.txt'):
      os.symlink(QWEN_DIR / name, directory / name)
    os.symlink(QWEN_DIR / 'qwen3' / 'tokenizer_config.json', directory / 'tokenizer_config.json')
  hf = transformers.AutoTokenizer.from_pretrained(str(directory))
  return request.param, hf, rl_tokenizer.load(directory)


def _episode(thinking: bool):
  """The sampled texts of a two-turn episode, and the conversation they make."""
  qwen = formats.get('qwen')
  think1 = '<think>\nI need the sum and the key.\n</think>\n\n' if thinking else ''
  think2 = '<think>\nBoth came back.\n</think>\n\n' if thinking else ''
  sampled1 = think1 + 'Let me check both.\n' + QWEN_CALLS
  sampled2 = think2 + 'The sum is 5 and café is a word.'
  calls, errors = qwen.parse_calls(sampled1)
  assert (calls, errors) == (TWO_CALLS, [])
  assert qwen.assistant_message(sampled1) == formats.assistant_message_with_calls(
      think1 + 'Let me check both.', calls)
  messages = [
      {'role': 'system', 'content': 'You are terse.'},
      {'role': 'user', 'content': 'Add 2 and 3, and look up café.'},
      qwen.assistant_message(sampled1),
      qwen.tool_message('5', calls[0]),
      qwen.tool_message('a coffee house', calls[1]),
      qwen.assistant_message(sampled2),
      {'role': 'user', 'content': 'Thanks. And 1 + 1?'},
  ]
  return [sampled1, sampled2], messages, [think1, think2]


def test_assistant_message_per_family():
  llama, tags = formats.get('llama3'), formats.get('tags')
  assert llama.assistant_message('{"name": "add", "parameters": {"a": 2, "b": 3}}') == (
      formats.assistant_message_with_calls('', [TWO_CALLS[0]]))
  assert llama.assistant_message('It is 5.') == {'role': 'assistant', 'content': 'It is 5.'}
  text = 'So <call>add: {"a": 2, "b": 3}</call>'
  assert tags.assistant_message(text) == {'role': 'assistant', 'content': text}


def _hf_ids(hf, messages, **kwargs):
  out = hf.apply_chat_template(messages, tokenize=True, **kwargs)
  return list(out['input_ids'] if hasattr(out, 'keys') else out)


@pytest.mark.parametrize('add_generation_prompt', [False, True])
@pytest.mark.parametrize('thinking', [False, True])
def test_renderer_matches_transformers(qwen_pair, add_generation_prompt, thinking):
  _, hf, rl = qwen_pair
  _, messages, _ = _episode(thinking)
  kwargs = dict(tools=formats.tool_schemas([ADD, LOOKUP]),
                add_generation_prompt=add_generation_prompt)
  text = hf.apply_chat_template(messages, tokenize=False, **kwargs)
  assert rl.apply_chat_template(messages, **kwargs) == text
  assert rl.encode_chat(messages, **kwargs) == _hf_ids(hf, messages, **kwargs)
  assert text.count('<tool_response>') == 2 and text.count('<|im_start|>user') == 3


def _episode_pieces(hf, rl, sampled, messages):
  """Prompt, then per turn the sampled text + end of turn and the observation after it.

  Each observation is what the template adds when the turn's messages are appended; it
  must extend the episode's text exactly, or the sampled tokens would be re-tokenised.
  """
  qwen = formats.get('qwen')
  tools = formats.tool_schemas([ADD, LOOKUP])
  render = lambda n: rl.apply_chat_template(messages[:n], tools=tools, add_generation_prompt=True)
  pieces = [render(2)]
  for turn, end in zip(sampled, (5, 7)):
    pieces.append(turn + qwen.turn_end)
    so_far, rendered = ''.join(pieces), render(end)
    if not rendered.startswith(so_far):
      return pieces, rendered
    pieces.append(rendered[len(so_far):])
  return pieces, None


def test_episode_concatenation_is_the_template_rendering(qwen_pair):
  _, hf, rl = qwen_pair
  sampled, messages, _ = _episode(thinking=False)
  pieces, mismatch = _episode_pieces(hf, rl, sampled, messages)
  assert mismatch is None
  full = hf.apply_chat_template(messages, tools=formats.tool_schemas([ADD, LOOKUP]),
                                tokenize=False, add_generation_prompt=True)
  assert ''.join(pieces) == full
  assert pieces[2] == ('\n<|im_start|>user\n<tool_response>\n5\n</tool_response>\n'
                       '<tool_response>\na coffee house\n</tool_response><|im_end|>\n'
                       '<|im_start|>assistant\n')
  # Encoding piece by piece (sampled tokens are never re-tokenised) gives the same ids.
  ids = [i for piece in pieces for i in rl.encode(piece)]
  assert ids == _hf_ids(hf, messages, tools=formats.tool_schemas([ADD, LOOKUP]),
                        add_generation_prompt=True)


def test_episode_with_reasoning(qwen_pair):
  """Qwen3 drops <think> blocks of turns before the last user message; Qwen2.5 keeps all."""
  name, hf, rl = qwen_pair
  sampled, messages, thinks = _episode(thinking=True)
  tools = formats.tool_schemas([ADD, LOOKUP])
  full = hf.apply_chat_template(messages, tools=tools, tokenize=False, add_generation_prompt=True)
  # Up to the tool results (no user message since) the episode is still exact.
  pieces, _ = _episode_pieces(hf, rl, sampled[:1], messages[:5])
  assert ''.join(pieces) == rl.apply_chat_template(messages[:5], tools=tools,
                                                   add_generation_prompt=True)
  pieces, mismatch = _episode_pieces(hf, rl, sampled, messages)
  if name == 'qwen2.5':
    assert mismatch is None and ''.join(pieces) == full
    return
  # Qwen3: once the second user message arrives, both earlier turns lose their reasoning:
  # the re-rendering is the episode's text with exactly the two <think> blocks removed.
  so_far = ''.join(pieces)
  stripped = so_far.replace(thinks[0], '').replace(thinks[1], '')
  assert mismatch.startswith(stripped) and thinks[0] in so_far
  episode = so_far + mismatch[len(stripped):]  # the new user turn, as the template writes it
  assert episode.replace(thinks[0], '').replace(thinks[1], '') == full
  assert thinks[0] not in full and thinks[1] not in full


def test_qwen3_no_thinking_prompt_is_not_re_rendered(qwen_pair):
  """With enable_thinking=False the generation prompt ends in an empty think block that the
  model never wrote; Qwen3's template leaves it out when that turn is rendered again, even
  before any new user message. Qwen2.5 ignores the flag."""
  name, hf, rl = qwen_pair
  sampled, messages, _ = _episode(thinking=False)
  kwargs = dict(tools=formats.tool_schemas([ADD, LOOKUP]), add_generation_prompt=True,
                enable_thinking=False)
  prompt = rl.apply_chat_template(messages[:2], **kwargs)
  assert prompt == hf.apply_chat_template(messages[:2], tokenize=False, **kwargs)
  episode = prompt + sampled[0] + '<|im_end|>'
  rendered = rl.apply_chat_template(messages[:5], **kwargs)
  assert rendered == hf.apply_chat_template(messages[:5], tokenize=False, **kwargs)
  empty_think = '<think>\n\n</think>\n\n'
  if name == 'qwen2.5':
    assert empty_think not in prompt and rendered.startswith(episode)
    return
  assert prompt.endswith('<|im_start|>assistant\n' + empty_think)
  assert not rendered.startswith(episode)
  assert rendered.startswith(episode.replace(empty_think, ''))
  assert rendered.endswith('<|im_start|>assistant\n' + empty_think)


@pytest.mark.parametrize('family', sorted(formats.FORMATS))
@pytest.mark.parametrize('deep', ['[' * 100_000, '1' * 5_000])
def test_unreadable_json_is_an_error_not_an_exception(family, deep):
  text = {'qwen': f'<tool_call>\n{{"name": "f", "arguments": {deep}\n</tool_call>',
          'llama3': '{"name": "f", "parameters": ' + deep,
          'tags': f'<call>f: {{"a": {deep}</call>'}[family]
  calls, errors = formats.get(family).parse_calls(text)
  assert not calls and len(errors) == 1, errors
