"""Study 25: DC-CoT, a director warm-started on a small spawn-format demonstration set, then multi-stage RL

Question: DC-CoT (Divide-and-Conquer CoT) starts from a long-CoT model, warm-starts it by SFT
on a small demonstration set in which it acts as a director that spawns parallel workers
(which costs accuracy), then runs multi-stage RL that first recovers the accuracy and then
rewards a shorter longest path; it reports the base model's accuracy at a 35-40% shorter
longest path. On a task whose number of independent subtasks varies (so whether to spawn and
how many workers is the director's choice), does the two-stage reward (stage 1 correctness,
stage 2 + a longest-path term when correct) end with a shorter longest path than
correctness-only RL at equal steps, without losing accuracy?

  python -m experiments.dynamics.dccot                  # full run
  python -m experiments.dynamics.dccot --smoke          # seconds
  python -m experiments.dynamics.dccot --write_notebook # colab/25_dccot.ipynb
  python -m rlreason.main --config experiments/dccot.py --workdir /tmp/dccot

Setup: parallel_sums with 1-4 groups of 3 digits ('a:314 b:592='; task option min_groups=1),
answer the sum of the groups' digit sums mod 10 (`arithmetic` verifier). Model: 2 layers,
d = 64, character tokenizer. (0) The long-CoT base stand-in: SFT on sequential solutions of
fresh problems (`base_steps`). (1) The DC-CoT warm start: SFT on a demonstration set of
`sft.num_demos` = 64 problems written by tasks/dccot_demos.py's director (one worker per
group, no spawn for a single group; one thread per SFT row). (2) From the same warm-started
state, two arms of GRPO on threaded rollouts (methods/dccot.py; G = 8, ppo_clip, token_mean):
multi-stage (stage1_steps = S with correctness only, then S steps with + 0.5 * correct *
(1 - longest_path / total_tokens)) and single-stage (2S steps of correctness only).
Evaluation: greedy on 128 held-out problems with the threaded sampler (the base never
spawns: one chain). `decision` is the fraction of problems where the director spawned as many
workers as the demonstrations' rule (0 for one group, else one per group).

Runtime: full run 305 s user CPU (+78 s system), 18 min wall at load ~17 on the shared
2-core machine; smoke 26 s CPU at XLA optimisation level 0 with a cold compilation cache
(over the 15 s notebook target: the threaded sampler's phases and the train step compile).

Result: (one seed, the full setting, 128 held-out problems; both arms on the same problems and
keys, so they are identical through stage 1) the paper's claim does not show at this scale.
What reproduces: the demonstration warm start costs accuracy, as in the paper: the sequential
base (1200 SFT steps) answers 0.758 in one chain of 27.3 tokens; after 200 SFT steps on the 64
demonstrations (workers 0/2/3/4: 14/16/18/16 problems) the director spawns exactly as the
demonstrations do on every held-out problem (decision 1.000, spawned 0.781 = the multi-group
share, 2.40 workers per episode), at a longest path of 21.5 tokens (0.785 of the base chain)
but accuracy 0.297. What does not: 16 GRPO steps (8 + 8) do not recover the accuracy in either
arm (stage 1 ends at 0.242; multi-stage 0.211, single-stage 0.203 after 16 steps:
accuracy_delta=+0.008), and the stage-2 path term does not shorten the path (21.45 vs 21.45
tokens, longest_path_ratio=1.000; spawned 0.781 in both). Why the path term is inert here:
the director already spawns one worker per group, the shortest path this format allows, so
within a prompt's group the correct episodes have the same 1 - longest/total and the term
adds a near-constant to them (a rescaled correctness reward). A first run in which the arms
drew different problem batches ended at 0.211 vs 0.297 (delta -0.086): the noise between
two batches, not an effect. Not tried (time): longer RL, the format and worker penalties
(format_weight, worker_weight; 0 here), a task whose sequential solution leaves room for a
shorter spawn plan than the demonstrations'.
"""

import tempfile

import jax
import jax.numpy as jnp
import matplotlib.pyplot as plt
import numpy as np

from experiments import dynamics as studies
from rlreason import config as config_lib
from rlreason.methods import threads
from rlreason.rl import run_setup
from rlreason.rl import sft
from rlreason.rl import train
from rlreason.rollout import fork_join
from rlreason.tasks import dccot_demos
from rlreason.verifiers import synthetic_tasks

NOTEBOOK = '25_dccot'


