"""Study 10: SLATE's step-level advantage variance against full-trajectory GRPO (T = 2..4)

Question: SLATE (arXiv 2602.23440) samples k candidates for one step from a shared prefix
instead of k whole trajectories, and proves that this reduces the variance of the advantage
estimates by up to a factor T for T-step trajectories under the same dense rewards. On the
multi-hop search task, with the same step rewards, how large is the per-step advantage variance
of SLATE's estimator against full-trajectory GRPO's for T = 2, 3, 4?

  python -m experiments.dynamics.slate_variance                  # full run, colab/figures/10_*.png
  python -m experiments.dynamics.slate_variance --smoke          # seconds
  python -m experiments.dynamics.slate_variance --write_notebook # colab/10_*.ipynb

Runtime: full run 25-34 s of CPU (3-5 min wall at load ~10 on the shared 2-core machine;
two runs gave identical numbers); smoke about 4 s of CPU.

Setup: search_qa (rlreason.envs.tasks, difficulty 1: 2-3 hop questions over 42 one-fact
passages) in the real environment (the `search` tool's BM25, the 'tags' format, the exact
verifier), SLATE's rule judge and step rewards (rollout/slate_judge.py, slate.step_reward:
r_think + r_query, or r_think + r_answer + 0.1 (B - t)/B with budget B = T). The policy is a
scripted stochastic agent, not a language model (our formalisation; a random tiny model writes
no well-formed call, so its step rewards barely vary): at each step it issues the next hop's
gold query (p 0.45), repeats a resolved hop's query (0.15), a vague query naming the
question's entity (0.1), a malformed call (0.1), or answers (0.2; 0.7 once every hop is
resolved; the right answer then, else a name from its context), with reasoning in <think> tags
half of the time, naming the next hop's entity or a random word. k = G = 5.

What is measured (labelled "per-step advantage variance"): for a state s_t (the prompt and t
steps drawn from the policy, t uniform over the steps a trajectory reaches) and one fixed
candidate step a at s_t, each estimator's advantage of a's tokens is a random variable over
independent rollout draws from the same state:
  SLATE  A = r(a) - (r(a) + r(c_2) + ... + r(c_k)) / k,   c_j ~ π(· | s_t)
  GRPO   A = R_1 - (R_1 + ... + R_k) / k,   R_1 = Σ_{t'<t} r_t' + r(a) + Σ_{t'>t} r_t' over a's
         continuation drawn from π, R_2..R_k the returns (sums of the same step rewards) of
         independent whole trajectories from the prompt.
Its variance across `draws` draws, averaged over (s_t, a) pairs, is the per-step advantage
variance; `advantage_variance_ratio` = SLATE / GRPO at T = 4. The same with the advantage
divided by (std of the k values + 1e-6), as both methods train on, is reported beside it.

Result: (full run: 30 (state, step) pairs per T, 100 draws each) the paper's direction, and
at least its factor. Centred per-step advantage variance, SLATE against GRPO: T = 2 0.208 vs
0.774 (ratio 0.269; 1/T = 0.5), T = 3 0.210 vs 1.228 (0.171; 0.333), T = 4 0.202 vs 1.890
(advantage_variance_ratio = 0.107; 0.25). SLATE's variance stays flat in T (it only sees one
step's noise); GRPO's grows with T. By step index at T = 4 the ratio is 0.066, 0.154, 0.180,
0.254 for t = 0..3 (13, 6, 6, 5 states): exactly ~1/T at the last step, far below it at the
first. That is what i.i.d. per-step noise predicts (our derivation, not the paper's theorem,
which we could not read): GRPO's estimate of step t carries its own continuation's T - t - 1
steps of noise, weighted by ((k-1)/k)², plus the k - 1 other trajectories' T steps, so the
ratio is 1 / ((k - 1)(T - t - 1) + T): 1/16, 1/12, 1/8, 1/4 here. Std-normalised advantages
(what both train on) shrink the gap, since GRPO's larger return spread also enlarges its
divisor: ratios 0.556, 0.582, 0.404 for T = 2, 3, 4 (normalised_advantage_variance_ratio
0.404), still below 1. Caveats: the policy is scripted (not a trained LM), the rewards are the
rule judge's, and the states oversample t = 0 (later steps are reached less often).
"""


