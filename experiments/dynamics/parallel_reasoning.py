"""Study 17: parallel reasoning threads (fork/join) against one sequential chain

Question: ThreadWeaver (arXiv 2512.07843) and DC-CoT let a model spawn parallel worker threads
for independent sub-problems and join their results, and report accuracy close to sequential
reasoning at a much shorter critical path (the tokens on the longest thread chain: the latency
proxy). On a task built of independent sub-problems, does a tiny model trained in the spawn
format (SFT on a scripted teacher, then GRPO on threaded rollouts) keep the sequential model's
accuracy (within 0.02) at longest_path_ratio <= 0.6, at equal RL training tokens?

  python -m experiments.dynamics.parallel_reasoning                  # full run
  python -m experiments.dynamics.parallel_reasoning --smoke          # seconds
  python -m experiments.dynamics.parallel_reasoning --write_notebook # colab/17_*.ipynb
  python -m rlreason.main --config experiments/parallel_reasoning.py --workdir /tmp/pr

Setup: parallel_sums (rlreason.tasks.parallel_sums), 4 groups of 6 digits ('a:314159 b:...=');
each group's running sum mod 10 is a sub-problem, the answer is the sum of the groups' values
mod 10, checked by the `arithmetic` verifier. Sequential teacher: 'a:348915 b:... +7419 #### 9'
(49 sampled tokens with EOS). Threaded teacher (rollout/fork_join.py's spawn format): the parent
writes '<a,b,c,d>', four workers each write one group's running sums after 'a:' (7 tokens), the
parent reads '[348915,...]' (prefilled) and writes '+7419 #### 9': 9 + 13 parent tokens, 28
worker tokens, critical path 9 + 7 + 13 = 29 (0.59 of 49) if the policy keeps the format.
Model: 2 layers, d = 64, character tokenizer, one initialisation per arm (same seed). SFT
warm start on the arm's teacher (the threaded teacher's rows are single threads, parent or
worker, uniformly), then GRPO (G = 8, 16 prompts, ppo_clip, token_mean, T = 1): sequential for
`rl_steps` steps, threaded until it has sampled as many tokens (the same RL training tokens;
capped at twice the steps). Evaluation: greedy, on held-out problems; threaded episodes fork.

Runtime: full run 312 s CPU (sequential arm) + 392 s CPU (threaded arm), run as two
processes (37-39 min wall each at load ~23 on the shared 2-core machine; `simulate(only=)`);
smoke (the notebook's): see tests/colab_test.py (130 s wall at that load).

Result: (one seed, the full setting) the tiny model did not learn the task, so the accuracy
comparison says nothing about the paper's claim; the critical-path reduction did show. Held-out
greedy accuracy (128 problems) after 1500 SFT steps: sequential 0.141, threaded 0.086; after
16 GRPO steps (100,550 sampled tokens) sequential 0.086; threaded after 16 steps (102,289
tokens, the equal-token budget) 0.109: all near chance for a mod-10 answer (0.1), and GRPO did
not move them (a group of 8 at ~10% accuracy gives little signal). accuracy_delta=+0.023
compares two chance-level policies. The format held: the threaded policy spawned in every
episode (4 workers), critical path 29.0 tokens against 49.0 sequential at the same total
(50.0 vs 49.0), longest_path_ratio=0.592, i.e. the teacher's 29/49 (below the 0.6 target,
by construction of the format rather than by learning). What blocks accuracy: the running
sums need an exact lookup of each digit; the sequential chain copies at a fixed offset from the
prompt, a worker must find its group by label. A larger model or longer SFT is the next try
(not run: each arm cost ~6 CPU-minutes here).
"""

import tempfile

import jax
import matplotlib.pyplot as plt
import numpy as np

from experiments import dynamics as studies
from rlreason import config as config_lib
from rlreason.methods import threads
from rlreason.rl import rl_batch
from rlreason.rl import run_setup
from rlreason.rl import sft
from rlreason.rl import train
from rlreason.rollout import fork_join
from rlreason.rollout import sampler
from rlreason.verifiers import synthetic_tasks

NOTEBOOK = '17_parallel_reasoning'


def make_config(arm: str, smoke: bool):
  """experiments/parallel_reasoning.py's settings for `arm` ('threaded' | 'sequential');
  seconds-long if `smoke`."""
  c = config_lib.default()
  c.data.update(task='parallel_sums', difficulty=6, task_options={'groups': 4},
                prompt_buckets=(40,))
  c.model.arch = dict(vocab_size=0, hidden_size=64, intermediate_size=192, num_layers=2,
                      num_heads=4, num_kv_heads=4, head_dim=16, qkv_bias=False, qk_norm=False,
                      tie_embeddings=False, family='qwen2', rope_theta=10_000.0)
  c.tokenizer.kind = 'chars'
  c.verifier.update(name='arithmetic', workers=1)
  teacher = 'rlreason.tasks.parallel_sums:threaded_teacher' if arm == 'threaded' else ''
  c.sft.update(steps=1500, batch_size=32, lr=3e-3, warmup_steps=20, decay=False, grad_clip=1.0,
               teacher=teacher)
  # rl.max_new_tokens: the sequential budget (49 at the teacher), and the SFT rows' length.
  c.rl.update(steps=16, prompts_per_step=16, group_size=8, temperature=1.0, max_new_tokens=64)
  c.threads.update(enabled=arm == 'threaded', max_workers=4, parent_tokens=12,
                   worker_tokens=8, final_tokens=16)
  c.objective.update(advantage='grpo', policy_loss='ppo_clip', aggregation='token_mean')
  c.optimizer.update(lr=3e-4, grad_clip=1.0)
  c.eval.update(every=8, num_prompts=128)
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
    c.eval.update(every=1, num_prompts=4)
  return c