def make_config(smoke: bool, stage1_steps: int = -1):
  """experiments/dccot.py's settings (the DC-CoT warm start and multi-stage RL); the base
  stand-in's sequential SFT is the study's (`simulate`). stage1_steps -1: half of rl.steps."""
  c = config_lib.default()
  c.data.update(task='parallel_sums', difficulty=3, task_options={'groups': 4, 'min_groups': 1},
                prompt_buckets=(32,))
  c.model.arch = dict(vocab_size=0, hidden_size=64, intermediate_size=192, num_layers=2,
                      num_heads=4, num_kv_heads=4, head_dim=16, qkv_bias=False, qk_norm=False,
                      tie_embeddings=False, family='qwen2', rope_theta=10_000.0)
  c.tokenizer.kind = 'chars'
  c.verifier.update(name='arithmetic', workers=1)
  c.sft.update(steps=200, batch_size=32, lr=1e-3, warmup_steps=10, decay=False, grad_clip=1.0,
               teacher='rlreason.tasks.dccot_demos:director_teacher',
               teacher_options={'spawn_min': 2}, num_demos=64)
  # max_new_tokens 48: the SFT rows' length (a 4-group chain is 37 tokens with EOS);
  # parent_tokens 40: a director that does not spawn can still write the whole chain.
  c.rl.update(steps=16, prompts_per_step=16, group_size=8, temperature=1.0, max_new_tokens=48)
  c.threads.update(enabled=True, max_workers=4, parent_tokens=40, worker_tokens=6,
                   final_tokens=16)
  c.dccot.update(enabled=True, path_weight=0.5, format_weight=0.0, worker_weight=0.0)
  c.objective.update(advantage='grpo', policy_loss='ppo_clip', aggregation='token_mean')
  c.optimizer.update(lr=3e-4, grad_clip=1.0)
  c.eval.update(every=0, num_prompts=128)
  c.checkpoint.every = 0
  c.mesh = dict(data=1, fsdp=-1, tensor=1)
  c.log_every = 5
  if smoke:
    c.data.update(difficulty=1, task_options={'groups': 2, 'min_groups': 1},
                  prompt_buckets=(16,))
    c.model.arch.update(hidden_size=32, intermediate_size=64, num_layers=1, num_heads=2,
                        num_kv_heads=1, head_dim=16)
    c.sft.update(steps=2, batch_size=8, num_demos=8)
    c.rl.update(steps=2, prompts_per_step=2, group_size=4, max_new_tokens=24)
    c.threads.update(max_workers=2, parent_tokens=12, worker_tokens=3, final_tokens=8)
    c.eval.update(every=2, num_prompts=4)  # The loop evaluates after its last step.
  c.dccot.stage1_steps = c.rl.steps // 2 if stage1_steps < 0 else stage1_steps
  return c


def evaluate(run, params) -> dict:
  """Greedy threaded answers to the held-out problems (a policy that never spawns is one
  chain: parent_tokens fits a whole sequential solution): accuracy, mean longest path and
  total tokens, spawned fraction, workers per episode, the director's decision accuracy."""
  examples, b = run.eval_examples, len(run.eval_examples)
  texts, path, total, workers = [], [], [], []
  for start in range(0, b, 64):  # One batch shape per run: compiled once.
    batch = examples[start:start + 64]
    batch = batch + batch[:64 - len(batch)] if b >= 64 else batch
    out = threads.sample_threads(run, params, batch, jax.random.key(0), temperature=0.0,
                                 group_size=1)
    tokens_N = np.asarray(out.rollout.loss_mask_NxL).sum(axis=1)
    texts += out.final_texts
    path += fork_join.longest_path_E(tokens_N, out.parent_N).tolist()
    total += fork_join.total_tokens_E(tokens_N, out.parent_N).tolist()
    workers += (out.threads_E - 1).tolist()
  k = min(b, len(texts))
  correct = [synthetic_tasks.verify_arithmetic({'completion': t, 'answer': ex.answer}).reward
             for t, ex in zip(texts[:k], examples)]
  rule = [dccot_demos.director_workers(ex) for ex in examples[:k]]
  mean = lambda xs: float(np.mean(xs[:k]))
  return {'accuracy': mean(correct), 'longest_path': mean(path), 'total_tokens': mean(total),
          'spawned': mean([w > 0 for w in workers]), 'workers': mean(workers),
          'decision': mean([w == r for w, r in zip(workers, rule)])}


