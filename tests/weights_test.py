"""HF checkpoint import/export: round trips through transformers, sharding, errors."""

import functools
import json
import re

import jax
import ml_dtypes
import numpy as np
import pytest
import safetensors.numpy
import safetensors.torch
import torch
import transformers

from rlreason.model import safetensors_io
from rlreason.model import sharding
from rlreason.model import transformer
from rlreason.model import weights

_LLAMA3 = transformer.Llama3RopeScaling(factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0,
                                  original_max_position_embeddings=16)


def _cfg(family, **kw):
  base = dict(vocab_size=128, hidden_size=32, intermediate_size=64, num_layers=2, num_heads=4,
              num_kv_heads=2, head_dim=8, family=family, qkv_bias=family == 'qwen2',
              qk_norm=family == 'qwen3', max_position_embeddings=256)
  return transformer.ModelConfig(**(base | kw))


CONFIGS = {
    'llama3': _cfg('llama', rope_theta=100.0, rope_scaling=_LLAMA3),
    'qwen2': _cfg('qwen2', rope_theta=1e6),
    'qwen2_nobias_tied': _cfg('qwen2', qkv_bias=False, tie_embeddings=True, num_kv_heads=4),
    'qwen3_tied': _cfg('qwen3', head_dim=16, num_kv_heads=1, tie_embeddings=True),
}


def _random_params(cfg, seed=0):
  """init_params with every leaf redrawn: non-unit norms and non-zero biases show layout bugs."""
  params = transformer.init_params(cfg, jax.random.key(seed))
  leaves, treedef = jax.tree_util.tree_flatten_with_path(params)
  keys = jax.random.split(jax.random.key(seed + 1), len(leaves))
  new = [(1.0 if 'norm' in jax.tree_util.keystr(path) else 0.0) +
         (0.3 if 'norm' in jax.tree_util.keystr(path) else 0.15) * jax.random.normal(k, x.shape)
         for (path, x), k in zip(leaves, keys)]
  return jax.tree.unflatten(treedef, new)


def _batch(vocab, t=20):
  tokens_NxT = np.random.default_rng(1).integers(0, vocab, size=(2, t))
  mask_NxT = np.ones((2, t), bool)
  mask_NxT[0, :4] = False
  return tokens_NxT, mask_NxT


def _our_logits(cfg, params, tokens_NxT, mask_NxT):
  logits, _ = jax.jit(functools.partial(transformer.apply, cfg=cfg))(params, tokens_NxT, mask_NxT=mask_NxT)
  return np.asarray(logits)


def _hf_logits(path, tokens_NxT, mask_NxT, dtype=torch.float32):
  hf_model = transformers.AutoModelForCausalLM.from_pretrained(
      path, dtype=dtype, attn_implementation='eager').eval()
  positions_NxT = np.maximum(np.cumsum(mask_NxT, axis=1) - 1, 0)  # transformer.default_positions.
  with torch.no_grad():
    return hf_model(input_ids=torch.tensor(tokens_NxT), attention_mask=torch.tensor(mask_NxT),
                    position_ids=torch.tensor(positions_NxT)).logits.float().numpy(), hf_model


def _assert_trees_equal(a, b):
  assert jax.tree.structure(a) == jax.tree.structure(b)
  for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)):
    assert x.dtype == y.dtype and x.shape == y.shape
    np.testing.assert_array_equal(np.asarray(x), np.asarray(y))


def _rewrite(file, edit):
  """Applies edit(dict of numpy tensors) to a safetensors file in place."""
  tensors = safetensors.numpy.load_file(file)
  edit(tensors)
  safetensors.numpy.save_file(tensors, file, metadata={'format': 'pt'})


@pytest.fixture(name='saved')
def _saved(tmp_path):
  cfg = CONFIGS['qwen2']
  params = _random_params(cfg)
  weights.save(tmp_path / 'ckpt', cfg, params)
  return cfg, params, tmp_path / 'ckpt'


# ----------------------------------------------------------------------------- round trips


