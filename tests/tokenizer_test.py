"""Tests for rlreason.model.tokenizer: parity with transformers and sentencepiece."""

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import sentencepiece as spm
import tokenizers
import transformers

from rlreason.model import tokenizer as tk

DATA = Path(__file__).resolve().parents[1].parent / 'shared' / 'data'
QWEN = DATA / 'qwen_tokenizer'
SP_MODEL = DATA / 'sentencepiece_c4_32k' / 'tokenizer.model'
GSM8K = DATA / 'gsm8k' / 'train.jsonl'

needs_data = pytest.mark.skipif(
    not DATA.is_dir(), reason=f'shared test data not found at {DATA} (repo checked out without '
    'the shared/ folder next to it)')

# From the README: HF output for Qwen3-0.6B.
QWEN_VECTOR_TEXT = '<|im_start|>user\nHi, this is a test!<|im_end|>\n<|im_start|>assistant\n'
QWEN_VECTOR_IDS = [151644, 872, 198, 13048, 11, 419, 374, 264, 1273, 0, 151645, 198, 151644,
                   77091, 198]
SP_VECTOR_TEXT = 'Hello world, this is a test of the T5 tokenizer.'
SP_VECTOR_IDS = [6774, 185, 5, 33, 12, 9, 796, 8, 4, 502, 827, 7, 5366, 14881, 3]

EXTRA_TEXTS = [
    '', ' ', 'Hello, world!', '  leading and trailing  ', 'tabs\tand\t\ttabs',
    'multiple     spaces   here', 'line1\nline2\n\n\nline5\r\nwindows\r\n', '\n\n  \n',
    'Ünïcödé café naïve résumé', 'e\u0301 vs \u00e9 (NFC)', 'ﬁ ligature ① ½ Ⅻ',
    '日本語のテキストと中文字符，以及한국어.', '🙂🚀👍🏽 emoji 👨‍👩‍👧 family', 'x = 3.14159e-10; y = -42',
    "I'm sure they've gone, it's 12:30 and we'd LEFT. DON'T", '12345678901234567890',
    'def f(x):\n    return x ** 2  # square\n', '$<<48/2=24>>24 #### 72',
    '<|im_start|>system\nYou are helpful.<|im_end|>\n', 'text<|endoftext|>more<|im_end|>',
    '<think>\nhmm\n</think>\n\nanswer', '<tool_call>\n{"name": "f"}\n</tool_call>',
    'almost special <|im_start and |im_end|>', 'a' * 300, ' '.join(['word'] * 50),
    'Zürich–Genève — “quotes” ‘single’ …', '\u200b zero width \ufeff bom', 'مرحبا بالعالم',
]


def _gsm8k_texts(n):
  lines = GSM8K.read_text(encoding='utf-8').splitlines()[:n]
  rows = [json.loads(line) for line in lines]
  return [r['question'] for r in rows] + [r['answer'] for r in rows]


@pytest.fixture(scope='module')
def texts():
  return _gsm8k_texts(50) + EXTRA_TEXTS


def _hf_load(path):
  return transformers.AutoTokenizer.from_pretrained(str(path))


@pytest.fixture(scope='module')
def qwen3_dir(tmp_path_factory):
  d = tmp_path_factory.mktemp('qwen3')
  for name in ('vocab.json', 'merges.txt'):
    (d / name).symlink_to(QWEN / name)
  shutil.copy(QWEN / 'qwen3' / 'tokenizer_config.json', d / 'tokenizer_config.json')
  return d


@pytest.fixture(scope='module')
def hf_qwen25():
  return _hf_load(QWEN)


@pytest.fixture(scope='module')
def hf_qwen3(qwen3_dir):
  return _hf_load(qwen3_dir)


@pytest.fixture(scope='module')
def qwen25():
  return tk.load(QWEN)


@pytest.fixture(scope='module')
def qwen3(qwen3_dir):
  return tk.load(qwen3_dir)


