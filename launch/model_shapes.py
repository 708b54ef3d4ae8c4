"""Architectures of the released checkpoints the experiments use, from their HF config.json.

For checks that need the real shapes without the weights: launch/aot_check.py and
tests/sharding_shapes_test.py. Values are the `config.json` fields of each Hugging Face
repository (hidden_size, intermediate_size, num_hidden_layers, num_attention_heads,
num_key_value_heads, head_dim, vocab_size, tie_word_embeddings, rope_theta, rope_scaling).
"""

from rlreason.model import transformer

_QWEN25 = dict(family='qwen2', qkv_bias=True, rope_theta=1_000_000.0, head_dim=128)
_QWEN3 = dict(family='qwen3', qk_norm=True, rope_theta=1_000_000.0, head_dim=128)

ARCHS = {
    'qwen2.5-0.5b': dict(_QWEN25, vocab_size=151936, hidden_size=896, intermediate_size=4864,
                         num_layers=24, num_heads=14, num_kv_heads=2, head_dim=64,
                         tie_embeddings=True),
    'qwen2.5-1.5b': dict(_QWEN25, vocab_size=151936, hidden_size=1536,
                         intermediate_size=8960, num_layers=28, num_heads=12, num_kv_heads=2,
                         tie_embeddings=True),
    'qwen2.5-7b': dict(_QWEN25, vocab_size=152064, hidden_size=3584, intermediate_size=18944,
                       num_layers=28, num_heads=28, num_kv_heads=4, tie_embeddings=False),
    'qwen3-4b': dict(_QWEN3, vocab_size=151936, hidden_size=2560, intermediate_size=9728,
                     num_layers=36, num_heads=32, num_kv_heads=8, tie_embeddings=True),
    'qwen3-8b': dict(_QWEN3, vocab_size=151936, hidden_size=4096, intermediate_size=12288,
                     num_layers=36, num_heads=32, num_kv_heads=8, tie_embeddings=False),
    'llama3-8b': dict(family='llama', vocab_size=128256, hidden_size=4096,
                      intermediate_size=14336, num_layers=32, num_heads=32, num_kv_heads=8,
                      head_dim=128, rope_theta=500_000.0, tie_embeddings=False),
}

# Parameter counts as published (rounded): a check that the table above is transcribed right.
PUBLISHED_BILLIONS = {'qwen2.5-0.5b': 0.49, 'qwen2.5-1.5b': 1.54, 'qwen2.5-7b': 7.62,
                      'qwen3-4b': 4.02, 'qwen3-8b': 8.19, 'llama3-8b': 8.03}


def model_config(name: str, **dtypes) -> transformer.ModelConfig:
  if name not in ARCHS:
    raise ValueError(f'unknown model {name!r}; known: {sorted(ARCHS)}.')
  return transformer.ModelConfig(**ARCHS[name], **dtypes)


def guess(path: str) -> str | None:
  """The ARCHS key that a checkpoint path names ('/ckpt/Qwen2.5-7B-Instruct' -> 'qwen2.5-7b')."""
  tail = path.rstrip('/').split('/')[-1].lower().replace('meta-llama-3', 'llama3')
  tail = tail.replace('llama-3', 'llama3')
  for name in sorted(ARCHS, key=len, reverse=True):
    if tail.startswith(name):
      return name
  return None
