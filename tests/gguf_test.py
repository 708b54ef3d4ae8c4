"""GGUF model source on small files written here with gguf.GGUFWriter: every tensor type against
the gguf package's own dequantisation, llama.cpp's q/k permutation undone, the same weights
through the HF path, the tokenizer and template from the metadata, the converter, bad input."""

import functools

import gguf
import jax
import ml_dtypes
import numpy as np
import pytest
import safetensors.numpy
import torch
import transformers

from rlreason.model import gguf_convert
from rlreason.model import gguf_file
from rlreason.model import tokenizer
from rlreason.model import transformer
from rlreason.model import weights

Q = gguf.GGMLQuantizationType
# A byte-level vocabulary: the 256 byte characters, three merges, three control tokens.
_MERGES = ['Ġ t', 'h e', 'Ġt he']
_SPECIALS = ['<|endoftext|>', '<|im_start|>', '<|im_end|>']
_TEMPLATE = ("{% for m in messages %}{{ '<|im_start|>' + m['role'] + '\\n' + m['content'] + "
             "'<|im_end|>\\n' }}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}"
             '{% endif %}')


def _byte_tokens():
  kept = [*range(ord('!'), ord('~') + 1), *range(ord('¡'), ord('¬') + 1), *range(ord('®'), ord('ÿ') + 1)]
  moved = [b for b in range(256) if b not in kept]
  return [chr(b) for b in kept] + [chr(256 + n) for n in range(len(moved))]


TOKENS = _SPECIALS + _byte_tokens() + ['Ġt', 'he', 'Ġthe']
TYPES = [3] * len(_SPECIALS) + [1] * (len(TOKENS) - len(_SPECIALS))


def _cfg(family, d=64, layers=2, heads=4, kv=2, f=96):
  return transformer.ModelConfig(vocab_size=len(TOKENS), hidden_size=d, intermediate_size=f,
                                 num_layers=layers, num_heads=heads, num_kv_heads=kv,
                                 head_dim=d // heads, rms_norm_eps=1e-5, rope_theta=5e4,
                                 qkv_bias=family == 'qwen2', qk_norm=family == 'qwen3',
                                 tie_embeddings=family != 'qwen3', max_position_embeddings=128,
                                 family=family)


def llamacpp_permute(w, n_head):
  """convert_hf_to_gguf.py's LlamaModel.permute (HF rotate-half rows -> interleaved)."""
  return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def _hf_tensors(cfg, tmp_path):
  """Random weights in HF names and layout, written through weights.save (the HF path)."""
  params = transformer.init_params(cfg, jax.random.key(0))
  params = jax.tree.map(lambda x: x * 3 if x.ndim > 1 else x + 0.1 * _normal(x.shape), params)
  path = tmp_path / f'hf_{cfg.family}'
  weights.save(path, cfg, params, dtype='float32')
  return path, safetensors.numpy.load_file(path / 'model.safetensors')


def _normal(shape):
  return np.random.default_rng(sum(shape)).normal(size=shape).astype(np.float32)


_TO_GGUF = {'model.embed_tokens.weight': 'token_embd.weight', 'model.norm.weight': 'output_norm.weight',
            'lm_head.weight': 'output.weight'}
_LAYER = {v: k for k, v in gguf_file._LAYER_NAMES.items()}


def _gguf_name(hf):
  if hf in _TO_GGUF:
    return _TO_GGUF[hf]
  _, _, i, rest = hf.split('.', 3)
  return f'blk.{i}.{_LAYER[rest]}'


