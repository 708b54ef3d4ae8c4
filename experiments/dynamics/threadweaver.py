"""Study 24: ThreadWeaver's data pipeline and trie training on a task of independent sub-problems

Question: ThreadWeaver (arXiv 2512.07843) builds its parallel-reasoning SFT data by rewriting
sequential solutions into threads and keeping only the rewrites that still verify, and trains
threaded rollouts as a trie, its shared prefixes computed once. On parallel_sums (study 17's
task), does SFT on trajectories rewritten from noisy sequential solutions (30% carry a one-digit
slip) match SFT on the hand-written spawn teacher, before and after threaded GRPO with trie
packing, and how many positions does the learner's forward compute per step, packed against
one row per thread?

  python -m experiments.dynamics.threadweaver                  # full run
  python -m experiments.dynamics.threadweaver --smoke          # seconds
  python -m experiments.dynamics.threadweaver --write_notebook # colab/24_*.ipynb

Setup: study 17's threaded arm (parallel_sums, 4 groups of 6 digits; 2 layers, d = 64,
character tokenizer; K = 4 workers, parent 12, worker 8, final 16 tokens), with
threads.trie_packing on. Two arms from the same initialisation: 'hand', SFT on
parallel_sums.threaded_teacher (study 17's), and 'rewritten', SFT on
tasks/thread_rewrite.teacher: the task's sequential solution, slipped with probability 0.3,
parsed into steps, independent steps rewritten as threads, kept only if every step recomputes
and the verifier accepts the parent (dropped rows are skipped by the SFT loop). Then GRPO on
threaded rollouts (G = 8, 16 prompts, ppo_clip, token_mean) with trie packing. Evaluation:
greedy threaded episodes on held-out problems. Before GRPO, one rollout checks the packed
learner against the per-row one: the largest gap between their old log-probs on trained
tokens, and between their losses.

Runtime: full run 290 s CPU (hand arm 198 s, rewritten arm 158 s, the second reusing compiled
code; 21 min wall at load ~20 on the shared 2-core machine); smoke 54 s CPU (two arms' compiles).

Result: (one seed, the full setting) the data pipeline and the trie packing work as claimed;
the accuracy comparison says nothing, because neither arm learns the task at this scale.
Rewrite on 400 noisy sources (27.8% slipped): kept_fraction=0.723, every clean source kept
(1.000) and every slipped one dropped (kept_slipped=0.000; 0.273 failed a step's recomputation,
0.005 the verifier). On clean sources the rewrite is the hand-written teacher exactly
(tests/thread_rewrite_test.py), so the two SFT arms differ only in which problems survive.
Held-out greedy accuracy (128 problems) after 800 SFT steps: hand 0.109, rewritten 0.133;
unchanged after 8 GRPO steps with trie packing (0.109, 0.133): chance level for a mod-10 answer
(0.1; the gap is within one binomial standard error, 0.03), as in study 17, where the tiny model
does not learn the running sums either. Both arms keep the spawn format (spawned 1.00, critical
path 29.0 of 50.0 tokens: the teacher's). Learner forward per step (128 episodes of 1 + 4 rows,
T = 105): 67,200 positions per row against 20,480 packed (525 against 160 per episode),
positions_ratio=0.305; counting real tokens only, trie nodes are 0.405 of the rows' tokens.
The packed learner's old log-probs on trained tokens are within 1.9e-06 of the per-row ones
and the losses within 9.3e-10 (trie_logprob_gap, trie_loss_gap). Not measured: the packed
forward's wall time (positions are the proxy here), and SFT on model-sampled sequential
solutions (the sources are the sequential teacher's, slipped).
"""

import itertools
import tempfile
import time

import jax
import matplotlib.pyplot as plt
import numpy as np

from experiments import dynamics as studies
from rlreason import config as config_lib
from rlreason.methods import threads
from rlreason.objectives import aggregation
from rlreason.rl import rl_batch
from rlreason.rl import run_setup
from rlreason.rl import sft
from rlreason.rl import train
from rlreason.rl import update
from rlreason.rollout import fork_join
from rlreason.tasks import thread_rewrite
from rlreason.verifiers import synthetic_tasks

NOTEBOOK = '24_threadweaver'
SLIP_RATE = 0.3