def assert_parity(ours, hf, texts):
  """Same ids, text, vocab and special tokens as a transformers tokenizer."""
  assert ours.vocab_size == len(hf)
  assert dict(ours.special_tokens) == hf.special_tokens_map
  assert (ours.bos_id, ours.eos_id, ours.pad_id) == (
      hf.bos_token_id, hf.eos_token_id, hf.pad_token_id)
  for add in (False, True):
    expected = [hf.encode(t, add_special_tokens=add) for t in texts]
    assert [ours.encode(t, add_special_tokens=add) for t in texts] == expected
    assert ours.encode_batch(texts, add_special_tokens=add) == expected
  ids = [hf.encode(t, add_special_tokens=False) for t in texts]
  for skip in (False, True):
    expected = [hf.decode(x, skip_special_tokens=skip) for x in ids]
    assert [ours.decode(x, skip_special_tokens=skip) for x in ids] == expected
    assert ours.decode_batch(ids, skip_special_tokens=skip) == expected
  some_ids = sorted({i for x in ids for i in x})[:500] + list(range(ours.vocab_size - 30,
                                                                    ours.vocab_size))
  assert [ours.id_to_token(i) for i in some_ids] == hf.convert_ids_to_tokens(some_ids)
  tokens = [ours.id_to_token(i) for i in some_ids]
  assert [ours.token_to_id(t) for t in tokens] == hf.convert_tokens_to_ids(tokens)


# --- Qwen (byte-level BPE from vocab.json + merges.txt, or tokenizer.json). ---


@needs_data
def test_qwen_test_vector(qwen25, qwen3):
  for tok in (qwen25, qwen3):
    assert tok.encode(QWEN_VECTOR_TEXT) == QWEN_VECTOR_IDS
    assert tok.decode(QWEN_VECTOR_IDS) == QWEN_VECTOR_TEXT
  assert qwen25.encode('Hello, world!') == [9707, 11, 1879, 0]


@needs_data
def test_qwen25_vocab_merges_parity(qwen25, hf_qwen25, texts):
  assert_parity(qwen25, hf_qwen25, texts)


@needs_data
def test_qwen3_vocab_merges_parity(qwen3, hf_qwen3, texts):
  assert_parity(qwen3, hf_qwen3, texts)
  assert qwen3.token_to_id('<think>') == 151667 and qwen3.token_to_id('</think>') == 151668


@needs_data
def test_qwen_tokenizer_json_saved_by_transformers(hf_qwen25, tmp_path, texts):
  hf_qwen25.save_pretrained(tmp_path)
  assert (tmp_path / 'tokenizer.json').is_file()
  ours = tk.load(tmp_path)
  assert_parity(ours, hf_qwen25, texts)
  assert ours.chat_template == hf_qwen25.chat_template
  # A path to the tokenizer.json file itself reads the same configs.
  assert tk.load(tmp_path / 'tokenizer.json').encode(QWEN_VECTOR_TEXT) == QWEN_VECTOR_IDS


@needs_data
def test_qwen_tokenizer_json_from_our_builder(qwen3, hf_qwen3, qwen3_dir, tmp_path, texts):
  qwen3.backend.save(str(tmp_path / 'tokenizer.json'))
  shutil.copy(qwen3_dir / 'tokenizer_config.json', tmp_path / 'tokenizer_config.json')
  ours = tk.load(tmp_path)
  assert_parity(ours, hf_qwen3, texts)
  # transformers reads the tokenizer.json we built exactly like its own.
  assert_parity(ours, _hf_load(tmp_path), texts)


@needs_data
def test_qwen_add_bos_eos_flags(tmp_path):
  # Without a tokenizer.json, add_{bos,eos}_token from the config shape the output.
  for name in ('vocab.json', 'merges.txt'):
    (tmp_path / name).symlink_to(QWEN / name)
  config = json.loads((QWEN / 'tokenizer_config.json').read_text())
  config.update(bos_token='<|im_start|>', add_bos_token=True, add_eos_token=True)
  (tmp_path / 'tokenizer_config.json').write_text(json.dumps(config))
  ours = tk.load(tmp_path)
  assert ours.encode('Hi', add_special_tokens=True) == [151644, 13048, 151645]
  assert_parity(ours, _hf_load(tmp_path), EXTRA_TEXTS)


