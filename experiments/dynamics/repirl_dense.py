"""Study 21: rePIRL's dense learned reward against the outcome reward on a multi-step task

Question: rePIRL (arXiv 2602.07832) learns a process reward model by inverse RL from expert
trajectories only and trains the policy with max-entropy RL on its dense token rewards; it
says the PRM gives an early signal on problems where the outcome reward is too sparse to
learn from. On a tabular token-level MDP with H steps (a known reward, the expert its optimal
policy, success = the expert's whole trajectory), how fast does the policy reach the expert
under rePIRL's learned reward, the 0/1 outcome reward, and the known per-step reward, as H
grows?

  python -m experiments.dynamics.repirl_dense                  # full run, colab/figures/21_*.png
  python -m experiments.dynamics.repirl_dense --smoke          # seconds
  python -m experiments.dynamics.repirl_dense --write_notebook # colab/21_*.ipynb

Setup: rlreason.dynamics.tabular_irl: random deterministic MDPs with 6 states x 4 actions
(state 0 at t = 0, tables over (t, s, a)), rewards N(0, 1), the expert the optimal policy by
backward induction. Three arms with the same policy optimiser (Adam 0.05, G = 16 samples per
iteration, REINFORCE with a leave-one-out baseline on rewards-to-go, objectives/irl.py):
'repirl' (4 copies of the expert trajectory; PRM r_φ[t, s, a] trained 2 Adam steps (0.05) per
iteration on irl.prm_loss with the samples and demos pooled; max-ent policy steps, α = 1, on
r_φ), 'outcome' (a 0/1 reward on the last step, 1 iff the sample is the expert's
trajectory; no demos, α = 0), and 'true_dense' (the known per-step reward, α = 1: an oracle,
whose max-ent optimum is not deterministic). The rePIRL arm sees demonstrations, the outcome
arm a verifier: they use different information, as in the paper. Metric: the probability of
the expert trajectory under the policy (exact, from the tables), mean over seeds, per
iteration; and the fraction of expert-visited states where r_φ ranks the expert's action
first.

Runtime: full run (H = 3, 5, 8; 8 seeds; 300 iterations) 24 s of CPU (2.2 min wall at load
~20 on the shared 2-core machine); smoke (H = 3, 2 seeds, 40 iterations) a few seconds.

Result: (full run, 2026-12-02; 8 seeds per point) the paper's direction, on a toy where it
is built in. Final P(expert trajectory), mean over seeds, and the median iteration at which
it first reached 0.5:
* H = 3: rePIRL 0.987 (iteration 27), outcome 0.995 (33): no difference while the outcome
  reward is not sparse (a uniform policy hits the expert's trajectory with p = 1/64).
* H = 5: rePIRL 0.981 (35), outcome 0.993 (103): the outcome arm needs 3x the iterations
  (p = 1/1024 at the start, ~1 success per 64 iterations of G = 16).
* H = 8: rePIRL 0.970 (44), outcome 0.000 in all 8 seeds (p = 1.5e-5: no success is ever
  sampled, so there is no gradient). rePIRL's learned reward ranks the expert's action first
  at every expert-visited state, at every H.
* The oracle 'true_dense' arm (max-ent on the known reward, α = 1) ends at P(expert) 0.216,
  0.081, 0.027: its optimum π ∝ exp(soft Q) spreads over near-optimal trajectories when the
  reward gaps are O(1), so P(expert) is the wrong yardstick for it (its true return is not
  plotted here); rePIRL's reward, fitted to a deterministic expert, grows without bound in
  the gaps and makes its max-ent policy near-deterministic (it ends below outcome's 0.99 by
  its entropy term).
* What this does not show: rePIRL uses 4 expert demonstrations the outcome arm never sees,
  so H = 8 compares information, not only reward density; with a deterministic expert and
  tabular states, rePIRL is close to behaviour cloning with extra steps. The LM version
  (methods/repirl.py) was run twice on a reduced demo setting, one seed each (experiments/repirl.py:
  held-out pass@1 0.594 -> 1.000 in 40 steps, or down to 0.078 with a slower PRM).
"""