def make_config(arm: str, smoke: bool):
  """Study 17's threaded settings with trie packing; the SFT teacher of `arm` ('hand' |
  'rewritten'); seconds-long if `smoke`."""
  c = config_lib.default()
  c.data.update(task='parallel_sums', difficulty=6, task_options={'groups': 4},
                prompt_buckets=(40,))
  c.model.arch = dict(vocab_size=0, hidden_size=64, intermediate_size=192, num_layers=2,
                      num_heads=4, num_kv_heads=4, head_dim=16, qkv_bias=False, qk_norm=False,
                      tie_embeddings=False, family='qwen2', rope_theta=10_000.0)
  c.tokenizer.kind = 'chars'
  c.verifier.update(name='arithmetic', workers=1)
  if arm == 'hand':
    c.sft.update(teacher='rlreason.tasks.parallel_sums:threaded_teacher')
  else:
    c.sft.update(teacher='rlreason.tasks.thread_rewrite:teacher',
                 teacher_options={'slip_rate': SLIP_RATE})
  c.sft.update(steps=800, batch_size=32, lr=3e-3, warmup_steps=20, decay=False, grad_clip=1.0)
  c.rl.update(steps=8, prompts_per_step=16, group_size=8, temperature=1.0, max_new_tokens=64)
  c.threads.update(enabled=True, max_workers=4, parent_tokens=12, worker_tokens=8,
                   final_tokens=16, trie_packing=True)
  c.objective.update(advantage='grpo', policy_loss='ppo_clip', aggregation='token_mean')
  c.optimizer.update(lr=3e-4, grad_clip=1.0)
  c.eval.update(every=0, num_prompts=128)
  c.checkpoint.every = 0
  c.mesh = dict(data=1, fsdp=-1, tensor=1)
  c.log_every = 5
  if smoke:
    c.data.update(difficulty=2, task_options={'groups': 2}, prompt_buckets=(16,))
    c.model.arch.update(hidden_size=32, intermediate_size=64, num_layers=1, num_heads=2,
                        num_kv_heads=1, head_dim=16)
    c.sft.update(steps=2, batch_size=8)
    c.rl.update(steps=1, prompts_per_step=2, group_size=4, max_new_tokens=24)
    c.threads.update(max_workers=2, parent_tokens=6, worker_tokens=4, final_tokens=8)
    c.eval.update(num_prompts=4)
  return c


def evaluate(run, params) -> dict:
  """Greedy threaded episodes on the held-out problems: accuracy, mean critical path and
  total sampled tokens per answer, and the fraction that spawned."""
  examples, b = run.eval_examples, len(run.eval_examples)
  batch = examples + examples[:(-b) % 64] if b >= 64 else examples
  texts, path, total, spawned = [], [], [], []
  for start in range(0, len(batch), 64):
    out = threads.sample_threads(run, params, batch[start:start + 64], jax.random.key(0),
                                 temperature=0.0, group_size=1)
    tokens_N = np.asarray(out.rollout.loss_mask_NxL).sum(axis=1)
    texts += out.final_texts
    path += fork_join.longest_path_E(tokens_N, out.parent_N).tolist()
    total += fork_join.total_tokens_E(tokens_N, out.parent_N).tolist()
    spawned += out.spawned_E.tolist()
  correct = [synthetic_tasks.verify_arithmetic({'completion': t, 'answer': ex.answer}).reward
             for t, ex in zip(texts[:b], examples)]
  mean = lambda xs: float(np.mean(xs[:b]))
  return {'accuracy': mean(correct), 'longest_path': mean(path), 'total_tokens': mean(total),
          'spawned': mean(spawned)}


def trie_check(run, params) -> dict:
  """One threaded rollout, its learner inputs with and without trie packing: the largest gap
  between the old log-probs of trained tokens, and between the losses (same advantages)."""
  rollout, scores, _ = train.sample_step(run, params, 1, {})
  batch, stats = rl_batch.make_train_batch(run, params, rollout)
  adv, _ = rl_batch.advantages_for(run, scores, stats, batch, progress=0.0)
  batch = batch.replace(advantages_NxL=adv)
  rows = run.logprobs(params, batch.tokens_NxT, batch.mask_NxT, batch.loss_mask_NxL.shape[1])
  mask = np.asarray(batch.loss_mask_NxL)
  gap = np.abs(np.asarray(rows.logprobs_NxT) - np.asarray(batch.old_logprobs_NxL))[mask].max()
  den = aggregation.denominators(batch.loss_mask_NxL, mode='token_mean')
  loss = jax.jit(lambda p, b: update.loss_fn(p, b, den, cfg=run.cfg, objective=run.objective)[0])
  return {'logprob_gap': float(gap),
          'loss_gap': abs(float(loss(params, batch)) - float(loss(params, batch.replace(trie=None))))}


