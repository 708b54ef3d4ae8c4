"""Study 3: group size and baselines, GRPO at N = 4, 8, 32 against OTB at N = 4 (arXiv 2602.07078)

Question: on a synthetic task, how does accuracy grow with the tokens consumed for GRPO at
group sizes N = 4, 8, 32 and for the Optimal Token Baseline at N = 4, and how do the
gradient-variance proxies (OTB's forward-only noise proxy, the gradient norm) evolve? OTB's
claim: N = 4 matches N = 32 with far fewer tokens and avoids gradient-norm blow-ups.

  python -m experiments.dynamics.group_size_baselines           # full run, colab/figures/03_*.png
  python -m experiments.dynamics.group_size_baselines --smoke    # seconds
  python -m experiments.dynamics.group_size_baselines --write_notebook  # colab/03_*.ipynb

Runtime: full run 170 s of CPU (13 min wall on the heavily shared 2-core machine); smoke
~13 s of CPU, mostly compilation.

Setup (rlreason.dynamics.toy_lm, the task of study 1), calibrated (issue #21): the first
version's hard SFT warm start left 78-95% of groups with zero reward variance, which decided
every comparison. Now: S_3 composition with k uniform in 1..3, a 2-layer d = 32 decoder
warm-started on a soft one-step table (300 SFT steps toward probability 0.7 on g · s:
toy_lm.one_step_sft's target_accuracy), then 500 RL steps of 16 prompts each for every
method, the same seeds and warm start; Adam 3e-4 (1e-3 collapsed the sampling entropy
within ~150 steps in a calibration run), one on-policy update per batch. GRPO uses per-prompt
std normalisation (advantages.grpo); OTB uses advantages.otb on the old policy's log-probs
and Σπ² from update.logprobs_step (no std normalisation, per-token baseline). Accuracy =
greedy accuracy averaged over k on 128 fixed problems per k; tokens = completion tokens in
the loss (k per sample, so N = 32 consumes 8x the tokens of N = 4 per step). 5 seeds;
every number is a seed mean with a 95% Student-t interval (rlreason.dynamics.seed_stats),
method differences are paired by seed. The verdict needs both halves of the claim: GRPO
N = 32 beats N = 4 (else there is nothing to match) and OTB N = 4 is not below N = 32.

Result: The claim does NOT show: OTB at N = 4 does not match GRPO at N = 32. Now that the
groups carry signal (mixed-reward share per 50 steps 0.53 -> 0.16 at N = 4, 0.71 -> 0.26 at
N = 8, 0.95 -> 0.54 at N = 32; the first version had 5-22% at every N), the big group does
help per step: mean-over-k greedy accuracy after 500 steps (from 0.465; 5 seeds, mean ± 95%
t) is 0.593 ± 0.029 GRPO N = 4, 0.584 ± 0.030 Dr. GRPO N = 4, 0.607 ± 0.016 OTB N = 4,
0.610 ± 0.028 GRPO N = 8, 0.665 ± 0.035 GRPO N = 32. Paired by seed: N = 32 − N = 4
+0.072 ± 0.051, OTB N = 4 − GRPO N = 32 -0.058 ± 0.041 (below, so no match), OTB N = 4 −
GRPO N = 4 +0.014 ± 0.038 (averaged over the run +0.013 ± 0.020), OTB N = 4 − Dr. GRPO N = 4
(the same unnormalised scale, group-mean baseline) +0.022 ± 0.017. Per token the small groups
win for every method: at the N = 4 runs' whole budget of 6.4e4 tokens, accuracy is 0.593 /
0.607 / 0.584 (GRPO / OTB / Dr. GRPO N = 4), 0.565 (N = 8), 0.539 (N = 32), and N = 32 needs
4.6e5 tokens for its final level, which no N = 4 run reaches in 500 steps. So OTB's
per-token baseline gives a small, real gain over the group-mean baseline and lower gradient
norms (mean 0.93 vs 1.39 for Dr. GRPO and 2.9-3.5 for std-normalised GRPO; max 15 vs 27 and
63-141), the paper's direction on both counts, but it closes about a fifth of the N = 4 to
N = 32 gap (0.014 of 0.072), not all of it. In this task all answers of a prompt have the same length k and
similar energies, so OTB's baseline stays close to the group mean; the paper's long,
variable-length reasoning traces are where its energy weighting has most room.
"""


