"""QUATRO (arXiv 2602.04620): per-prompt KL trust region, dual solved by bisection.

  python -m rlreason.main --config experiments/quatro.py --workdir /tmp/quatro   # ~demo's runtime
  python -m rlreason.main --config experiments/quatro.py:runlocal --workdir /tmp/x   # smoke run

The demo's setting and hardware (see experiments/demo.py) with this objective, so its curve
compares with GRPO's. The form is the log-space target (objectives/quatro_variants.py, our
formalisation [I]): the most stable QUATRO form in colab/05_trust_regions. Expected result: not
yet measured (only the smoke run is tested).
"""

from experiments import demo


def get_config(arg: str = ''):
  c = demo.get_config('' if arg == 'runlocal' else arg)
  c.objective.policy_loss = 'quatro_log_target'
  c.objective.loss_kwargs = {'delta': 0.05}
  c.objective.aggregation = 'seq_mean_token_mean'
  if arg == 'runlocal':
    demo.shrink_for_runlocal(c)
  return c
