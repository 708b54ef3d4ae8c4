"""Episode text around the model's turns: the prompt, and each observation after a turn.

The episode loop never re-tokenises what the model sampled. It encodes the prompt once and,
after each turn with tool calls, the observation: the text the chat template writes between
the end of that turn and the start of the next one (the end-of-turn token, the tool messages,
the next generation prompt). Appending these to the sampled tokens gives the token sequence
the template renders for the same conversation (tests/envs_formats_test.py pins this against
transformers for Qwen2.5 and Qwen3, and the Qwen3 reasoning-stripping difference).

  renderer = make_renderer(tok, family='qwen', tools=env.specs(), system_prompt='...')
  renderer.prompt_text(example)                     # system + user + generation prompt
  renderer.observation_pieces(messages, ended)      # after a turn; `ended`: it sampled an EOS
  tok.encode_pieces(pieces)                         # the observation's ids

ChatRenderer follows a tokenizer's chat template (qwen, llama3): the observation is what the
template writes after the text of a stand-in assistant answer when [stand-in exchange,
messages] is rendered with the generation prompt. It is anchored at that answer's end, so
it never depends on how the template re-renders earlier turns (Qwen3 drops the reasoning of
turns before a later user message, and the empty think block of an enable_thinking=False
prompt; the episode keeps what the model saw). The assistant turn's own end
(`<|im_end|>\\n`) comes first unless the model sampled the EOS itself.
TextRenderer is for tokenizers without a template (the character-level demo model, 'tags'):
the prompt is `prompt_template` and an observation is `<result>...</result>` per call.

Observations come as pieces, (text, trusted): the template's own text may hold control
tokens, the messages' content (a tool's output, a feedback turn) is encoded as ordinary text
(Tokenizer.encode_pieces), so a tool cannot write `<|im_end|><|im_start|>user` into the
conversation. Content is made valid unicode first (a lone surrogate becomes U+FFFD).
`tool_calls_per_turn` ('one', 'many', '': the format's default) says whether a turn stops
at a call's end (episodes.stop_sequences).

Not here: tokenisation itself (the tokenizer is passed in, duck-typed: `apply_chat_template`,
`encode`), parsing calls (formats.py), running tools (environment.py).
"""

import dataclasses
import re
from typing import Any, Mapping, Sequence

from rlreason.envs import base
from rlreason.envs import formats

RESULT_OPEN, RESULT_CLOSE = '<result>', '</result>'
Pieces = list[tuple[str, bool]]  # (text, trusted): the template's own text, or message content


def _unused(pattern: str, texts: Sequence[str]) -> str:
  """pattern.format(k) for the smallest k that no text holds (private-use characters in the
  pattern make k = 0 the rule; a text cannot hold every k)."""
  k = 0
  while any(pattern.format(k) in t for t in texts):
    k += 1
  return pattern.format(k)


def valid_unicode(text: str) -> str:
  """`text` with surrogate pairs joined and lone surrogates (which no tokenizer encodes)
  replaced by U+FFFD: a tool's output or a decoded turn never stops an episode."""
  if text.isascii():
    return text
  return text.encode('utf-16', 'surrogatepass').decode('utf-16', 'replace')


def clean_messages(messages: Sequence[Mapping[str, Any]]) -> list[dict]:
  """Copies of `messages` whose string content is valid unicode (lone surrogates replaced)."""
  return [{**m, 'content': valid_unicode(m['content'])}
          if isinstance(m.get('content'), str) else dict(m) for m in messages]


def observation_pieces(renderer, messages: Sequence[Mapping[str, Any]], ended: bool) -> Pieces:
  """`renderer.observation_pieces`, or for a renderer that only writes text (patient.py,
  artist.py: '= {content}\\n') its whole observation as plain text: no control ids (a renderer
  whose own text needs them writes observation_pieces)."""
  if hasattr(renderer, 'observation_pieces'):
    return renderer.observation_pieces(messages, ended)
  return [(renderer.observation_text(clean_messages(messages), ended), False)]


@dataclasses.dataclass(frozen=True)
class TextRenderer:
  """Plain text around turns: `prompt_template` (+ an optional system line) and results.

  tool_calls_per_turn: 'one' (a turn stops at the call's end), 'many', or '' for the
  format's default (formats.Format.calls_per_turn).
  """
  prompt_template: str = '{prompt}'
  system_prompt: str = ''
  tool_calls_per_turn: str = ''

  def prompt_text(self, example) -> str:
    prompt = self.prompt_template.format(prompt=example.prompt)
    return f'{self.system_prompt}\n{prompt}' if self.system_prompt else prompt

  def observation_pieces(self, messages: Sequence[Mapping[str, Any]], ended: bool) -> Pieces:
    del ended  # No turn structure: the model continues its own text after the results.
    pieces = []
    for m in clean_messages(messages):
      pieces += [(RESULT_OPEN, True), (str(m['content']), False), (RESULT_CLOSE, True)]
    return pieces

  def observation_text(self, messages: Sequence[Mapping[str, Any]], ended: bool) -> str:
    return ''.join(text for text, _ in self.observation_pieces(messages, ended))


