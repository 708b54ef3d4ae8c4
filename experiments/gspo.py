"""GSPO (arXiv 2507.18071): clipping on the length-normalised sequence ratio.

  python -m rlreason.main --config experiments/gspo.py --workdir /tmp/gspo
  python -m rlreason.main --config experiments/gspo.py:runlocal --workdir /tmp/gspo_local

Hardware: a 2-core CPU. The setting is the embedded demo's (SFT on a flawed teacher, then RL
on column-wise 5-digit addition) with this method's objective, so curves are comparable with
`experiments/demo.py` (GRPO). Runtime: about as long as the demo (a few minutes); `runlocal`
is a seconds-long smoke run. Expected: held-out accuracy rising from the SFT plateau (~0.2);
this config has only been run as the smoke test, so no headline number is claimed yet.
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
