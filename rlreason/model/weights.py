"""Hugging Face checkpoints (config.json + safetensors) in and out of transformer.py params.

  cfg = config_from_hf(json.load(open('config.json')))
  cfg, params = load(path, mesh=mesh, rules=sharding.TRAIN_RULES)
  save(out_path, cfg, params, dtype='bfloat16')

`load` streams one tensor at a time: it reads the tensor's bytes, converts it to
our layout and dtype, and places it straight into its target sharding before
reading the next, so host memory holds one tensor (in two layouts at most) at a
time. Everything that can be checked from the file headers (names, shapes,
dtypes) is checked first, and all problems are reported in one CheckpointError.
`save` gathers and writes one tensor at a time too, into a directory that
`transformers.AutoModelForCausalLM.from_pretrained` loads. Llama, Qwen2, Qwen3 and their MoE
variants Qwen2MoeForCausalLM / Qwen3MoeForCausalLM (one safetensors tensor per expert, as
save_pretrained writes them; stacked into [E, ...] leaves on load, so an MoE leaf's experts
are on the host together once).

Safetensors files are parsed by model/safetensors_io.py (no `safe_open(framework='numpy')`:
it has no bfloat16).

Deliberately not here: hub downloads, `pytorch_model.bin`, quantized or LoRA
checkpoints, sliding-window attention, RoPE types other than default and llama3,
optimizer state.
"""

import json
import math
import pathlib
from typing import Any

import jax
import ml_dtypes
import numpy as np

from rlreason.model import gguf_file
from rlreason.model import moe_config
from rlreason.model import safetensors_io
from rlreason.model import sharding as sharding_lib
from rlreason.model import transformer

_ARCHS = {'LlamaForCausalLM': 'llama', 'Qwen2ForCausalLM': 'qwen2', 'Qwen3ForCausalLM': 'qwen3',
          # MoE: the attention of their dense family, cfg.moe set.
          'Qwen2MoeForCausalLM': 'qwen2', 'Qwen3MoeForCausalLM': 'qwen3'}
_MODEL_TYPES = {'LlamaForCausalLM': 'llama', 'Qwen2ForCausalLM': 'qwen2',
                'Qwen3ForCausalLM': 'qwen3', 'Qwen2MoeForCausalLM': 'qwen2_moe',
                'Qwen3MoeForCausalLM': 'qwen3_moe'}
_TYPE_ARCH = {model_type: arch for arch, model_type in _MODEL_TYPES.items()}
_ROPE_TYPES = ('default', 'llama3')
# Re-exported: callers catch weights.CheckpointError.
CheckpointError = safetensors_io.CheckpointError


# ----------------------------------------------------------------------------- configs