@dataclasses.dataclass(frozen=True)
class ChatRenderer:
  """The tokenizer's chat template, with the tools' schemas in its system prompt.

  tool_calls_per_turn: as TextRenderer's.
  """
  tok: Any
  format: formats.Format
  tools: tuple[base.ToolSpec, ...]
  system_prompt: str = ''
  chat_kwargs: Mapping[str, Any] = dataclasses.field(default_factory=dict)
  tool_calls_per_turn: str = ''

  def _render(self, messages, add_generation_prompt: bool) -> str:
    return self.tok.apply_chat_template(
        list(messages), tools=formats.tool_schemas(self.tools),
        add_generation_prompt=add_generation_prompt, **dict(self.chat_kwargs))

  def _system(self) -> list[dict]:
    return [{'role': 'system', 'content': self.system_prompt}] if self.system_prompt else []

  def prompt_text(self, example) -> str:
    return self._render(self._system() + [{'role': 'user', 'content': example.prompt}], True)

  def observation_pieces(self, messages: Sequence[Mapping[str, Any]], ended: bool) -> Pieces:
    """The template's text after an assistant turn that `messages` (tool results, user turns)
    answer, split into the template's own text (trusted) and the messages' content.

    It is read off one rendering of a stand-in exchange + `messages` + the generation prompt,
    after the stand-in answer's text: whatever the template does to earlier turns when later
    messages arrive (Qwen3 drops their reasoning once a user turn follows) is never used.
    ended: the turn's last sampled token was an EOS (the template's turn end); otherwise the
    turn stopped at a call's end, and the turn end is part of the observation.
    """
    messages = clean_messages(messages)
    texts = [str(m.get('content', '')) for m in messages] + [self.system_prompt]
    anchor = _unused('stand-in answer \ue000{}\ue001', texts)
    stand_in = self._system() + [{'role': 'user', 'content': 'q'},
                                 {'role': 'assistant', 'content': anchor}]
    plain = self._after(anchor, stand_in + messages)
    pieces = self._split_content(anchor, stand_in, messages, texts, plain)
    end = self.format.turn_end
    if end and not (pieces[0][1] and pieces[0][0].startswith(end)):
      raise ValueError(f'{self.format.family}: the chat template writes {plain[:40]!r} after '
                       f'an assistant turn, not its turn end {end!r}.')
    if ended and end:  # The model sampled the turn end: it is not observed again.
      pieces[0] = (pieces[0][0][len(end):], True)
    return [(text, trusted) for text, trusted in pieces if text]

  def observation_text(self, messages: Sequence[Mapping[str, Any]], ended: bool) -> str:
    return ''.join(text for text, _ in self.observation_pieces(messages, ended))

  def _after(self, anchor: str, messages) -> str:
    text = self._render(messages, True)
    return text[text.index(anchor) + len(anchor):]

  def _split_content(self, anchor, stand_in, messages, texts, plain: str) -> Pieces:
    """`plain` as pieces: each message's content (as the template wrote it, which may quote
    or trim it) untrusted, the rest trusted. Found by rendering the content between marks."""
    opening = _unused('\ue002{}\ue003', texts)
    closing = _unused('\ue004{}\ue005', texts)
    for trim in (False, True):
      marked = [{**m, 'content': opening + (m['content'].strip() if trim else m['content'])
                 + closing} if isinstance(m.get('content'), str) else m for m in messages]
      text = self._after(anchor, stand_in + marked)
      if text.replace(opening, '').replace(closing, '') != plain:
        continue
      pieces, trusted = [], True
      for part in re.split(f'({re.escape(opening)}|{re.escape(closing)})', text):
        if part in (opening, closing):
          trusted = part == closing
        elif part:
          pieces.append((part, trusted))
      return pieces
    raise ValueError(f'{self.format.family}: the chat template transforms message content in '
                     'a way the renderer cannot separate from its own text.')


def make_renderer(tok, *, family: str, tools: Sequence[base.ToolSpec], system_prompt: str = '',
                  prompt_template: str = '{prompt}', chat_kwargs=None,
                  tool_calls_per_turn: str = ''):
  """TextRenderer for 'tags', ChatRenderer (the tokenizer's template) for qwen and llama3.

  tool_calls_per_turn (config env.tool_calls_per_turn): 'one' stops a turn at the call's end,
  'many' lets a turn hold several calls (it ends at EOS), '' or 'family' the format's default.
  """
  fmt = formats.get(family)
  per_turn = formats.calls_per_turn(fmt, tool_calls_per_turn)
  if family == 'tags':
    system = system_prompt if system_prompt != 'tools' else formats.render_system_prompt(tools)
    return TextRenderer(prompt_template=prompt_template, system_prompt=system,
                        tool_calls_per_turn=per_turn)
  if not getattr(tok, 'chat_template', None):
    raise ValueError(f'env.family={family!r} renders with the tokenizer\'s chat template, and '
                     'this tokenizer has none; use family="tags" for a template-less model.')
  return ChatRenderer(tok=tok, format=fmt, tools=tuple(tools), system_prompt=system_prompt,
                      chat_kwargs=dict(chat_kwargs or {}), tool_calls_per_turn=per_turn)
