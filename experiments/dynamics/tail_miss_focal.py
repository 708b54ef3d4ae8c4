"""Study 2: tail miss and focal scaling (F-GRPO, arXiv 2602.06717)

Question: how likely is a group of N samples to reward a prompt while missing its rare correct
answer, and does GRPO on a categorical bandit with a common and a rare correct answer shrink
the rare (usually unsampled) correct mass while the total correct mass grows? Does F-GRPO's
focal scaling (1 - µ̂)^γ change that, and what happens to pass@k?

  python -m experiments.dynamics.tail_miss_focal            # full run, colab/figures/02_*.png
  python -m experiments.dynamics.tail_miss_focal --smoke    # seconds
  python -m experiments.dynamics.tail_miss_focal --write_notebook   # regenerates colab/02_*.ipynb

Runtime: full run about 35 s of CPU (1.5-2.5 min wall on the shared 2-core machine), mostly
compilation; smoke a few seconds.

Setup: one prompt, 256 answers; answer 0 correct with initial mass 0.25, answer 1 correct with
0.02 (the rare mode), 254 wrong. GRPO advantages (unbiased std), on-policy PPO-clip loss (one
update per batch, so r = 1 and it is plain policy gradient), token-mean, SGD lr 0.5 on the
logits, 300 iterations, 64 seeds; γ ∈ {0 (GRPO), 0.5, 1} at N = 8 and GRPO at N = 32.
Then 8 prompts sharing parameters (logits = shared_V + own_BxV, 64 answers, the shared part
initialised as above): on 6 easy prompts answers 0 and 1 are correct, on 2 hard ones only
answer 1, the globally rare one; same training, γ ∈ {0, 0.5, 1}.

Result: (full run, 64 seeds)
* Tail miss: the Monte-Carlo frequency (50,000 groups) matches eq. 11 within 0.004 at every N
  for the three (µ, τ); it is non-monotonic in N with its peak at N = 6-8 (0.70 for µ = 0.6,
  τ = 0.05), as the paper says.
* GRPO at N = 8: the total correct mass µ rises from 0.31 (after one step) to 0.997 while the
  rare correct mass τ falls from 0.019 to 0.00008, in every seed; the mass of the correct
  answers a group did not sample drifts down at every iteration. Same direction as the paper's
  claim (sharpening onto the common mode).
* F-GRPO: after 300 iterations γ = 0.5 / 1 keep τ 3x / 8x higher (0.00024 / 0.00061) but with
  lower µ (0.992 / 0.979). Plotted against µ, the τ(µ) curves of γ = 0, 0.5, 1 and of GRPO at
  N = 32 coincide: on one prompt the focal weight only acts as a µ-dependent step size, slowing
  the sharpening without changing where it leads. The paper's gain comes from reweighting
  prompts against each other, which a one-prompt bandit cannot show; this study does not
  confirm it. GRPO at N = 32 loses τ faster per iteration, not slower.
* pass@k: with one prompt pass@k = 1 - (1 - µ)^k rises with µ, so it cannot drop here (the
  unbiased estimator on 256 samples of the final policies, evaluate.pass_at_k, agrees with the
  exact value). The rare answer's own pass@32 falls from 0.46 to 0.003 (GRPO), 0.008 (γ = 0.5),
  0.020 (γ = 1).
* Prompts sharing parameters, where the cross-prompt claim can show: GRPO drives the easy
  prompts to 0.997 and, through the shared logits, the hard prompts from 0.020 to 0.000; pass@1
  over the 8 prompts rises 0.21 -> 0.75 while pass@64 falls 0.93 -> 0.76 (pass@k curves cross
  near k = 10). F-GRPO keeps more of the hard prompts' mass (0.001 / 0.005 for γ = 0.5 / 1) and
  more pass@64 (0.77 / 0.82) at almost the same pass@1 (0.74 / 0.73): the paper's direction
  (pass@1 stable, pass@k higher), though the hard prompts still decline under every γ, only
  more slowly.
"""


import jax
import jax.numpy as jnp
import matplotlib.pyplot as plt
import numpy as np
import optax

from experiments import dynamics as studies
from rlreason.dynamics import bandit
from rlreason.objectives import advantage_transforms
from rlreason.objectives import advantages
from rlreason.objectives import losses
from rlreason.rl import evaluate


