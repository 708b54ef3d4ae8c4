"""Study 6: symmetric (GRPO) vs asymmetric (A-GRAE) advantages

Question: A-GRAE (arXiv 2602.05548) says GRPO's symmetric advantages leave the logits of
unsampled correct answers unchanged (weak exploration) and favour medium-difficulty prompts at
every stage, and that suppressing positive advantages while shifting the focus from easy to
hard prompts fixes both. On a contextual bandit with prompts of graded difficulty, do the
unsampled-correct logits move, and where does each method spend its updates over training?

  python -m experiments.dynamics.asymmetric_advantages            # full run, colab/figures/06_*.png
  python -m experiments.dynamics.asymmetric_advantages --smoke    # seconds
  python -m experiments.dynamics.asymmetric_advantages --write_notebook   # colab/06_*.ipynb

Runtime: full run about 15 s of CPU (40 s - 2 min wall on the shared 2-core machine), smoke a
few seconds.

Setup: 8 prompts with initial success 0.02 ... 0.8 (log-spaced), 64 answers each, 4 of them
correct sharing that mass; G = 8; GRPO advantages (unbiased std) with or without the A-GRAE
transform (α = 1, batch accuracy µ̄ = the batch's mean success); on-policy PPO-clip (one update
per batch, i.e. policy gradient), token-mean, SGD lr 2 on the logits; 300 iterations, 32 seeds.

Result: (full run, 32 seeds)
* Exploration: with GRPO's symmetric advantages (which sum to 0 per group) the logits of the
  correct answers a group did not sample stay exactly unchanged (Σ Δlogit = 0.000, as the
  hand derivation in tests/dynamics_test.py predicts); A-GRAE's suppressed positive advantages
  make Σ A < 0 and raise every unsampled logit (cumulative +0.39). A-GRAE also keeps more of
  the 4 correct answers alive per prompt (effective number 1.99 vs 1.60). Same direction as the
  paper's claim (i).
* Difficulty focus: A-GRAE puts 79% of the first tenth of its updates on the 3 easiest prompts
  (initial success 0.28-0.8; GRPO 58%) and 88% of the last tenth on the 3 hardest (0.02-0.06;
  GRPO 75%): the easy-to-hard shift is visible and sharper than GRPO's. GRPO's own focus
  follows the prompts whose groups are most often mixed at the time (success near 0.5), so it
  also drifts to the hard prompts once the easy ones saturate.
* Efficiency: NOT the paper's direction at this scale: after 300 iterations GRPO has solved
  more (hardest prompt 0.40 vs 0.05, second hardest 0.98 vs 0.23; pass@1 0.923 vs 0.787; both
  reach pass@256 = 1.0). Suppressing positives while the batch accuracy is low slows
  learning on hard prompts, where a correct sample is the only signal; the bandit has no
  shared parameters, so exploration cannot pay off by generalising.
"""


import jax
import matplotlib.pyplot as plt
import numpy as np
import optax

from experiments import dynamics as studies
from rlreason.dynamics import bandit
from rlreason.objectives import advantage_transforms
from rlreason.objectives import advantages
from rlreason.objectives import losses


def simulate(smoke: bool) -> dict:
  """GRPO and A-GRAE runs: per-prompt success, update size, unsampled-correct logit drift."""
  success_B = np.geomspace(0.02, 0.8, 8)
  logits, correct = bandit.difficulty_ladder(success_B=success_B, num_answers=64,
                                               num_correct=4)
  iterations, seeds = (15, 2) if smoke else (300, 32)

  def a_grae(rewards_BxG):
    return advantage_transforms.a_grae(advantages.grpo(rewards_BxG), rewards_BxG, alpha=1.0)

  out = {'success0_B': success_B, 'methods': {}}
  for name, advantage_fn in (('GRPO', advantages.grpo), ('A-GRAE', a_grae)):
    train = bandit.make_train(
        correct_BxLxV=correct, init_params=logits, advantage_fn=advantage_fn,
        loss_fn=losses.ppo_clip, optimizer=optax.sgd(2.0), group_size=8,
        num_iterations=iterations)
    state, metrics = bandit.run_seeds(train, seed=0, num_seeds=seeds)
    probs_RxBxV = np.asarray(jax.nn.softmax(state.params, -1))[:, :, 0]
    correct_probs_RxBx4 = probs_RxBxV[..., :4] / probs_RxBxV[..., :4].sum(-1, keepdims=True)
    out['methods'][name] = {
        'success_RxIxB': np.asarray(metrics['success_B']),
        'update_norm_RxIxB': np.asarray(metrics['update_norm_B']),
        'unsampled_logit_delta_RxI': np.asarray(metrics['unsampled_correct_logit_delta']),
        'entropy_RxI': np.asarray(metrics['entropy']),
        # exp(entropy) of the mass among the 4 correct answers: 4 = all kept, 1 = one survives.
        'correct_modes_RxB': np.exp(-np.sum(correct_probs_RxBx4 * np.log(
            np.maximum(correct_probs_RxBx4, 1e-30)), -1)),
    }
  out['ks'] = np.array([1, 2, 4, 8, 16, 32, 64, 128, 256])
  for run in out['methods'].values():
    final_RxB = run['success_RxIxB'][:, -1]
    run['pass_at_k_J'] = np.asarray(bandit.pass_at_k_exact(final_RxB, ks=out['ks'])).mean((0, 1))
  return out