def config_from_hf(hf_config: dict[str, Any], *, param_dtype: str = 'float32',
                   compute_dtype: str = 'float32', remat: str = 'none') -> transformer.ModelConfig:
  """ModelConfig from the contents of a HF config.json (transformers 4 or 5 style)."""
  c = hf_config
  archs = c.get('architectures') or []
  arch = archs[0] if len(archs) == 1 else _TYPE_ARCH.get(c.get('model_type'))
  if not isinstance(arch, str) or arch not in _ARCHS:
    raise CheckpointError(f'config.json: architectures={archs!r} (model_type='
                          f'{c.get("model_type")!r}) is not supported; supported: {sorted(_ARCHS)}.')
  family, model_type = _ARCHS[arch], _MODEL_TYPES[arch]
  if c.get('model_type') is not None and c['model_type'] != model_type:
    # transformers builds the class named by architectures; a model_type that disagrees
    # means a hand-edited or mixed-up config, whose other fields may be for either.
    raise CheckpointError(f'config.json: model_type={c["model_type"]!r} does not match '
                          f'architectures={archs!r} (which means model_type={model_type!r}).')
  moe = None
  if model_type.endswith('_moe'):
    try:
      moe = moe_config.moe_config_from_hf({**c, 'model_type': model_type})
    except ValueError as e:
      raise CheckpointError(f'config.json: {e}') from e
  _check_unsupported(c, family)

  rope = c.get('rope_parameters') or c.get('rope_scaling') or {}
  if any(isinstance(v, dict) for v in rope.values()):
    raise CheckpointError(f'config.json: per-layer-type rope_parameters {rope!r} are not supported.')
  rope_type = rope.get('rope_type', rope.get('type', 'default'))
  if rope_type not in _ROPE_TYPES:
    raise CheckpointError(f'config.json: rope_type={rope_type!r} is not supported; '
                          f'supported: {list(_ROPE_TYPES)}.')
  if rope.get('partial_rotary_factor', c.get('partial_rotary_factor', 1.0)) != 1.0:
    raise CheckpointError('config.json: partial_rotary_factor != 1 is not supported.')
  max_pos = c.get('max_position_embeddings', 4096)
  scaling = None
  if rope_type == 'llama3':
    scaling = transformer.Llama3RopeScaling(
        factor=float(rope['factor']), low_freq_factor=float(rope['low_freq_factor']),
        high_freq_factor=float(rope['high_freq_factor']),
        # transformers defaults the pretraining length to max_position_embeddings.
        original_max_position_embeddings=int(rope.get('original_max_position_embeddings', max_pos)))

  heads = c['num_attention_heads']
  return transformer.ModelConfig(
      vocab_size=c['vocab_size'], hidden_size=c['hidden_size'],
      intermediate_size=c['intermediate_size'], num_layers=c['num_hidden_layers'],
      num_heads=heads, num_kv_heads=c.get('num_key_value_heads') or heads,
      head_dim=c.get('head_dim') or c['hidden_size'] // heads,
      rms_norm_eps=c.get('rms_norm_eps', 1e-6),
      rope_theta=float(rope.get('rope_theta', c.get('rope_theta', 10_000.0))),
      # Qwen2-MoE's config has qkv_bias (default True); dense Qwen2 always has the biases.
      rope_scaling=scaling, qkv_bias=family == 'qwen2' and bool(c.get('qkv_bias', True)),
      qk_norm=family == 'qwen3', moe=moe,
      tie_embeddings=bool(c.get('tie_word_embeddings', False)), max_position_embeddings=max_pos,
      family=family, param_dtype=param_dtype, compute_dtype=compute_dtype, remat=remat)


def _check_unsupported(c: dict[str, Any], family: str):
  """Raises for config fields whose values transformer.py cannot reproduce."""
  bad = []
  if c.get('hidden_act', 'silu') != 'silu':
    bad.append(f"hidden_act={c['hidden_act']!r} (supported: 'silu')")
  # Llama's and Qwen3's attention_bias also puts a bias on o_proj, which transformer.py lacks.
  if family in ('llama', 'qwen3') and c.get('attention_bias', False):
    bad.append('attention_bias=True (it adds an o_proj bias; supported: False)')
  if c.get('mlp_bias', False):
    bad.append('mlp_bias=True (supported: False)')
  if c.get('use_sliding_window', False):
    bad.append('use_sliding_window=True (supported: False)')
  if 'sliding_attention' in (c.get('layer_types') or ()):
    bad.append("layer_types with 'sliding_attention' (supported: 'full_attention' only)")
  if bad:
    raise CheckpointError(f'config.json ({family}): unsupported settings: ' + '; '.join(bad) + '.')


