"""Adapter export: PEFT round trip through peft + transformers, merged HF checkpoint, errors.

The PEFT model runs the adapter unmerged (x W + s (x A) B in torch), so it is also an
independent reference for lora.merge's merged forward.
"""

import functools
import json

import jax
import numpy as np
import peft
import pytest
import safetensors.numpy
import torch
import transformers

from rlreason.model import adapter_export
from rlreason.model import lora
from rlreason.model import transformer
from rlreason.model import weights

_COMMON = dict(vocab_size=128, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
               rms_norm_eps=1e-6, max_position_embeddings=256, attn_implementation='eager')
CASES = {
    'qwen2_bias': (transformers.Qwen2ForCausalLM, transformers.Qwen2Config,
                   dict(num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=False)),
    'llama': (transformers.LlamaForCausalLM, transformers.LlamaConfig,
              dict(num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=False)),
    'qwen2_tied': (transformers.Qwen2ForCausalLM, transformers.Qwen2Config,
                   dict(num_attention_heads=4, num_key_value_heads=4, tie_word_embeddings=True)),
}
# Every target kind (embed and lm_head too); a partial set that needs the regex form.
ALL = lora.LoraConfig(rank=4, alpha=8.0, targets=('*',))
PARTIAL = lora.LoraConfig(rank=3, alpha=5.0, targets=('layers.0.attn.q', 'layers.1.mlp.*', 'o'))


def _hf_checkpoint(name, root):
  hf_cls, cfg_cls, kwargs = CASES[name]
  torch.manual_seed(0)
  hf_model = hf_cls(cfg_cls(**_COMMON, **kwargs)).eval()
  with torch.no_grad():  # HF's init has zero biases and unit norms: randomise every layout.
    for n, p in hf_model.named_parameters():
      p.copy_((1.0 + 0.3 * torch.randn_like(p)) if 'norm' in n else 0.15 * torch.randn_like(p))
  path = root / name
  hf_model.save_pretrained(path, safe_serialization=True)
  return path


def _random_adapter(cfg, lora_cfg, seed=1):
  adapter = lora.init(cfg, lora_cfg, jax.random.key(seed))
  leaves, treedef = jax.tree_util.tree_flatten_with_path(adapter)
  keys = jax.random.split(jax.random.key(seed + 1), len(leaves))
  return jax.tree.unflatten(treedef, [
      0.05 * jax.random.normal(k, x.shape) if path[-1].key == 'b' else x
      for (path, x), k in zip(leaves, keys)])


def _batch(vocab, t=12):
  tokens_NxT = np.random.default_rng(1).integers(0, vocab, size=(2, t))
  mask_NxT = np.ones((2, t), bool)
  mask_NxT[0, :3] = False  # Left padding in row 0.
  return tokens_NxT, mask_NxT


def _ours(cfg, params, tokens_NxT, mask_NxT):
  fwd = jax.jit(functools.partial(transformer.apply, cfg=cfg))
  return np.asarray(fwd(params, tokens_NxT, mask_NxT=mask_NxT)[0])


def _torch_logits(model, tokens_NxT, mask_NxT):
  positions_NxT = np.maximum(np.cumsum(mask_NxT, axis=1) - 1, 0)  # default_positions.
  with torch.no_grad():
    return model(input_ids=torch.tensor(tokens_NxT), attention_mask=torch.tensor(mask_NxT),
                 position_ids=torch.tensor(positions_NxT)).logits.double().numpy()


def _max_diff(a, b, mask_NxT):
  return float(np.abs(a - b)[mask_NxT].max())


@pytest.mark.parametrize('name,lora_cfg', [('qwen2_bias', ALL), ('llama', ALL),
                                           ('llama', PARTIAL)])
def test_peft_round_trip_and_merged_export_give_our_logits(name, lora_cfg, tmp_path):
  base_path = _hf_checkpoint(name, tmp_path)
  cfg, params = weights.load(base_path)
  adapter = _random_adapter(cfg, lora_cfg)
  tokens_NxT, mask_NxT = _batch(cfg.vocab_size)
  merged = lora.merge(params, adapter, cfg, lora_cfg)
  ours = _ours(cfg, merged, tokens_NxT, mask_NxT)
  # The adapter moves the logits far more than the tolerance, so equality is not vacuous.
  assert _max_diff(ours, _ours(cfg, params, tokens_NxT, mask_NxT), mask_NxT) > 0.05

  adapter_export.save_peft(tmp_path / 'peft', cfg, adapter, lora_cfg, str(base_path))
  config = json.loads((tmp_path / 'peft' / 'adapter_config.json').read_text())
  assert config['peft_type'] == 'LORA' and config['r'] == lora_cfg.rank
  hf_model = transformers.AutoModelForCausalLM.from_pretrained(
      base_path, dtype=torch.float32, attn_implementation='eager').eval()
  peft_model = peft.PeftModel.from_pretrained(hf_model, tmp_path / 'peft').eval()
  # Every tensor we wrote is one peft created, and every adapter peft created is ours.
  written = safetensors.numpy.load_file(tmp_path / 'peft' / 'adapter_model.safetensors')
  loaded = {k.replace('.default', ''): v for k, v in peft_model.state_dict().items()
            if 'lora_' in k}
  assert set(written) == set(loaded)
  for k, v in written.items():
    np.testing.assert_array_equal(loaded[k].numpy(), v)
  diff = _max_diff(_torch_logits(peft_model, tokens_NxT, mask_NxT), ours, mask_NxT)
  print(f'{name}: peft vs ours max abs logit diff {diff:.2e}')
  assert diff <= 1e-4

  # PEFT unmerged in float64 is an independent reference of the merged forward. Without
  # padding: transformers' fp64 eager attention turns a left-padded row into NaNs.
  full_NxT = np.ones_like(mask_NxT)
  ref64 = _torch_logits(peft_model.double(), tokens_NxT, full_NxT)
  diff64 = _max_diff(ref64, _ours(cfg, merged, tokens_NxT, full_NxT), full_NxT)
  print(f'{name}: peft fp64 unmerged vs ours fp32 merged max abs logit diff {diff64:.2e}')
  assert diff64 <= 1e-5

  adapter_export.save_merged(tmp_path / 'merged', cfg, params, adapter, lora_cfg)
  merged_hf = transformers.AutoModelForCausalLM.from_pretrained(
      tmp_path / 'merged', dtype=torch.float32, attn_implementation='eager').eval()
  diff = _max_diff(_torch_logits(merged_hf, tokens_NxT, mask_NxT), ours, mask_NxT)
  print(f'{name}: merged HF vs ours max abs logit diff {diff:.2e}')
  assert diff <= 1e-4


