"""One small tokenizer interface over HF `tokenizers` and sentencepiece models.

`load(path)` reads a Hugging Face tokenizer directory (`tokenizer.json`, or
Qwen2-style `vocab.json` + `merges.txt`), a sentencepiece model or a GGUF file, plus the
optional `tokenizer_config.json`, `special_tokens_map.json`,
`generation_config.json` and `chat_template.jinja` beside it. The `Tokenizer` it
returns encodes and decodes like `transformers.AutoTokenizer` (v5) does, knows
the special token ids and the EOS set that ends sampling, and renders chat
templates with transformers' Jinja2 setup (model/chat_template.py). `pad_left` makes bucketed,
left-padded numpy batches of prompts.

Sentencepiece models also follow transformers, not the raw library, in one
respect: control pieces and unk ('<s>', '</s>', '<unk>') written in text become
their ids, and `decode` prints them, so chat templates work on both backends.

Deliberately not here: `transformers`/`torch` imports; slow tokenizers other
than sentencepiece; pair inputs, truncation, offsets; `continue_final_message`,
assistant-token masks and tools given as Python callables (pass JSON schemas);
`clean_up_tokenization_spaces` (transformers ignores it for BPE as well). The
`vocab.json` + `merges.txt` builder only knows the Qwen2/Qwen3 pipeline.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import os
import re
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import sentencepiece as spm
import tokenizers
from tokenizers import AddedToken, Regex, decoders, normalizers, pre_tokenizers, processors

from rlreason.model import chat_template as chat_template_lib
from rlreason.model import gguf_file
from rlreason.model import gguf_tokenizer

# The named special tokens that transformers hands to chat templates.
SPECIAL_TOKEN_NAMES = ('bos_token', 'eos_token', 'unk_token', 'sep_token', 'pad_token',
                       'cls_token', 'mask_token')
QWEN2_PRETOKENIZE_REGEX = (r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}|"""
                           r""" ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+""")
_QWEN2_CLASSES = (None, 'Qwen2Tokenizer', 'Qwen2TokenizerFast')