@pytest.mark.parametrize('name', sorted(CONFIGS))
def test_export_matches_transformers(name, tmp_path):
  cfg = CONFIGS[name]
  params = _random_params(cfg)
  weights.save(tmp_path, cfg, params)
  hf_config = json.loads((tmp_path / 'config.json').read_text())
  assert hf_config['architectures'] == [weights.config_to_hf(cfg)['architectures'][0]]
  assert hf_config['model_type'] == cfg.family and hf_config['dtype'] == 'float32'
  names = safetensors.numpy.load_file(tmp_path / 'model.safetensors').keys()
  assert ('lm_head.weight' in names) != cfg.tie_embeddings

  tokens_NxT, mask_NxT = _batch(cfg.vocab_size)
  want, _ = _hf_logits(tmp_path, tokens_NxT, mask_NxT)
  got = _our_logits(cfg, params, tokens_NxT, mask_NxT)
  assert want.std() > 0.3
  assert np.abs(got - want)[mask_NxT].max() <= 1e-4

  cfg2, params2 = weights.load(tmp_path)
  if cfg.family == 'qwen2' and not cfg.qkv_bias:  # HF Qwen2 always has biases; ours are zeros.
    assert cfg2 == cfg.replace(qkv_bias=True)
    assert not np.asarray(params2['layers']['1']['attn']['k_bias']).any()
    np.testing.assert_array_equal(_our_logits(cfg2, params2, tokens_NxT, mask_NxT), got)
  else:
    assert cfg2 == cfg
    _assert_trees_equal(params2, params)


def test_config_round_trip_and_legacy_rope_fields():
  for cfg in CONFIGS.values():
    if cfg.qkv_bias or cfg.family != 'qwen2':
      assert weights.config_from_hf(weights.config_to_hf(cfg)) == cfg
  legacy = weights.config_to_hf(CONFIGS['llama3'])
  del legacy['rope_parameters']
  legacy['rope_scaling'] = {'type': 'llama3', 'factor': 8.0, 'low_freq_factor': 1.0,
                            'high_freq_factor': 4.0, 'original_max_position_embeddings': 16}
  assert weights.config_from_hf(legacy) == CONFIGS['llama3']
  v5 = weights.config_to_hf(CONFIGS['qwen2'])
  del v5['rope_theta'], v5['rope_scaling'], v5['head_dim']
  cfg = weights.config_from_hf(v5, param_dtype='bfloat16', remat='full')
  assert cfg == CONFIGS['qwen2'].replace(param_dtype='bfloat16', remat='full')


def test_index_sharded_save(saved, tmp_path):
  cfg, params, single = saved
  weights.save(tmp_path / 'sharded', cfg, params, max_shard_bytes=20_000)
  index = json.loads((tmp_path / 'sharded' / 'model.safetensors.index.json').read_text())
  files = sorted(set(index['weight_map'].values()))
  assert len(files) > 2 and not (tmp_path / 'sharded' / 'model.safetensors').exists()
  assert sorted(p.name for p in (tmp_path / 'sharded').glob('*.safetensors')) == files

  cfg2, params2 = weights.load(tmp_path / 'sharded')
  assert cfg2 == cfg
  _assert_trees_equal(params2, params)
  tokens_NxT, mask_NxT = _batch(cfg.vocab_size)
  logits_sharded, hf_sharded = _hf_logits(tmp_path / 'sharded', tokens_NxT, mask_NxT)
  logits_single, hf_single = _hf_logits(single, tokens_NxT, mask_NxT)
  single_state = hf_single.state_dict()
  for name, value in hf_sharded.state_dict().items():
    assert torch.equal(value, single_state[name]), name
  np.testing.assert_array_equal(logits_sharded, logits_single)


def test_load_onto_mesh(saved):
  cfg, params, path = saved
  mesh = sharding.make_mesh({'fsdp': 2, 'tensor': 4})
  expected = sharding.param_shardings(cfg, mesh, sharding.TRAIN_RULES)
  _, on_mesh = weights.load(path, mesh=mesh, rules=sharding.TRAIN_RULES)
  _, by_callable = weights.load(
      path, shardings=lambda c: sharding.param_shardings(c, mesh, sharding.TRAIN_RULES))
  for tree in (on_mesh, by_callable):
    jax.tree.map(lambda x, s: assert_sharding(x, s), tree, expected)
    _assert_trees_equal(tree, params)
  assert on_mesh['embed'].sharding.spec == jax.sharding.PartitionSpec('tensor', 'fsdp')
  assert len(on_mesh['layers']['0']['mlp']['up'].addressable_shards) == 8


def assert_sharding(x, s):
  assert x.sharding == s, (x.sharding, s)


