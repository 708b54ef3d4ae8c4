"""rePIRL on the demo's arithmetic: a PRM learned from expert traces only fixes the flawed SFT.

  python -m rlreason.main --config experiments/repirl.py --workdir /tmp/repirl
  python -m rlreason.main --config experiments/repirl.py:runlocal --workdir /tmp/x   # seconds

The demo (experiments/demo.py): 5-digit column addition, a tiny model warm-started on a teacher
that drops 75% of the carries (greedy pass@1 ~0.2 after SFT). Instead of GRPO on the verifier,
rePIRL (methods/repirl.py): the expert is the task's reference solutions (2 per prompt), the PRM is
the policy's architecture with a per-token scalar head, trained by the expert likelihood with
log Z importance-sampled from the policy's 8 samples per prompt pooled with the demos (4 PRM
Adam steps of 1e-3 per step); the policy takes one max-entropy step (alpha 0.05, lr 5e-5) on
the PRM's dense token rewards. The verifier is never trained on: 'train/reward' and
'eval/pass@1' read it.

Hardware: a 2-core CPU. The full config (the demo's 800 SFT steps, 80 rePIRL steps) was not
run. Measured (2026-12-02, one seed, at load ~24 on the shared machine) on a reduced setting:
  python -m rlreason.main --config experiments/repirl.py:runlocal --workdir /tmp/r \
    --config.data.difficulty=2 --config.model.arch.hidden_size=64 \
    --config.model.arch.intermediate_size=128 --config.model.arch.num_layers=2 \
    --config.model.arch.num_heads=4 --config.model.arch.num_kv_heads=4 --config.sft.steps=400 \
    --config.sft.batch_size=32 --config.rl.steps=40 --config.rl.prompts_per_step=8 \
    --config.eval.every=20 --config.eval.num_prompts=64 --config.repirl.prm_steps=4
greedy pass@1 on 64 held-out problems 0.594 after SFT on the flawed teacher -> 0.828 (step
20) -> 1.000 (step 40); 79 s CPU, 9 min wall. With a slower PRM (prm_lr 3e-4, 1 Adam step
per step) and policy lr 2e-4 the same run fell 0.594 -> 0.156 -> 0.078: the PRM
had not yet separated the expert's traces from the samples (expert and sample returns
within 0.1 for 20 steps) while the policy followed its noise. One seed each; not compared
with GRPO on the verifier at this size.
"""

from experiments import demo


def get_config(arg: str = ''):
  c = demo.get_config('' if arg == 'runlocal' else arg)
  c.repirl.update(enabled=True, expert='', expert_per_prompt=2, prm_steps=4, prm_lr=1e-3,
                  alpha=0.05, pool_expert=True, reward_l2=1e-3)
  c.optimizer.lr = 5e-5
  if arg == 'runlocal':
    demo.shrink_for_runlocal(c)
    c.repirl.prm_steps = 1  # A smaller compiled step for the smoke test.
  return c