@dataclasses.dataclass(frozen=True, eq=False)
class Tokenizer:
  """A loaded tokenizer; build it with `load`.

  Attributes:
    backend: a `tokenizers.Tokenizer` or a `sentencepiece.SentencePieceProcessor`.
    bos_id, eos_id, pad_id: special token ids, None where there is none.
    eos_ids: every id that ends a generation: `eos_id`, generation_config.json's
      `eos_token_id` and whatever the caller added (`with_extra_eos`).
    special_tokens: named special tokens, e.g. {'eos_token': '<|im_end|>'}.
    chat_template: a Jinja template, a {name: template} dict, or None.
    config: tokenizer_config.json as read (special_tokens_map.json merged in).
    add_bos, add_eos: what `add_special_tokens=True` adds for sentencepiece;
      `tokenizers` backends use their post-processor instead.
    sp_specials: sentencepiece control/unk pieces, which (as in transformers)
      are matched in text and printed by `decode`.
  """
  backend: tokenizers.Tokenizer | spm.SentencePieceProcessor = dataclasses.field(repr=False)
  bos_id: int | None = None
  eos_id: int | None = None
  pad_id: int | None = None
  eos_ids: frozenset[int] = frozenset()
  special_tokens: Mapping[str, str] = dataclasses.field(default_factory=dict)
  chat_template: str | Mapping[str, str] | None = dataclasses.field(default=None, repr=False)
  config: Mapping[str, Any] = dataclasses.field(default_factory=dict, repr=False)
  add_bos: bool = False
  add_eos: bool = False
  sp_specials: Mapping[str, int] = dataclasses.field(default_factory=dict, repr=False)

  @property
  def is_sentencepiece(self) -> bool:
    return isinstance(self.backend, spm.SentencePieceProcessor)

  @property
  def vocab_size(self) -> int:
    """Number of ids, added tokens included (transformers' `len(tokenizer)`)."""
    if self.is_sentencepiece:
      return self.backend.get_piece_size()
    return self.backend.get_vocab_size(with_added_tokens=True)

  def token_to_id(self, token: str) -> int | None:
    if not self.is_sentencepiece:
      return self.backend.token_to_id(token)
    i = self.backend.piece_to_id(token)
    return i if self.backend.id_to_piece(i) == token else None  # Not unk's id.

  def id_to_token(self, i: int) -> str | None:
    if not self.is_sentencepiece:
      return self.backend.id_to_token(int(i))
    return self.backend.id_to_piece(int(i)) if 0 <= i < self.vocab_size else None

  def encode(self, text: str, *, add_special_tokens: bool = False) -> list[int]:
    if self.is_sentencepiece:
      return self.encode_batch([text], add_special_tokens=add_special_tokens)[0]
    return self.backend.encode(text, add_special_tokens=add_special_tokens).ids

  def encode_batch(self, texts: Sequence[str], *,
                   add_special_tokens: bool = False) -> list[list[int]]:
    if not self.is_sentencepiece:
      encs = self.backend.encode_batch(list(texts), add_special_tokens=add_special_tokens)
      return [e.ids for e in encs]
    bos = [self.bos_id] if add_special_tokens and self.add_bos and self.bos_id is not None else []
    eos = [self.eos_id] if add_special_tokens and self.add_eos and self.eos_id is not None else []
    return [bos + self._sp_encode(t) + eos for t in texts]

  def encode_pieces(self, pieces: Sequence[tuple[str, bool]]) -> list[int]:
    """Ids of the pieces' concatenated text, where only trusted pieces (True: a template's own
    text) may produce added/special token ids; untrusted ones (False: a tool's output, a
    user's text) are ordinary text, so '<|im_end|>' in a tool result cannot end a turn.

    Text runs across piece boundaries between added tokens are encoded as one (as `encode`
    does), so when no untrusted piece holds an added token's text the ids equal
    `encode(''.join(text))`.
    """
    added = self._added_texts()
    pattern = _specials_regex(added) if added else None
    runs: list[str | int] = []  # text to encode, or an added token's id
    for text, trusted in pieces:
      start = 0
      for m in pattern.finditer(text) if trusted and pattern else ():
        runs += [text[start:m.start()], self._added_id(m.group())]
        start = m.end()
      runs.append(text[start:])
    ids, buffer = [], ''
    for run in [*runs, None]:
      if isinstance(run, str):
        buffer += run
        continue
      if buffer:
        ids += self._encode_plain(buffer)
        buffer = ''
      if run is not None:
        ids.append(run)
    return ids

  def _added_texts(self) -> tuple[str, ...]:
    if self.is_sentencepiece:
      return tuple(self.sp_specials)
    return tuple(t.content for t in self.backend.get_added_tokens_decoder().values()
                 if t.content)

  def _added_id(self, text: str) -> int:
    return self.sp_specials[text] if self.is_sentencepiece else self.backend.token_to_id(text)

  def _encode_plain(self, text: str) -> list[int]:
    """`text` encoded with no added-token matching (control strings become ordinary text)."""
    if self.is_sentencepiece:
      return self.backend.encode(text)
    return _without_added_tokens(self.backend).encode(text, add_special_tokens=False).ids

  def decode(self, ids: Iterable[int], *, skip_special_tokens: bool = False) -> str:
    return self.decode_batch([ids], skip_special_tokens=skip_special_tokens)[0]

  def decode_batch(self, batch: Iterable[Iterable[int]], *,
                   skip_special_tokens: bool = False) -> list[str]:
    batch = [[int(i) for i in ids] for ids in batch]  # numpy/jax rows -> Python ints.
    if self.is_sentencepiece:
      return [self._sp_decode(ids, skip_special_tokens) for ids in batch]
    return self.backend.decode_batch(batch, skip_special_tokens=skip_special_tokens)

  def with_extra_eos(self, extra: Iterable[int | str]) -> Tokenizer:
    """A copy whose `eos_ids` also holds `extra` (ids, or strings that are one token)."""
    ids = set(self.eos_ids)
    for e in extra:
      i = int(e) if isinstance(e, (int, np.integer)) else self.token_to_id(e)
      if i is None or i < 0:
        raise ValueError(f'Stop token {e!r} is not a single token of this vocabulary.')
      ids.add(i)
    return dataclasses.replace(self, eos_ids=frozenset(ids))

  def apply_chat_template(self, messages: Sequence[Mapping[str, Any]], *,
                          add_generation_prompt: bool = False,
                          tools: Sequence[Mapping[str, Any]] | None = None,
                          documents: Sequence[Mapping[str, Any]] | None = None,
                          chat_template: str | None = None, **kwargs) -> str:
    """Renders like transformers' `apply_chat_template(..., tokenize=False)`.

    `chat_template` overrides the template (or names one of several); extra
    `kwargs` such as `enable_thinking=False` are template variables.
    """
    if not messages:
      raise ValueError('Cannot apply a chat template to an empty conversation.')
    if tools is not None and not all(isinstance(t, Mapping) for t in tools):
      raise TypeError('tools must be JSON-schema dicts; callables are not converted.')
    return chat_template_lib.render(
        self._select_template(chat_template, tools), messages=messages, tools=tools,
        documents=documents, add_generation_prompt=add_generation_prompt,
        variables={**self.special_tokens, **kwargs})  # kwargs win, as in transformers.

  def encode_chat(self, messages: Sequence[Mapping[str, Any]], **kwargs) -> list[int]:
    """`apply_chat_template(...)` then `encode`: the template writes the specials."""
    return self.encode(self.apply_chat_template(messages, **kwargs))

  def _select_template(self, name_or_template: str | None, tools) -> str:
    templates = self.chat_template
    if isinstance(templates, Mapping):  # Several named templates, as in transformers.
      if name_or_template is None:
        name_or_template = 'tool_use' if tools is not None and 'tool_use' in templates else 'default'
        if name_or_template not in templates:
          raise ValueError(f'No default chat template; name one of {sorted(templates)}.')
      return templates.get(name_or_template, name_or_template)
    if name_or_template is None and templates is None:
      raise ValueError('This tokenizer has no chat_template; pass chat_template=...')
    return name_or_template if name_or_template is not None else templates

  def _sp_encode(self, text: str) -> list[int]:
    if not self.sp_specials:
      return self.backend.encode(text)
    ids, start = [], 0
    for m in _specials_regex(tuple(self.sp_specials)).finditer(text):
      ids += self.backend.encode(text[start:m.start()]) + [self.sp_specials[m.group()]]
      start = m.end()
    return ids + self.backend.encode(text[start:])

  def _sp_decode(self, ids: list[int], skip_special_tokens: bool) -> str:
    special = set(self.sp_specials.values())
    if skip_special_tokens:
      return self.backend.decode([i for i in ids if i not in special])
    # Decode the runs between specials; like transformers' Metaspace decoder,
    # only the very first word loses its leading space.
    parts, run = [], []
    for i in [*ids, None]:
      if i is not None and i not in special:
        run.append(i)
        continue
      if run:
        space = parts and self.backend.id_to_piece(run[0]).startswith('\u2581')
        parts.append(' ' * bool(space) + self.backend.decode(run))
        run = []
      if i is not None:
        parts.append(self.backend.id_to_piece(i))
    return ''.join(parts)