def test_target_modules_list_or_regex():
  cfg = weights.config_from_hf(transformers.LlamaConfig(**_COMMON, num_attention_heads=4,
                                                        num_key_value_heads=2).to_dict()
                               | {'architectures': ['LlamaForCausalLM']})
  modules = lambda c: adapter_export._target_modules(cfg, lora.target_paths(cfg, c))
  assert modules(ALL) == ['down_proj', 'gate_proj', 'k_proj', 'o_proj', 'q_proj', 'up_proj',
                          'v_proj', 'embed_tokens', 'lm_head']
  assert modules(PARTIAL) == (r'model\.layers\.0\.self_attn\.q_proj|'
                              r'model\.layers\.0\.self_attn\.o_proj|'
                              r'model\.layers\.1\.self_attn\.o_proj|'
                              r'model\.layers\.1\.mlp\.gate_proj|'
                              r'model\.layers\.1\.mlp\.up_proj|'
                              r'model\.layers\.1\.mlp\.down_proj')


def test_quantised_base_needs_its_dequantised_copy(tmp_path):
  base_path = _hf_checkpoint('qwen2_bias', tmp_path)
  cfg, params = weights.load(base_path)
  lora_cfg = lora.LoraConfig(rank=4, alpha=8.0, quantize='int8')
  base = lora.quantize_base(params, cfg, lora_cfg)
  adapter = _random_adapter(cfg, lora_cfg)
  with pytest.raises(ValueError, match=r'int8-quantised base.*quantized_base='):
    adapter_export.save_peft(tmp_path / 'peft', cfg, adapter, lora_cfg, str(base_path))
  assert not (tmp_path / 'peft').exists()
  deq_path = tmp_path / 'dequantised'
  adapter_export.save_peft(tmp_path / 'peft', cfg, adapter, lora_cfg, str(deq_path),
                           quantized_base=base)
  tokens_NxT, mask_NxT = _batch(cfg.vocab_size)
  ours = _ours(cfg, lora.merge(base, adapter, cfg, lora_cfg), tokens_NxT, mask_NxT)
  hf_model = transformers.AutoModelForCausalLM.from_pretrained(
      deq_path, dtype=torch.float32, attn_implementation='eager').eval()
  peft_model = peft.PeftModel.from_pretrained(hf_model, tmp_path / 'peft').eval()
  assert _max_diff(_torch_logits(peft_model, tokens_NxT, mask_NxT), ours, mask_NxT) <= 1e-4
  # The merged export of a quantised base is its dequantised weights plus the update.
  adapter_export.save_merged(tmp_path / 'merged', cfg, base, adapter, lora_cfg)
  merged_hf = transformers.AutoModelForCausalLM.from_pretrained(
      tmp_path / 'merged', dtype=torch.float32, attn_implementation='eager').eval()
  assert _max_diff(_torch_logits(merged_hf, tokens_NxT, mask_NxT), ours, mask_NxT) <= 1e-4


def test_tied_embedding_adapter_refuses_peft_but_exports_merged(tmp_path):
  base_path = _hf_checkpoint('qwen2_tied', tmp_path)
  cfg, params = weights.load(base_path)
  lora_cfg = lora.LoraConfig(rank=4, alpha=8.0, targets=('*',))
  adapter = _random_adapter(cfg, lora_cfg)
  with pytest.raises(ValueError, match=r"targets 'embed' of a model with tied embeddings"):
    adapter_export.save_peft(tmp_path / 'peft', cfg, adapter, lora_cfg, str(base_path))
  with pytest.raises(ValueError, match=r"targets 'embed' of a model with tied embeddings"):
    adapter_export.check_peft(cfg, lora_cfg)  # The same, before any training.
  adapter_export.check_peft(cfg, lora.LoraConfig(rank=4, alpha=8.0))  # No embed: fine.
  assert not (tmp_path / 'peft').exists()
  adapter_export.save_merged(tmp_path / 'merged', cfg, params, adapter, lora_cfg)
  tokens_NxT, mask_NxT = _batch(cfg.vocab_size)
  ours = _ours(cfg, lora.merge(params, adapter, cfg, lora_cfg), tokens_NxT, mask_NxT)
  merged_hf = transformers.AutoModelForCausalLM.from_pretrained(
      tmp_path / 'merged', dtype=torch.float32, attn_implementation='eager').eval()
  assert _max_diff(_torch_logits(merged_hf, tokens_NxT, mask_NxT), ours, mask_NxT) <= 1e-4