def simulate(smoke: bool) -> dict:
  """Tail-miss curves and the bandit runs; returns numpy arrays keyed by what they hold."""
  out = {}
  # 1. Tail miss: analytic (eq. 11) against Monte-Carlo, for a few (µ, τ).
  out['group_sizes'] = (1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64)
  out['mu_tau'] = ((0.6, 0.05), (0.3, 0.02), (0.9, 0.1))
  num_groups = 2_000 if smoke else 50_000
  out['tail_exact'] = [np.asarray(advantage_transforms.tail_miss_probability(
      np.array(out['group_sizes']), mu=mu, tau=tau)) for mu, tau in out['mu_tau']]
  out['tail_mc'] = [np.asarray(bandit.tail_miss_monte_carlo(
      jax.random.key(i), group_sizes=out['group_sizes'], mu=mu, tau=tau, num_groups=num_groups))
      for i, (mu, tau) in enumerate(out['mu_tau'])]
  out['tail_num_groups'] = num_groups

  # 2. One prompt: GRPO and F-GRPO (γ traced, one compilation for every γ) at each N.
  logits, correct = bandit.two_answer_bandit(num_answers=256, common_mass=0.25, rare_mass=0.02)
  iterations, seeds = (20, 4) if smoke else (300, 64)
  out['gammas'] = np.array([0.0, 0.5, 1.0])
  out['runs'] = {}
  for group_size in ((8,) if smoke else (8, 32)):
    def train_for(gamma, key, group_size=group_size):
      def focal_grpo(rewards_BxG):
        return advantage_transforms.focal_scale(advantages.grpo(rewards_BxG), rewards_BxG,
                                                gamma=gamma)
      return bandit.make_train(
          correct_BxLxV=correct, init_params=logits, advantage_fn=focal_grpo,
          loss_fn=losses.ppo_clip, optimizer=optax.sgd(0.5), group_size=group_size,
          num_iterations=iterations, record_probs=True)(key)

    gammas = out['gammas'] if group_size == 8 else out['gammas'][:1]
    state, metrics = bandit.run_grid(train_for, jnp.asarray(gammas), seed=0, num_seeds=seeds)
    probs_CxRxIxV = np.asarray(metrics['probs_BxLxV'])[:, :, :, 0, 0]
    out['runs'][group_size] = {
        'common_CxRxI': probs_CxRxIxV[..., 0], 'rare_CxRxI': probs_CxRxIxV[..., 1],
        'unsampled_delta_CxRxI': np.asarray(metrics['unsampled_correct_mass_after']
                                            - metrics['unsampled_correct_mass_before']),
        'final_logits_CxRxV': np.asarray(state.params)[:, :, 0, 0]}

  # 3. Prompts that share parameters: logits = shared_V + own_BxV. On 6 "easy" prompts answers
  # 0 and 1 are correct, on 2 "hard" ones only answer 1 (the globally rare one) is, so pushing
  # the shared logits towards answer 0 on easy prompts hurts the hard ones.
  num_easy, num_hard = 6, 2
  shared_logits, _ = bandit.two_answer_bandit(num_answers=64, common_mass=0.25, rare_mass=0.02)
  params = {'shared_V': shared_logits[0, 0], 'own_BxLxV': jnp.zeros((num_easy + num_hard, 1, 64))}
  shared_correct = np.zeros((num_easy + num_hard, 1, 64), np.float32)
  shared_correct[:num_easy, 0, :2] = 1.0
  shared_correct[num_easy:, 0, 1] = 1.0

  def shared_logits_fn(p):
    return p['shared_V'][None, None] + p['own_BxLxV']

  def shared_train_for(gamma, key):
    def focal_grpo(rewards_BxG):
      return advantage_transforms.focal_scale(advantages.grpo(rewards_BxG), rewards_BxG,
                                              gamma=gamma)
    return bandit.make_train(
        correct_BxLxV=shared_correct, init_params=params, advantage_fn=focal_grpo,
        loss_fn=losses.ppo_clip, optimizer=optax.sgd(0.5), group_size=8,
        num_iterations=iterations, logits_fn=shared_logits_fn)(key)

  _, metrics = bandit.run_grid(shared_train_for, jnp.asarray(out['gammas']), seed=0,
                                 num_seeds=seeds)
  success_CxRxIxB = np.asarray(metrics['success_B'])
  out['shared'] = {
      'num_easy': num_easy,
      'success0_B': np.asarray(bandit.success_probability(shared_logits_fn(params),
                                                            shared_correct)),
      'easy_CxRxI': success_CxRxIxB[..., :num_easy].mean(-1),
      'hard_CxRxI': success_CxRxIxB[..., num_easy:].mean(-1),
      'final_CxRxB': success_CxRxIxB[:, :, -1],
  }

  # 4. pass@k at the end, exact from the policy, checked against the unbiased estimator on
  # samples drawn from the final policies.
  out['ks'] = 2 ** np.arange(9)
  n_samples = 256
  shared = out['shared']
  shared['pass0_J'] = np.asarray(bandit.pass_at_k_exact(shared['success0_B'], ks=out['ks'])
                                 ).mean(0)
  shared['pass_CxJ'] = np.asarray(bandit.pass_at_k_exact(shared['final_CxRxB'], ks=out['ks'])
                                  ).mean((1, 2))
  for group_size, run in out['runs'].items():
    total_CxR = run['common_CxRxI'][..., -1] + run['rare_CxRxI'][..., -1]
    run['pass_total_CxJ'] = np.asarray(bandit.pass_at_k_exact(total_CxR, ks=out['ks'])).mean(1)
    run['pass_rare_CxJ'] = np.asarray(bandit.pass_at_k_exact(
        run['rare_CxRxI'][..., -1], ks=out['ks'])).mean(1)
    draws_CxRxS = np.asarray(jax.random.categorical(
        jax.random.key(1), run['final_logits_CxRxV'][:, :, None], shape=(
            *total_CxR.shape, n_samples)))
    hits_CxR = (draws_CxRxS <= 1).sum(-1)
    run['pass_sampled_CxJ'] = np.array([[np.mean([evaluate.pass_at_k(n_samples, int(c), int(k))
                                                  for c in row]) for k in out['ks']]
                                        for row in hits_CxR])
  return out