def load(path: str | os.PathLike[str], *, extra_eos: Iterable[int | str] = ()) -> Tokenizer:
  """Loads a HF tokenizer directory or `tokenizer.json`, or a sentencepiece model.

  Args:
    path: a directory with `tokenizer.json`, or `vocab.json` + `merges.txt`
      (Qwen2-style byte-level BPE), or `tokenizer.model`; or a `tokenizer.json`
      or sentencepiece `.model` file. Config files are read beside it.
    extra_eos: more stop tokens (ids or token strings) for `eos_ids`.

  A `.gguf` path (also 'pkg:<package>/<file>.gguf') gives the tokenizer and chat template in
  that file's metadata (model/gguf_tokenizer.py), built like a Qwen2-style directory's.
  """
  if gguf_file.is_gguf(path):
    backend, config = gguf_tokenizer.read(path)
    tok = _load_hf(backend, config, gguf_file.resolve(path), from_json=False)
    return tok.with_extra_eos([*config['extra_eos_ids'], *extra_eos])
  path = Path(path)
  if not path.exists():
    raise FileNotFoundError(f'Tokenizer path does not exist: {path}')
  directory = path if path.is_dir() else path.parent
  config = _read_config(directory)
  hf_file = sp_file = None
  if path.is_file():
    hf_file, sp_file = (path, None) if path.suffix == '.json' else (None, path)
  elif (path / 'tokenizer.json').is_file():
    hf_file = path / 'tokenizer.json'
  elif not (path / 'vocab.json').is_file() and (path / 'tokenizer.model').is_file():
    sp_file = path / 'tokenizer.model'
  if hf_file is not None:
    try:
      backend = tokenizers.Tokenizer.from_file(str(hf_file))
    except Exception as e:  # tokenizers raises bare Exceptions on bad files.
      raise ValueError(f'Cannot read {hf_file} as a tokenizer.json: {e}') from e
    tok = _load_hf(backend, config, directory, from_json=True)
  elif sp_file is not None:
    tok = _load_sentencepiece(sp_file, config)
  elif (path / 'vocab.json').is_file() and (path / 'merges.txt').is_file():
    if config.get('tokenizer_class') not in _QWEN2_CLASSES:
      raise ValueError(f'{path}: vocab.json + merges.txt is only supported for Qwen2-style '
                       f'tokenizers, not {config["tokenizer_class"]!r}; add a tokenizer.json.')
    tok = _load_hf(_build_qwen2_bpe(path), config, path, from_json=False)
  else:
    missing = 'merges.txt' if (path / 'vocab.json').is_file() else 'tokenizer.json'
    raise FileNotFoundError(f'No tokenizer in {path}: {missing} is missing (expected '
                            'tokenizer.json, vocab.json + merges.txt, or tokenizer.model).')
  return tok.with_extra_eos([*_generation_eos_ids(directory), *extra_eos])