def figure(results: dict):
  """Per-prompt success; update share by difficulty; unsampled-correct logit drift; pass@k."""
  names = list(results['methods'])
  fig, axes = plt.subplots(2, 3, figsize=(15, 8))
  colors = plt.cm.viridis(np.linspace(0, 0.9, len(results['success0_B'])))
  for col, name in enumerate(names):
    run = results['methods'][name]
    x_I = np.arange(1, run['success_RxIxB'].shape[1] + 1)
    for b, color in enumerate(colors):
      axes[0, col].plot(x_I, np.median(run['success_RxIxB'][:, :, b], 0), color=color,
                        label=f'p₀={results["success0_B"][b]:.2f}')
    axes[0, col].set(title=f'{name}: success per prompt (median)', xlabel='iteration',
                     ylim=(0, 1.02))
    share_IxB = bandit.update_share(run['update_norm_RxIxB'])
    axes[1, col].stackplot(x_I, share_IxB.T, colors=colors)
    axes[1, col].set(title=f'{name}: share of ‖Δlogits‖ per prompt (hard at the bottom)',
                     xlabel='iteration', ylim=(0, 1))
  axes[0, 0].legend(fontsize=7, ncol=2)
  for name in names:
    run = results['methods'][name]
    x_I = np.arange(1, run['unsampled_logit_delta_RxI'].shape[1] + 1)
    axes[0, 2].plot(x_I, np.cumsum(run['unsampled_logit_delta_RxI'].mean(0)), label=name)
    axes[1, 2].plot(results['ks'], run['pass_at_k_J'], 'o-', label=name)
  axes[0, 2].set(title='Σ mean Δlogit of unsampled correct answers', xlabel='iteration')
  axes[0, 2].legend()
  axes[1, 2].set(title='pass@k at the end (exact, mean over prompts)', xscale='log', xlabel='k')
  axes[1, 2].legend()
  fig.tight_layout()
  return fig


def summary(results: dict) -> str:
  """Final per-prompt success, update shares early / late, drift, modes kept, pass@k."""
  lines = []
  for name, run in results['methods'].items():
    succ_B = np.median(run['success_RxIxB'][:, -1], 0)
    share_IxB = bandit.update_share(run['update_norm_RxIxB'])
    n = share_IxB.shape[0]
    early_B, late_B = share_IxB[: max(1, n // 10)].mean(0), share_IxB[-max(1, n // 10):].mean(0)
    lines.append(
        f'{name}: final success per prompt [{" ".join(f"{x:.3f}" for x in succ_B)}]; '
        f'update share of the 3 hardest / 3 easiest prompts: '
        f'first 10% {early_B[:3].sum():.2f} / {early_B[-3:].sum():.2f},'
        f' last 10% {late_B[:3].sum():.2f} / {late_B[-3:].sum():.2f}; Σ unsampled-correct Δlogit '
        f'{run["unsampled_logit_delta_RxI"].mean(0).sum():+.3f}; correct modes kept (of 4) '
        f'{run["correct_modes_RxB"].mean():.2f}; pass@1 {run["pass_at_k_J"][0]:.3f}, '
        f'pass@256 {run["pass_at_k_J"][-1]:.3f}')
  return '\n'.join(lines)


def main():
  studies.run_study(__name__, notebook='06_asymmetric_advantages', dpi=60)


if __name__ == '__main__':
  main()
