"""MoE in the model's forward: Qwen3-MoE / Qwen2-MoE checkpoints against transformers, export,
the expert-parallel mesh, replay of recorded routes, the config check, one RL step.

Block-level maths (routing, dispatch, losses) is tests/moe_test.py's.
"""

import functools
import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
import transformers

from rlreason.model import moe_config
from rlreason.model import moe_layer
from rlreason.model import sharding
from rlreason.model import transformer
from rlreason.model import weights

_BASE = dict(vocab_size=64, hidden_size=32, intermediate_size=48, moe_intermediate_size=16,
             num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=8,
             max_position_embeddings=64, rms_norm_eps=1e-6, tie_word_embeddings=False)

# (HF class, extra config): each mixes a dense and a sparse layer, or is all sparse.
HF_CASES = {
    'qwen3_top2_norm_mlp_only': ('Qwen3Moe', dict(num_experts=8, num_experts_per_tok=2,
                                                  norm_topk_prob=True, mlp_only_layers=[1])),
    'qwen3_top2_sparse_all': ('Qwen3Moe', dict(num_experts=4, num_experts_per_tok=2,
                                               norm_topk_prob=False)),
    'qwen2_top2_step2': ('Qwen2Moe', dict(num_experts=4, num_experts_per_tok=2,
                                          norm_topk_prob=False, decoder_sparse_step=2,
                                          shared_expert_intermediate_size=24)),
    'qwen2_top4_norm': ('Qwen2Moe', dict(num_experts=8, num_experts_per_tok=4,
                                         norm_topk_prob=True, shared_expert_intermediate_size=24)),
}


def _save_hf(case, path):
  """A random tiny HF MoE checkpoint (routers scaled up so the top-k is far from ties)."""
  kind, extra = HF_CASES[case]
  hf_cfg = getattr(transformers, f'{kind}Config')(**_BASE, **extra)
  torch.manual_seed(0)
  model = getattr(transformers, f'{kind}ForCausalLM')(hf_cfg).eval()
  with torch.no_grad():
    for name, p in model.named_parameters():
      if name.endswith('mlp.gate.weight'):
        p.normal_(0.0, 1.0)
  model.save_pretrained(path)
  return path


def _batch(t=12):
  tokens_NxT = np.random.default_rng(1).integers(0, _BASE['vocab_size'], size=(3, t))
  mask_NxT = np.ones((3, t), bool)
  mask_NxT[0, :4] = False  # Left padding.
  mask_NxT[2, :1] = False
  return tokens_NxT, mask_NxT


def _hf_logits(path, tokens_NxT, mask_NxT):
  model = transformers.AutoModelForCausalLM.from_pretrained(
      path, dtype=torch.float32, attn_implementation='eager').eval()
  positions_NxT = np.maximum(np.cumsum(mask_NxT, axis=1) - 1, 0)  # default_positions.
  with torch.no_grad():
    return model(input_ids=torch.tensor(tokens_NxT), attention_mask=torch.tensor(mask_NxT),
                 position_ids=torch.tensor(positions_NxT)).logits.numpy()


def _forward(cfg, params, tokens_NxT, mask_NxT, **kw):
  return jax.jit(functools.partial(transformer.apply, cfg=cfg, return_routing=True, **kw))(
      params, tokens_NxT, mask_NxT=mask_NxT)


@pytest.fixture(scope='module', name='ckpts')
def _ckpts(tmp_path_factory):
  root = tmp_path_factory.mktemp('moe_ckpts')
  return {case: _save_hf(case, root / case) for case in HF_CASES}


@pytest.mark.parametrize('case', sorted(HF_CASES))
def test_logits_match_transformers(case, ckpts):
  cfg, params = weights.load(ckpts[case])
  _, extra = HF_CASES[case]
  assert cfg.moe.num_experts == extra['num_experts']
  assert cfg.moe.norm_topk_prob == extra['norm_topk_prob']
  tokens_NxT, mask_NxT = _batch()
  logits_NxTxV, _, routing = _forward(cfg, params, tokens_NxT, mask_NxT)
  want_NxTxV = _hf_logits(ckpts[case], tokens_NxT, mask_NxT)
  np.testing.assert_allclose(np.asarray(logits_NxTxV)[mask_NxT], want_NxTxV[mask_NxT],
                             atol=1e-4, rtol=1e-4)
  sparse = [i for i in range(cfg.num_layers) if moe_config.is_moe_layer(i, cfg.moe)]
  assert routing.expert_ids_LxNxTxK.shape == (len(sparse), 3, 12, extra['num_experts_per_tok'])
