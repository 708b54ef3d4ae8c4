"""GSPO (arXiv 2507.18071): clipping on the length-normalised sequence ratio.

  python -m rlreason.main --config experiments/gspo.py --workdir /tmp/gspo   # ~demo's runtime
  python -m rlreason.main --config experiments/gspo.py:runlocal --workdir /tmp/x   # smoke run

The demo's setting and hardware (see experiments/demo.py) with this objective, so its curve
compares with GRPO's. Expected result: not yet measured (only the smoke run is tested).
"""

from experiments import demo


def get_config(arg: str = ''):
  c = demo.get_config('' if arg == 'runlocal' else arg)
  c.objective.policy_loss = 'gspo'
  c.objective.aggregation = 'seq_mean_token_mean'
  c.rl.minibatches = 2
  if arg == 'runlocal':
    demo.shrink_for_runlocal(c)
  return c
