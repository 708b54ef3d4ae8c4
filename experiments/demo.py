"""The embedded default: SFT a tiny model on a flawed teacher, then GRPO fixes the flaw.

  make demo SEED=0      # both commands below, from a fresh clone
  python -m rlreason.main --config experiments/demo.py:0 --workdir /tmp/demo
  python -m experiments.demo_report --config experiments/demo.py:0 --workdir /tmp/demo

Hardware: a 2-core CPU. Runtime (measured 2026-12-01, nothing else running): `make demo
SEED=23` on a fresh clone, venv and install included (warm pip cache), 472 s; of which
rlreason.main ~260 s and demo_report ~130 s (seeds 21, 22).
Measured (seed: greedy pass@1 on 500 held-out problems after SFT -> after GRPO; SFT-only
continuation, RFT), this config (GRPO lr 2e-4): 13: 0.218 -> 1.000; 14: 0.196 -> 1.000;
15: 0.206 -> 1.000 (these three RL-only from their warm starts); 21: 0.208 -> 1.000 (0.208,
1.000); 22: 0.190 -> 1.000 (0.190, 1.000); 23: 0.222 -> 1.000 (0.188, 0.862). Those were
judged by a verifier that read only the number the chain spells; rerun (2026-12-01, load ~7)
with verify_carry_chain checking every digit and carry flag: 13: 0.216 -> 1.000 (0.222,
0.728); 15: 0.206 -> 0.988 (0.998 at steps 40 and 60; the 6 misses write the top column's
digit off by one); 21: 0.208 -> 0.998 (1.000 at step 60; 0.196, 0.856). The final greedy
completions of 15 and 21 get the same verdicts under the old rule, so those GRPO drops are
not the stricter check; whether 21's baselines moved (0.208 -> 0.196, 1.000 -> 0.856)
because of it or of other code changed meanwhile was not separated. With lr
1e-4, seed 15 stopped at 0.958 from step 40 on: its policy's entropy had collapsed to ~0.002
nats/token with 4% of problems wrong in one way (a carry emitted where the column sums to 9),
so their groups were all wrong and gave no gradient; at 2e-4 the flaw is fixed before the
collapse. Earlier variants: 2 layers with 600 SFT / 60 RL steps failed on
seed 12 (0.04 -> 0.06: its SFT stuck at loss 0.2 with digit errors).

Task: 5-digit addition written column by column ('8+3 5+0 6+7 8+0 1+8='), answered with one
(digit, carry) pair per column ('1,1 6,0 3,1 9,0 9,0'). The warm-start teacher drops the
carry in 75% of the columns whose sum is 10-12, so SFT learns the flaw and its greedy
accuracy plateaus near the fraction of problems with no such column (~0.2). GRPO with a
binary verifier reward: >= 0.99 by step 40 on the seeds above.
"""

from rlreason import config as config_lib


def get_config(arg: str = ''):
  c = config_lib.default()
  c.seed = int(arg) if arg not in ('', 'runlocal') else 0
  c.data.task = 'arithmetic'
  c.data.difficulty = 5
  c.data.task_options = {'layout': 'columns', 'final_answer': False}
  c.data.prompt_buckets = (20,)
  # 8 heads of 16 (not 4 of 32) and 3 layers (not 2): over 12 seeds, 4 heads left the SFT
  # loss plateau (~0.6, the column lookup not yet found) as late as step 700, and 2 layers
  # sometimes never learned the whole addition table (seed 12).
  c.model.arch = dict(vocab_size=0, hidden_size=128, intermediate_size=384, num_layers=3,
                      num_heads=8, num_kv_heads=8, head_dim=16, qkv_bias=False, qk_norm=False,
                      tie_embeddings=False, family='qwen2', rope_theta=10_000.0)
  c.tokenizer.kind = 'chars'
  c.sft.steps = 800
  c.sft.batch_size = 64
  c.sft.lr = 3e-3
  # Clipped: unclipped, a loss spike during the plateau (~0.6) could undo the column
  # alignment before it formed, and SFT then never left the plateau (seen at seed 3).
  c.sft.grad_clip = 1.0
  # Constant after warmup: a cosine decay froze some seeds (6, 8 of 12 tried) short of the
  # teacher's loss floor, with half-learned columns that RL then had to repair.
  c.sft.decay = False
  c.sft.teacher = 'rlreason.tasks.arithmetic:flawed_solution'
  c.sft.teacher_options = {'drop_carry_prob': 0.75}
  c.rl.steps = 80
  c.rl.prompts_per_step = 16
  c.rl.group_size = 8
  c.rl.max_new_tokens = 20
  c.rl.temperature = 1.0
  c.objective.advantage = 'grpo'
  c.objective.policy_loss = 'ppo_clip'
  c.objective.aggregation = 'token_mean'
  # 2e-4, not 1e-4: at 1e-4 seed 15's entropy collapsed before its last flaw was fixed.
  c.optimizer.lr = 2e-4
  c.optimizer.grad_clip = 1.0
  c.verifier.name = 'rlreason.tasks.arithmetic:verify_carry_chain'
  c.verifier.deadline_s = 30.0
  c.verifier.workers = 1
  c.eval.every = 20
  c.eval.num_prompts = 500
  c.checkpoint.every = 20
  c.mesh = dict(data=1, fsdp=-1, tensor=1)  # All local devices (1 on a plain CPU).
  c.log_every = 5
  if arg == 'runlocal':
    shrink_for_runlocal(c)
  return c


def shrink_for_runlocal(c) -> None:
  """Seconds-long settings for smoke tests: a smaller model, 2 RL steps, tiny eval."""
  c.data.difficulty = 2
  c.data.prompt_buckets = (8,)
  c.model.arch.update(hidden_size=32, intermediate_size=64, num_layers=1, num_heads=2,
                      num_kv_heads=1, head_dim=16)
  c.sft.steps, c.sft.batch_size = 2, 8
  c.rl.steps, c.rl.max_new_tokens = 2, 8
  c.rl.prompts_per_step = max(c.rl.minibatches, 2) * 2
  c.eval.every, c.eval.num_prompts = 2, 4
  c.checkpoint.every = 0