import matplotlib.pyplot as plt
import numpy as np

from experiments import dynamics as studies
from rlreason.envs import environment
from rlreason.envs import formats
from rlreason.envs import slate_rules
from rlreason.envs import tasks as env_tasks
from rlreason.rollout import slate
from rlreason.rollout import slate_judge


def simulate(smoke: bool) -> dict:
  """Per-step advantage variance of SLATE and full-trajectory GRPO for T = 2, 3, 4."""
  k, turns_list = 5, (2, 3, 4)
  states, draws = (3, 12) if smoke else (30, 100)
  fmt = formats.get('tags')
  rng = np.random.default_rng(0)

  def call(query):
    return '<call>search: {"query": "%s"}</call>' % query

  def policy(example, history, judge):
    """One step of the scripted agent (module docstring) from the state `history`."""
    facts, subjects = judge.facts(example)
    seen = '\n'.join(h['observation'] for h in history)
    todo = [i for i, f in enumerate(facts) if f not in seen]
    queries = [c['arguments']['query'] for c in example.meta['gold_calls']]
    p_answer = 0.2 if todo else 0.7
    u = rng.random()
    think = ''
    if rng.random() < 0.5:
      target = subjects[todo[0]] if todo else example.answer
      think = f'<think>look up {target}</think>' if rng.random() < 0.7 else '<think>hmm</think>'
    if u < p_answer:
      names = sorted(set(slate_rules.NAME.findall(seen + example.prompt)) - {'Where', 'Who',
                                                                               'In', 'Use'})
      guess = example.answer if not todo else str(rng.choice(names))
      return think + guess
    u = (u - p_answer) / (1 - p_answer)
    if u < 0.45 / 0.8:
      return think + call(queries[todo[0]] if todo else queries[-1])
    if u < 0.6 / 0.8:
      done = [queries[i] for i in range(len(facts)) if i not in todo] or queries[:1]
      return think + call(str(rng.choice(done)))
    if u < 0.7 / 0.8:
      return think + call(subjects[0] + ' ' + str(rng.choice(['company', 'city', 'person'])))
    return think + '<call>search: {"query": </call>'

  def run(example, env, judge, history, turns, first=None, until=None):
    """Rolls the policy on from `history` (a copy) to the end or `until` steps: (history,
    rewards). `first` is the fixed next step's text."""
    state = env.reset(example)
    for h in history:  # Replay the prefix in a fresh episode state (search is stateless).
      env.step(state, h['text'])
    history, rewards = list(history), []
    while len(history) < (until if until is not None else turns) and not state.done:
      t = len(history)
      text = first if (first is not None and not rewards) else policy(example, history, judge)
      step = slate_judge.parse_step(text, fmt)
      (scores,) = judge.score([example], [history], [[step]])
      rewards.append(slate.step_reward(step.kind, *scores[0], step=t, budget=turns))
      out = env.step(state, text)
      history.append({'text': text, 'observation': out.observation, 'reward': rewards[-1]})
    return history, rewards

  results = {'k': k, 'turns': turns_list, 'states': states, 'draws': draws}
  for turns in turns_list:
    env = environment.ToolEnvironment(tools=['search'], family='tags', verifier='exact',
                                      max_turns=turns, deadline_s=None)
    judge = slate_rules.SearchRuleJudge(verify=env.verify)
    var = {'slate': [], 'grpo': [], 'slate_norm': [], 'grpo_norm': [], 't': []}
    index = 0
    while len(var['t']) < states:
      example = env_tasks.search_qa(1, index, difficulty=1)
      index += 1
      t = int(rng.integers(turns))
      prefix, _ = run(example, env, judge, [], turns, until=t)
      if len(prefix) < t or (prefix and slate_judge.parse_step(prefix[-1]['text'],
                                                                fmt).kind == 'answer'):
        continue  # The trajectory ended before step t.
      fixed = policy(example, prefix, judge)
      step = slate_judge.parse_step(fixed, fmt)
      r_a = slate.step_reward(step.kind, *judge.score([example], [prefix], [[step]])[0][0],
                              step=t, budget=turns)
      past = sum(h['reward'] for h in prefix)
      a_slate, a_grpo = np.zeros((draws, 2)), np.zeros((draws, 2))
      for d in range(draws):
        others = [slate_judge.parse_step(policy(example, prefix, judge), fmt)
                  for _ in range(k - 1)]
        scores = judge.score([example], [prefix], [others])[0]
        r = np.array([r_a] + [slate.step_reward(c.kind, *s, step=t, budget=turns)
                              for c, s in zip(others, scores)])
        returns = [past + sum(run(example, env, judge, prefix, turns, first=fixed)[1])]
        returns += [sum(run(example, env, judge, [], turns)[1]) for _ in range(k - 1)]
        for out, values in ((a_slate, r), (a_grpo, np.array(returns))):
          out[d] = values[0] - values.mean(), float(np.asarray(slate.step_advantages(values))[0])
      var['slate'].append(a_slate[:, 0].var())
      var['grpo'].append(a_grpo[:, 0].var())
      var['slate_norm'].append(a_slate[:, 1].var())
      var['grpo_norm'].append(a_grpo[:, 1].var())
      var['t'].append(t)
    results[turns] = {key: np.array(v) for key, v in var.items()}
  return results


