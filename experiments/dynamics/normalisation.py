"""Study 4: normalisation, GRPO's per-prompt std against unnormalised and global (arXiv 2601.23135)

Question: with prompts of heterogeneous difficulty, does GRPO's per-prompt std normalisation
converge faster than unnormalised REINFORCE (group-mean baseline, no std) and than global
normalisation (group mean subtracted, one std over the batch), and does its gain track the
within-prompt reward-std heterogeneity? The paper's claim: per-prompt std acts as a prompt-wise
adaptive step size; at 1.5B it beats both baselines, the gain appearing in a middle phase when
per-prompt variances become heterogeneous; at 7B the schemes are indistinguishable.

  python -m experiments.dynamics.normalisation            # full run, writes colab/figures/04_*.png
  python -m experiments.dynamics.normalisation --smoke    # seconds
  python -m experiments.dynamics.normalisation --write_notebook   # regenerates colab/04_*.ipynb

Runtime: full run 70 s of CPU (4.7 min wall on the heavily shared 2-core machine); smoke
~13 s of CPU, mostly compilation.

Setup (rlreason.dynamics.toy_lm, the task of study 1), calibrated (issue #21) so that the
schemes have something to act on: the first version warm-started by hard SFT, which left a
near-deterministic policy and 78-95% of groups with zero reward variance. Now: S_3
composition with k uniform in 1..3 (so per-prompt success rates, hence σ_x, differ), a
2-layer d = 32 decoder warm-started on a *soft* one-step table (300 SFT steps toward
probability 0.7 on g · s and 0.06 on each other element: toy_lm.one_step_sft's
target_accuracy, §24(d)'s noisy step), then 600 RL steps of 16 prompts x G = 8 at Adam 3e-4
(1e-3 collapsed the sampling entropy within ~150 steps in a calibration run) for each scheme,
every scheme from the same seeds and warm start: advantages.grpo (per-prompt std),
advantages.dr_grpo (mean-centred only), advantages.reinforce_pp_baseline (group mean, then
the batch std: the global normalisation). Global-norm clipping at 1 for all three; the
aggregation (seq-mean-token-mean) is the same, so only the advantage scale per prompt
differs. Heterogeneity per step: std_cv = std/mean of σ_x over prompts with σ_x > 0
(toy_lm.std_heterogeneity). 5 seeds; every number is a seed mean with a 95% Student-t
interval (rlreason.dynamics.seed_stats), method differences are paired by seed. Note Adam
divides out any global gradient scale, so unnormalised and global differ only through the
time variation of the batch std.

Result: The claim does NOT show: the three schemes are indistinguishable, now with a setup
that gives them signal. The share of groups with mixed rewards (seed mean, per 50 steps) goes
0.71, 0.61, 0.52, 0.47, 0.43, 0.39, 0.35, 0.33, 0.28, 0.26, 0.24, 0.22 under GRPO (the other
two within 0.03), inside the 20-80% band for the whole run (the first version had 5-22%).
Mean-over-k greedy accuracy goes 0.465 -> 0.613 ± 0.039 with per-prompt std, 0.629 ± 0.046
unnormalised, 0.615 ± 0.026 global std after 600 steps (5 seeds, 95% t); averaged over the
evaluations (a convergence-speed measure) 0.574 ± 0.021, 0.576 ± 0.034, 0.576 ± 0.028.
GRPO's lead, paired by seed: against unnormalised -0.016 ± 0.046 final, -0.003 ± 0.022 on
the average; against global std -0.002 ± 0.039 final, -0.002 ± 0.008 on the average. So a
per-prompt-std gain of more than ~0.02 in average accuracy is excluded here, and the lead does
not grow in any phase (figure, right). Per k the final means are [1.0, 0.62, 0.22],
[1.0, 0.62, 0.26], [1.0, 0.61, 0.23]: k = 2 is what all three learn, k = 3 stays near chance
(1/6). Why the mechanism has little to act on: with binary rewards and G = 8 a mixed group's
σ_x is one of 0.33, 0.43, 0.48, 0.5, so per-prompt normalisation re-weights prompts by at most
1.5x; the measured heterogeneity std/mean of σ_x is 0.16 falling to 0.08, and Adam removes any
global scale (why unnormalised and global coincide). The outcome resembles the paper's 7B
report (indistinguishable), not its 1.5B gain; a larger G or graded rewards would widen the
σ_x spread and are the next thing to try.
"""


import matplotlib.pyplot as plt
import numpy as np

from experiments import dynamics as studies
from rlreason.dynamics import seed_stats
from rlreason.dynamics import toy_lm


def simulate(smoke: bool) -> dict:
  """The three normalisation schemes from the same calibrated warm start and seeds."""
  max_k = 3
  task = toy_lm.GroupTask.make('S3', max_k=max_k)
  cfg = toy_lm.tiny_model(task, hidden=16 if smoke else 32, layers=1 if smoke else 2,
                          heads=2)
  steps, every, seeds = (4, 2, (0, 1)) if smoke else (600, 50, (0, 1, 2, 3, 4))
  # Calibrated warm start: a soft one-step table (sampled accuracy 0.7), so groups are mixed.
  params_S = toy_lm.initial_params(task=task, model_cfg=cfg, seeds=seeds,
                                   sft_steps=10 if smoke else 300, target_accuracy=0.7)
  schemes = {'per-prompt std (GRPO)': 'grpo', 'unnormalised (Dr. GRPO)': 'dr_grpo',
             'global std (REINFORCE++-baseline)': 'global'}
  runs = {}
  for name, estimator in schemes.items():
    runs[name] = toy_lm.train(
        task=task, difficulties=tuple(range(1, max_k + 1)), estimator=estimator, group_size=8,
        prompts_per_step=4 if smoke else 16, steps=steps, eval_every=every, model_cfg=cfg,
        seeds=seeds, lr=3e-4, eval_per_k=16 if smoke else 128, params_S=params_S)
  return {'runs': runs, 'chance': 1 / task.order}


