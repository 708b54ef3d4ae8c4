"""Logit parity of transformer.apply (via weights.load) with transformers' PyTorch models."""

import functools

import jax
import numpy as np
import pytest
import torch
import transformers

from rlreason.model import transformer
from rlreason.model import weights

_COMMON = dict(vocab_size=128, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
               rms_norm_eps=1e-6, max_position_embeddings=256)
_LLAMA3 = {'rope_type': 'llama3', 'factor': 8.0, 'low_freq_factor': 1.0, 'high_freq_factor': 4.0,
           'original_max_position_embeddings': 32}

# name -> (HF class, config class, config kwargs, sequence length).
CASES = {
    'qwen2_bias_untied': (transformers.Qwen2ForCausalLM, transformers.Qwen2Config,
                          dict(num_attention_heads=4, num_key_value_heads=2,
                               tie_word_embeddings=False, rope_theta=1e6), 12),
    'qwen2_tied': (transformers.Qwen2ForCausalLM, transformers.Qwen2Config,
                   dict(num_attention_heads=4, num_key_value_heads=4, tie_word_embeddings=True), 12),
    'qwen3_untied': (transformers.Qwen3ForCausalLM, transformers.Qwen3Config,
                     dict(num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                          tie_word_embeddings=False), 12),
    'qwen3_tied': (transformers.Qwen3ForCausalLM, transformers.Qwen3Config,
                   dict(num_attention_heads=4, num_key_value_heads=1, head_dim=16,
                        tie_word_embeddings=True), 12),
    # Positions run past original_max_position_embeddings=32; theta 100 puts the 4 frequencies
    # in all three llama3 bands (kept, smoothed, divided by factor).
    'llama3_scaled': (transformers.LlamaForCausalLM, transformers.LlamaConfig,
                      dict(num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=False,
                           rope_theta=100.0, rope_scaling=dict(_LLAMA3)), 40),
}


def _randomize(hf_model):
  """Replaces HF's init (zero biases, unit norms) so every tensor's layout is exercised."""
  with torch.no_grad():
    for name, p in hf_model.named_parameters():
      if 'norm' in name:
        p.copy_(1.0 + 0.3 * torch.randn_like(p))
      else:
        p.copy_(0.15 * torch.randn_like(p))


def _left_padded_batch(rng, vocab, t):
  tokens_NxT = rng.integers(0, vocab, size=(2, t))
  mask_NxT = np.ones((2, t), bool)
  mask_NxT[0, :3] = False  # Row 0 is left-padded; row 1 is full length.
  return tokens_NxT, mask_NxT


def _hf_checkpoint(name, tmp_root):
  hf_cls, cfg_cls, kwargs, _ = CASES[name]
  torch.manual_seed(0)
  hf_model = hf_cls(cfg_cls(**_COMMON, **kwargs, attn_implementation='eager')).eval()
  _randomize(hf_model)
  path = f'{tmp_root}/{name}'
  hf_model.save_pretrained(path, safe_serialization=True)
  return hf_model, path


@pytest.mark.parametrize('name', sorted(CASES))
def test_logits_match_transformers(name, tmp_path):
  hf_model, path = _hf_checkpoint(name, str(tmp_path))
  cfg, params = weights.load(path)
  t = CASES[name][3]
  tokens_NxT, mask_NxT = _left_padded_batch(np.random.default_rng(1), cfg.vocab_size, t)
  positions_NxT = np.maximum(np.cumsum(mask_NxT, axis=1) - 1, 0)  # transformer.default_positions.

  with torch.no_grad():
    want = hf_model(input_ids=torch.tensor(tokens_NxT), attention_mask=torch.tensor(mask_NxT),
                    position_ids=torch.tensor(positions_NxT)).logits.numpy()
  apply = jax.jit(functools.partial(transformer.apply, cfg=cfg))
  got, _ = apply(params, tokens_NxT, mask_NxT=mask_NxT)
  got = np.asarray(got)

  assert want.std() > 0.3  # Logits big enough that 1e-4 is a real test.
  diff = np.abs(got - want)[mask_NxT].max()
  print(f'{name}: max abs logit diff {diff:.2e}')
  assert diff <= 1e-4, name


def test_cases_cover_gqa_head_dim_and_scaling():
  configs = {name: weights.config_from_hf(cfg_cls(**_COMMON, **kw).to_dict() | {
      'architectures': [hf_cls.__name__]}) for name, (hf_cls, cfg_cls, kw, _) in CASES.items()}
  assert sum(c.num_kv_heads < c.num_heads for c in configs.values()) >= 2
  qwen3 = configs['qwen3_untied']
  assert qwen3.head_dim != qwen3.hidden_size // qwen3.num_heads and qwen3.qk_norm
  assert configs['qwen2_bias_untied'].qkv_bias and configs['qwen2_tied'].tie_embeddings
  llama = configs['llama3_scaled']
  assert llama.rope_scaling == transformer.Llama3RopeScaling(8.0, 1.0, 4.0, 32)
  assert CASES['llama3_scaled'][3] > llama.rope_scaling.original_max_position_embeddings
  # The scaling must change some frequencies and keep others (all three llama3 bands).
  scaled, plain = transformer.rope_inv_freq(llama), transformer.rope_inv_freq(llama.replace(rope_scaling=None))
  assert (scaled == plain).any() and (scaled == plain / 8).any()
  assert ((scaled != plain) & (scaled != plain / 8)).any()