def _write(path, cfg, tensors, *, qtype=Q.F32, drop=(), arch=None, tokenizer_meta=True,
           raw=None, extra=None, pre='default'):
  """A GGUF file as llama.cpp's converter writes it: q/k rows permuted for llama, 2-D weights
  in `qtype` (quantised by gguf.quants), norms and biases F32. `raw` maps GGUF names to
  (bytes array, type) written as given; `drop` leaves metadata keys out."""
  arch = arch or cfg.family
  w = gguf.GGUFWriter(str(path), arch)
  keys = {'block_count': cfg.num_layers, 'context_length': cfg.max_position_embeddings,
          'embedding_length': cfg.hidden_size, 'feed_forward_length': cfg.intermediate_size,
          'attention.head_count': cfg.num_heads, 'attention.head_count_kv': cfg.num_kv_heads,
          'attention.layer_norm_rms_epsilon': cfg.rms_norm_eps, 'rope.freq_base': cfg.rope_theta,
          **(extra or {})}
  for key, value in keys.items():
    if key in drop:
      continue
    (w.add_float32 if isinstance(value, float) else w.add_uint32)(f'{arch}.{key}', value)
  if tokenizer_meta:
    w.add_tokenizer_model('gpt2')
    w.add_tokenizer_pre(pre)
    w.add_token_list(TOKENS)
    w.add_token_types(TYPES)
    w.add_token_merges(_MERGES)
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    w.add_pad_token_id(0)
    w.add_eot_token_id(0)
    w.add_add_bos_token(True)
    w.add_chat_template(_TEMPLATE)
  for hf, x in tensors.items():
    name = _gguf_name(hf)
    if raw and name in raw:
      data, t = raw[name]
      w.add_tensor(name, data, raw_dtype=t)
      continue
    if arch == 'llama' and hf.endswith(('q_proj.weight', 'k_proj.weight')):
      x = llamacpp_permute(x, cfg.num_heads if 'q_proj' in hf else cfg.num_kv_heads)
    if x.ndim == 1 or qtype == Q.F32:
      w.add_tensor(name, np.ascontiguousarray(x, np.float32))
    else:
      w.add_tensor(name, gguf.quants.quantize(np.ascontiguousarray(x, np.float32), qtype),
                   raw_dtype=qtype)
  w.write_header_to_file()
  w.write_kv_data_to_file()
  w.write_tensors_to_file()
  w.close()
  return path


def _by_hf_name(cfg, params):
  """Our params in HF names and layout (weights.save's inverse map)."""
  out = {}
  for hf, (ours, shape, transpose) in weights._tensor_map(cfg).items():
    x = np.asarray(weights.tree_get(params, ours))
    out[hf] = x.reshape(shape[::-1]).T if transpose else x.reshape(shape)
  return out


def test_unpermute_inverts_llamacpp_permute():
  rng = np.random.default_rng(0)
  for heads, dh, cols in ((4, 8, 16), (3, 64, 5), (1, 2, 1)):
    w = rng.normal(size=(heads * dh, cols)).astype(np.float32)
    np.testing.assert_array_equal(gguf_file.unpermute_rotary_rows(llamacpp_permute(w, heads), heads), w)
    b = rng.normal(size=(heads * dh,)).astype(np.float32)  # Biases are permuted the same way.
    np.testing.assert_array_equal(gguf_file.unpermute_rotary_rows(llamacpp_permute(b, heads), heads), b)
  w = np.arange(8 * 2).reshape(8, 2)  # One head of 8: rows 0..3 (first halves), 4..7 (second).
  assert llamacpp_permute(w, 1)[:, 0].tolist() == [0, 8, 2, 10, 4, 12, 6, 14]


@pytest.mark.parametrize('family', ['llama', 'qwen2', 'qwen3'])
def test_f32_gguf_equals_the_hf_path(family, tmp_path):
  cfg = _cfg(family)
  hf_dir, hf = _hf_tensors(cfg, tmp_path)
  path = _write(tmp_path / 'm.gguf', cfg, hf)
  got_cfg, got = weights.load(path)
  want_cfg, want = weights.load(hf_dir)
  assert got_cfg.rms_norm_eps == pytest.approx(1e-5)  # Stored as float32.
  assert got_cfg.replace(rms_norm_eps=want_cfg.rms_norm_eps) == want_cfg
  jax.tree.map(np.testing.assert_array_equal, got, want)
  assert got_cfg.tie_embeddings == (family != 'qwen3')


_QUANTISABLE = [Q.F32, Q.F16, Q.BF16, Q.Q8_0, Q.Q4_0, Q.Q4_1, Q.Q5_0, Q.Q5_1]
_K_QUANTS = [Q.Q2_K, Q.Q3_K, Q.Q4_K, Q.Q5_K, Q.Q6_K]


