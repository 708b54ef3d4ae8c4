"""OTB (arXiv 2602.07078): per-token optimal baseline, here at G = 4.

  python -m rlreason.main --config experiments/otb.py --workdir /tmp/otb
  python -m rlreason.main --config experiments/otb.py:runlocal --workdir /tmp/otb_local

Hardware: a 2-core CPU. The setting is the embedded demo's (SFT on a flawed teacher, then RL
on column-wise 5-digit addition) with this method's objective, so curves are comparable with
`experiments/demo.py` (GRPO). Runtime: about as long as the demo (a few minutes); `runlocal`
is a seconds-long smoke run. Expected: held-out accuracy rising from the SFT plateau (~0.2);
this config has only been run as the smoke test, so no headline number is claimed yet.
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