def mixed_SxB(h):
  """Share of groups with mixed rewards (σ_x > 0), per seed and evaluation block."""
  return seed_stats.block_mean(1.0 - h.train['zero_std_frac'], int(h.eval_steps_E[1]))


def figure(results: dict):
  """Accuracy, mixed-group share, std heterogeneity, GRPO's paired lead (mean, 95% t-CI)."""
  runs = results['runs']
  names = list(runs)
  fig, axes = plt.subplots(1, 4, figsize=(20, 4))
  for name, h in runs.items():
    line = seed_stats.plot_ci(axes[0], h.eval_steps_E, h.eval_acc_SxExK.mean(-1), label=name)
    every = int(h.eval_steps_E[1])
    mid_B = h.eval_steps_E[1:] - every / 2
    seed_stats.plot_ci(axes[1], mid_B, mixed_SxB(h), label=name, color=line.get_color())
    seed_stats.plot_ci(axes[2], mid_B, seed_stats.block_mean(h.train['std_cv'], every),
                       label=name, color=line.get_color())
  for other, style in zip(names[1:], ('-', '--')):
    lead_SxE = runs[names[0]].eval_acc_SxExK.mean(-1) - runs[other].eval_acc_SxExK.mean(-1)
    seed_stats.plot_ci(axes[3], runs[other].eval_steps_E, lead_SxE, ls=style,
                       label=f'GRPO − {other.split(" (")[0]}')
  axes[0].axhline(results['chance'], color='grey', lw=0.8, ls='--')
  axes[0].set(xlabel='RL step', ylabel='greedy accuracy (mean over k)',
              title='accuracy (seed mean, 95% t-interval)')
  axes[0].legend(fontsize=8)
  axes[1].axhspan(0.2, 0.8, color='green', alpha=0.06)
  axes[1].set(xlabel='RL step', ylabel='share of groups with mixed rewards', ylim=(0, 1),
              title='mixed-reward groups (the signal)')
  axes[2].set(xlabel='RL step', ylabel='std/mean of σ_x over live prompts',
              title='within-prompt std heterogeneity')
  axes[3].axhline(0, color='grey', lw=0.8)
  axes[3].set(xlabel='RL step', ylabel='accuracy difference (same seed)',
              title="GRPO's paired lead")
  axes[3].legend(fontsize=8)
  fig.tight_layout()
  return fig


def summary(results: dict) -> str:
  """Mixed-group share over time, final / mean accuracy with 95% t-CIs, paired leads, verdict."""
  runs = results['runs']
  names = list(runs)
  lines = ['95% Student-t intervals over seeds; "mean acc" = accuracy averaged over the '
           'evaluations after step 0 (area under the curve, a convergence-speed measure).']
  for name, h in runs.items():
    acc_SxE = h.eval_acc_SxExK.mean(-1)
    lines.append(
        f'{name}: accuracy {acc_SxE[:, 0].mean():.3f} -> {seed_stats.format_ci(acc_SxE[:, -1])}'
        f', mean acc {seed_stats.format_ci(acc_SxE[:, 1:].mean(-1))}, final per-k '
        f'{toy_lm.rounded(h.eval_acc_SxExK[:, -1].mean(0))}\n'
        f'  mixed-group share per {int(h.eval_steps_E[1])} steps: '
        f'{toy_lm.rounded(mixed_SxB(h).mean(0))}, mean std heterogeneity '
        f'{h.train["std_cv"].mean():.3f}')
  signs = []
  for other in names[1:]:
    lead_SxE = runs[names[0]].eval_acc_SxExK.mean(-1) - runs[other].eval_acc_SxExK.mean(-1)
    _, lo, hi = seed_stats.t_interval(lead_SxE[:, 1:].mean(-1)[:, None])
    signs.append(1 if lo[0] > 0 else -1 if hi[0] < 0 else 0)
    lines.append(f'GRPO − {other} (paired): final {seed_stats.format_ci(lead_SxE[:, -1])}, '
                 f'mean acc {seed_stats.format_ci(lead_SxE[:, 1:].mean(-1))}')
  verdict = ('SHOWS' if all(x > 0 for x in signs) else 'is CONTRADICTED' if -1 in signs
             else 'does NOT show (indistinguishable)' if signs == [0] * len(signs)
             else 'shows only in part')
  lines.append(f'Claim (per-prompt std converges faster than both): {verdict} (CI of GRPO\'s '
               'paired lead in mean accuracy against each: > 0, < 0 or containing 0).')
  return '\n'.join(lines)


def main():
  studies.run_study(__name__, notebook='04_normalisation', helpers=('mixed_SxB',), dpi=70)


if __name__ == '__main__':
  main()
