"""Episode text around the model's turns: the prompt, and each observation after a turn.

The episode loop never re-tokenises what the model sampled. It encodes the prompt once and,
after each turn with tool calls, the observation: the text the chat template writes between
the end of that turn and the start of the next one (the end-of-turn token, the tool messages,
the next generation prompt). Appending these to the sampled tokens gives the token sequence
the template renders for the same conversation (tests/envs_formats_test.py pins this against
transformers for Qwen2.5 and Qwen3, and the Qwen3 reasoning-stripping difference).

  renderer = make_renderer(tok, family='qwen', tools=env.specs(), system_prompt='...')
  renderer.prompt_text(example)                # system + user + generation prompt
  renderer.observation_text(messages, ended)   # after a turn; `ended`: it sampled an EOS

ChatRenderer follows a tokenizer's chat template (qwen, llama3): the observation is the
template's rendering of [..., assistant, tool messages] + generation prompt minus its
rendering of [..., assistant], computed on a fixed stand-in conversation; the assistant
turn's own end (`<|im_end|>\\n`) comes first unless the model sampled the EOS itself.
TextRenderer is for tokenizers without a template (the character-level demo model, 'tags'):
the prompt is `prompt_template` and an observation is `<result>...</result>` per call.

Not here: tokenisation itself (the tokenizer is passed in, duck-typed: `apply_chat_template`,
`encode`), parsing calls (formats.py), running tools (environment.py).
"""

import dataclasses
from typing import Any, Mapping, Sequence

from rlreason.envs import base
from rlreason.envs import formats

RESULT_OPEN, RESULT_CLOSE = '<result>', '</result>'
# The stand-in turn carries reasoning, so templates that render an empty think block only for
# the last assistant turn (Qwen3) render it the same before and after the tool messages.
_STAND_IN = [{'role': 'user', 'content': 'q'},
             {'role': 'assistant', 'content': '<think>\nr\n</think>\n\na'}]


@dataclasses.dataclass(frozen=True)
class TextRenderer:
  """Plain text around turns: `prompt_template` (+ an optional system line) and results."""
  prompt_template: str = '{prompt}'
  system_prompt: str = ''

  def prompt_text(self, example) -> str:
    prompt = self.prompt_template.format(prompt=example.prompt)
    return f'{self.system_prompt}\n{prompt}' if self.system_prompt else prompt

  def observation_text(self, messages: Sequence[Mapping[str, Any]], ended: bool) -> str:
    del ended  # No turn structure: the model continues its own text after the results.
    return ''.join(f'{RESULT_OPEN}{m["content"]}{RESULT_CLOSE}' for m in messages)


@dataclasses.dataclass(frozen=True)
class ChatRenderer:
  """The tokenizer's chat template, with the tools' schemas in its system prompt."""
  tok: Any
  format: formats.Format
  tools: tuple[base.ToolSpec, ...]
  system_prompt: str = ''
  chat_kwargs: Mapping[str, Any] = dataclasses.field(default_factory=dict)

  def _render(self, messages, add_generation_prompt: bool) -> str:
    return self.tok.apply_chat_template(
        list(messages), tools=formats.tool_schemas(self.tools),
        add_generation_prompt=add_generation_prompt, **dict(self.chat_kwargs))

  def _system(self) -> list[dict]:
    return [{'role': 'system', 'content': self.system_prompt}] if self.system_prompt else []

  def prompt_text(self, example) -> str:
    return self._render(self._system() + [{'role': 'user', 'content': example.prompt}], True)

  def observation_text(self, messages: Sequence[Mapping[str, Any]], ended: bool) -> str:
    """The template's text after an assistant turn that `messages` (tool results) answer.

    ended: the turn's last sampled token was an EOS (the template's turn end); otherwise the
    turn stopped at the call's end, and the turn end is part of the observation.
    """
    before = self._render(self._system() + _STAND_IN, False)
    after = self._render(self._system() + _STAND_IN + list(messages), True)
    if not after.startswith(before):
      raise ValueError(f'{self.format.family}: the chat template rewrites earlier turns when '
                       'tool messages follow; an observation cannot be appended token-exactly.')
    end = self.format.turn_end
    turn_tail = before[before.rindex(end):] if end and end in before else ''
    if ended:
      turn_tail = turn_tail[len(end):]
    return turn_tail + after[len(before):]


def make_renderer(tok, *, family: str, tools: Sequence[base.ToolSpec], system_prompt: str = '',
                  prompt_template: str = '{prompt}', chat_kwargs=None):
  """TextRenderer for 'tags', ChatRenderer (the tokenizer's template) for qwen and llama3."""
  fmt = formats.get(family)
  if family == 'tags':
    system = system_prompt if system_prompt != 'tools' else formats.render_system_prompt(tools)
    return TextRenderer(prompt_template=prompt_template, system_prompt=system)
  if not getattr(tok, 'chat_template', None):
    raise ValueError(f'env.family={family!r} renders with the tokenizer\'s chat template, and '
                     'this tokenizer has none; use family="tags" for a template-less model.')
  return ChatRenderer(tok=tok, format=fmt, tools=tuple(tools), system_prompt=system_prompt,
                      chat_kwargs=dict(chat_kwargs or {}))
