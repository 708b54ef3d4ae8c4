"""F-GRPO (arXiv 2602.06717): focal scaling of GRPO advantages by group success.

  python -m rlreason.main --config experiments/f_grpo.py --workdir /tmp/f_grpo   # ~demo's runtime
  python -m rlreason.main --config experiments/f_grpo.py:runlocal --workdir /tmp/x   # smoke run

The demo's setting and hardware (see experiments/demo.py) with this objective, so its curve
compares with GRPO's. Expected result: not yet measured (only the smoke run is tested).
"""

from experiments import demo


def get_config(arg: str = ''):
  c = demo.get_config('' if arg == 'runlocal' else arg)
  c.objective.transforms = ('f_grpo',)
  c.objective.transform_kwargs = {'f_grpo': {'gamma': 0.5}}
  if arg == 'runlocal':
    demo.shrink_for_runlocal(c)
  return c