import matplotlib.pyplot as plt
import numpy as np

from experiments import dynamics as studies
from rlreason.dynamics import seed_stats
from rlreason.dynamics import toy_lm


def simulate(smoke: bool) -> dict:
  """GRPO at each group size and OTB at the smallest, from the same calibrated warm start."""
  max_k = 3
  task = toy_lm.GroupTask.make('S3', max_k=max_k)
  cfg = toy_lm.tiny_model(task, hidden=16 if smoke else 32, layers=1 if smoke else 2,
                          heads=2)
  steps, every, seeds = (4, 2, (0, 1)) if smoke else (500, 50, (0, 1, 2, 3, 4))
  # Calibrated warm start: a soft one-step table (sampled accuracy 0.7), so groups are mixed.
  params_S = toy_lm.initial_params(task=task, model_cfg=cfg, seeds=seeds,
                                   sft_steps=10 if smoke else 300, target_accuracy=0.7)
  # Same-shape runs share a compilation, so the smoke run keeps only N = 4. Dr. GRPO N = 4
  # (group-mean baseline, no std) is the control that separates OTB's per-token baseline
  # from its missing std normalisation.
  methods = [('grpo', 4), ('otb', 4)] + ([] if smoke else [('dr_grpo', 4), ('grpo', 8),
                                                           ('grpo', 32)])
  labels = {'grpo': 'GRPO', 'otb': 'OTB', 'dr_grpo': 'Dr. GRPO'}
  runs = {}
  for estimator, group_size in methods:
    runs[f'{labels[estimator]} N={group_size}'] = toy_lm.train(
        task=task, difficulties=tuple(range(1, max_k + 1)), estimator=estimator,
        group_size=group_size, prompts_per_step=4 if smoke else 16, steps=steps,
        eval_every=every, model_cfg=cfg, seeds=seeds, lr=3e-4,
        eval_per_k=16 if smoke else 128, params_S=params_S)
  return {'runs': runs, 'chance': 1 / task.order}


def eval_tokens_E(h):
  """Completion tokens consumed at each evaluation (0 at step 0)."""
  return np.concatenate([[0], h.tokens_T()[h.eval_steps_E[1:] - 1]])


def mixed_SxB(h):
  """Share of groups with mixed rewards (σ_x > 0), per seed and evaluation block."""
  return seed_stats.block_mean(1.0 - h.train['zero_std_frac'], int(h.eval_steps_E[1]))


def tokens_to(h, target: float):
  """Tokens at the first evaluation whose seed-mean accuracy reaches `target` (None: never)."""
  hit = np.flatnonzero(h.eval_acc_SxExK.mean(-1).mean(0) >= target)
  return float(eval_tokens_E(h)[hit[0]]) if hit.size else None


def figure(results: dict):
  """Accuracy against tokens and steps, mixed-group share, gradient norm (mean, 95% t-CI)."""
  fig, axes = plt.subplots(1, 4, figsize=(20, 4))
  for name, h in results['runs'].items():
    acc_SxE = h.eval_acc_SxExK.mean(-1)
    line = seed_stats.plot_ci(axes[0], eval_tokens_E(h)[1:], acc_SxE[:, 1:], label=name)
    color = line.get_color()
    seed_stats.plot_ci(axes[1], h.eval_steps_E, acc_SxE, label=name, color=color)
    every = int(h.eval_steps_E[1])
    mid_B = h.eval_steps_E[1:] - every / 2
    seed_stats.plot_ci(axes[2], mid_B, mixed_SxB(h), label=name, color=color)
    seed_stats.plot_ci(axes[3], mid_B, seed_stats.block_mean(h.train['grad_norm'], every),
                       label=name, color=color)
  for ax in axes[:2]:
    ax.axhline(results['chance'], color='grey', lw=0.8, ls='--')
  axes[0].set(xscale='log', xlabel='completion tokens consumed',
              ylabel='greedy accuracy (mean over k)',
              title='accuracy vs tokens (seed mean, 95% t-interval)')
  axes[1].set(xlabel='RL step', ylabel='greedy accuracy (mean over k)', title='accuracy vs steps')
  axes[2].axhspan(0.2, 0.8, color='green', alpha=0.06)
  axes[2].set(xlabel='RL step', ylabel='share of groups with mixed rewards', ylim=(0, 1),
              title='mixed-reward groups (the signal)')
  axes[3].set(xlabel='RL step', ylabel='‖∇loss‖ (block mean)', yscale='log',
              title='gradient norm')
  axes[0].legend(fontsize=8)
  fig.tight_layout()
  return fig


