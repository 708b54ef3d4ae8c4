"""R²PO (arXiv 2601.11960): a residual rollout head explores, the model's own head answers.

  python -m rlreason.main --config experiments/r2po.py --workdir /tmp/r2po   # ~demo's runtime
  python -m rlreason.main --config experiments/r2po.py:runlocal --workdir /tmp/x   # smoke run

The demo's setting and hardware (see experiments/demo.py) with R²PO's stages (methods/r2po.py):
the head alone on the rarity reward for steps 1-20, the backbone on GRPO with the head frozen
for 21-60, the head again for 61-70, then the backbone to the end (the reference's 2stage
switches at 40, 80, 100 of its run, scaled to the demo's 80 steps). As the reference: k3 KL
with β = 0.04 to the warm start, T = 1 here (the demo's; the reference samples at 0.9), and no
correction of the stage-2 ratio for the head-augmented behaviour policy (set
objective.correction='tis_token' to correct it; offpolicy/ metrics show the gap either way).
Expected result: not yet measured (only the smoke run is tested).
"""

from experiments import demo


def get_config(arg: str = ''):
  c = demo.get_config('' if arg == 'runlocal' else arg)
  c.r2po.enabled = True
  c.r2po.switch_steps = (20, 60, 70)
  c.objective.kl_coef, c.objective.kl_estimator = 0.04, 'k3'
  if arg == 'runlocal':
    demo.shrink_for_runlocal(c)
    c.r2po.switch_steps = (1,)  # One step of each stage.
  return c
