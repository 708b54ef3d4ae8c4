"""Study 23: SOAR, a teacher's curriculum for a hard subset that direct RL cannot learn

Question: a student that solves none of a set of hard problems gets no reward signal from
them, so direct RL on them stays at 0. Does a teacher that proposes problems and is rewarded
by the student's measured improvement on the hard subset (SOAR's asymmetric self-play) write
a curriculum that unlocks them, and does it beat the same loop with a non-learning proposer?

  python -m experiments.dynamics.soar_curriculum           # full run, colab/figures/23_*.png
  python -m experiments.dynamics.soar_curriculum --smoke    # seconds
  python -m experiments.dynamics.soar_curriculum --write_notebook  # colab/23_*.ipynb

Runtime: full run 5.7 min CPU, 5.6 min wall (4 arms x 3 seeds x 300 outer steps,
each outer step = 8 student GRPO steps + 5 hard-set measurements + 1 teacher step); smoke ~10 s.

Setup (rlreason.dynamics.soar, our formalisation [F] of the abstract; its docstring states the
loop exactly): group composition on S_3 with K = 4 (toy_lm's task), CHAIN reward (all k
written states right; chance 6^-k). Student: toy_lm's 2-layer d = 32 decoder with the soft
one-step SFT warm start (sampled accuracy 0.9). Hard subset: k = 4; success = the exact
probability that a temperature-1 sample solves a problem. Teacher: a 1-layer d = 32 decoder
that writes [k, g_1..g_4], warm-started by SFT on well-formed proposals with k uniform in 1..4
(the stand-in for a pretrained LLM). Each outer step: D = 4 candidate sets of M = 16 problems,
each trains a copy of the student 2 GRPO steps (G = 8, Adam 1e-3); the teacher's reward r_d is
the copy's mean success on 64 fixed hard reward problems minus the student's before; the
teacher takes a GRPO-over-sets REINFORCE step (Adam 3e-4), the best copy becomes the student.
Arms (same loop, same promotion, same seeds and warm starts; only the proposer differs):
'soar' (the teacher proposes and learns), 'random teacher' (the teacher frozen at its warm
start: k uniform, the implicit-curriculum mixture), 'direct' (only hard k = 4 problems),
'schedule' (a fixed easy-to-hard curriculum: k = 1, 2, 3, 4 in four equal blocks). Reported:
success on 128 held-out hard TEST problems (not the reward set) and per k.

Result: Partly. A curriculum helps the hard subset, but the LEARNED teacher adds nothing
measurable over the same teacher frozen, and nothing is "unlocked" at this budget: after 300
outer steps the hard subset is still solved with probability ~0.02. Full run (300 outer steps,
3 seeds, mean ± 95% t; hard TEST P(solve), k = 4, chance 7.7e-4, 0.0012 after the warm
start): soar 0.0166 ± 0.0189, random teacher 0.0153 ± 0.0178, schedule 0.0067 ± 0.0198,
direct 0.0037 ± 0.0087. Paired at the end: soar − direct +0.0129 ± 0.0112 and soar − schedule
+0.0099 ± 0.0073 (both intervals exclude 0), soar − random teacher +0.0013 ± 0.0165 (none).
Per k = 1..4 at the end: soar [0.94, 0.39, 0.07, 0.005], random teacher [0.91, 0.34, 0.09,
0.004], schedule [0.60, 0.13, 0.03, 0.002], direct [0.33, 0.06, 0.01, 0.000]. So direct RL on
the hard subset stays near 0 (the chain reward is almost never earned; its k = 1 skill even
decays from the warm start's 0.59, the promotion choosing among noise), while mixing easy
horizons starts the relay (k = 2 and 3 rise) that has not yet reached k = 4. The teacher's
curriculum barely moved: proposed k shares, first vs last quarter, [0.26, 0.22, 0.26, 0.27] ->
[0.22, 0.19, 0.26, 0.33] (a drift toward the hard k, not to easier stepping stones); parsable
share 0.99. Its reward, a change of order 1e-4 in a hard-set success of order 1e-3, makes the
GRPO advantage over 4 candidate sets mostly noise: the meta-level sparse-reward problem.
Other runs (same code): 120 outer steps, 2 seeds: soar 0.0094 ± 0.0197, random teacher
0.0092 ± 0.0587, schedule 0.0103 ± 0.0342, direct 0.0037 ± 0.0076, shares unmoved. One seed,
300 steps, teacher Adam 3e-4: soar 0.028, random teacher 0.024, direct 0.017. K = 3 with the
teacher warm-started toward the hard k (prior [0.1, 0.1, 0.8], teacher Adam 1e-3, 200 steps,
2 seeds): k = 3 is not at 0 there (0.03 sampled success after the warm start) and direct RL
learns it as well as SOAR (hard test end: soar 0.076 / 0.108, frozen teacher 0.114 / 0.060,
direct 0.157 / 0.036 per seed); the teacher moved further toward the hard k (share 0.75 ->
0.85) instead of easier problems. Not measured: more candidate sets per step, longer runs.
"""

import matplotlib.pyplot as plt
import numpy as np

from experiments import dynamics as studies
from rlreason.dynamics import seed_stats
from rlreason.dynamics import soar
from rlreason.dynamics import toy_lm


