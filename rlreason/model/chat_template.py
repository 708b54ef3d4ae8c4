"""Chat templates rendered in the Jinja environment transformers builds (a sandboxed, immutable
environment with `tojson`, `raise_exception`, `strftime_now`, the `generation` tag and loop
controls), so rendered text equals `apply_chat_template(..., tokenize=False)`'s
(tests/tokenizer_test.py compares them).
"""

from __future__ import annotations

import datetime
import functools
import json
from collections.abc import Mapping, Sequence
from typing import Any

import jinja2
import jinja2.ext
import jinja2.nodes
import jinja2.sandbox
import numpy as np

# transformers copies a message's reasoning to all of these keys.
_REASONING_KEYS = ('reasoning_content', 'thinking', 'reasoning')


def render(template: str, *, messages: Sequence[Mapping[str, Any]],
           tools: Sequence[Mapping[str, Any]] | None, documents: Sequence[Mapping[str, Any]] | None,
           add_generation_prompt: bool, variables: Mapping[str, Any]) -> str:
  """`template` rendered for the conversation; `variables` are extra template variables
  (special tokens, enable_thinking, ...). Nothing the caller passed is modified."""
  return _compile_template(template).render(
      messages=[_prepare_message(m) for m in messages], tools=_plain(tools),
      documents=_plain(documents), add_generation_prompt=add_generation_prompt,
      **_plain(dict(variables)))


def _plain(x: Any) -> Any:
  """A fresh copy of JSON-like data, so templates never touch caller objects."""
  if isinstance(x, Mapping):
    return {k: _plain(v) for k, v in x.items()}
  if isinstance(x, list):
    return [_plain(v) for v in x]
  if isinstance(x, tuple):
    return tuple(_plain(v) for v in x)
  return x.item() if isinstance(x, np.generic) else x


def _prepare_message(message: Mapping[str, Any]) -> dict[str, Any]:
  if not isinstance(message, Mapping):
    raise TypeError(f'Chat messages must be dicts, got {message!r}.')
  # Like transformers: drop None values (templates test for missing keys), and
  # show the reasoning under every name templates read it by.
  m = {k: _plain(v) for k, v in message.items() if v is not None}
  reasoning = next((m[k] for k in _REASONING_KEYS if m.get(k) is not None), None)
  if reasoning is not None:
    m = {'thinking': reasoning, **m, 'reasoning_content': reasoning}
  return m


def _raise_exception(message: str):
  raise jinja2.exceptions.TemplateError(message)


def _tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False) -> str:
  # Jinja's own tojson escapes HTML characters, which chat templates must not.
  return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators,
                    sort_keys=sort_keys)


class _GenerationTag(jinja2.ext.Extension):
  """Parses `{% generation %}` (transformers' assistant-mask marker); renders its body."""
  tags = {'generation'}

  def parse(self, parser):
    lineno = next(parser.stream).lineno
    body = parser.parse_statements(('name:endgeneration',), drop_needle=True)
    return jinja2.nodes.CallBlock(self.call_method('_body'), [], [], body).set_lineno(lineno)

  def _body(self, caller):
    return caller()


@functools.lru_cache(maxsize=32)
def _compile_template(template: str) -> jinja2.Template:
  env = jinja2.sandbox.ImmutableSandboxedEnvironment(  # Templates are untrusted code.
      trim_blocks=True, lstrip_blocks=True, extensions=[_GenerationTag, jinja2.ext.loopcontrols])
  env.filters['tojson'] = _tojson
  env.globals.update(raise_exception=_raise_exception,
                     strftime_now=lambda fmt: datetime.datetime.now().strftime(fmt))
  return env.from_string(template)
