"""OTB (arXiv 2602.07078): per-token optimal baseline, here at G = 4.

  python -m rlreason.main --config experiments/otb.py --workdir /tmp/otb   # ~demo's runtime
  python -m rlreason.main --config experiments/otb.py:runlocal --workdir /tmp/x   # smoke run

The demo's setting and hardware (see experiments/demo.py) with this objective, so its curve
compares with GRPO's. Expected result: not yet measured (only the smoke run is tested).
"""

from experiments import demo


def get_config(arg: str = ''):
  c = demo.get_config('' if arg == 'runlocal' else arg)
  c.objective.advantage = 'otb'
  c.objective.advantage_kwargs = {'zero_tail': False}
  c.rl.group_size = 4
  c.rl.prompts_per_step = 32
  if arg == 'runlocal':
    demo.shrink_for_runlocal(c)
  return c