def config_to_hf(cfg: transformer.ModelConfig, *, dtype: str | None = None) -> dict[str, Any]:
  """config.json contents for `cfg` that transformers 4 and 5 both read."""
  if cfg.family == 'qwen3' and (cfg.qkv_bias or not cfg.qk_norm):
    raise CheckpointError('export: family qwen3 needs qk_norm=True and qkv_bias=False.')
  if cfg.family in ('llama', 'qwen2') and cfg.qk_norm:
    raise CheckpointError(f'export: family {cfg.family} has no q/k norm; got qk_norm=True.')
  if cfg.family == 'llama' and cfg.qkv_bias:
    raise CheckpointError('export: HF Llama cannot hold a qkv bias without an o_proj bias; '
                          "use family='qwen2'.")
  if cfg.moe is not None and cfg.family == 'qwen3' and cfg.moe.shared_expert_intermediate_size:
    raise CheckpointError('export: Qwen3-MoE has no shared expert; got moe.'
                          f'shared_expert_intermediate_size={cfg.moe.shared_expert_intermediate_size}.')
  if cfg.moe is not None and cfg.family == 'qwen2' and not cfg.moe.shared_expert_intermediate_size:
    raise CheckpointError('export: HF Qwen2-MoE always has a shared expert; got moe.'
                          'shared_expert_intermediate_size=0.')
  arch = next(a for a, f in _ARCHS.items() if f == cfg.family and ('Moe' in a) == (cfg.moe is not None))
  dtype = dtype or cfg.param_dtype
  rope = {'rope_type': 'default', 'rope_theta': cfg.rope_theta}
  if cfg.rope_scaling is not None:
    s = cfg.rope_scaling
    rope.update(rope_type='llama3', factor=s.factor, low_freq_factor=s.low_freq_factor,
                high_freq_factor=s.high_freq_factor,
                original_max_position_embeddings=s.original_max_position_embeddings)
  out = {
      'architectures': [arch], 'model_type': _MODEL_TYPES[arch],
      'vocab_size': cfg.vocab_size, 'hidden_size': cfg.hidden_size,
      'intermediate_size': cfg.intermediate_size, 'num_hidden_layers': cfg.num_layers,
      'num_attention_heads': cfg.num_heads, 'num_key_value_heads': cfg.num_kv_heads,
      'head_dim': cfg.head_dim, 'hidden_act': 'silu',
      'max_position_embeddings': cfg.max_position_embeddings, 'rms_norm_eps': cfg.rms_norm_eps,
      'tie_word_embeddings': cfg.tie_embeddings, 'attention_dropout': 0.0, 'use_cache': True,
      # transformers 5 reads rope_parameters, 4.x and most servers rope_theta/rope_scaling.
      'rope_parameters': rope, 'rope_theta': cfg.rope_theta,
      'rope_scaling': None if cfg.rope_scaling is None else {
          k: v for k, v in rope.items() if k != 'rope_theta'},
      # Likewise 'dtype' (transformers 5) and 'torch_dtype' (4.x).
      'dtype': dtype, 'torch_dtype': dtype,
  }
  if cfg.family in ('llama', 'qwen3'):
    out['attention_bias'] = False
  if cfg.family == 'llama':
    out['mlp_bias'] = False
  else:
    out['use_sliding_window'] = False
  if cfg.moe is not None:
    m = cfg.moe
    out.update(num_experts=m.num_experts, num_experts_per_tok=m.num_experts_per_tok,
               moe_intermediate_size=m.moe_intermediate_size, norm_topk_prob=m.norm_topk_prob,
               decoder_sparse_step=m.decoder_sparse_step, mlp_only_layers=list(m.mlp_only_layers),
               router_aux_loss_coef=m.router_aux_loss_coef)
    if cfg.family == 'qwen2':
      out.update(qkv_bias=cfg.qkv_bias,
                 shared_expert_intermediate_size=m.shared_expert_intermediate_size)
  return out


# ----------------------------------------------------------------------------- tensor names