# --- EOS sets. ---


@needs_data
def test_eos_ids(qwen25, tmp_path):
  assert qwen25.eos_ids == {151645}
  assert qwen25.with_extra_eos(['<|endoftext|>', 7]).eos_ids == {151645, 151643, 7}
  with pytest.raises(ValueError, match='not a single token'):
    qwen25.with_extra_eos(['two tokens'])
  for name in ('vocab.json', 'merges.txt', 'tokenizer_config.json'):
    (tmp_path / name).symlink_to(QWEN / name)
  (tmp_path / 'generation_config.json').write_text(json.dumps({'eos_token_id': [151645, 151643]}))
  assert tk.load(tmp_path).eos_ids == {151645, 151643}
  (tmp_path / 'generation_config.json').write_text(json.dumps({'eos_token_id': 151643}))
  assert tk.load(tmp_path, extra_eos=['<|im_start|>']).eos_ids == {151645, 151643, 151644}


# --- Chat templates. ---

SYSTEM_MULTI_TURN = [
    {'role': 'system', 'content': 'You are a careful math tutor.'},
    {'role': 'user', 'content': 'What is 2 + 3?'},
    {'role': 'assistant', 'content': '2 + 3 = 5.'},
    {'role': 'user', 'content': 'And times 4? Ünïcödé 🙂 <tag> "quoted"'},
]
SINGLE_USER = [{'role': 'user', 'content': 'Natalia sold clips to 48 of her friends.'}]
QWEN3_THINKING = [
    {'role': 'user', 'content': 'What is 2 + 3?'},
    {'role': 'assistant', 'content': '<think>\nAdd them: 2 + 3 = 5.\n</think>\n\nThe answer is 5.'},
    {'role': 'user', 'content': 'Double it.'},
    {'role': 'assistant', 'content': '<think>\n5 * 2 = 10\n</think>\n\n10'},
]
QWEN3_REASONING_FIELD = [
    {'role': 'user', 'content': 'Double 5.'},
    {'role': 'assistant', 'content': '10', 'reasoning_content': '5 * 2 = 10', 'tool_calls': None},
]
TOOLS = [{
    'type': 'function',
    'function': {
        'name': 'get_weather',
        'description': 'Weather in a city, e.g. "Zürich" – in °C.',
        'parameters': {'type': 'object', 'required': ['city'],
                       'properties': {'city': {'type': 'string', 'description': 'City name'}}},
    },
}]
TOOL_CALL_CHAT = [
    {'role': 'user', 'content': 'Weather in Zürich?'},
    {'role': 'assistant', 'content': '', 'tool_calls': [
        {'type': 'function', 'function': {'name': 'get_weather', 'arguments': {'city': 'Zürich'}}}]},
    {'role': 'tool', 'name': 'get_weather', 'content': '{"temp": 21}'},
]


def _check_chat(ours, hf, messages, **kwargs):
  for gen in (False, True):
    expected = hf.apply_chat_template(messages, tokenize=False, add_generation_prompt=gen,
                                      **kwargs)
    assert ours.apply_chat_template(messages, add_generation_prompt=gen, **kwargs) == expected
    ids = hf.apply_chat_template(messages, add_generation_prompt=gen, return_dict=False, **kwargs)
    assert ours.encode_chat(messages, add_generation_prompt=gen, **kwargs) == ids


@needs_data
@pytest.mark.parametrize('messages', [SINGLE_USER, SYSTEM_MULTI_TURN, TOOL_CALL_CHAT])
def test_chat_template_qwen25(qwen25, hf_qwen25, messages):
  _check_chat(qwen25, hf_qwen25, messages)
  _check_chat(qwen25, hf_qwen25, messages, tools=TOOLS)