def from_characters(chars: Iterable[str], *, pad: str = '<pad>', eos: str = '<eos>',
                    unk: str = '<unk>') -> Tokenizer:
  """A character-level tokenizer for synthetic tasks: pad 0, eos 1, unk 2, then `chars`.

  A character outside `chars` encodes to the unk id, which a task's tests can look for.
  """
  chars = list(dict.fromkeys(chars))
  if any(len(c) != 1 for c in chars):
    raise ValueError(f'from_characters: entries must be single characters, got {chars}.')
  vocab = {pad: 0, eos: 1, unk: 2, **{c: i + 3 for i, c in enumerate(chars)}}
  tok = tokenizers.Tokenizer(tokenizers.models.WordLevel(vocab, unk_token=unk))
  tok.pre_tokenizer = pre_tokenizers.Split(Regex('.|\\n'), behavior='isolated')
  tok.decoder = decoders.Fuse()
  tok.add_special_tokens([AddedToken(t, special=True) for t in (pad, eos, unk)])
  config = {'eos_token': eos, 'pad_token': pad, 'unk_token': unk}
  return _load_hf(tok, config, Path('.'), from_json=True)


def pad_left(seqs: Sequence[Sequence[int]], *, buckets: Sequence[int],
             pad_id: int) -> tuple[np.ndarray, np.ndarray]:
  """Left-pads id lists to the smallest bucket that fits the longest one.

  Left padding puts every prompt's last token in the last column, where
  sampling continues; a few fixed widths bound the number of jit compilations.

  Returns:
    tokens [B, P] int32 and mask [B, P] bool (True on real tokens).
  """
  if pad_id is None:
    raise ValueError('pad_left needs a pad_id (this tokenizer may have none).')
  if not buckets or not seqs:
    raise ValueError(f'pad_left needs buckets and sequences, got {len(buckets)} buckets '
                     f'and {len(seqs)} sequences.')
  largest = max(buckets)
  for row, s in enumerate(seqs):
    if not len(s):
      raise ValueError(f'Row {row} is empty; cannot left-pad an empty sequence.')
    if len(s) > largest:
      raise ValueError(f'Row {row} has length {len(s)}, longer than the largest bucket '
                       f'{largest} (buckets {sorted(buckets)}).')
  width = min(b for b in buckets if b >= max(len(s) for s in seqs))
  tokens = np.full((len(seqs), width), pad_id, dtype=np.int32)
  mask = np.zeros((len(seqs), width), dtype=bool)
  for row, s in enumerate(seqs):
    tokens[row, width - len(s):] = np.asarray(s, dtype=np.int32)
    mask[row, width - len(s):] = True
  return tokens, mask