def _tensor_map(cfg: transformer.ModelConfig) -> dict[str, tuple[tuple[str, ...], tuple[int, ...], bool]]:
  """HF name -> (our params path, HF shape, whether our layout is the HF one transposed).

  A transposed tensor is a torch Linear weight [out, in]; ours is x.T reshaped to
  split heads ([D, H, Dh] for q/k/v, [H, Dh, D] for o), so the reshape is a view. A path
  ending in an int e names slice e of a stacked leaf (an MoE layer's expert e, stored by HF
  as one tensor per expert; moe_config.py has the names).
  """
  d, f, v, dh = cfg.hidden_size, cfg.intermediate_size, cfg.vocab_size, cfg.head_dim
  m = {'model.embed_tokens.weight': (('embed',), (v, d), False),
       'model.norm.weight': (('final_norm', 'scale'), (d,), False)}
  if not cfg.tie_embeddings:
    m['lm_head.weight'] = (('lm_head',), (v, d), True)
  for i in range(cfg.num_layers):
    p, ours = f'model.layers.{i}.', ('layers', str(i))
    m[p + 'input_layernorm.weight'] = (ours + ('attn_norm', 'scale'), (d,), False)
    m[p + 'post_attention_layernorm.weight'] = (ours + ('mlp_norm', 'scale'), (d,), False)
    for n, heads in (('q', cfg.num_heads), ('k', cfg.num_kv_heads), ('v', cfg.num_kv_heads)):
      m[f'{p}self_attn.{n}_proj.weight'] = (ours + ('attn', n), (heads * dh, d), True)
      if cfg.qkv_bias:
        m[f'{p}self_attn.{n}_proj.bias'] = (ours + ('attn', f'{n}_bias'), (heads * dh,), False)
    m[p + 'self_attn.o_proj.weight'] = (ours + ('attn', 'o'), (d, cfg.num_heads * dh), True)
    if cfg.qk_norm:
      for n in ('q', 'k'):
        m[f'{p}self_attn.{n}_norm.weight'] = (ours + ('attn', f'{n}_norm', 'scale'), (dh,), False)
    if cfg.moe is not None and moe_config.is_moe_layer(i, cfg.moe):
      m.update(moe_config.tensor_map(cfg.moe, hidden_size=d, prefix=p + 'mlp.',
                                     ours=ours + ('mlp',)))
      continue
    for n, shape in (('gate', (f, d)), ('up', (f, d)), ('down', (d, f))):
      m[f'{p}mlp.{n}_proj.weight'] = (ours + ('mlp', n), shape, True)
  return m


def _leaf_path(ours: tuple) -> tuple[tuple, int | None]:
  """(the params path of the leaf, the expert slice or None) of a _tensor_map path."""
  return (ours[:-1], ours[-1]) if isinstance(ours[-1], int) else (ours, None)


def tree_get(tree, path):
  """The leaf (or subtree) of nested dicts at a tuple of keys."""
  for key in path:
    tree = tree[key]
  return tree


def tree_set(tree, path, value):
  """Writes value at a tuple of keys, creating the dicts on the way (in place)."""
  for key in path[:-1]:
    tree = tree.setdefault(key, {})
  tree[path[-1]] = value


# ----------------------------------------------------------------------------- reading


def _check_entries(entries: dict[str, safetensors_io.Entry], tmap, cfg: transformer.ModelConfig, where: str):
  """Raises one CheckpointError listing every name, shape and dtype problem."""
  # Tied checkpoints may still carry lm_head.weight (transformers ties it to the embedding),
  # and older Llama exports carry the rotary buffer.
  ignored = {n for n in entries if n.endswith('.rotary_emb.inv_freq')}
  if cfg.tie_embeddings:
    ignored.add('lm_head.weight')
  problems = []
  missing = sorted(set(tmap) - set(entries))
  unexpected = sorted(set(entries) - set(tmap) - ignored)
  if missing:
    problems.append(f'missing tensors: {missing}')
  if unexpected:
    problems.append(f'unexpected tensors: {unexpected}')
  for name in sorted(set(tmap) & set(entries)):
    e, shape = entries[name], tmap[name][1]
    if e.dtype not in safetensors_io.DTYPES:
      problems.append(f'{name}: dtype {e.dtype} is not floating (supported: {sorted(safetensors_io.DTYPES)})')
    elif e.shape != shape:
      problems.append(f'{name}: shape mismatch, expected {list(shape)}, got {list(e.shape)}')
  if problems:
    raise CheckpointError(f'{where} does not match its config.json ({cfg.family}, '
                          f'{cfg.num_layers} layers):\n  ' + '\n  '.join(problems))


def _target_shardings(cfg, shardings, mesh, rules):
  if shardings is not None:
    if mesh is not None or rules is not None:
      raise ValueError('load: pass either shardings or mesh (+ rules), not both.')
    return shardings(cfg) if callable(shardings) else shardings
  if mesh is not None:
    return sharding_lib.param_shardings(cfg, mesh, rules or sharding_lib.TRAIN_RULES)
  if rules is not None:
    raise ValueError('load: rules need a mesh.')
  return None