def simulate(smoke: bool) -> dict:
  """Base stand-in SFT, the demonstration-set warm start, then both RL arms from the same
  state on one Run, on the same problem stream and per-step keys (the arms differ only in
  dccot.stage1_steps, read at every step)."""
  c = make_config(smoke)
  run = run_setup.build(c, tempfile.mkdtemp(prefix='dccot_'))
  demo_sft, base_steps = c.sft.to_dict(), 2 if smoke else 1200
  results = {'demos': dccot_demos.spawn_counts(sft.demonstration_set(c))}
  state, _ = run.restore_or_init()
  with jax.set_mesh(run.mesh):
    run.config.sft.update(teacher='', teacher_options={}, num_demos=0)
    state, _ = sft.sft_loop(run, state, steps=base_steps, seed_offset=1)
    results['base'] = evaluate(run, run.policy(state.params))
    print('base (sequential SFT):', results['base'], flush=True)
    run.config.sft.update(demo_sft)
    state, _ = sft.sft_loop(run, state, steps=c.sft.steps)
  results['sft'] = evaluate(run, run.policy(state.params))
  print('after the demonstration warm start:', results['sft'], flush=True)
  s1, steps = c.dccot.stage1_steps, c.rl.steps
  data_state = run.data_iter.get_state()
  for arm, stage1 in (('multistage', s1), ('single', steps)):
    run.config.dccot.stage1_steps = stage1
    run.data_iter.set_state(data_state)  # Both arms see the same problems and sampling keys.
    arm_state = jax.tree.map(jnp.copy, state)
    curve = []
    for step in range(1, steps + 1):
      with jax.set_mesh(run.mesh):
        arm_state, metrics = train.rl_step(run, arm_state, step, {})
      m = jax.device_get(metrics)
      curve.append({k: float(m[k]) for k in ('train/accuracy', 'threads/longest_path_mean',
                                             'threads/spawned_frac', 'dccot/term_path')})
      if step in (s1, steps):
        results[f'{arm}_{step}'] = evaluate(run, run.policy(arm_state.params))
        print(arm, f'step {step}:', results[f'{arm}_{step}'], flush=True)
    results[f'{arm}_curve'] = curve
  results['steps'], results['stage1_steps'] = steps, s1
  run.close()
  return results


def figure(results):
  fig, axes = plt.subplots(1, 3, figsize=(12, 3.3))
  for arm in ('multistage', 'single'):
    curve = results[f'{arm}_curve']
    x = np.arange(1, len(curve) + 1)
    for ax, key in zip(axes, ('train/accuracy', 'threads/longest_path_mean',
                              'threads/spawned_frac')):
      ax.plot(x, [m[key] for m in curve], marker='o', label=arm)
      ax.set_title(key + ' (sampled, T = 1)')
  for ax in axes:
    ax.axvline(results['stage1_steps'] + 0.5, color='gray', ls=':')
    ax.set_xlabel('RL step (dotted: stage boundary of the multi-stage arm)')
  axes[0].legend()
  fig.tight_layout()
  return fig


def summary(results) -> str:
  fmt = lambda m: ' '.join(f'{k} {v:.3f}' for k, v in m.items())
  s1, steps = results['stage1_steps'], results['steps']
  lines = [f'demonstration set: workers -> count {results["demos"]}',
           f'base (one chain)      {fmt(results["base"])}',
           f'after demo SFT        {fmt(results["sft"])}']
  for arm in ('multistage', 'single'):
    for step in sorted({s1, steps}):
      lines.append(f'{arm:10s} step {step:3d}  {fmt(results[f"{arm}_{step}"])}')
  multi, single = results[f'multistage_{steps}'], results[f'single_{steps}']
  lines += [f'base_accuracy={results["base"]["accuracy"]:.3f}',
            f'sft_accuracy={results["sft"]["accuracy"]:.3f}',
            f'multistage_accuracy={multi["accuracy"]:.3f}',
            f'single_accuracy={single["accuracy"]:.3f}',
            f'accuracy_delta={multi["accuracy"] - single["accuracy"]:+.3f}',
            f'multistage_longest_path={multi["longest_path"]:.2f}',
            f'single_longest_path={single["longest_path"]:.2f}',
            f'longest_path_ratio={multi["longest_path"] / max(single["longest_path"], 1e-9):.3f}',
            f'base_path_ratio={multi["longest_path"] / max(results["base"]["longest_path"], 1e-9):.3f}',
            f'multistage_spawned={multi["spawned"]:.3f}',
            f'single_spawned={single["spawned"]:.3f}']
  return '\n'.join(lines)


def main():
  studies.run_study(__name__, notebook=NOTEBOOK, before=('make_config', 'evaluate'))


if __name__ == '__main__':
  main()