def simulate(smoke: bool) -> dict:
  """Hard-subset success over the bilevel loop for SOAR and three fixed proposers."""
  max_k = 2 if smoke else 4
  task = toy_lm.GroupTask.make('S3', max_k=max_k)
  hidden = 16 if smoke else 32
  s = soar.Setting(
      task=task, student_cfg=toy_lm.tiny_model(task, hidden=hidden, layers=1 if smoke else 2,
                                               heads=2),
      teacher_cfg=soar.teacher_model(task, hidden=hidden), hard_ks=(max_k,),
      candidates=2 if smoke else 4, problems_per_set=4 if smoke else 16,
      group_size=2 if smoke else 8, inner_steps=1 if smoke else 2,
      reward_set_size=8 if smoke else 64)
  steps, every, seeds = (2, 1, (0,)) if smoke else (300, 30, (0, 1, 2))
  student_S = toy_lm.initial_params(task=task, model_cfg=s.student_cfg, seeds=seeds,
                                    sft_steps=0 if smoke else 300, target_accuracy=0.9)
  uniform_K = np.full(max_k, 1 / max_k, np.float32)
  teacher_S = soar.initial_teacher(s=s, seeds=seeds, prior_K=uniform_K,
                                   sft_steps=0 if smoke else 200)
  hard_K = np.eye(max_k, dtype=np.float32)[-1]
  block = steps // max_k
  schedule_TxK = np.eye(max_k, dtype=np.float32)[np.minimum(np.arange(steps) // max(block, 1),
                                                            max_k - 1)]
  arms = {'soar': ('teacher', None), 'random teacher': ('frozen_teacher', None),
          'direct': ('fixed', hard_K), 'schedule': ('fixed', schedule_TxK)}
  runs = {name: soar.train(s=s, student_S=student_S, teacher_S=teacher_S, seeds=seeds,
                           steps=steps, eval_every=every, proposer=proposer,
                           weights_TxK=weights, eval_per_k=8 if smoke else 64,
                           test_size=8 if smoke else 128)
          for name, (proposer, weights) in arms.items()}
  return {'runs': runs, 'max_k': max_k, 'chance': 1 / task.order ** max_k}


def figure(results: dict):
  """Hard test success per arm; SOAR's proposed k over time; per-k success at the end."""
  runs, max_k = results['runs'], results['max_k']
  fig, axes = plt.subplots(1, 3, figsize=(16, 4))
  for name, h in runs.items():
    seed_stats.plot_ci(axes[0], h.eval_steps_E, h.hard_test_SxE, label=name)
  axes[0].set(xlabel='outer step', ylabel=f'P(solve) on hard test set (k={max_k})',
              title='hard subset (mean, 95% t-CI over seeds)')
  axes[0].legend(fontsize=8)
  share_TxK = runs['soar'].train['proposed_k_K'].mean(0)
  for k in range(max_k):
    axes[1].plot(share_TxK[:, k], label=f'k={k + 1}')
  axes[1].plot(runs['soar'].train['valid_frac'].mean(0), 'k:', label='parsable share')
  axes[1].set(xlabel='outer step', ylabel='share of parsable proposals', ylim=(0, 1.02),
              title="SOAR teacher's curriculum (seed mean)")
  axes[1].legend(fontsize=8)
  width = 0.8 / len(runs)
  for i, (name, h) in enumerate(runs.items()):
    axes[2].bar(np.arange(1, max_k + 1) + i * width, h.success_SxExK[:, -1].mean(0),
                width=width, label=name)
  axes[2].set(xlabel='k', ylabel='P(solve), end of run', title='per horizon at the end')
  axes[2].legend(fontsize=8)
  fig.tight_layout()
  return fig


def summary(results: dict) -> str:
  """Hard test success start/end per arm, paired SOAR − baselines, SOAR's curriculum."""
  runs = results['runs']
  lines = [f'chance (chain reward, k={results["max_k"]}) = {results["chance"]:.2e}; '
           '95% Student-t intervals over seeds']
  for name, h in runs.items():
    lines.append(
        f'{name}: hard test P(solve) {h.hard_test_SxE[:, 0].mean():.4f} -> '
        f'{seed_stats.format_ci(h.hard_test_SxE[:, -1], digits=4)}; per k at the end '
        f'{toy_lm.rounded(h.success_SxExK[:, -1].mean(0), 3)}; parsable share '
        f'{h.train["valid_frac"].mean():.3f}')
  for name in runs:
    if name != 'soar':
      diff_S = runs['soar'].hard_test_SxE[:, -1] - runs[name].hard_test_SxE[:, -1]
      lines.append(f'soar − {name} (paired, end): {seed_stats.format_ci(diff_S, digits=4)}')
  share_TxK = runs['soar'].train['proposed_k_K'].mean(0)
  quarter = max(share_TxK.shape[0] // 4, 1)
  lines.append(f'SOAR proposed k shares, first vs last quarter: '
               f'{toy_lm.rounded(share_TxK[:quarter].mean(0))} -> '
               f'{toy_lm.rounded(share_TxK[-quarter:].mean(0))}')
  return '\n'.join(lines)


def main():
  studies.run_study(__name__, notebook='23_soar_curriculum', dpi=70)


if __name__ == '__main__':
  main()