def test_bf16_checkpoint(tmp_path):
  torch.manual_seed(0)
  hf_model = transformers.Qwen3ForCausalLM(transformers.Qwen3Config(
      vocab_size=128, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
      num_attention_heads=4, num_key_value_heads=2, head_dim=16, tie_word_embeddings=False))
  with torch.no_grad():
    for p in hf_model.parameters():
      p.add_(0.1 * torch.randn_like(p))
  hf_model.to(torch.bfloat16).save_pretrained(tmp_path / 'hf', safe_serialization=True)
  state = {k: v.float().numpy() for k, v in hf_model.state_dict().items()}

  cfg, params = weights.load(tmp_path / 'hf', param_dtype='bfloat16')
  assert cfg.param_dtype == 'bfloat16'
  assert all(x.dtype == ml_dtypes.bfloat16 for x in jax.tree.leaves(params))
  _, params32 = weights.load(tmp_path / 'hf')  # bf16 -> fp32 is exact.
  layer = params32['layers']['1']
  np.testing.assert_array_equal(params32['embed'], state['model.embed_tokens.weight'])
  np.testing.assert_array_equal(params32['lm_head'], state['lm_head.weight'].T)
  np.testing.assert_array_equal(layer['attn']['q'], state['model.layers.1.self_attn.q_proj.weight']
                                .T.reshape(32, 4, 16))
  np.testing.assert_array_equal(layer['attn']['o'], state['model.layers.1.self_attn.o_proj.weight']
                                .T.reshape(4, 16, 32))
  np.testing.assert_array_equal(layer['attn']['k_norm']['scale'],
                                state['model.layers.1.self_attn.k_norm.weight'])
  np.testing.assert_array_equal(layer['mlp']['down'], state['model.layers.1.mlp.down_proj.weight'].T)
  _assert_trees_equal(jax.tree.map(lambda x: np.asarray(x, np.float32), params), params32)

  weights.save(tmp_path / 'ours', cfg, params)  # And back out, bit for bit.
  theirs = safetensors.torch.load_file(tmp_path / 'hf' / 'model.safetensors')
  ours = safetensors.torch.load_file(tmp_path / 'ours' / 'model.safetensors')
  assert sorted(ours) == sorted(theirs)
  for name, value in theirs.items():
    assert value.dtype == torch.bfloat16 and torch.equal(ours[name], value), name


def test_tied_checkpoint_with_lm_head_present(tmp_path):
  cfg = CONFIGS['qwen3_tied']
  params = _random_params(cfg)
  weights.save(tmp_path, cfg, params)
  _rewrite(tmp_path / 'model.safetensors', lambda t: t.update(
      {'lm_head.weight': t['model.embed_tokens.weight']}))
  _, params2 = weights.load(tmp_path)
  _assert_trees_equal(params2, params)


# ----------------------------------------------------------------------------- errors


def test_wrong_shape_names_tensor(saved):
  _, _, path = saved
  _rewrite(path / 'model.safetensors', lambda t: t.update(
      {'model.layers.1.mlp.up_proj.weight': np.zeros((64, 31), np.float32)}))
  with pytest.raises(weights.CheckpointError, match=re.escape(
      'model.layers.1.mlp.up_proj.weight: shape mismatch, expected [64, 32], got [64, 31]')):
    weights.load(path)


def test_missing_and_unexpected_listed_together(saved):
  _, _, path = saved

  def edit(t):
    del t['model.layers.0.input_layernorm.weight'], t['model.layers.1.self_attn.q_proj.bias']
    t['model.layers.0.extra.weight'] = np.zeros(3, np.float32)
  _rewrite(path / 'model.safetensors', edit)
  with pytest.raises(weights.CheckpointError, match=re.escape(
      "missing tensors: ['model.layers.0.input_layernorm.weight', "
      "'model.layers.1.self_attn.q_proj.bias']\n  unexpected tensors: "
      "['model.layers.0.extra.weight']")):
    weights.load(path)


def test_integer_tensor_rejected(saved):
  _, _, path = saved
  _rewrite(path / 'model.safetensors', lambda t: t.update(
      {'model.norm.weight': np.zeros(32, np.int32)}))
  with pytest.raises(weights.CheckpointError, match='model.norm.weight: dtype I32 is not floating'):
    weights.load(path)


def test_missing_files_named(saved, tmp_path):
  cfg, params, path = saved
  with pytest.raises(weights.CheckpointError, match=f'directory {tmp_path / "nope"} does not'):
    weights.load(tmp_path / 'nope')
  (path / 'model.safetensors').unlink()
  with pytest.raises(weights.CheckpointError, match=re.escape(f'{path}: no model.safetensors')):
    weights.load(path)
  (path / 'config.json').unlink()
  with pytest.raises(weights.CheckpointError, match=re.escape(f'{path / "config.json"} does not')):
    weights.load(path)

  weights.save(tmp_path / 'sharded', cfg, params, max_shard_bytes=20_000)
  shard = sorted((tmp_path / 'sharded').glob('model-00002-of-*.safetensors'))[0]
  shard.unlink()
  with pytest.raises(weights.CheckpointError, match=re.escape(f'missing shard files: [{str(shard)!r}]')):
    weights.load(tmp_path / 'sharded')