def ratio(results: dict, turns: int, key: str = '') -> float:
  """Mean per-step variance of SLATE over that of GRPO at T = turns ('' centred, '_norm')."""
  r = results[turns]
  return float(r['slate' + key].mean() / max(r['grpo' + key].mean(), 1e-12))


def figure(results: dict):
  """Per-step advantage variance against T, and the SLATE/GRPO ratio against 1/T."""
  turns = np.array(results['turns'])
  fig, axes = plt.subplots(1, 3, figsize=(15, 4))
  for ax, key, title in ((axes[0], '', 'centred: A = r - mean'),
                         (axes[1], '_norm', 'normalised: A = (r - mean) / (std + 1e-6)')):
    for name in ('slate', 'grpo'):
      means = [results[t][name + key].mean() for t in turns]
      ax.plot(turns, means, 'o-', label='SLATE (k steps from s_t)' if name == 'slate' else
              'GRPO (k whole trajectories)')
    ax.set(xlabel='T (steps per trajectory)', ylabel='per-step advantage variance',
           title=title, xticks=turns)
    ax.legend(fontsize=8)
  for key, label in (('', 'centred'), ('_norm', 'normalised')):
    axes[2].plot(turns, [ratio(results, t, key) for t in turns], 'o-', label=label)
  axes[2].plot(turns, 1 / turns, 'k--', lw=0.8, label="1/T (the paper's factor T)")
  axes[2].set(xlabel='T', ylabel='SLATE / GRPO', title='variance ratio', xticks=turns,
              ylim=(0, None))
  axes[2].legend(fontsize=8)
  fig.tight_layout()
  return fig


def summary(results: dict) -> str:
  """Per T: both variances and ratios; per step index t at the largest T; the headline."""
  lines = [f"k = G = {results['k']}, {results['states']} (state, step) pairs per T, "
           f"{results['draws']} draws each"]
  for t in results['turns']:
    r = results[t]
    lines.append(f'T = {t}: centred var SLATE {r["slate"].mean():.3f} GRPO {r["grpo"].mean():.3f}'
                 f' ratio {ratio(results, t):.3f} (1/T = {1 / t:.3f}); normalised var SLATE '
                 f'{r["slate_norm"].mean():.3f} GRPO {r["grpo_norm"].mean():.3f} ratio '
                 f'{ratio(results, t, "_norm"):.3f}')
  last = results[max(results['turns'])]
  for t in sorted(set(last['t'].tolist())):
    sel = last['t'] == t
    lines.append(f'  T = {max(results["turns"])}, step t = {t} ({sel.sum()} states): centred '
                 f'ratio {last["slate"][sel].mean() / max(last["grpo"][sel].mean(), 1e-12):.3f}')
  lines.append(f'normalised_advantage_variance_ratio={ratio(results, 4, "_norm"):.4f}')
  lines.append(f'advantage_variance_ratio={ratio(results, 4):.4f}')
  return '\n'.join(lines)


def main():
  studies.run_study(__name__, notebook='10_slate_variance', helpers=('ratio',), dpi=60)


if __name__ == '__main__':
  main()
