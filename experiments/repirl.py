"""rePIRL on the demo's arithmetic: a PRM learned from expert traces only fixes the flawed SFT.

  python -m rlreason.main --config experiments/repirl.py --workdir /tmp/repirl
  python -m rlreason.main --config experiments/repirl.py:runlocal --workdir /tmp/x   # seconds

The demo (experiments/demo.py): 5-digit column addition, a tiny model warm-started on a teacher
that drops 75% of the carries (greedy pass@1 ~0.2 after SFT). Instead of GRPO on the verifier,
rePIRL (rl/repirl.py): the expert is the task's reference solutions (2 per prompt), the PRM is
the policy's architecture with a per-token scalar head, trained by the expert likelihood with
log Z importance-sampled from the policy's 8 samples per prompt pooled with the demos; the
policy takes max-entropy steps (alpha 0.05) on the PRM's dense token rewards. The verifier is
never trained on: 'train/reward' and 'eval/pass@1' read it.

Hardware: a 2-core CPU. The full run was not measured (see the study
experiments/dynamics/repirl_dense.py for what was); runlocal is a seconds-long smoke run.
"""

from experiments import demo


def get_config(arg: str = ''):
  c = demo.get_config('' if arg == 'runlocal' else arg)
  c.repirl.update(enabled=True, expert='', expert_per_prompt=2, prm_steps=1, prm_lr=3e-4,
                  alpha=0.05, pool_expert=True, reward_l2=1e-3)
  c.optimizer.lr = 2e-4
  if arg == 'runlocal':
    demo.shrink_for_runlocal(c)
  return c