def figure(results: dict):
  """Tail miss vs N; µ and τ over training; τ against µ; unsampled-correct drift; pass@k."""
  fig, axes = plt.subplots(3, 3, figsize=(15, 12))
  ax = axes[0, 0]
  for (mu, tau), exact, mc in zip(results['mu_tau'], results['tail_exact'], results['tail_mc']):
    line, = ax.plot(results['group_sizes'], exact, label=f'µ={mu}, τ={tau}')
    ax.plot(results['group_sizes'], mc, 'o', color=line.get_color(), ms=4)
  ax.set(xscale='log', xlabel='group size N', ylabel='Pr(tail miss)',
         title=f'tail miss: eq. 11 (lines), Monte-Carlo (dots)')
  ax.legend(fontsize=8)
  styles = [(8, i, f'N=8, γ={g:g}' + (' (GRPO)' if g == 0 else ''))
            for i, g in enumerate(results['gammas'])]
  if 32 in results['runs']:
    styles.append((32, 0, 'N=32, GRPO'))
  for n, c, label in styles:
    run = results['runs'][n]
    x_I = np.arange(1, run['rare_CxRxI'].shape[-1] + 1)
    total_RxI = run['common_CxRxI'][c] + run['rare_CxRxI'][c]
    line = bandit.plot_band(axes[0, 1], x_I, total_RxI, label=label)
    color = line.get_color()
    bandit.plot_band(axes[0, 2], x_I, run['rare_CxRxI'][c], label=label, color=color)
    axes[1, 0].plot(np.median(total_RxI, 0), np.median(run['rare_CxRxI'][c], 0), color=color,
                    label=label)
    axes[1, 1].plot(x_I, np.cumsum(run['unsampled_delta_CxRxI'][c].mean(0)), color=color,
                    label=label)
    axes[1, 2].plot(results['ks'], run['pass_total_CxJ'][c], color=color, label=label)
    axes[1, 2].plot(results['ks'], run['pass_rare_CxJ'][c], '--', color=color)
    axes[1, 2].plot(results['ks'], run['pass_sampled_CxJ'][c], 'o', color=color, ms=3)
  axes[0, 1].set(xlabel='iteration', ylabel='total correct mass µ', title='µ (median, IQR band)')
  axes[0, 1].legend(fontsize=8)
  axes[0, 2].set(xlabel='iteration', ylabel='rare correct mass τ', yscale='log',
                 title='τ (median, IQR band)')
  axes[1, 0].set(xlabel='total correct mass µ (median)', ylabel='rare correct mass τ (median)',
                 yscale='log', title='τ against µ along training')
  axes[1, 1].set(xlabel='iteration', ylabel='Σ Δ mass',
                 title='Σ Δ unsampled-correct mass (seed mean)')
  axes[1, 2].set(xscale='log', xlabel='k', ylabel='pass@k at the end',
                 title='pass@k: any correct (solid, dots sampled),\nrare answer (dashed)')
  shared = results['shared']
  axes[2, 2].plot(results['ks'], shared['pass0_J'], 'k:', label='start')
  for c, gamma in enumerate(results['gammas']):
    label = f'γ={gamma:g}' + (' (GRPO)' if gamma == 0 else '')
    x_I = np.arange(1, shared['easy_CxRxI'].shape[-1] + 1)
    line = bandit.plot_band(axes[2, 0], x_I, shared['easy_CxRxI'][c], label=label)
    bandit.plot_band(axes[2, 1], x_I, shared['hard_CxRxI'][c], label=label,
                       color=line.get_color())
    axes[2, 2].plot(results['ks'], shared['pass_CxJ'][c], color=line.get_color(), label=label)
  axes[2, 0].set(xlabel='iteration', ylabel='success',
                 title='shared logits: easy prompts (0 or 1 correct)')
  axes[2, 0].legend(fontsize=8)
  axes[2, 1].set(xlabel='iteration', ylabel='success',
                 title='shared logits: hard prompts (only 1 correct)')
  axes[2, 2].set(xscale='log', xlabel='k', ylabel='pass@k',
                 title='shared logits: pass@k over the 8 prompts')
  axes[2, 2].legend(fontsize=8)
  fig.tight_layout()
  return fig


