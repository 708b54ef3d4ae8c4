"""Study 5: trust regions under a high learning rate and stale rollouts

Question: with several updates per batch, a behaviour policy two iterations old and a large
learning rate, how do PPO's clip, DAPO's clip-higher, CISPO's clipped IS weight and QUATRO's
per-prompt KL trust region (our formalisation, algorithms.md §7) differ in entropy, KL to the
behaviour policy and stability across seeds?

  python -m experiments.dynamics.trust_regions            # full run, writes colab/figures/05_*.png
  python -m experiments.dynamics.trust_regions --smoke    # seconds
  python -m experiments.dynamics.trust_regions --write_notebook   # regenerates colab/05_*.ipynb

Runtime: full run about 40 s of CPU (3.7 min wall on the shared 2-core machine), smoke a few
seconds.

Setup: a contextual bandit with sequence-like answers: 8 prompts, each answer 4 tokens drawn
independently per position from 16 choices, one correct choice per position with initial mass
0.05 ... 0.4 depending on the prompt; reward = fraction of correct positions; G = 8, GRPO
advantages, token-mean; Adam on the logits; 4 updates per batch and rollouts from the policy 2
iterations old; learning rate 0.01 (moderate), 0.1 and 1 (high); 150 iterations, 32 seeds.
Losses: no trust region (PPO-clip with ε = ∞), PPO-clip ε = 0.2, clip-higher 0.2 / 0.28, CISPO
weight clip [0, 1.2] (verl's example), QUATRO δ = 0.02 (REPS dual per prompt, token ratios)
with the §7 stabiliser ρ log ρ and with the 'kl_generator' one (ρ log ρ − ρ + 1).

Result: (full run, 32 seeds; "locked" = a position whose mass sits > 0.99 on a wrong token)
* lr 0.01: no ratio leaves the clip range, so no trust region, PPO clip, clip-higher and CISPO
  give the same curves (final expected reward 0.966). QUATRO with the §7 stabiliser ρ log ρ
  learns far slower (0.51): at ρ = 1 its λ term adds −λ ∇log π on every sampled token, which has
  zero mean in expectation but on a finite group pushes all sampled answers down; the
  'kl_generator' form (no such term) reaches 0.949 with slightly higher entropy.
* lr 0.1: everything but §7-QUATRO reaches 0.997-0.999; clipping halves the KL to the
  behaviour policy (0.031 vs 0.050 for no trust region and CISPO); one CISPO seed lags (0.968).
* lr 1 (aggressive): without a trust region 44% of positions lock onto a wrong token (reward
  0.56, seed std 0.09); PPO clip and clip-higher keep 0.937 with 4.5% locked; CISPO, which
  never masks a token's gradient, behaves like no trust region (30% locked, 0.66); QUATRO
  collapses too (kl_generator 37% locked, 0.44; §7 form 67%, 0.11). Clip-higher is
  indistinguishable from PPO clip here; entropy collapses within ~10 iterations for all.
* Against the paper's claims: QUATRO's robustness to large learning rates and staleness is NOT
  reproduced by our formalisation (algorithms.md §7 is [I]; the paper's method section could
  not be read), and in this toy the hard clip is the most stable of the five. The claim that
  clipping's zero gradients cause collapse does not show at this scale.
"""

import functools

import jax
import jax.numpy as jnp
import matplotlib.pyplot as plt
import numpy as np
import optax

from experiments import dynamics as studies
from rlreason.dynamics import bandit
from rlreason.objectives import advantages
from rlreason.objectives import losses
from rlreason.objectives import trust_region


