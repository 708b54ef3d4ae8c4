"""Tool-use demo: SFT a tiny model on a teacher that mostly guesses, then GRPO makes it call.

  make demo-tools SEED=0      # both commands below
  python -m rlreason.main --config experiments/demo_tools.py:0 --workdir /tmp/demo_tools
  python -m experiments.demo_tools_report --config experiments/demo_tools.py:0 \\
      --workdir /tmp/demo_tools

Task: calc_multiply with 4-digit operands ('What is 4509 * 5603? Use the calculator.'), far
beyond what a 2-layer model computes in one pass; the 'tags' format, character tokenizer,
`calculator` tool, exact-match reward. Teacher (envs.tasks.calculator_trace): 30% of traces
call the calculator ('<call>calculator: {"expression": "4509 * 5603"}</call>', result,
'#### 25263927'); the rest answer '#### ' + the product with one digit changed. SFT learns
both; greedy decoding takes the 70% branch ('#' over '<') and is never right, while sampling
at T=1 calls in ~25% of episodes, which pay when the copies are right. GRPO on the reward
turns calling into the greedy choice.

Hardware: a 2-core CPU shared with other test runs (load 3-9 throughout; no quiet
measurement). Measured 2026-12-02 (seed: greedy pass@1 on 500 held-out problems after SFT
-> after GRPO; greedy tool-call rate before -> after; SFT-only continuation's accuracy and
tool-call rate), 800 SFT steps of 32, GRPO lr 5e-4:
  40 RL steps (tuning): 0: 0.000 -> 0.710 (0.600 at step 20), calls 0.00 -> 1.00, SFT-only
  0.000 / 0.00; continued to 80 steps: 0.728 at 60, 0.714 at 80. 1: 0.000 -> 1.000 (1.000
  at step 20), calls 0.00 -> 1.00, SFT-only 0.000 / 0.00. These two ran side by side under
  load ~8: rlreason.main 517-520 s, report 153-155 s each (over the 10-minute target; alone
  and unloaded not measured).
  80 RL steps (this config): 2: 0.000 -> 0.000 (0 at every eval), calls 0.00 -> 0.00,
  SFT-only 0.000 / 0.00. Fresh, untuned seeds: 11: 0.000 -> 0.592 (0.532, 0.578, 0.584 at
  steps 20-60), calls 0.00 -> 1.00, SFT-only 0.000 / 0.00; 12: 0.000 -> 0.756 (0.682,
  0.660, 0.702), calls 0.00 -> 1.00, SFT-only 0.000 / 0.00. Seeds 2, 11, 12 and seed 0's
  continuation ran side by side (load 7.5-8.7): rlreason.main 658-732 s (seed 12: 80 RL
  steps 277 s, of which update 188 s and generation 79 s; evaluations 18 s; the rest SFT and
  compilation), report 80-211 s. Targets (final >= 0.9, gain >= 0.5, under 10 minutes) met
  by seed 1 only.
Failure modes (the warm start's copying, not the decision to call, which GRPO fixed on
every seed whose calls could earn a reward): seed 2's warm start never learned to copy the
operands into the call (SFT loss 0.58 at step 800; its sampled calls were all wrong, so
every group had reward 0 and GRPO had no gradient: 0.000 throughout). Seed 0's calls are
right but 29% of its answers get the first digit wrong (it writes a head guess of the
leading digit instead of copying it), and GRPO fixed that only slowly (0.60 -> 0.71 in
steps 20-80). Seed 11 after GRPO, 256 held-out problems: 61 calls with a wrong operand
digit, 36 answers with a wrong digit.
Untried: a longer or larger SFT (more call traces), which costs the time this is over.
Earlier variants (seed 0 unless said): the teacher writing bare numbers (no '#### '): a
student's greedy first token was the call's '<' (98-100% of episodes at call_prob 0.25, SFT
steps 100-400), since a guess's first digit is spread over 1-9; with '#### ' greedy guesses
whenever call_prob < 0.5 (at 0.4 one eval flipped to 96% calls: too close). 3 layers,
d=128 (the main demo's model): copying not learned in 300 SFT steps even on 100%-call
traces, ~0.3-2 s/step; 2 layers, d=64: 67% exact episodes after 200 steps on 100%-call
traces. Answers left-aligned: GRPO stopped at 0.848 on seed 0 (steps 20-120): every
7-digit product (17% of them) was copied one place off, all of a group alike, so no
gradient; right-aligned answers (envs.tasks.calculator_trace right_align) put every answer
digit at one distance from its digit in the observation.
"""

from rlreason import config as config_lib


def get_config(arg: str = ''):
  c = config_lib.default()
  c.seed = int(arg) if arg not in ('', 'runlocal') else 0
  c.data.task = 'calc_multiply'
  c.data.difficulty = 4
  c.data.prompt_template = '{prompt}\n'
  c.data.prompt_buckets = (41,)  # 'What is 1234 * 5678? Use the calculator.\n'
  c.model.arch = dict(vocab_size=0, hidden_size=64, intermediate_size=192, num_layers=2,
                      num_heads=4, num_kv_heads=4, head_dim=16, qkv_bias=False, qk_norm=False,
                      tie_embeddings=False, family='qwen2', rope_theta=10_000.0)
  c.tokenizer.kind = 'chars'
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
  c.rl.temperature = 1.0
  c.objective.advantage = 'grpo'
  c.objective.policy_loss = 'ppo_clip'
  c.objective.aggregation = 'token_mean'
  c.optimizer.lr = 5e-4
  c.optimizer.grad_clip = 1.0
  c.eval.every = 10
  c.eval.num_prompts = 500
  c.checkpoint.every = 20
  c.mesh = dict(data=1, fsdp=-1, tensor=1)  # All local devices (1 on a plain CPU).
  c.log_every = 5
  if arg == 'runlocal':
    shrink_for_runlocal(c)
  return c


def shrink_for_runlocal(c) -> None:
  """Seconds-long settings for smoke tests: a smaller model, 2-digit operands, 2 RL steps."""
  c.data.difficulty = 2
  c.data.prompt_buckets = (37,)
  c.model.arch.update(hidden_size=32, intermediate_size=64, num_layers=1, num_heads=2,
                      num_kv_heads=1, head_dim=16)
  c.env.update(max_turn_tokens=52, transcripts=2)
  c.rl.max_new_tokens = 132
  c.sft.steps, c.sft.batch_size = 2, 8
  c.rl.steps = 2
  c.rl.prompts_per_step = max(c.rl.minibatches, 2) * 2
  c.eval.every, c.eval.num_prompts = 2, 4
  c.checkpoint.every = 0
