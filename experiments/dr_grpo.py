"""Dr. GRPO (arXiv 2503.20783): no std scaling, constant normaliser.

  python -m rlreason.main --config experiments/dr_grpo.py --workdir /tmp/dr_grpo   # ~demo's runtime
  python -m rlreason.main --config experiments/dr_grpo.py:runlocal --workdir /tmp/x   # smoke run

The demo's setting and hardware (see experiments/demo.py) with this objective, so its curve
compares with GRPO's. Expected result: not yet measured (only the smoke run is tested).
"""

from experiments import demo


def get_config(arg: str = ''):
  c = demo.get_config('' if arg == 'runlocal' else arg)
  c.objective.advantage = 'dr_grpo'
  c.objective.aggregation = 'constant_normalizer'
  if arg == 'runlocal':
    demo.shrink_for_runlocal(c)
  return c