def simulate(smoke: bool) -> dict:
  """Each method at each learning rate: metrics with axes [lr, seed, iteration]."""
  logits, correct = bandit.difficulty_ladder(
      success_B=np.linspace(0.05, 0.4, 8), num_answers=16, num_correct=1, position_count=4)
  iterations, seeds = (10, 2) if smoke else (150, 32)
  group_size = 8
  lrs = np.array([0.01, 0.1, 1.0])

  def train_for(hparams, key, loss_fn):
    return bandit.make_train(
        correct_BxLxV=correct, init_params=logits, advantage_fn=advantages.grpo,
        loss_fn=functools.partial(loss_fn, **hparams['loss']),
        optimizer=optax.adam(hparams['lr']), group_size=group_size, num_iterations=iterations,
        num_updates=4, staleness=2)(key)

  # Methods that differ only in numbers share one compilation (their options are traced).
  ppo_family = {'no trust region': (1e9, 1e9), 'PPO clip 0.2': (0.2, 0.2),
                'clip-higher 0.2/0.28': (0.2, 0.28)}
  programs = {
      'ppo': (losses.ppo_clip, list(ppo_family),
              [dict(eps_low=lo, eps_high=hi) for lo, hi in ppo_family.values()]),
      'cispo': (functools.partial(losses.cispo, cap='relative'), ['CISPO [0, 1.2]'],
                [dict(eps_low=1.0, eps_high=0.2)]),
      'quatro': (functools.partial(trust_region.quatro, group_size=group_size),
                 ['QUATRO δ=0.02'], [dict(delta=0.02)]),
      'quatro_kl_generator': (functools.partial(trust_region.quatro, group_size=group_size,
                                                stabilizer='kl_generator'),
                              ['QUATRO δ=0.02 kl_generator'], [dict(delta=0.02)]),
  }
  if smoke:  # Same code path as 'quatro' with another option string: one compilation fewer.
    del programs['quatro_kl_generator']
  out = {'lrs': lrs, 'methods': {}}
  for loss_fn, names, options in programs.values():
    grid = {'lr': jnp.tile(jnp.asarray(lrs), len(names)),
            'loss': {k: jnp.repeat(jnp.asarray([o[k] for o in options], jnp.float32), len(lrs))
                     for k in options[0]}}
    state, metrics = bandit.run_grid(functools.partial(train_for, loss_fn=loss_fn), grid,
                                       seed=0, num_seeds=seeds)
    probs_CxRxBxLxV = jax.nn.softmax(state.params, -1)
    # A position has collapsed onto a wrong answer when one wrong choice holds > 0.99.
    locked_CxRxBxL = jnp.max(jnp.where(correct > 0, 0.0, probs_CxRxBxLxV), -1) > 0.99
    for i, name in enumerate(names):
      rows = slice(i * len(lrs), (i + 1) * len(lrs))  # this method's learning rates
      out['methods'][name] = {
          'success_CxRxI': np.asarray(metrics['success_B'][rows].mean(-1)),
          'entropy_CxRxI': np.asarray(metrics['entropy'][rows]),
          'kl_CxRxI': np.asarray(metrics['kl_behaviour'][rows]),
          'wrong_lock_CxR': np.asarray(locked_CxRxBxL[rows].mean((-1, -2))),
      }
  return out


def figure(results: dict):
  """Rows: success, entropy, KL to the behaviour policy; columns: learning rates."""
  lrs = results['lrs']
  fig, axes = plt.subplots(3, len(lrs), figsize=(5 * len(lrs), 10), squeeze=False)
  for name, run in results['methods'].items():
    for c, lr in enumerate(lrs):
      x_I = np.arange(1, run['success_CxRxI'].shape[-1] + 1)
      line = bandit.plot_band(axes[0, c], x_I, run['success_CxRxI'][c], label=name)
      bandit.plot_band(axes[1, c], x_I, run['entropy_CxRxI'][c], label=name,
                         color=line.get_color())
      bandit.plot_band(axes[2, c], x_I, np.maximum(run['kl_CxRxI'][c], 1e-6), label=name,
                         color=line.get_color())
      axes[0, c].set(title=f'Adam lr {lr:g}: expected reward', ylim=(0, 1.02))
      axes[1, c].set(title='mean per-position entropy (nats)')
      axes[2, c].set(title='KL(π_new ‖ π_behaviour), behaviour 2 iterations old', yscale='log',
                     xlabel='iteration')
  axes[0, 0].legend(fontsize=8)
  fig.tight_layout()
  return fig


def summary(results: dict) -> str:
  """Final expected reward (median, seed std), entropy, mean KL, wrong-locked positions."""
  lines = []
  for c, lr in enumerate(results['lrs']):
    for name, run in results['methods'].items():
      final_R = run['success_CxRxI'][c, :, -1]
      lines.append(
          f'lr={lr:g} {name:28s} reward {np.median(final_R):.3f} (seed std {final_R.std():.3f}, '
          f'min {final_R.min():.3f}), entropy {np.median(run["entropy_CxRxI"][c, :, -1]):.3f}, '
          f'mean KL {run["kl_CxRxI"][c].mean():.3f}, '
          f'wrong-locked positions {run["wrong_lock_CxR"][c].mean():.3f}')
  return '\n'.join(lines)


def main():
  studies.run_study(__name__, notebook='05_trust_regions', dpi=60)


if __name__ == '__main__':
  main()