def summary(results: dict) -> str:
  """Mixed-group share, final accuracy with 95% t-CIs, tokens, paired differences, verdict."""
  runs = results['runs']
  lines = ['95% Student-t intervals over seeds (paired: same seeds and warm start).']
  for name, h in runs.items():
    acc_SxE = h.eval_acc_SxExK.mean(-1)
    lines.append(
        f'{name}: accuracy {acc_SxE[:, 0].mean():.3f} -> {seed_stats.format_ci(acc_SxE[:, -1])}'
        f' with {h.tokens_T()[-1]:.3g} tokens, grad norm mean {h.train["grad_norm"].mean():.3g}'
        f' max {h.train["grad_norm"].max():.3g}\n  mixed-group share per '
        f'{int(h.eval_steps_E[1])} steps: {toy_lm.rounded(mixed_SxB(h).mean(0))}')
  if 'GRPO N=32' not in runs:
    return '\n'.join(lines + ['(no N = 32 run in this setting: no verdict)'])
  acc = {name: h.eval_acc_SxExK.mean(-1) for name, h in runs.items()}
  big, small, otb = acc['GRPO N=32'], acc['GRPO N=4'], acc['OTB N=4']
  target = 0.9 * big[:, -1].mean() + 0.1 * big[:, 0].mean()
  lines.append(f'tokens to reach {target:.3f} (90% of GRPO N=32\'s mean gain): '
               + ', '.join(f'{n} {tokens_to(h, target)}' for n, h in runs.items()))
  budget = runs['GRPO N=4'].tokens_T()[-1]
  lines.append(f'accuracy at {budget:.3g} tokens (the N = 4 runs\' whole budget): '
               + ', '.join(f'{n} {np.interp(budget, eval_tokens_E(h), acc[n].mean(0)):.3f}'
                           for n, h in runs.items()))
  gap_lo = seed_stats.t_interval((big - small)[:, -1:])[1][0]
  otb_hi = seed_stats.t_interval((otb - big)[:, -1:])[2][0]
  lines += [f'GRPO N=32 − GRPO N=4 final (paired): {seed_stats.format_ci((big - small)[:, -1])}',
            f'OTB N=4 − GRPO N=32 final (paired): {seed_stats.format_ci((otb - big)[:, -1])}',
            f'OTB N=4 − GRPO N=4 final (paired): {seed_stats.format_ci((otb - small)[:, -1])}',
            *([f'OTB N=4 − Dr. GRPO N=4 final (paired): '
               f'{seed_stats.format_ci((otb - acc["Dr. GRPO N=4"])[:, -1])}']
              if 'Dr. GRPO N=4' in acc else []),
            'Claim (OTB N=4 matches GRPO N=32 with 8x fewer tokens): '
            + ('SHOWS' if gap_lo > 0 and otb_hi >= 0 else 'does NOT show')
            + f' (N=32 beats N=4: {gap_lo > 0}; OTB N=4 not below N=32: {otb_hi >= 0}).']
  return '\n'.join(lines)


def main():
  studies.run_study(__name__, notebook='03_group_size_baselines',
                    helpers=('eval_tokens_E', 'mixed_SxB', 'tokens_to'), dpi=60)


if __name__ == '__main__':
  main()