@needs_data
@pytest.mark.parametrize(
    'messages', [SINGLE_USER, SYSTEM_MULTI_TURN, QWEN3_THINKING, QWEN3_REASONING_FIELD,
                 TOOL_CALL_CHAT])
def test_chat_template_qwen3(qwen3, hf_qwen3, messages):
  _check_chat(qwen3, hf_qwen3, messages)
  _check_chat(qwen3, hf_qwen3, messages, enable_thinking=False)
  _check_chat(qwen3, hf_qwen3, messages, tools=TOOLS)


@needs_data
def test_chat_template_details(qwen25, qwen3):
  text = qwen25.apply_chat_template(SINGLE_USER, add_generation_prompt=True)
  assert text.startswith('<|im_start|>system\nYou are Qwen, created by Alibaba Cloud.')
  assert text.endswith('<|im_start|>assistant\n')
  thinking = qwen3.apply_chat_template(QWEN3_REASONING_FIELD)
  assert '<think>\n5 * 2 = 10\n</think>\n\n10<|im_end|>' in thinking
  off = qwen3.apply_chat_template(SINGLE_USER, add_generation_prompt=True, enable_thinking=False)
  assert off.endswith('<|im_start|>assistant\n<think>\n\n</think>\n\n')
  # tojson keeps non-ASCII text and HTML characters as they are.
  assert '"Weather in a city, e.g. \\"Zürich\\" – in °C."' in qwen25.apply_chat_template(
      SINGLE_USER, tools=TOOLS)
  with pytest.raises(ValueError, match='empty'):
    qwen25.apply_chat_template([])
  with pytest.raises(TypeError, match='JSON-schema'):
    qwen25.apply_chat_template(SINGLE_USER, tools=[len])
  custom = "{% for m in messages %}{{ m['content'] | upper }}{% endfor %}{{ raise_exception('x') if add_generation_prompt }}"
  assert qwen25.apply_chat_template(SINGLE_USER, chat_template=custom) == 'NATALIA SOLD CLIPS TO 48 OF HER FRIENDS.'
  with pytest.raises(Exception, match='x'):
    qwen25.apply_chat_template(SINGLE_USER, chat_template=custom, add_generation_prompt=True)


# --- A small BPE trained here. ---

TINY_TEMPLATE = ("{{ bos_token }}{% for m in messages %}{% generation %}<|im_start|>{{ m['role'] }}\n"
                 "{{ m['content'] }}{% endgeneration %}<|im_end|>\n{% endfor %}"
                 "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")


@pytest.fixture(scope='module')
def tiny_bpe_dir(tmp_path_factory):
  d = tmp_path_factory.mktemp('tiny_bpe')
  specials = ['<s>', '</s>', '<pad>', '<|im_start|>', '<|im_end|>']
  tok = tokenizers.Tokenizer(tokenizers.models.BPE())
  tok.pre_tokenizer = tokenizers.pre_tokenizers.ByteLevel(add_prefix_space=False)
  tok.decoder = tokenizers.decoders.ByteLevel()
  trainer = tokenizers.trainers.BpeTrainer(
      vocab_size=500, special_tokens=specials,
      initial_alphabet=tokenizers.pre_tokenizers.ByteLevel.alphabet())
  tok.train_from_iterator(_gsm8k_texts(150), trainer=trainer)
  tok.post_processor = tokenizers.processors.TemplateProcessing(
      single='<s> $A </s>', pair='<s> $A </s> $B </s>', special_tokens=[('<s>', 0), ('</s>', 1)])
  tok.save(str(d / 'tokenizer.json'))
  (d / 'tokenizer_config.json').write_text(json.dumps({
      # transformers ignores add_bos_token when there is a tokenizer.json.
      'bos_token': '<s>', 'eos_token': '</s>', 'pad_token': '<pad>', 'add_bos_token': False,
      'chat_template': TINY_TEMPLATE}))
  return d


