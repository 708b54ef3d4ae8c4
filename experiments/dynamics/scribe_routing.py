"""Study 22: SCRIBE's routed rubrics against a generic one: reward variance on the same episodes

Question: SCRIBE (Skill-Conditioned Reward with Intermediate Behavioral Evaluation) routes each
subgoal of a tool episode to a skill prototype and gives the judge that prototype's rubric,
which its abstract says substantially reduces reward variance. Holding the episodes and the
judge model fixed, does routing (rollout/scribe.py, the 'tools' library) change (a) the
judge's noise, the variance of a step's score across meaning-preserving rewordings of the
rubric's instructions, and (b) the spread of episode rewards and their gap between right and
wrong episodes, against the generic rubric (judge.DEFAULT_TEMPLATE)?

  python -m experiments.dynamics.scribe_routing                  # full run, colab/figures/22_*.png
  python -m experiments.dynamics.scribe_routing --smoke          # seconds
  python -m experiments.dynamics.scribe_routing --write_notebook # colab/22_*.ipynb

Setup: episodes of calc_multiply (rlreason.envs.tasks, 3-digit factors) written by the task's
flawed tool teacher (envs.tasks.calculator_trace, call_prob 0.5): right episodes call the
calculator and copy its result, wrong ones answer from the head; half of them open with a
planning line. Each episode's steps are its lines (call, <result>, answer, plan). The judges
are tiny random transformers over characters (2 layers, d = 32, weights x5 so that their
label distributions depend on the prompt; one per judge seed): no pretrained judge is
available offline, so they know nothing about arithmetic or tools. Scores are 'expected'
(Σ p(label) x score); a reward is the mean step score. Rewordings: K variants of the
instructions (as written; a 'Read carefully.' preamble; 'Reply with a single character'
for 'Answer with one character'), applied alike to the generic and the routed rubrics.

Runtime: full run (48 episodes, 3 judge seeds, K = 3) 35 s of CPU (4.5 min wall at load ~20
on the shared 2-core machine); smoke (8 episodes, 1 judge, K = 2) about 11 s of CPU.

Result: (full run, 2026-12-02) nothing here tests SCRIBE's claim; the numbers are a mechanism
check. Routing is deterministic and covers every step of these episodes (tool_call 0.20,
result_use 0.20, planning 0.17, answer 0.42, calculation 0, unrouted 0). With the random
judges every score is almost constant: step-score variance across rewordings 0.0000-0.0006,
episode-reward variance 0.0001-0.0008 on a [-1, 1] scale, and the right-wrong gap is within
+-0.05 with either sign (judge 0: generic +0.012, routed +0.007; judge 1: +0.029, +0.046;
judge 2: -0.016, -0.004). Routed judging's rewording noise is lower in all three judges
(noise_ratio_routed_over_generic = 0.32: 0.56, 0.21, 0.18), which reads like the paper's
direction but is most likely a length effect: the routed rubrics are longer and a random
model's label distribution moves less when the same words change inside a longer prompt. A
test of the claim needs a judge that can read rubrics (an instruction-tuned model; none is
available offline here): the study runs unchanged with any judge.Judge (tiny_judge is the
only part to swap).
"""

import dataclasses
import string

import jax
import matplotlib.pyplot as plt
import numpy as np

from experiments import dynamics as studies
from rlreason.envs import tasks
from rlreason.model import tokenizer
from rlreason.model import transformer
from rlreason.rollout import judge
from rlreason.rollout import scribe


