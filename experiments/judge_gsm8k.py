"""GRPO on GSM8K with the math verifier plus a model-judged step reward (rlreason/rollout/judge.py).

  python -m rlreason.main --config experiments/judge_gsm8k.py:qwen2.5-0.5b --workdir DIR \
      --config.model.path=/ckpt/Qwen2.5-0.5B-Instruct --config.judge.model=/ckpt/Qwen2.5-7B-Instruct
  python -m rlreason.main --config experiments/judge_gsm8k.py:runlocal --workdir /tmp/judge_local

grpo_gsm8k's setting, with reward = 1.0 * math verdict + w * judge, where the judge (by default
the policy itself, 'policy'; or any HF chat checkpoint directory) scores every line of the
completion -1/0/+1 by its next-token probabilities of '-', '0', '+' after a rubric prompt, and
the completion's judge reward is the mean over its lines. w ramps from 0.5 to 0.1 over the run,
so the judge shapes early training and the verifier dominates later. Hardware as grpo_gsm8k
(a separate 7B judge needs its own ~15 GB of bf16 weights per replica); runtime not measured.
Expected result: not measured; this config demonstrates the wiring, and `runlocal` (tiny random
policy judging itself, real Qwen tokenizer and chat template) is a smoke run of a few seconds.
"""

from experiments import grpo_gsm8k


def get_config(arg: str = 'qwen2.5-0.5b'):
  c = grpo_gsm8k.get_config(arg)
  j = c.judge
  j.enabled, j.model = True, 'policy'
  j.schedule, j.weight, j.weight_end, j.verifier_weight = 'linear', 0.5, 0.1, 1.0
  j.split, j.max_steps, j.aggregate, j.score = 'lines', 16, 'mean', 'expected'
  j.dtype = 'bfloat16'
  j.prompt_buckets, j.batch_size = (512, 1024), 64
  if arg == 'runlocal':
    j.dtype, j.max_steps = 'float32', 4
    j.prompt_buckets, j.batch_size = (512,), 8
  return c