@needs_data
def test_tiny_bpe_parity(tiny_bpe_dir, tmp_path, texts):
  ours = tk.load(tiny_bpe_dir)
  assert ours.vocab_size == 500
  assert (ours.bos_id, ours.eos_id, ours.pad_id, ours.eos_ids) == (0, 1, 2, {1})
  ids = ours.encode('hi', add_special_tokens=True)
  assert ids[0] == 0 and ids[-1] == 1 and ids[1:-1] == ours.encode('hi')
  hf = _hf_load(tiny_bpe_dir)
  assert_parity(ours, hf, texts)
  _check_chat(ours, hf, SYSTEM_MULTI_TURN)
  # Just the file, no config: compare with PreTrainedTokenizerFast on the same file.
  bare_file = tmp_path / 'tokenizer.json'
  shutil.copy(tiny_bpe_dir / 'tokenizer.json', bare_file)
  bare = tk.load(bare_file)
  assert bare.special_tokens == {} and bare.eos_ids == frozenset() and bare.pad_id is None
  hf_bare = transformers.PreTrainedTokenizerFast(tokenizer_file=str(bare_file))
  assert_parity(bare, hf_bare, texts)


@needs_data
def test_tiny_bpe_named_templates_and_special_tokens_map(tiny_bpe_dir, tmp_path, texts):
  shutil.copy(tiny_bpe_dir / 'tokenizer.json', tmp_path / 'tokenizer.json')
  # Legacy layout: special tokens only in special_tokens_map.json (one as an AddedToken dict).
  (tmp_path / 'special_tokens_map.json').write_text(json.dumps({
      'eos_token': '</s>', 'pad_token': {'content': '<pad>', 'lstrip': False, 'normalized': False,
                                         'rstrip': False, 'single_word': False}}))
  ours = tk.load(tmp_path)
  hf = _hf_load(tmp_path)
  assert_parity(ours, hf, texts)
  assert (ours.eos_id, ours.pad_id, ours.bos_id) == (1, 2, None)
  # Several named templates: 'default', or 'tool_use' when tools are given.
  (tmp_path / 'tokenizer_config.json').write_text(json.dumps({'chat_template': [
      {'name': 'default', 'template': TINY_TEMPLATE},
      {'name': 'tool_use', 'template': '{{ tools | tojson(indent=2) }}' + TINY_TEMPLATE}]}))
  ours, hf = tk.load(tmp_path), _hf_load(tmp_path)
  assert set(ours.chat_template) == {'default', 'tool_use'}
  _check_chat(ours, hf, SYSTEM_MULTI_TURN)
  _check_chat(ours, hf, SYSTEM_MULTI_TURN, tools=TOOLS)
  _check_chat(ours, hf, SINGLE_USER, chat_template='tool_use', tools=TOOLS)
  _check_chat(ours, hf, SINGLE_USER, chat_template='{{ messages[0].content }}')


# --- Sentencepiece. ---


@pytest.fixture(scope='module')
def c4_sp():
  return tk.load(SP_MODEL)


@pytest.fixture(scope='module')
def hf_c4_sp(tmp_path_factory):
  # A directory with only tokenizer.model: transformers converts it generically.
  # (LlamaTokenizer assumes a BPE model and T5Tokenizer remaps ids, so neither fits.)
  d = tmp_path_factory.mktemp('c4_sp')
  shutil.copy(SP_MODEL, d / 'tokenizer.model')
  return _hf_load(d)


def _has_specials(text):
  return any(p in text for p in ('<s>', '</s>', '<unk>'))