def evaluate(run, params, arm: str) -> dict:
  """Greedy answers to the held-out problems (threaded episodes fork): accuracy, the mean
  critical path and total sampled tokens per answer, and the fraction that spawned."""
  examples, b = run.eval_examples, len(run.eval_examples)
  texts, path, total, spawned = [], [], [], []
  for start in range(0, b, 64):  # One batch shape per run: compiled once.
    batch = examples[start:start + 64]
    batch = batch + batch[:64 - len(batch)] if b >= 64 else batch
    if arm == 'threaded':
      out = threads.sample_threads(run, params, batch, jax.random.key(0), temperature=0.0,
                                   group_size=1)
      tokens_N = np.asarray(out.rollout.loss_mask_NxL).sum(axis=1)
      texts += out.final_texts
      path += fork_join.longest_path_E(tokens_N, out.parent_N).tolist()
      total += fork_join.total_tokens_E(tokens_N, out.parent_N).tolist()
      spawned += out.spawned_E.tolist()
    else:
      ro = sampler.generate(params, run_setup.encode_prompts(run, batch), cfg=run.cfg,
                            group_size=1, max_new_tokens=run.config.rl.max_new_tokens,
                            rng=jax.random.key(0), temperature=0.0,
                            stop_tokens=tuple(run.tok.eos_ids), pad_id=run.pad_id)
      texts += rl_batch.decode_completions(run, ro)
      n = np.asarray(ro.lengths_N).tolist()
      path, total, spawned = path + n, total + n, spawned + [False] * len(n)
  k = min(b, len(texts))
  correct = [synthetic_tasks.verify_arithmetic({'completion': t, 'answer': ex.answer}).reward
             for t, ex in zip(texts[:k], examples)]
  mean = lambda xs: float(np.mean(xs[:k]))
  return {'accuracy': mean(correct), 'longest_path': mean(path), 'total_tokens': mean(total),
          'spawned': mean(spawned)}


def simulate(smoke: bool, only: tuple[str, ...] = ()) -> dict:
  """Per arm (or those in `only`), from the same initialisation: SFT on the arm's teacher,
  then GRPO; held-out greedy metrics after SFT and after each eval.every steps. After the
  sequential arm, the threaded arm trains until it has sampled as many RL tokens (at most
  2 x rl.steps steps); on its own, rl.steps steps."""
  results = {}
  budget = None
  for arm in ('sequential', 'threaded'):
    if only and arm not in only:
      continue
    c = make_config(arm, smoke)
    run = run_setup.build(c, tempfile.mkdtemp(prefix=f'parallel_{arm}_'))
    state, _ = run.restore_or_init()
    with jax.set_mesh(run.mesh):
      state, _ = sft.sft_loop(run, state, steps=c.sft.steps)
    curve = [(0, 0, evaluate(run, run.policy(state.params), arm))]
    print(arm, 'after SFT:', curve[0][2], flush=True)
    sampled, step = 0, 0
    while True:
      step += 1
      times = {}
      with jax.set_mesh(run.mesh):
        state, _ = train.rl_step(run, state, step, times)
      sampled += int(times['tokens/generate'])
      done = (step >= c.rl.steps if budget is None
              else sampled >= budget or step >= 2 * c.rl.steps)
      if step % c.eval.every == 0 or done:
        curve.append((step, sampled, evaluate(run, run.policy(state.params), arm)))
        print(arm, f'step {step} ({sampled} tokens):', curve[-1][2], flush=True)
      if done:
        break
    budget = budget or sampled
    results[arm] = curve
    run.close()
  return results


def figure(results):
  fig, axes = plt.subplots(1, 2, figsize=(9, 3.3))
  for arm, curve in results.items():
    tokens = [t for _, t, _ in curve]
    axes[0].plot(tokens, [m['accuracy'] for *_, m in curve], marker='o', label=arm)
    axes[1].plot(tokens, [m['longest_path'] for *_, m in curve], marker='o', label=arm)
  axes[0].set_title('held-out accuracy (greedy)')
  axes[1].set_title('longest path (tokens on the critical path)')
  for ax in axes:
    ax.set_xlabel('RL tokens sampled (0 = after SFT)')
  axes[0].legend()
  fig.tight_layout()
  return fig


def summary(results) -> str:
  lines = []
  for arm, curve in results.items():
    (_, _, first), (step, tokens, last) = curve[0], curve[-1]
    lines.append(f'{arm:10s} after SFT acc {first["accuracy"]:.3f} path '
                 f'{first["longest_path"]:.1f}; after {step} GRPO steps ({tokens} tokens) acc '
                 f'{last["accuracy"]:.3f} path {last["longest_path"]:.1f} total '
                 f'{last["total_tokens"]:.1f} spawned {last["spawned"]:.2f}')
  thr, seq = results['threaded'][-1][2], results['sequential'][-1][2]
  lines.append(f'accuracy_delta={thr["accuracy"] - seq["accuracy"]:+.3f}')
  lines.append(f'longest_path_ratio={thr["longest_path"] / max(seq["longest_path"], 1e-9):.3f}')
  return '\n'.join(lines)


def main():
  studies.run_study(__name__, notebook=NOTEBOOK, before=('make_config', 'evaluate'))


if __name__ == '__main__':
  main()
