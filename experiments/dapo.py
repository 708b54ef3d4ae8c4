"""DAPO (arXiv 2503.14476): clip-higher, token-mean loss, dynamic sampling.

  python -m rlreason.main --config experiments/dapo.py --workdir /tmp/dapo
  python -m rlreason.main --config experiments/dapo.py:runlocal --workdir /tmp/dapo_local

Hardware: a 2-core CPU. The setting is the embedded demo's (SFT on a flawed teacher, then RL
on column-wise 5-digit addition) with this method's objective, so curves are comparable with
`experiments/demo.py` (GRPO). Runtime: about as long as the demo (a few minutes); `runlocal`
is a seconds-long smoke run. Expected: held-out accuracy rising from the SFT plateau (~0.2);
this config has only been run as the smoke test, so no headline number is claimed yet.
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