@needs_data
def test_sentencepiece_c4(c4_sp, hf_c4_sp, texts):
  sp = spm.SentencePieceProcessor(model_file=str(SP_MODEL))
  assert c4_sp.encode(SP_VECTOR_TEXT) == SP_VECTOR_IDS
  assert c4_sp.decode(SP_VECTOR_IDS) == SP_VECTOR_TEXT
  assert (c4_sp.bos_id, c4_sp.eos_id, c4_sp.pad_id, c4_sp.eos_ids) == (1, 2, None, {2})
  assert c4_sp.vocab_size == 32768
  assert c4_sp.token_to_id('▁the') == 4 and c4_sp.token_to_id('not-a-piece') is None
  assert c4_sp.id_to_token(1) == '<s>' and c4_sp.id_to_token(32768) is None
  # Plain text: exactly the sentencepiece library.
  for t in texts + ['a<b>c', 'tokens </ s>']:
    if _has_specials(t):
      continue
    ids = sp.encode(t)
    assert c4_sp.encode(t) == ids, t
    if sp.unk_id() not in ids:
      assert c4_sp.decode(ids) == sp.decode(ids), t
  # Everything, special-token strings and unk included: exactly transformers.
  special_texts = ['x</s>y <s> z', '<s>Hello', 'a<unk>b', 'Hi </s>', '  <s>  x  ', '</s></s>',
                   '<s>']
  assert_parity(c4_sp, hf_c4_sp, texts + special_texts)
  # Where the two disagree we follow transformers, so that both backends treat
  # special-token strings alike (a chat template's '{{ bos_token }}' must become <s>).
  assert c4_sp.encode('a</s>') == [9, 2] and sp.encode('a</s>') != [9, 2]
  assert c4_sp.decode([9, 0]) == 'a<unk>' and sp.decode([9, 0]) == 'a ⁇ '
  assert c4_sp.decode([9, 0, 2], skip_special_tokens=True) == 'a'


@needs_data
def test_sentencepiece_chat_template(tmp_path):
  shutil.copy(SP_MODEL, tmp_path / 'tokenizer.model')
  (tmp_path / 'tokenizer_config.json').write_text(json.dumps({'chat_template': TINY_TEMPLATE}))
  ours = tk.load(tmp_path)
  ids = ours.encode_chat(SINGLE_USER, add_generation_prompt=True)
  assert ids[0] == 1  # {{ bos_token }} became <s>, not the characters '<', 's', '>'.
  _check_chat(ours, _hf_load(tmp_path), SYSTEM_MULTI_TURN)


@pytest.mark.parametrize('model_type,vocab_size', [('unigram', 300), ('bpe', 400)])
@needs_data
def test_tiny_sentencepiece(model_type, vocab_size, tmp_path, texts):
  corpus = tmp_path / 'corpus.txt'
  lines = _gsm8k_texts(200)
  corpus.write_text('\n'.join(lines), encoding='utf-8')
  spm.SentencePieceTrainer.train(
      input=str(corpus), model_prefix=str(tmp_path / 'tiny'), vocab_size=vocab_size,
      model_type=model_type, character_coverage=1.0, byte_fallback=model_type == 'bpe',
      minloglevel=2)
  model = tmp_path / 'tiny.model'
  sp = spm.SentencePieceProcessor(model_file=str(model))
  ours = tk.load(model)
  assert ours.vocab_size == vocab_size and (ours.bos_id, ours.eos_id, ours.pad_id) == (1, 2, None)
  for t in lines[:40]:  # Normalized training text round-trips.
    assert ours.decode(ours.encode(t)) == ' '.join(t.split())
  for t in texts:
    if _has_specials(t):
      continue
    ids = sp.encode(t)
    assert ours.encode(t) == ids, t
    if sp.unk_id() not in ids:
      assert ours.decode(ids) == sp.decode(ids), t
  assert ours.encode_batch(lines[:5], add_special_tokens=True) == [sp.encode(t) for t in lines[:5]]


@needs_data
def test_sentencepiece_add_bos(tmp_path):
  shutil.copy(SP_MODEL, tmp_path / 'tokenizer.model')
  (tmp_path / 'tokenizer_config.json').write_text(
      json.dumps({'add_bos_token': True, 'add_eos_token': True}))
  ours = tk.load(tmp_path)
  assert ours.encode('Hello', add_special_tokens=True) == [1, 6774, 2]
  assert ours.encode('Hello') == [6774]
  assert_parity(ours, _hf_load(tmp_path), EXTRA_TEXTS)