def load(path, *, shardings=None, mesh=None, rules=None, param_dtype: str = 'float32',
         compute_dtype: str = 'float32') -> tuple[transformer.ModelConfig, transformer.Params]:
  """Reads a HF checkpoint directory into (ModelConfig, params).

  Args:
    path: directory with config.json and model.safetensors or an index with shards; or a
      `.gguf` file, also as 'pkg:<package>/<file>.gguf' (model/gguf_file.py).
    shardings: where to place the params: a tree like the params of Shardings, one
      Sharding for all, or a callable cfg -> tree (the config is only known once read).
    mesh: instead of `shardings`, shard by `rules` (default TRAIN_RULES) on this mesh.
    rules: logical-axis rules for `mesh`.
    param_dtype: dtype the params are cast to, 'float32' or 'bfloat16'.
    compute_dtype: the returned config's compute dtype.

  Returns:
    (cfg, params). Without shardings or mesh, params live on the default device.
  """
  if gguf_file.is_gguf(path):  # Dequantised tensors in HF names and layout (model/gguf_file.py).
    cfg, entries, read = gguf_file.open_checkpoint(path, param_dtype=param_dtype,
                                                   compute_dtype=compute_dtype)
  else:
    path = pathlib.Path(path)
    if not path.is_dir():
      raise CheckpointError(f'checkpoint directory {path} does not exist.')
    if not (path / 'config.json').is_file():
      raise CheckpointError(f'{path / "config.json"} does not exist.')
    cfg = config_from_hf(safetensors_io.read_json((path / 'config.json').read_text(), path / 'config.json'),
                         param_dtype=param_dtype, compute_dtype=compute_dtype)
    entries = safetensors_io.index_checkpoint(path)
    read = lambda name: safetensors_io.read_tensor(entries[name])
  tmap = _tensor_map(cfg)
  _check_entries(entries, tmap, cfg, str(path))
  targets = _target_shardings(cfg, shardings, mesh, rules)
  abstract = transformer.abstract_params(cfg)
  params, stacks = {}, {}  # stacks: an MoE leaf's host buffer and how many experts it holds.
  for name, (ours, _, transpose) in tmap.items():
    x = read(name)
    ours, expert = _leaf_path(ours)
    leaf = tree_get(abstract, ours)
    shape = leaf.shape if expert is None else leaf.shape[1:]
    # A view (transposes only permute strides); astype makes the one converted copy.
    x = (x.T if transpose else x).reshape(shape).astype(leaf.dtype, order='C')
    if expert is not None:  # Experts fill one host buffer; it is placed once all are in.
      buf, filled = stacks.get(ours) or (np.empty(leaf.shape, leaf.dtype), 0)
      buf[expert] = x
      stacks[ours] = (buf, filled + 1)
      if filled + 1 < leaf.shape[0]:
        continue
      x = stacks.pop(ours)[0]
    target = targets if targets is None or isinstance(targets, jax.sharding.Sharding) else tree_get(
        targets, ours)
    # Wait for the copy so the host buffer is free before the next tensor is read.
    tree_set(params, ours, jax.device_put(x, target).block_until_ready())
    del x
  return cfg, params


# ----------------------------------------------------------------------------- writing


