"""The SFT-only baseline, tool-call rates and learning curves for the tool demo.

  python -m rlreason.main --config experiments/demo_tools.py:0 --workdir /tmp/demo_tools
  python -m experiments.demo_tools_report --config experiments/demo_tools.py:0 \\
      --workdir /tmp/demo_tools

Runs greedy episodes on the run's held-out problems with the step-0 (SFT warm start) and the
final parameters: their accuracy and the fraction of episodes with a tool call. From the
step-0 checkpoint it trains the SFT-only continuation (more steps on the same flawed teacher,
as many sequences as GRPO sampled: steps x prompts x G) and evaluates it the same way. It
draws accuracy and tool-call rate against extra training sequences into
`<workdir>/learning_curves.png`, writes the SFT-only curve as TensorBoard events under
`<workdir>/baselines/sft_only` (the run's are in `<workdir>/tensorboard`), and prints
`initial_accuracy=`, `final_accuracy=`, `sft_only_accuracy=`, `initial_tool_call_rate=`,
`final_tool_call_rate=` and `sft_only_tool_call_rate=`.

Not here: rejection-sampling fine-tuning (demo_report.py has it for the main demo).
"""

import pathlib

from absl import app
from absl import flags
from absl import logging as absl_logging
import jax
from ml_collections import config_flags
import numpy as np

from rlreason.rl import checkpoint
from rlreason.rollout import episodes as episodes_lib
from rlreason.rl import metrics as metrics_lib
from rlreason.rl import train
from rlreason.rl.run_setup import build, warm_start_checkpointer
from rlreason.rl.sft import sft_loop

_CONFIG = config_flags.DEFINE_config_file('config', 'experiments/demo_tools.py', 'Demo config.')
_WORKDIR = flags.DEFINE_string('workdir', None, 'The workdir of the finished run.')
flags.mark_flags_as_required(['workdir'])


def greedy_episodes(run, params) -> dict[str, float]:
  """Accuracy, tool-call rate (episodes with a call that ran without error) and tool-error
  rate (episodes with a failed call: an unknown tool, bad arguments, a malformed call) of
  greedy episodes on all held-out problems."""
  examples, chunk = run.eval_examples, run.eval_chunk
  rewards, calls, errors = [], [], []
  for start in range(0, len(examples), chunk):
    part = examples[start:start + chunk]
    padded = part + [part[-1]] * (chunk - len(part))  # One shape: one compilation.
    episodes = train.run_episodes(run, params, padded, run.eval_rng, group_size=1,
                                  temperature=0.0)
    rewards.append(episodes.rewards_N[:len(part)])
    calls.append(episodes_lib.ok_calls_N(episodes)[:len(part)] > 0)
    failed = sum(episodes.errors_N.values(), np.zeros_like(episodes.tool_calls_N))
    errors.append(failed[:len(part)] > 0)
  return {'accuracy': float(np.concatenate(rewards).mean()),
          'tool_call_rate': float(np.concatenate(calls).mean()),
          'tool_error_rate': float(np.concatenate(errors).mean())}


def restore(directory, abstract, step=None):
  source = checkpoint.Checkpointer(directory) if step is None else warm_start_checkpointer(
      directory)
  step, state, _, _ = source.restore(abstract, step=step)
  source.close()
  return step, state


