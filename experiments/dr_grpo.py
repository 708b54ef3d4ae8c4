"""Dr. GRPO (arXiv 2503.20783): no std scaling, constant normaliser.

  python -m rlreason.main --config experiments/dr_grpo.py --workdir /tmp/dr_grpo
  python -m rlreason.main --config experiments/dr_grpo.py:runlocal --workdir /tmp/dr_grpo_local

Hardware: a 2-core CPU. The setting is the embedded demo's (SFT on a flawed teacher, then RL
on column-wise 5-digit addition) with this method's objective, so curves are comparable with
`experiments/demo.py` (GRPO). Runtime: about as long as the demo (a few minutes); `runlocal`
is a seconds-long smoke run. Expected: held-out accuracy rising from the SFT plateau (~0.2);
this config has only been run as the smoke test, so no headline number is claimed yet.
"""

from experiments import demo


def get_config(arg: str = ''):
  c = demo.get_config('' if arg == 'runlocal' else arg)
  c.objective.advantage = 'dr_grpo'
  c.objective.aggregation = 'constant_normalizer'
  if arg == 'runlocal':
    demo.shrink_for_runlocal(c)
  return c
