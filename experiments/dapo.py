"""DAPO (arXiv 2503.14476): clip-higher, token-mean loss, dynamic sampling.

  python -m rlreason.main --config experiments/dapo.py --workdir /tmp/dapo   # ~demo's runtime
  python -m rlreason.main --config experiments/dapo.py:runlocal --workdir /tmp/x   # smoke run

The demo's setting and hardware (see experiments/demo.py) with this objective, so its curve
compares with GRPO's. Expected result: not yet measured (only the smoke run is tested).
"""

from experiments import demo


def get_config(arg: str = ''):
  c = demo.get_config('' if arg == 'runlocal' else arg)
  c.objective.policy_loss = 'ppo_clip'
  c.objective.loss_kwargs = {'eps_low': 0.2, 'eps_high': 0.28}
  c.objective.aggregation = 'token_mean'
  c.rl.dynamic_sampling = True
  c.rl.max_refill_rounds = 2
  if arg == 'runlocal':
    demo.shrink_for_runlocal(c)
  return c
