"""CISPO (arXiv 2506.13585): REINFORCE with a clipped, detached IS weight.

  python -m rlreason.main --config experiments/cispo.py --workdir /tmp/cispo   # ~demo's runtime
  python -m rlreason.main --config experiments/cispo.py:runlocal --workdir /tmp/x   # smoke run

The demo's setting and hardware (see experiments/demo.py) with this objective, so its curve
compares with GRPO's. Expected result: not yet measured (only the smoke run is tested).
"""

from experiments import demo


def get_config(arg: str = ''):
  c = demo.get_config('' if arg == 'runlocal' else arg)
  c.objective.policy_loss = 'cispo'
  c.objective.loss_kwargs = {'cap': 'relative', 'eps_high': 2.0}
  if arg == 'runlocal':
    demo.shrink_for_runlocal(c)
  return c