import matplotlib.pyplot as plt
import numpy as np

from experiments import dynamics as studies
from rlreason.dynamics import tabular_irl


def simulate(smoke: bool) -> dict:
  """Per horizon H and arm: expert-trajectory probability and PRM ranking, seeds x iterations."""
  horizons, seeds, iterations = ((3,), 2, 40) if smoke else ((3, 5, 8), 8, 300)
  arms = ('repirl', 'outcome', 'true_dense')
  results = {'horizons': horizons, 'seeds': seeds, 'iterations': iterations, 'arms': arms}
  for h in horizons:
    for arm in arms:
      probs, ranks = [], []
      for seed in range(seeds):
        mdp = tabular_irl.random_mdp(1000 * h + seed, states=6, actions=4, horizon=h)
        expert = tabular_irl.expert_actions(mdp)
        _, m = tabular_irl.run(mdp, expert, seed, iterations=iterations, mode=arm,
                               group_size=16, num_expert=4, prm_steps=2, prm_lr=0.05,
                               policy_lr=0.05, alpha=1.0)
        probs.append(m['expert_prob'])
        ranks.append(m['prm_ranks_expert_first'])
      results[h, arm] = {'expert_prob': np.array(probs), 'ranks': np.array(ranks)}
  return results


def first_reach(curve_I: np.ndarray, level: float = 0.5) -> float:
  """The first iteration at which the curve reaches `level` (nan if never)."""
  hit = np.nonzero(curve_I >= level)[0]
  return float(hit[0] + 1) if hit.size else float('nan')


def figure(results: dict):
  """Expert-trajectory probability per iteration, one panel per horizon."""
  horizons = results['horizons']
  fig, axes = plt.subplots(1, len(horizons), figsize=(5 * len(horizons), 3.6), squeeze=False)
  for ax, h in zip(axes[0], horizons):
    for arm in results['arms']:
      p = results[h, arm]['expert_prob']
      mean, lo, hi = p.mean(0), p.min(0), p.max(0)
      x = np.arange(1, p.shape[1] + 1)
      ax.plot(x, mean, label=arm)
      ax.fill_between(x, lo, hi, alpha=0.15)
    ax.set(xlabel='iteration', ylabel='P(expert trajectory)', title=f'H = {h} steps',
           ylim=(0, 1.02))
    ax.legend(fontsize=8)
  fig.tight_layout()
  return fig


def summary(results: dict) -> str:
  """Per H and arm: final probability (mean over seeds), iterations to 0.5, PRM ranking."""
  lines = [f"{results['seeds']} seeds x {results['iterations']} iterations, 6 states x 4 "
           'actions, G = 16']
  for h in results['horizons']:
    for arm in results['arms']:
      r = results[h, arm]
      p = r['expert_prob']
      reach = [first_reach(c) for c in p]
      got = [x for x in reach if x == x]
      lines.append(f'H = {h} {arm:10s}: final P(expert) {p[:, -1].mean():.3f} (min '
                   f'{p[:, -1].min():.3f}); reached 0.5 in {len(got)}/{len(reach)} seeds'
                   + (f', median iteration {np.median(got):.0f}' if got else '')
                   + (f'; PRM ranks the expert first at {r["ranks"][:, -1].mean():.2f} of its '
                      'states' if arm == 'repirl' else ''))
  h = max(results['horizons'])
  lines.append(f'final_expert_prob_repirl_H{h}='
               f'{results[h, "repirl"]["expert_prob"][:, -1].mean():.4f}')
  lines.append(f'final_expert_prob_outcome_H{h}='
               f'{results[h, "outcome"]["expert_prob"][:, -1].mean():.4f}')
  return '\n'.join(lines)


def main():
  studies.run_study(__name__, notebook='21_repirl_dense', helpers=('first_reach',), dpi=60)


if __name__ == '__main__':
  main()