def main(argv):
  del argv
  absl_logging.set_verbosity(absl_logging.WARNING)
  config, workdir = _CONFIG.value, pathlib.Path(_WORKDIR.value)
  log = metrics_lib.read_jsonl(workdir / 'metrics.jsonl')
  evals = sorted({row['step']: row['eval/pass@1'] for row in log if 'eval/pass@1' in row}.items())
  sampled = sorted({row['step']: row['episodes/ok_call_frac'] for row in log
                    if 'episodes/ok_call_frac' in row}.items())
  per_step = config.rl.prompts_per_step * config.rl.group_size

  run = build(config, workdir / 'baselines')
  fresh, _ = run.restore_or_init()
  abstract = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=x.sharding),
                          fresh)
  _, sft_state = restore(workdir, abstract, step=0)
  final_step, final_state = restore(workdir, abstract)

  sft_steps = max(config.rl.steps * per_step // config.sft.batch_size, 1)
  writer = metrics_lib.Writer(workdir / 'baselines' / 'sft_only')
  with jax.set_mesh(run.mesh):
    initial = greedy_episodes(run, sft_state.params)
    final = greedy_episodes(run, final_state.params)
    sft_curve = [(0, initial)]

    def record(done, params):
      sft_curve.append((done, greedy_episodes(run, params)))
      writer.write(done * config.sft.batch_size // per_step,
                   {f'eval/{k}': v for k, v in sft_curve[-1][1].items()})

    # One continuous SFT run, evaluated halfway and at the end (rounded up, so that no point
    # falls a step before the end).
    sft_loop(run, sft_state, steps=sft_steps, seed_offset=1000, every=-(-sft_steps // 2),
             on_every=record)
  writer.close()
  run.close()

  import matplotlib
  matplotlib.use('Agg')
  import matplotlib.pyplot as plt
  fig, (acc_ax, call_ax) = plt.subplots(1, 2, figsize=(10, 4.2))
  sft_x = [done * config.sft.batch_size for done, _ in sft_curve]
  acc_ax.plot([s * per_step for s, _ in evals], [a for _, a in evals], 'o-',
              label=f'GRPO ({config.objective.policy_loss})')
  acc_ax.plot(sft_x, [r['accuracy'] for _, r in sft_curve], 's--',
              label='SFT-only continuation (flawed teacher)')
  acc_ax.set_ylabel(f'greedy pass@1 on {len(run.eval_examples)} held-out problems')
  call_ax.plot([s * per_step for s, _ in sampled], [f for _, f in sampled], '.-', alpha=0.6,
               label='GRPO, sampled episodes (T=1)')
  call_ax.plot([0, final_step * per_step], [initial['tool_call_rate'], final['tool_call_rate']],
               'o', label='GRPO, greedy held-out episodes')
  call_ax.plot(sft_x, [r['tool_call_rate'] for _, r in sft_curve], 's--',
               label='SFT-only continuation, greedy held-out')
  call_ax.set_ylabel('fraction of episodes that call the calculator (without error)')
  for ax in (acc_ax, call_ax):
    ax.set_xlabel('extra training sequences after the SFT warm start')
    ax.set_ylim(-0.02, 1.02)
    ax.grid(alpha=0.3)
    ax.legend(loc='center right', fontsize=8)
  fig.suptitle(f'rlreason tool demo (calc_multiply, {config.data.difficulty}-digit operands), '
               f'seed {config.seed}')
  fig.tight_layout()
  plot = workdir / 'learning_curves.png'
  fig.savefig(plot, dpi=120)

  sft_only = sft_curve[-1][1]
  print(f'initial_accuracy={evals[0][1]:.4f}')
  print(f'final_accuracy={evals[-1][1]:.4f}')
  print(f'sft_only_accuracy={sft_only["accuracy"]:.4f}')
  print(f'initial_tool_call_rate={initial["tool_call_rate"]:.4f}')
  print(f'final_tool_call_rate={final["tool_call_rate"]:.4f}')
  print(f'sft_only_tool_call_rate={sft_only["tool_call_rate"]:.4f}')
  print(f'initial_tool_error_rate={initial["tool_error_rate"]:.4f}')
  print(f'final_tool_error_rate={final["tool_error_rate"]:.4f}')
  print(f'sft_only_tool_error_rate={sft_only["tool_error_rate"]:.4f}')
  print(f'plot: {plot}')
  print(f'tensorboard: tensorboard --logdir {workdir}')
  print(f'metrics log: {workdir / "metrics.jsonl"}')
  ok = (evals[-1][1] >= 0.9 and evals[-1][1] - evals[0][1] >= 0.5
        and sft_only['accuracy'] <= initial['accuracy'] + 0.1)
  print(f'demo_targets_met={int(ok)}')


if __name__ == '__main__':
  app.run(main)
