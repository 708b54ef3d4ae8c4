"""SOUP / "Thinking Seeds" (arXiv 2601.21476, algorithms.md §15): historical-snapshot prefixes.

  python -m rlreason.main --config experiments/soup.py --workdir /tmp/soup       # ~demo's runtime
  python -m rlreason.main --config experiments/soup.py:runlocal --workdir /tmp/x  # smoke run

The demo's setting and hardware (experiments/demo.py: 5-digit column addition, SFT on a teacher
that drops carries, then RL) with SOUP's rollouts (methods/soup.py, our formalisation): a buffer of
the 4 newest policy snapshots (one every 10 steps, the warm start first); in each group of 8,
the first 4 rows start with a prefix of 1..Q' tokens (Q' ≤ 12) sampled by a snapshot drawn
uniformly by age, and the current policy continues. The loss is prefix_mixed_ppo: prefix
tokens' ratio is π_θ/π_h against the snapshot's recorded log-prob, with a tighter clip (0.1),
continuation tokens π_θ/π_old. Rewards on the whole response, GRPO advantages over all 8.
Arguments combine with commas: a seed, 'runlocal'.

Expected result: not measured at this config's full scale; experiments/dynamics/soup_entropy.py
compares entropy and pass@k over training with plain GRPO on a toy setting.
"""

from experiments import demo


def get_config(arg: str = ''):
  parts = {p for p in arg.split(',') if p}
  unknown = {p for p in parts if p != 'runlocal' and not p.isdigit()}
  if unknown:
    raise ValueError(f"experiments/soup.py: unknown argument(s) {sorted(unknown)}; use a seed, "
                     "'runlocal', joined by commas.")
  seeds = [p for p in parts if p.isdigit()]
  c = demo.get_config(seeds[0] if seeds else '')
  c.prefix_rollouts.update(enabled=True, max_tokens=12, rows_per_group=4, refresh_every=10,
                           keep=4, age_decay=1.0)
  c.objective.policy_loss = 'prefix_mixed_ppo'
  c.objective.loss_kwargs = {'prefix_eps_low': 0.1, 'prefix_eps_high': 0.1}
  if 'runlocal' in parts:
    demo.shrink_for_runlocal(c)
    c.prefix_rollouts.update(max_tokens=4, rows_per_group=1, refresh_every=1, keep=2)
    c.rl.group_size = 2
  return c
