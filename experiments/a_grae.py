"""A-GRAE (arXiv 2602.05548): asymmetric, difficulty-aware advantages.

  python -m rlreason.main --config experiments/a_grae.py --workdir /tmp/a_grae   # ~demo's runtime
  python -m rlreason.main --config experiments/a_grae.py:runlocal --workdir /tmp/x   # smoke run

The demo's setting and hardware (see experiments/demo.py) with this objective, so its curve
compares with GRPO's. Expected result: not yet measured (only the smoke run is tested).
"""

from experiments import demo


def get_config(arg: str = ''):
  c = demo.get_config('' if arg == 'runlocal' else arg)
  c.objective.transforms = ('a_grae',)
  c.objective.transform_kwargs = {'a_grae': {'alpha': 1.0}}
  if arg == 'runlocal':
    demo.shrink_for_runlocal(c)
  return c