def simulate(smoke: bool) -> dict:
  """Step scores per (judge seed, mode, rewording) on the same episodes."""

  def reword(template: str, r: int) -> str:
    """Rewording r of a rubric's instructions (0: as written); the meaning is kept."""
    if r == 1:
      return 'Read carefully.\n\n' + template
    if r == 2:
      return template.replace('Answer with one character', 'Reply with a single character')
    return template

  def episodes(count: int, seed: int = 0) -> tuple[list[str], list[str], np.ndarray]:
    """(problems, episode texts, right_N): calculator-teacher episodes, half with a plan line."""
    rng = np.random.default_rng(seed)
    problems, texts, right = [], [], []
    for i in range(count):
      ex = tasks.calc_multiply(seed, i, difficulty=3)
      segments = tasks.calculator_trace(ex, rng, call_prob=0.5)
      lines = [text for text, _ in segments]
      if rng.random() < 0.5:
        lines.insert(0, 'First we need to multiply the two numbers.')
      problems.append(ex.prompt)
      texts.append('\n'.join(lines))
      right.append(lines[-1].strip() == ex.answer)
    return problems, texts, np.array(right)

  def tiny_judge(seed: int, template: str) -> judge.Judge:
    tok = tokenizer.from_characters(string.printable)
    cfg = transformer.ModelConfig(vocab_size=tok.vocab_size, hidden_size=32,
                                  intermediate_size=64, num_layers=2, num_heads=2,
                                  num_kv_heads=1, head_dim=16)
    params = jax.tree.map(lambda x: x * 5 if x.ndim > 1 else x,
                          transformer.init_params(cfg, jax.random.key(seed)))
    return judge.Judge(cfg=cfg, tok=tok, params=params, template=template,
                       score_mode='expected', prompt_buckets=(640,), batch_size=32,
                       use_chat_template=False)

  count, seeds, k = (8, 1, 2) if smoke else (48, 3, 3)
  problems, texts, right = episodes(count)
  results = {'right': right, 'seeds': seeds, 'k': k, 'count': count, 'routes': None}
  for seed in range(seeds):
    for r in range(k):
      generic = tiny_judge(seed, reword(judge.DEFAULT_TEMPLATE, r))
      library = tuple(dataclasses.replace(p, rubric=reword(p.rubric, r))
                      for p in scribe.TOOLS)
      routed = scribe.ScribeJudge(judge=generic, library=library, unrouted='generic')
      for mode, j in (('generic', generic), ('routed', routed)):
        res = j.score(problems, texts)
        results[seed, mode, r] = (np.concatenate(res.step_scores), res.rewards_N)
        if mode == 'routed':
          results['routes'] = res.metrics()
  return results


def noise(results: dict, seed: int, mode: str) -> float:
  """Mean over steps of the score's variance across the K rewordings."""
  steps_KxM = np.stack([results[seed, mode, r][0] for r in range(results['k'])])
  return float(steps_KxM.var(0).mean())


def spread(results: dict, seed: int, mode: str) -> tuple[float, float]:
  """(variance of episode rewards, mean reward of right minus wrong episodes), first wording."""
  rewards = results[seed, mode, 0][1]
  right = results['right']
  gap = rewards[right].mean() - rewards[~right].mean() if right.any() and (~right).any() else 0.
  return float(rewards.var()), float(gap)


def figure(results: dict):
  """Per judge seed: rewording noise and episode-reward variance, generic vs routed."""
  seeds = range(results['seeds'])
  fig, axes = plt.subplots(1, 3, figsize=(14, 3.6))
  width = 0.38
  for i, mode in enumerate(('generic', 'routed')):
    x = np.arange(results['seeds']) + (i - 0.5) * width
    axes[0].bar(x, [noise(results, s, mode) for s in seeds], width, label=mode)
    axes[1].bar(x, [spread(results, s, mode)[0] for s in seeds], width, label=mode)
    axes[2].bar(x, [spread(results, s, mode)[1] for s in seeds], width, label=mode)
  for ax, title in zip(axes, ('step-score variance across rewordings (noise)',
                              'episode-reward variance', 'reward gap: right - wrong episodes')):
    ax.set(xlabel='judge seed', title=title, xticks=np.arange(results['seeds']))
    ax.legend(fontsize=8)
  fig.tight_layout()
  return fig


def summary(results: dict) -> str:
  lines = [f"{results['count']} episodes ({int(results['right'].sum())} right), "
           f"{results['seeds']} random judges, K = {results['k']} rewordings"]
  routes = results['routes']
  lines.append('routes: ' + ', '.join(f'{k.split("route_")[1][:-5]} {v:.2f}'
                                      for k, v in routes.items() if 'route_' in k)
               + f', unrouted {routes["scribe/unrouted_frac"]:.2f}')
  ratios = []
  for s in range(results['seeds']):
    g, r = noise(results, s, 'generic'), noise(results, s, 'routed')
    (gv, gg), (rv, rg) = spread(results, s, 'generic'), spread(results, s, 'routed')
    ratios.append(r / max(g, 1e-12))
    lines.append(f'judge {s}: rewording noise generic {g:.4f} routed {r:.4f} (ratio '
                 f'{ratios[-1]:.2f}); episode-reward var generic {gv:.4f} routed {rv:.4f}; '
                 f'right-wrong gap generic {gg:+.3f} routed {rg:+.3f}')
  lines.append(f'noise_ratio_routed_over_generic={np.mean(ratios):.4f}')
  return '\n'.join(lines)


def main():
  studies.run_study(__name__, notebook='22_scribe_routing', helpers=('noise', 'spread'), dpi=60)


if __name__ == '__main__':
  main()