# --- Loading. ---


def _read_json(path: Path) -> Any:
  try:
    return json.loads(path.read_text(encoding='utf-8'))
  except json.JSONDecodeError as e:
    raise ValueError(f'Invalid JSON in {path}: {e}') from e


def _read_config(directory: Path) -> dict[str, Any]:
  """tokenizer_config.json; special_tokens_map.json fills what it leaves unset."""
  config = {}
  if (directory / 'tokenizer_config.json').is_file():
    config = _read_json(directory / 'tokenizer_config.json')
  if (directory / 'special_tokens_map.json').is_file():
    for k, v in _read_json(directory / 'special_tokens_map.json').items():
      if config.get(k) is None:
        config[k] = v
  # Newer transformers save the template in its own file, which wins.
  if (directory / 'chat_template.jinja').is_file():
    config['chat_template'] = (directory / 'chat_template.jinja').read_text(encoding='utf-8')
  if isinstance(config.get('chat_template'), list):  # [{'name': ..., 'template': ...}]
    config['chat_template'] = {t['name']: t['template'] for t in config['chat_template']}
  return config


def _generation_eos_ids(directory: Path) -> list[int]:
  if not (directory / 'generation_config.json').is_file():
    return []
  eos = _read_json(directory / 'generation_config.json').get('eos_token_id')
  return [] if eos is None else [eos] if isinstance(eos, int) else list(eos)


def _token_str(value: Any) -> str | None:
  """Special tokens are saved as strings or as serialized AddedToken dicts."""
  return value.get('content') if isinstance(value, Mapping) else value


def _added_token(value: Any, special: bool) -> AddedToken:
  if not isinstance(value, Mapping):
    return AddedToken(value, special=special, normalized=False)
  flags = ('single_word', 'lstrip', 'rstrip', 'normalized')
  return AddedToken(value['content'], special=special, **{k: value[k] for k in flags if k in value})


