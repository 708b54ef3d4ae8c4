"""GRPO on GSM8K with Qwen2.5-Instruct (0.5B or 1.5B), rewarded by the math verifier.

  python -m rlreason.main --config experiments/grpo_gsm8k.py:qwen2.5-0.5b --workdir DIR \
      --config.model.path=/ckpt/Qwen2.5-0.5B-Instruct \
      --config.data.path=/data/gsm8k/train.jsonl --config.data.eval_path=/data/gsm8k/test.jsonl
  python -m rlreason.main --config experiments/grpo_gsm8k.py:runlocal --workdir /tmp/gsm8k_local

Hardware: one TPU v5e-8 host (0.5B) or v5p-8 (1.5B) for the full run; `runlocal` swaps in a
tiny random model with the real Qwen tokenizer and the GSM8K files in ../shared/data, and
runs two steps on a CPU in about a minute. Runtime of the full run: not measured here (no
accelerator); expected from the literature: Qwen2.5-0.5B-Instruct moves from ~0.3 to ~0.45
GSM8K accuracy within a few hundred steps of GRPO. This repo has not reproduced that yet.
"""

import pathlib

from rlreason import config as config_lib

_SHARED = pathlib.Path(__file__).resolve().parents[2] / 'shared' / 'data'
_SIZES = {'qwen2.5-0.5b': 'Qwen2.5-0.5B-Instruct', 'qwen2.5-1.5b': 'Qwen2.5-1.5B-Instruct'}


def get_config(arg: str = 'qwen2.5-0.5b'):
  c = config_lib.default()
  c.model.init = 'hf'
  c.model.path = f'/checkpoints/{_SIZES.get(arg, "Qwen2.5-0.5B-Instruct")}'
  c.model.compute_dtype = 'bfloat16'
  c.model.remat = 'full'
  c.tokenizer.kind = 'hf'
  c.tokenizer.path = ''  # The checkpoint's own tokenizer: follows --config.model.path.
  c.data.source = 'jsonl'
  c.data.format = 'gsm8k'
  c.data.path = '/data/gsm8k/train.jsonl'
  c.data.eval_path = '/data/gsm8k/test.jsonl'
  c.data.prompt_template = ('<|im_start|>user\n{prompt}\nReason step by step, then give the '
                            'final answer after "####".<|im_end|>\n<|im_start|>assistant\n')
  c.data.prompt_buckets = (256, 512)
  c.rl.steps, c.rl.prompts_per_step, c.rl.group_size = 500, 64, 8
  c.rl.max_new_tokens, c.rl.minibatches, c.rl.micro_batches = 512, 4, 2
  c.objective.advantage, c.objective.policy_loss = 'grpo', 'ppo_clip'
  c.objective.kl_coef = 0.0
  c.optimizer.lr, c.optimizer.warmup_steps = 1e-6, 10
  c.verifier.name, c.verifier.workers = 'math', 8
  c.eval.every, c.eval.num_prompts = 50, 659
  c.checkpoint.every = 50
  c.mesh = dict(data=1, fsdp=-1, tensor=1)
  if arg == 'runlocal':
    c.model.init = 'random'
    c.model.compute_dtype, c.model.remat = 'float32', 'none'
    c.model.arch = dict(vocab_size=0, hidden_size=32, intermediate_size=64, num_layers=1,
                        num_heads=2, num_kv_heads=1, head_dim=16, qkv_bias=True, qk_norm=False,
                        tie_embeddings=True, family='qwen2', rope_theta=1_000_000.0)
    c.tokenizer.path = str(_SHARED / 'qwen_tokenizer')
    c.data.path = str(_SHARED / 'gsm8k' / 'train.jsonl')
    c.data.eval_path = str(_SHARED / 'gsm8k' / 'test.first_half.jsonl')
    c.data.prompt_buckets = (256,)
    c.rl.steps, c.rl.prompts_per_step, c.rl.group_size = 2, 4, 2
    c.rl.max_new_tokens, c.rl.minibatches, c.rl.micro_batches = 8, 1, 1
    c.verifier.workers = 1
    c.eval.every, c.eval.num_prompts = 2, 4
    c.checkpoint.every = 0
  return c