@pytest.mark.parametrize('change, message', [
    ({'architectures': ['GPT2LMHeadModel'], 'model_type': 'gpt2'},
     r"architectures=\['GPT2LMHeadModel'\].*supported: \['LlamaForCausalLM'"),
    ({'rope_parameters': {'rope_type': 'yarn', 'factor': 4.0, 'rope_theta': 1e4}},
     r"rope_type='yarn' is not supported; supported: \['default', 'llama3'\]"),
    ({'use_sliding_window': True}, 'use_sliding_window=True'),
    ({'attention_bias': True}, r'attention_bias=True \(it adds an o_proj bias'),
    ({'mlp_bias': True}, 'mlp_bias=True'),
    ({'hidden_act': 'gelu'}, "hidden_act='gelu'"),
    ({'model_type': 'qwen2'},
     r"model_type='qwen2' does not match architectures=\['LlamaForCausalLM'\]"),
])
def test_unsupported_configs(change, message, saved):
  _, _, path = saved
  hf_config = weights.config_to_hf(CONFIGS['llama3']) | change
  with pytest.raises(weights.CheckpointError, match=message):
    weights.config_from_hf(hf_config)
  (path / 'config.json').write_text(json.dumps(hf_config))
  with pytest.raises(ValueError, match=message):
    weights.load(path)


def test_export_rejects_what_hf_cannot_hold(tmp_path):
  with pytest.raises(weights.CheckpointError, match='qk_norm=True'):
    weights.config_to_hf(CONFIGS['qwen2'].replace(qk_norm=True))
  with pytest.raises(weights.CheckpointError, match='o_proj bias'):
    weights.config_to_hf(CONFIGS['llama3'].replace(qkv_bias=True))
  params = _random_params(CONFIGS['qwen2'])
  del params['layers']['1']['mlp']['up']
  with pytest.raises(weights.CheckpointError, match=re.escape(
      "params['layers', '1', 'mlp', 'up']: expected shape [32, 64], got missing")):
    weights.save(tmp_path, CONFIGS['qwen2'], params)
  with pytest.raises(ValueError, match="dtype='int8'"):
    weights.save(tmp_path, CONFIGS['qwen2'], _random_params(CONFIGS['qwen2']), dtype='int8')



def _header(file):
  raw = file.read_bytes()
  size = int.from_bytes(raw[:8], 'little')
  return json.loads(raw[8:8 + size]), raw[8 + size:]


def _write_header(file, header, data):
  raw = json.dumps(header).encode()
  file.write_bytes(len(raw).to_bytes(8, 'little') + raw + data)


@pytest.fixture(name='no_tensor_reads')
def _no_tensor_reads(monkeypatch):
  """Counts tensor reads: a bad header must fail before the first one."""
  reads = []
  read = safetensors_io.read_tensor
  monkeypatch.setattr(safetensors_io, 'read_tensor', lambda e: reads.append(e) or read(e))
  return reads


def test_truncated_file_fails_before_any_tensor_is_read(tmp_path, no_tensor_reads):
  torch.manual_seed(0)
  hf_model = transformers.Qwen2ForCausalLM(transformers.Qwen2Config(
      vocab_size=128, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
      num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=False))
  hf_model.save_pretrained(tmp_path, safe_serialization=True)
  file = tmp_path / 'model.safetensors'
  header, data = _header(file)
  last = max((n for n in header if n != '__metadata__'), key=lambda n: header[n]['data_offsets'])
  file.write_bytes(file.read_bytes()[:-1])  # A download cut one byte short.
  with pytest.raises(weights.CheckpointError, match=re.escape(
      f'{file}: tensor {last}: data_offsets {header[last]["data_offsets"]} run past the end of '
      f'the data section ({len(data) - 1} bytes)')):
    weights.load(tmp_path)
  assert not no_tensor_reads


@pytest.mark.parametrize('edit, message', [
    (lambda h: h['model.norm.weight'].update(shape=[33]),
     r'hold 128 bytes, but F32 \[33\] needs 132'),
    (lambda h: h['model.norm.weight']['data_offsets'].__setitem__(0, 10**12),
     'end before they begin'),
    (lambda h: h['model.norm.weight'].update(data_offsets=h['model.embed_tokens.weight'][
        'data_offsets'], shape=h['model.embed_tokens.weight']['shape']), 'overlap'),
    (lambda h: h['model.norm.weight'].pop('dtype'), 'malformed header entry'),
], ids=['size', 'reversed', 'overlap', 'malformed'])
def test_inconsistent_header_names_file_and_tensor(saved, edit, message, no_tensor_reads):
  _, _, path = saved
  file = path / 'model.safetensors'
  header, data = _header(file)
  edit(header)
  _write_header(file, header, data)
  with pytest.raises(weights.CheckpointError,
                     match=f'{re.escape(str(file))}: tensors? .*({message})'):
    weights.load(path)
  assert not no_tensor_reads
