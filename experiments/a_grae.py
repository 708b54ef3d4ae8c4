"""A-GRAE (arXiv 2602.05548): asymmetric, difficulty-aware advantages.

  python -m rlreason.main --config experiments/a_grae.py --workdir /tmp/a_grae
  python -m rlreason.main --config experiments/a_grae.py:runlocal --workdir /tmp/a_grae_local

Hardware: a 2-core CPU. The setting is the embedded demo's (SFT on a flawed teacher, then RL
on column-wise 5-digit addition) with this method's objective, so curves are comparable with
`experiments/demo.py` (GRPO). Runtime: about as long as the demo (a few minutes); `runlocal`
is a seconds-long smoke run. Expected: held-out accuracy rising from the SFT plateau (~0.2);
this config has only been run as the smoke test, so no headline number is claimed yet.
"""

from experiments import demo


def get_config(arg: str = ''):
  c = demo.get_config('' if arg == 'runlocal' else arg)
  c.objective.transforms = ('a_grae',)
  c.objective.transform_kwargs = {'a_grae': {'alpha': 1.0}}
  if arg == 'runlocal':
    demo.shrink_for_runlocal(c)
  return c