def simulate(smoke: bool) -> dict:
  """The rewrite's kept fraction on noisy sources, then per arm from the same
  initialisation: SFT on its teacher, the trie check, GRPO with trie packing."""
  c = make_config('rewritten', smoke)
  sources = list(itertools.islice(iter(sft.problem_stream(c)), 40 if smoke else 400))
  results = {'data': thread_rewrite.kept_fraction(sources, slip_rate=SLIP_RATE, seed=0)}
  print('rewrite on noisy sources:', results['data'], flush=True)
  for arm in ('hand', 'rewritten'):
    c = make_config(arm, smoke)
    cpu = time.process_time()
    run = run_setup.build(c, tempfile.mkdtemp(prefix=f'threadweaver_{arm}_'))
    state, _ = run.restore_or_init()
    with jax.set_mesh(run.mesh):
      state, _ = sft.sft_loop(run, state, steps=c.sft.steps)
      after_sft = evaluate(run, run.policy(state.params))
      print(arm, 'after SFT:', after_sft, flush=True)
      check = trie_check(run, run.policy(state.params))
      steps = []
      for step in range(1, c.rl.steps + 1):
        state, metrics = train.rl_step(run, state, step, {})
        steps.append({k: float(v) for k, v in metrics.items()
                      if k.startswith('threads/') or k in ('train/accuracy', 'loss')})
      after_rl = evaluate(run, run.policy(state.params))
    print(arm, f'after {c.rl.steps} GRPO steps:', after_rl, flush=True)
    results[arm] = {'sft': after_sft, 'rl': after_rl, 'check': check, 'steps': steps,
                    'cpu_s': time.process_time() - cpu}
    run.close()
  return results


def figure(results):
  fig, axes = plt.subplots(1, 2, figsize=(9, 3.3))
  arms = ('hand', 'rewritten')
  x = np.arange(len(arms))
  for i, stage in enumerate(('sft', 'rl')):
    axes[0].bar(x + 0.35 * i, [results[a][stage]['accuracy'] for a in arms], 0.35,
                label='after SFT' if stage == 'sft' else 'after GRPO (trie)')
  axes[0].set_xticks(x + 0.175, [f'{a} teacher' for a in arms])
  axes[0].set_title('held-out accuracy (greedy, threaded)')
  axes[0].legend()
  names = ('positions_rows', 'positions_packed', 'positions_rows_real', 'positions_packed_real')
  means = [np.mean([s[f'threads/{n}'] for a in arms for s in results[a]['steps']]) for n in names]
  axes[1].bar(range(4), means, color=['tab:gray', 'tab:blue', 'tab:gray', 'tab:blue'])
  axes[1].set_xticks(range(4), ['rows', 'packed', 'rows (real)', 'trie (real)'])
  axes[1].set_title("learner forward positions per step")
  fig.tight_layout()
  return fig


def summary(results) -> str:
  d = results['data']
  lines = [f'rewrite on noisy sources ({SLIP_RATE:.0%} slipped): kept {d["kept"]:.3f} '
           f'(clean {d["kept_clean"]:.3f}, slipped {d["kept_slipped"]:.3f})']
  for arm in ('hand', 'rewritten'):
    r = results[arm]
    lines.append(f'{arm:9s} SFT acc {r["sft"]["accuracy"]:.3f} path {r["sft"]["longest_path"]:.1f}'
                 f' spawned {r["sft"]["spawned"]:.2f}; GRPO acc {r["rl"]["accuracy"]:.3f} path '
                 f'{r["rl"]["longest_path"]:.1f} total {r["rl"]["total_tokens"]:.1f}; '
                 f'cpu {r["cpu_s"]:.0f} s')
  steps = [s for arm in ('hand', 'rewritten') for s in results[arm]['steps']]
  mean = lambda k: float(np.mean([s[f'threads/{k}'] for s in steps]))
  gaps = [results[a]['check'] for a in ('hand', 'rewritten')]
  lines += [f'kept_fraction={d["kept"]:.3f}', f'kept_slipped={d["kept_slipped"]:.3f}',
            f'sft_accuracy_hand={results["hand"]["sft"]["accuracy"]:.3f}',
            f'sft_accuracy_rewritten={results["rewritten"]["sft"]["accuracy"]:.3f}',
            f'accuracy_hand={results["hand"]["rl"]["accuracy"]:.3f}',
            f'accuracy_rewritten={results["rewritten"]["rl"]["accuracy"]:.3f}',
            f'longest_path_hand={results["hand"]["rl"]["longest_path"]:.1f}',
            f'longest_path_rewritten={results["rewritten"]["rl"]["longest_path"]:.1f}',
            f'positions_rows={mean("positions_rows"):.0f}',
            f'positions_packed={mean("positions_packed"):.0f}',
            f'positions_ratio={mean("positions_packed") / mean("positions_rows"):.3f}',
            f'real_positions_ratio={mean("positions_packed_real") / mean("positions_rows_real"):.3f}',
            f'trie_logprob_gap={max(g["logprob_gap"] for g in gaps):.2e}',
            f'trie_loss_gap={max(g["loss_gap"] for g in gaps):.2e}']
  return '\n'.join(lines)


def main():
  studies.run_study(__name__, notebook=NOTEBOOK, before=(
      f'SLIP_RATE = {SLIP_RATE}  # the share of sequential sources given a one-digit slip',
      'make_config', 'evaluate', 'trie_check'))


if __name__ == '__main__':
  main()