# --- pad_left. ---


def test_pad_left():
  tokens, mask = tk.pad_left([[5, 6, 7], [8], [1, 2, 3, 4, 5]], buckets=(4, 8, 16), pad_id=0)
  np.testing.assert_array_equal(tokens, [[0, 0, 0, 0, 0, 5, 6, 7],
                                         [0, 0, 0, 0, 0, 0, 0, 8],
                                         [0, 0, 0, 1, 2, 3, 4, 5]])
  np.testing.assert_array_equal(mask, tokens != 0)
  assert tokens.dtype == np.int32 and mask.dtype == bool
  tokens, mask = tk.pad_left([[1, 2, 3, 4]], buckets=[8, 4], pad_id=-1)  # Exact fit, unsorted.
  assert tokens.tolist() == [[1, 2, 3, 4]] and mask.all()
  tokens, _ = tk.pad_left([np.array([3, 4])], buckets=[3], pad_id=9)
  assert tokens.tolist() == [[9, 3, 4]]


def test_pad_left_errors():
  with pytest.raises(ValueError, match=r'Row 1 has length 5, longer than the largest bucket 4'):
    tk.pad_left([[1], [1, 2, 3, 4, 5]], buckets=[2, 4], pad_id=0)
  with pytest.raises(ValueError, match='Row 2 is empty'):
    tk.pad_left([[1], [2], []], buckets=[4], pad_id=0)
  with pytest.raises(ValueError, match='pad_id'):
    tk.pad_left([[1]], buckets=[4], pad_id=None)
  with pytest.raises(ValueError):
    tk.pad_left([], buckets=[4], pad_id=0)


# --- Errors name the path. ---


def test_load_errors(tmp_path):
  with pytest.raises(FileNotFoundError, match='does not exist: .*nowhere'):
    tk.load(tmp_path / 'nowhere')
  with pytest.raises(FileNotFoundError, match=f'No tokenizer in {tmp_path}.*tokenizer.json'):
    tk.load(tmp_path)
  (tmp_path / 'vocab.json').write_text('{}')
  with pytest.raises(FileNotFoundError, match='merges.txt is missing'):
    tk.load(tmp_path)
  (tmp_path / 'merges.txt').write_text('#version: 0.2\n')
  (tmp_path / 'tokenizer_config.json').write_text('{"tokenizer_class": "GPT2Tokenizer"}')
  with pytest.raises(ValueError, match='only supported for Qwen2-style'):
    tk.load(tmp_path)
  (tmp_path / 'tokenizer_config.json').write_text('{not json')
  with pytest.raises(ValueError, match='Invalid JSON in .*tokenizer_config.json'):
    tk.load(tmp_path)
  (tmp_path / 'tokenizer_config.json').unlink()
  bad = tmp_path / 'bad.model'
  bad.write_bytes(b'not a model')
  with pytest.raises(ValueError, match='bad.model'):
    tk.load(bad)
  bad_json = tmp_path / 'sub' / 'tokenizer.json'
  bad_json.parent.mkdir()
  bad_json.write_text('{}')
  with pytest.raises(ValueError, match='tokenizer.json'):
    tk.load(bad_json.parent)


def test_character_tokenizer_round_trips_and_marks_unknowns():
  tok = tk.from_characters('0123456789+=,| \n')
  text = '12+34=46|5,0 1,1\n'
  ids = tok.encode(text)
  assert len(ids) == len(text) and tok.decode(ids) == text
  assert (tok.pad_id, tok.eos_id, tok.vocab_size) == (0, 1, 3 + 16)
  assert tok.eos_ids == frozenset({1})
  assert tok.decode(ids + [1, 0], skip_special_tokens=True) == text
  assert tok.encode('1a')[-1] == tok.token_to_id('<unk>') == 2