def _build_qwen2_bpe(directory: Path) -> tokenizers.Tokenizer:
  """The Qwen2/Qwen3 byte-level BPE pipeline, built as transformers builds it."""
  vocab, merges = tokenizers.models.BPE.read_file(
      str(directory / 'vocab.json'), str(directory / 'merges.txt'))
  tok = tokenizers.Tokenizer(tokenizers.models.BPE(
      vocab=vocab, merges=merges, unk_token=None, continuing_subword_prefix='',
      end_of_word_suffix='', fuse_unk=False, byte_fallback=False))
  tok.normalizer = normalizers.NFC()
  tok.pre_tokenizer = pre_tokenizers.Sequence([
      pre_tokenizers.Split(Regex(QWEN2_PRETOKENIZE_REGEX), behavior='isolated', invert=False),
      pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
  tok.decoder = decoders.ByteLevel()
  return tok


def _load_hf(tok: tokenizers.Tokenizer, config: dict[str, Any], directory: Path,
             from_json: bool) -> Tokenizer:
  # Config-listed added tokens, in id order so that new ones get their ids.
  existing = {t.content for t in tok.get_added_tokens_decoder().values()}
  for i, spec in sorted((int(k), v) for k, v in config.get('added_tokens_decoder', {}).items()):
    if spec['content'] not in existing:
      tok.add_tokens([_added_token(spec, spec.get('special', False))])
    if tok.token_to_id(spec['content']) != i:
      raise ValueError(f'{directory}: added token {spec["content"]!r} should have id {i}, '
                       f'but has {tok.token_to_id(spec["content"])}.')
  # As in transformers, named and additional special tokens are always special.
  named = {k: config[k] for k in SPECIAL_TOKEN_NAMES if config.get(k) is not None}
  extra = config.get('additional_special_tokens') or config.get('extra_special_tokens') or []
  existing = {t.content for t in tok.get_added_tokens_decoder().values()}
  for value in [*named.values(), *(extra.values() if isinstance(extra, Mapping) else extra)]:
    if _token_str(value) not in existing:
      tok.add_special_tokens([_added_token(value, special=True)])
  special = {k: _token_str(v) for k, v in named.items()}
  # transformers (v5) honours add_{bos,eos}_token only without a tokenizer.json;
  # otherwise its post-processor decides.
  if not from_json and (config.get('add_bos_token') or config.get('add_eos_token')):
    bos = special.get('bos_token') if config.get('add_bos_token') else None
    eos = special.get('eos_token') if config.get('add_eos_token') else None

    def seq(name: str, type_id: int) -> str:
      return ' '.join([f'{bos}:{type_id}'] * bool(bos) + [f'${name}:{type_id}']
                      + [f'{eos}:{type_id}'] * bool(eos))

    tok.post_processor = processors.TemplateProcessing(
        single=seq('A', 0), pair=f"{seq('A', 0)} {seq('B', 1)}",
        special_tokens=[(t, tok.token_to_id(t)) for t in (bos, eos) if t])
  tok.encode_special_tokens = bool(config.get('split_special_tokens', False))
  ids = {k: tok.token_to_id(v) for k, v in special.items()}
  return Tokenizer(
      backend=tok, bos_id=ids.get('bos_token'), eos_id=ids.get('eos_token'),
      pad_id=ids.get('pad_token'), eos_ids=frozenset([ids.get('eos_token')]) - {None},
      special_tokens=special, chat_template=config.get('chat_template'), config=config)


def _load_sentencepiece(file: Path, config: dict[str, Any]) -> Tokenizer:
  sp = spm.SentencePieceProcessor()
  try:
    sp.load(str(file))
  except (OSError, RuntimeError) as e:
    raise ValueError(f'Cannot read {file} as a sentencepiece model: {e}') from e
  ids = {'bos_token': sp.bos_id(), 'eos_token': sp.eos_id(), 'unk_token': sp.unk_id(),
         'pad_token': sp.pad_id()}
  special = {k: sp.id_to_piece(i) for k, i in ids.items() if i >= 0}
  special.update({k: _token_str(config[k]) for k in SPECIAL_TOKEN_NAMES if config.get(k)})
  ids = {k: sp.piece_to_id(v) for k, v in special.items()}
  for k, v in special.items():
    if sp.id_to_piece(ids[k]) != v:
      raise ValueError(f'{file}: {k} {v!r} from the config is not a piece of this model.')
  # Control pieces (<s>, </s>) and unk are matched in text, as transformers does.
  specials = {sp.id_to_piece(i): i for i in range(sp.get_piece_size())
              if sp.is_control(i) or sp.is_unknown(i)}
  return Tokenizer(
      backend=sp, bos_id=ids.get('bos_token'), eos_id=ids.get('eos_token'),
      pad_id=ids.get('pad_token'), eos_ids=frozenset([ids.get('eos_token')]) - {None},
      special_tokens=special, chat_template=config.get('chat_template'), config=config,
      add_bos=bool(config.get('add_bos_token', False)),
      add_eos=bool(config.get('add_eos_token', False)),
      sp_specials={p: i for p, i in specials.items() if p})  # Skip empty pieces.


@functools.lru_cache(maxsize=8)
def _without_added_tokens(backend: tokenizers.Tokenizer) -> tokenizers.Tokenizer:
  """A copy of `backend` that knows no added tokens (same normalizer, pre-tokenizer, model)."""
  data = json.loads(backend.to_str())
  data['added_tokens'] = []
  return tokenizers.Tokenizer.from_str(json.dumps(data))


@functools.lru_cache(maxsize=8)
def _specials_regex(pieces: tuple[str, ...]) -> re.Pattern[str]:
  return re.compile('|'.join(map(re.escape, sorted(pieces, key=len, reverse=True))))