@pytest.mark.parametrize('qtype', _QUANTISABLE, ids=lambda q: q.name)
def test_quantised_llama_equals_gguf_dequantisation(qtype, tmp_path):
  cfg = _cfg('llama', d=64, layers=1, f=64)
  _, hf = _hf_tensors(cfg, tmp_path)
  _, params = weights.load(_write(tmp_path / 'm.gguf', cfg, hf, qtype=qtype))
  got = _by_hf_name(cfg, params)
  for name, x in hf.items():
    # Quantisation blocks run along rows, so it commutes with the row permutation: the
    # expected value is the gguf package's round trip of the HF-order weight.
    want = x if x.ndim == 1 else gguf.quants.dequantize(gguf.quants.quantize(x, qtype), qtype)
    np.testing.assert_array_equal(got[name], want, err_msg=f'{qtype.name} {name}')
  if qtype != Q.F32:
    assert any(not np.array_equal(got[n], hf[n]) for n in hf)  # Really quantised.


@pytest.mark.parametrize('qtype', _K_QUANTS, ids=lambda q: q.name)
def test_k_quants_read_as_gguf_dequantises_them(qtype, tmp_path):
  """Random blocks (bytes < 0x7c: finite fp16 scales); rows are 256 wide, one K block."""
  cfg = _cfg('llama', d=256, layers=1, heads=4, kv=2, f=256)
  _, hf = _hf_tensors(cfg, tmp_path)
  rng, raw, want = np.random.default_rng(1), {}, {}
  block, size = gguf.GGML_QUANT_SIZES[qtype]
  for name, x in hf.items():
    if x.ndim == 2:
      data = rng.integers(0, 0x7c, size=(x.shape[0], x.shape[1] // block * size), dtype=np.uint8)
      raw[_gguf_name(name)] = (data, qtype)
      deq = gguf.quants.dequantize(data, qtype)
      if name.endswith(('q_proj.weight', 'k_proj.weight')):  # Undo the permutation by its indices.
        heads = cfg.num_heads if 'q_proj' in name else cfg.num_kv_heads
        deq = deq[np.argsort(llamacpp_permute(np.arange(x.shape[0]), heads))]
      want[name] = deq
  _, params = weights.load(_write(tmp_path / 'm.gguf', cfg, hf, raw=raw))
  got = _by_hf_name(cfg, params)
  for name, x in want.items():
    assert np.isfinite(x).all()
    np.testing.assert_array_equal(got[name], x, err_msg=f'{qtype.name} {name}')


def test_bfloat16_params_and_pkg_paths(tmp_path, monkeypatch):
  cfg = _cfg('llama')
  _, hf = _hf_tensors(cfg, tmp_path)
  pkg = tmp_path / 'site' / 'fake_models_pkg'
  pkg.mkdir(parents=True)
  (pkg / '__init__.py').write_text('raise ImportError("must not be imported")\n')
  _write(pkg / 'm.gguf', cfg, hf)
  monkeypatch.syspath_prepend(str(tmp_path / 'site'))
  got_cfg, params = weights.load('pkg:fake_models_pkg/m.gguf', param_dtype='bfloat16')
  assert params['embed'].dtype == ml_dtypes.bfloat16 and got_cfg.param_dtype == 'bfloat16'
  tok = tokenizer.load('pkg:fake_models_pkg/m.gguf')
  assert tok.bos_id == 1
  with pytest.raises(weights.CheckpointError, match="package 'no_such_pkg_s7' is not installed"):
    weights.load('pkg:no_such_pkg_s7/m.gguf')


@pytest.mark.parametrize('pre', ['default', 'smollm', 'qwen2', 'llama-bpe'])
def test_tokenizer_and_template_from_metadata(pre, tmp_path):
  cfg = _cfg('llama', layers=1)
  _, hf = _hf_tensors(cfg, tmp_path)
  path = _write(tmp_path / 'm.gguf', cfg, hf, pre=pre)
  tok = tokenizer.load(path)
  assert (tok.bos_id, tok.eos_id, tok.pad_id) == (1, 2, 0)
  assert tok.eos_ids == {2, 0}  # eos and llama.cpp's end-of-turn token.
  assert tok.special_tokens['eos_token'] == '<|im_end|>'
  ids = tok.encode(' the<|im_end|>x')
  assert [tok.id_to_token(i) for i in ids] == ['Ġthe', '<|im_end|>', 'x']
  assert tok.encode('x', add_special_tokens=True) == [1, tok.token_to_id('x')]  # add_bos_token.
  assert tok.decode(ids) == ' the<|im_end|>x'
  msgs = [{'role': 'user', 'content': 'hi'}]
  assert tok.apply_chat_template(msgs, add_generation_prompt=True) == (
      '<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n')
  hf_tok = transformers.AutoTokenizer.from_pretrained(str(tmp_path), gguf_file='m.gguf')
  # (No digits after a run of spaces: there 'smollm' splits as llama.cpp, transformers as GPT-2.)
  for text in ['the theme', ' then  the\n\tthe ', 'é🤖 12 the 345', '<|im_start|>the<|im_end|>']:
    assert tok.encode(text) == hf_tok.encode(text, add_special_tokens=False), text
    assert tok.encode(text, add_special_tokens=True) == hf_tok.encode(text), text


def test_converter_writes_a_directory_transformers_loads(tmp_path):
  cfg = _cfg('llama')
  _, hf = _hf_tensors(cfg, tmp_path)
  path = _write(tmp_path / 'm.gguf', cfg, hf, qtype=Q.Q8_0)
  gguf_convert.main([str(path), str(tmp_path / 'out')])
  model = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / 'out').eval()
  hf_tok = transformers.AutoTokenizer.from_pretrained(tmp_path / 'out')
  tok = tokenizer.load(path)
  text = tok.apply_chat_template([{'role': 'user', 'content': 'the 42'}], add_generation_prompt=True)
  assert hf_tok.apply_chat_template([{'role': 'user', 'content': 'the 42'}], tokenize=False,
                                    add_generation_prompt=True) == text
  ids = tok.encode(text, add_special_tokens=True)
  assert hf_tok.encode(text) == ids and ids[0] == 1
  got_cfg, params = weights.load(path)
  got = np.asarray(jax.jit(functools.partial(transformer.apply, cfg=got_cfg))(params, np.array([ids]))[0])
  with torch.no_grad():
    want = model(input_ids=torch.tensor([ids])).logits.numpy()
  assert np.abs(got - want).max() <= 1e-4
  assert model.generation_config.eos_token_id in (2, [0, 2])


def _error(tmp_path, **kw):
  cfg = _cfg('llama', layers=1)
  _, hf = _hf_tensors(cfg, tmp_path)
  with pytest.raises(weights.CheckpointError) as e:
    weights.load(_write(tmp_path / 'bad.gguf', cfg, hf, **kw))
  message = str(e.value)
  assert '\n' not in message
  return message


def test_bad_input_errors(tmp_path):
  assert "architecture 'gpt2' is not supported; supported: ['llama', 'qwen2', 'qwen3']" in _error(
      tmp_path, arch='gpt2')
  assert "metadata key 'llama.feed_forward_length' is missing" in _error(
      tmp_path, drop=('feed_forward_length',))
  i8 = np.zeros((64, 64), np.int8)
  assert 'tensor blk.0.attn_v.weight: type I8 is not supported' in _error(
      tmp_path, raw={'blk.0.attn_v.weight': (i8, Q.I8)})
  assert 'rope.dimension_count=8 (partial rotary)' in _error(tmp_path, extra={'rope.dimension_count': 8})
  good = _write(tmp_path / 'good.gguf', _cfg('llama', layers=1), _hf_tensors(_cfg('llama', layers=1), tmp_path)[1])
  data = good.read_bytes()
  for cut in (len(data) - 100, 200, 3):
    (tmp_path / 'cut.gguf').write_bytes(data[:cut])
    with pytest.raises(weights.CheckpointError, match='is it truncated') as e:
      weights.load(tmp_path / 'cut.gguf')
    assert '\n' not in str(e.value)
  with pytest.raises(weights.CheckpointError, match='does not exist'):
    weights.load(tmp_path / 'missing.gguf')


def test_unsupported_tokenizer_is_named(tmp_path):
  cfg = _cfg('llama', layers=1)
  _, hf = _hf_tensors(cfg, tmp_path)
  path = _write(tmp_path / 'm.gguf', cfg, hf, tokenizer_meta=False)
  with pytest.raises(ValueError, match="metadata key 'tokenizer.ggml.model' is missing"):
    tokenizer.load(path)