def save(path, cfg: transformer.ModelConfig, params: transformer.Params, *, dtype: str | None = None,
         max_shard_bytes: int = 5 * 10**9):
  """Writes params as a HF checkpoint directory (config.json + safetensors).

  Args:
    path: output directory, created if needed; its old model*.safetensors are removed.
    cfg: the architecture; cfg.family picks the HF class.
    params: as from init_params or load, sharded or not (single-process: each array
      must be fully addressable here).
    dtype: 'float32', 'bfloat16' or 'float16'; defaults to cfg.param_dtype.
    max_shard_bytes: above this many bytes the tensors go to several files plus
      model.safetensors.index.json (a tensor larger than this gets a file to itself).
  """
  dtype = dtype or cfg.param_dtype
  if dtype not in ('float32', 'bfloat16', 'float16'):
    raise ValueError(f"save: dtype={dtype!r}; supported: 'float32', 'bfloat16', 'float16'.")
  np_dtype = np.dtype(ml_dtypes.bfloat16 if dtype == 'bfloat16' else dtype)
  hf_config = config_to_hf(cfg, dtype=dtype)
  tmap = _tensor_map(cfg)
  _check_params(params, tmap, cfg)
  if cfg.family == 'qwen2' and not cfg.qkv_bias and cfg.moe is None:  # HF Qwen2 always has
    # q/k/v biases: write zeros (Qwen2-MoE's config says qkv_bias=False instead).
    for i in range(cfg.num_layers):
      for n, heads in (('q', cfg.num_heads), ('k', cfg.num_kv_heads), ('v', cfg.num_kv_heads)):
        tmap[f'model.layers.{i}.self_attn.{n}_proj.bias'] = (None, (heads * cfg.head_dim,), False)

  shards, size = [[]], 0  # Plan files from shapes alone, so each tensor is fetched once.
  for name, (_, shape, _) in tmap.items():
    nbytes = math.prod(shape) * np_dtype.itemsize
    if shards[-1] and size + nbytes > max_shard_bytes:
      shards.append([])
      size = 0
    shards[-1].append(name)
    size += nbytes

  path = pathlib.Path(path)
  path.mkdir(parents=True, exist_ok=True)
  for old in [*path.glob('model*.safetensors'), path / safetensors_io.INDEX]:
    old.unlink(missing_ok=True)  # A stale model.safetensors would shadow a new index.
  (path / 'config.json').write_text(json.dumps(hf_config, indent=2) + '\n')
  names = ([safetensors_io.SINGLE] if len(shards) == 1 else
           [f'model-{i + 1:05d}-of-{len(shards):05d}.safetensors' for i in range(len(shards))])
  weight_map = {}
  for file_name, shard in zip(names, shards):
    _write_file(path / file_name, shard, tmap, params, np_dtype)
    weight_map.update({n: file_name for n in shard})
  if len(shards) > 1:
    total = sum(math.prod(tmap[n][1]) * np_dtype.itemsize for n in weight_map)
    index = {'metadata': {'total_size': total}, 'weight_map': dict(sorted(weight_map.items()))}
    (path / safetensors_io.INDEX).write_text(json.dumps(index, indent=2) + '\n')


def _check_params(params, tmap, cfg):
  problems, abstract = [], transformer.abstract_params(cfg)
  for ours in dict.fromkeys(_leaf_path(o)[0] for o, _, _ in tmap.values()):
    want = tree_get(abstract, ours).shape
    try:
      got = tuple(tree_get(params, ours).shape)
    except (KeyError, TypeError):
      got = 'missing'
    if got != want:
      problems.append(f'params{list(ours)}: expected shape {list(want)}, got {got}')
  if problems:
    raise CheckpointError('save: params do not match the config:\n  ' + '\n  '.join(problems))


def _write_file(file: pathlib.Path, names, tmap, params, np_dtype: np.dtype):
  header, offset = {'__metadata__': {'format': 'pt'}}, 0  # transformers wants format=pt.
  for name in names:
    shape = tmap[name][1]
    nbytes = math.prod(shape) * np_dtype.itemsize
    header[name] = {'dtype': safetensors_io.DTYPE_NAMES[np_dtype], 'shape': list(shape),
                    'data_offsets': [offset, offset + nbytes]}
    offset += nbytes
  raw = json.dumps(header, separators=(',', ':')).encode()
  raw += b' ' * (-len(raw) % 8)  # Keeps tensor data 8-byte aligned, as safetensors does.
  with open(file, 'wb') as fh:
    fh.write(len(raw).to_bytes(8, 'little'))
    fh.write(raw)
    stacked = (None, None)  # The last MoE leaf gathered, so its experts are fetched once.
    for name in names:
      ours, shape, transpose = tmap[name]
      if ours is None:
        x = np.zeros(shape, np_dtype)
      else:
        ours, expert = _leaf_path(ours)
        if expert is None:
          x = np.asarray(jax.device_get(tree_get(params, ours)))  # Gathers one tensor to host.
        else:
          if stacked[0] != ours:
            stacked = (ours, np.asarray(jax.device_get(tree_get(params, ours))))
          x = stacked[1][expert]
        x = (x.reshape(shape[::-1]).T if transpose else x.reshape(shape))
        x = x.astype(np_dtype, order='C')
      fh.write(x.reshape(-1).view(np.uint8).data)
