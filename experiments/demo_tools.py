"""Tool-use demo: SFT a tiny model on a teacher that mostly misnames its tool, then GRPO.

  make demo-tools SEED=0      # both commands below
  python -m rlreason.main --config experiments/demo_tools.py:0 --workdir /tmp/demo_tools
  python -m experiments.demo_tools_report --config experiments/demo_tools.py:0 \\
      --workdir /tmp/demo_tools

Task: calc_multiply with 4-digit operands ('What is 4509 * 5603? Use the calculator.'), far
beyond what a 2-layer model computes in one pass; the 'tags' format, character tokenizer,
`calculator` tool, exact-match reward. Teacher (envs.tasks.calculator_trace, wrong_tool): in
30% of traces it calls the calculator ('<call>calculator: {"expression": "4509 * 5603"}</call>',
the result, '#### 25263927'); in the rest it calls 'calculater', which does not exist, sees
the environment's error ("Error: unknown tool 'calculater'; available: calculator") and
answers '#### ' + the product with one digit changed. Every trace copies the operands at the
same place, so SFT learns the copy from all of them, and the call-or-guess choice is one
letter ('o' or 'e'). Greedy decoding takes the 70% branch and is never right; sampling at
T=1 calls the real tool in ~28% of episodes, which then pay. GRPO on the reward makes the
right name the greedy choice.

Measured 2026-12-02 (greedy pass@1 on 500 held-out problems, warm start -> after 40 GRPO
steps; the SFT-only continuation trained on as many sequences; tool-call rate = episodes with
a call that ran without error), on the shared 2-core VM:
  seed 2: 0.000 -> 1.000 (1.000 from step 10), calls 0.00 -> 1.00, SFT-only 0.000 / 0.00;
    265 s for main + report (load ~1-2.4: the quietest run).
  seed 0: 0.000 -> 1.000, calls 0.00 -> 1.00, SFT-only 0.000 / 0.00; 403 s (load 4-7).
  seed 1: 0.000 -> 0.990 (0.998 at step 10), calls 0.00 -> 1.00, SFT-only 0.000; 763 s.
  seed 3: 0.000 -> 0.998, calls 0.00 -> 1.00, SFT-only 0.000 / 0.00; 755 s.
  seed 4: 0.000 -> 1.000 (0.998 at step 10), calls 0.00 -> 1.00, SFT-only 0.000 / 0.00;
    main 486 s (its report was rerun after an import change broke the first attempt).
  (seeds 1, 3 and 4 ran at load 6-9 beside test runs and other helpers' benchmarks.)
`pip install -e .[demo]` into a fresh venv took 148 s under that load. So: targets (final
>= 0.9, gain >= 0.5, SFT-only within +0.1) met on every seed run; the 10-minute bound is met
quiet (265 s + install) and missed under load 6-9 (755-763 s + install).
Why this teacher: with the earlier one (70% of traces answered from the head with no call at
all), seed 2 never learned to copy the operands (SFT-only probe, call_prob 0.3: no right
call in 1600 steps; call_prob 1.0: all right after 200), and seeds 0, 11, 12 stopped at
0.59-0.76 after 80 GRPO steps, their calls or copies of the result wrong by a digit.
Right-aligned answers (right_align) put every answer digit at one distance from its digit in
the observation; left-aligned, 7-digit products were copied one place off, all of a group
alike, so GRPO had no gradient for them.
"""

from rlreason import config as config_lib

# The character-level model of the tool demos and studies (experiments/slate.py, kbqa_r1.py,
# dynamics/cleaner_rollback.py, dynamics/dart_conflict.py build on tool_config), and the
# smaller one of their seconds-long settings.
MODEL = dict(vocab_size=0, hidden_size=64, intermediate_size=192, num_layers=2, num_heads=4,
             num_kv_heads=4, head_dim=16, qkv_bias=False, qk_norm=False, tie_embeddings=False,
             family='qwen2', rope_theta=10_000.0)
SMALL_MODEL = dict(hidden_size=32, intermediate_size=64, num_layers=1, num_heads=2,
                   num_kv_heads=1, head_dim=16)


def tool_config(task: str, *, difficulty: int, prompt_buckets: tuple[int, ...], seed: int = 0):
  """A tool task on the character model: prompt + newline, GRPO with PPO-clip and token-mean
  aggregation at T = 1, two verifier workers, all local devices on fsdp."""
  c = config_lib.default()
  c.seed = seed
  c.data.update(task=task, difficulty=difficulty, prompt_template='{prompt}\n',
                prompt_buckets=prompt_buckets)
  c.model.arch = dict(MODEL)
  c.tokenizer.kind = 'chars'
  c.rl.temperature = 1.0
  c.objective.update(advantage='grpo', policy_loss='ppo_clip', aggregation='token_mean')
  c.verifier.workers = 2  # The 2-core machine these were measured on.
  c.mesh = dict(data=1, fsdp=-1, tensor=1)  # All local devices (1 on a plain CPU).
  c.log_every = 5
  return c


def get_config(arg: str = ''):
  # 'What is 1234 * 5678? Use the calculator.\n'
  c = tool_config('calc_multiply', difficulty=4, prompt_buckets=(41,),
                  seed=int(arg) if arg not in ('', 'runlocal') else 0)
  # An episode: '<call>calculator: {"expression": "1234 * 5678"}</call>' (54 tokens), the
  # observation '<result>7006652</result>' (24-25), '#### ' + the answer right-aligned to 8
  # characters + EOS (14): 93 at most.
  c.env.update(enabled=True, tools=('calculator',), family='tags', verifier='exact',
               max_turns=2, max_turn_tokens=58, max_observation_tokens=72, transcripts=16,
               workers=4)
  c.rl.max_new_tokens = 140
  c.sft.steps = 800
  c.sft.batch_size = 32
  c.sft.lr = 3e-3
  c.sft.grad_clip = 1.0
  c.sft.decay = False
  c.sft.teacher = 'rlreason.envs.tasks:calculator_trace'
  c.sft.teacher_options = {'call_prob': 0.3, 'answer_prefix': '#### ', 'spaced': True,
                            'right_align': True, 'wrong_tool': 'calculater'}
  c.rl.steps = 40
  c.rl.prompts_per_step = 16
  c.rl.group_size = 8
  c.optimizer.lr = 5e-4
  c.optimizer.grad_clip = 1.0
  c.eval.every = 10
  c.eval.num_prompts = 500
  c.checkpoint.every = 20
  if arg == 'runlocal':
    shrink_for_runlocal(c)
  return c


def shrink_for_runlocal(c) -> None:
  """Seconds-long settings for smoke tests: a smaller model, 2-digit operands, 2 RL steps."""
  c.data.difficulty = 2
  c.data.prompt_buckets = (37,)
  c.model.arch.update(SMALL_MODEL)
  c.env.update(max_turn_tokens=52, transcripts=2)
  c.rl.max_new_tokens = 132
  c.sft.steps, c.sft.batch_size = 2, 8
  c.rl.steps = 2
  c.rl.prompts_per_step = max(c.rl.minibatches, 2) * 2
  c.eval.every, c.eval.num_prompts = 2, 4
  c.checkpoint.every = 0