def summary(results: dict) -> str:
  """The headline numbers the docstring and README quote."""
  lines = []
  for (mu, tau), exact, mc in zip(results['mu_tau'], results['tail_exact'], results['tail_mc']):
    lines.append(f'tail miss µ={mu} τ={tau}: max |MC - exact| '
                 f'= {np.max(np.abs(mc - exact)):.4f}, '
                 f'peak at N={results["group_sizes"][int(np.argmax(exact))]} ({exact.max():.3f})')
  for n, run in results['runs'].items():
    for c in range(run['rare_CxRxI'].shape[0]):
      rare, common = run['rare_CxRxI'][c], run['common_CxRxI'][c]
      total = rare + common
      j32 = int(np.searchsorted(results['ks'], 32))
      lines.append(
          f'N={n} γ={results["gammas"][c]:g}: µ {np.median(total[:, 0]):.3f} -> '
          f'{np.median(total[:, -1]):.3f}, τ {np.median(rare[:, 0]):.4f} -> '
          f'{np.median(rare[:, -1]):.5f} '
          f'(seeds with τ_end < τ_0: {np.mean(rare[:, -1] < 0.02):.2f}), '
          f'mean Δ unsampled-correct mass/iter {run["unsampled_delta_CxRxI"][c].mean():+.2e}, '
          f'pass@1 {run["pass_total_CxJ"][c][0]:.3f}, rare pass@{results["ks"][j32]} '
          f'{run["pass_rare_CxJ"][c][j32]:.3f}, pass@256 sampled vs exact '
          f'{run["pass_sampled_CxJ"][c][-1]:.3f} / {run["pass_total_CxJ"][c][-1]:.3f}')
  shared = results['shared']
  j_big = int(np.searchsorted(results['ks'], 64))
  easy = shared['num_easy']
  lines.append(f'shared logits, start: easy {shared["success0_B"][:easy].mean():.3f}, '
               f'hard {shared["success0_B"][easy:].mean():.3f}, pass@1 '
               f'{shared["pass0_J"][0]:.3f}, '
               f'pass@{results["ks"][j_big]} {shared["pass0_J"][j_big]:.3f}')
  for c, gamma in enumerate(results['gammas']):
    lines.append(f'shared logits γ={gamma:g}: '
                 f'easy {np.median(shared["easy_CxRxI"][c, :, -1]):.3f}, '
                 f'hard {np.median(shared["hard_CxRxI"][c, :, -1]):.3f}, pass@1 '
                 f'{shared["pass_CxJ"][c][0]:.3f}, pass@{results["ks"][j_big]} '
                 f'{shared["pass_CxJ"][c][j_big]:.3f}')
  return '\n'.join(lines)


def main():
  studies.run_study(__name__, notebook='02_tail_miss_focal', dpi=58)


if __name__ == '__main__':
  main()
