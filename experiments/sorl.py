"""SORL (SO-GRPO / SO-PPO, arXiv 2511.20718) on tool-using episodes, trained off-policy.

  python -m rlreason.main --config experiments/sorl.py --workdir /tmp/sorl            # SO-GRPO
  python -m rlreason.main --config experiments/sorl.py:so_ppo --workdir /tmp/so_ppo   # SO-PPO
  python -m rlreason.main --config experiments/sorl.py:runlocal --workdir /tmp/sorl_rl  # smoke

The tool demo's task, model and warm start (experiments/demo_tools.py: calc_multiply with
4-digit operands, the calculator tool in the 'tags' format, a 2-layer d = 64 model SFT'd on a
teacher that mostly misnames the tool), then RL on 2-turn episodes (the call, the tool's
result as a masked observation, the answer) with SORL's loss (losses.sorl, our formalisation
of algorithms.md §14): each turn's importance ratio is the geometric mean of its tokens'
ratios, clipped at [0.8, 1.2] as a whole, and rows with clipped tokens weigh less, the loss
renormalised by the weights' global sum (clipping-triggered normalisation). Off-policy on
purpose: 2 epochs x 4 minibatches = 8 updates per sampled batch, so the later minibatches
are trained with a policy up to 7 updates away from the one that sampled them.
SO-GRPO: group advantages (G = 8). `:so_ppo`: GAE with the turn-level critic (a value head;
one GAE step per turn, the value read at the turn's first token: our formalisation).
Arguments combine with commas: '3' (seed), 'so_ppo', 'runlocal'.

Runtime: as the tool demo (its 800 SFT steps and 40 RL steps; the 4x more updates per step
add ~1-2 min on the 2-core CPU VM). Expected: greedy pass@1 0 -> ~1 as the demo's GRPO;
experiments/dynamics/sorl_stability.py compares SO-GRPO with token-level PPO-clip under
heavier off-policy training.
"""

from experiments import demo_tools


def get_config(arg: str = ''):
  parts = {p for p in arg.split(',') if p}
  unknown = {p for p in parts if p not in ('so_ppo', 'runlocal') and not p.isdigit()}
  if unknown:
    raise ValueError(f"experiments/sorl.py: unknown argument(s) {sorted(unknown)}; use a seed, "
                     "'so_ppo', 'runlocal', joined by commas.")
  seeds = [p for p in parts if p.isdigit()]
  c = demo_tools.get_config(seeds[0] if seeds else '')
  c.objective.policy_loss = 'sorl'
  c.objective.loss_kwargs = {'eps_low': 0.2, 'eps_high': 0.2, 'turn_ratio': 'geometric',
                             'normalization': 'reliability'}
  c.objective.aggregation = 'token_mean'  # The reliability normalisation needs it.
  c.rl.epochs, c.rl.minibatches = 2, 4
  if 'so_ppo' in parts:
    c.objective.advantage = 'gae'
    c.objective.advantage_kwargs = {'gamma': 1.0, 'lam': 1.0, 'turn_level': True}
    # As experiments/ppo_critic.py: a fresh head on a small model needs a large lr.
    c.critic.update(enabled=True, lr=1e-3, warmup_steps=0, coef=0.5, clip=0.5, grad_clip=1.0)
  if 'runlocal' in parts:
    demo_tools.shrink_for_runlocal(c)
    c.rl.epochs, c.rl.minibatches = 2, 2
    c.rl.prompts_per_step = 4
    c.rl.group_size = 2
  return c
