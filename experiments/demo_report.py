"""Baselines and the learning-curve plot for the embedded demo (run after rlreason.main).

  python -m rlreason.main --config experiments/demo.py:0 --workdir /tmp/demo
  python -m experiments.demo_report --config experiments/demo.py:0 --workdir /tmp/demo

From the run's step-0 checkpoint (the SFT warm start) it trains two baselines with the same
number of extra training sequences that GRPO used (steps x prompts x G):
  * SFT-only continuation: more supervised steps on the same flawed teacher;
  * rejection-sampling fine-tuning (RFT): SFT on the SFT policy's own samples that the
    verifier accepts (the honest stronger baseline; it uses the verifier too).
It evaluates both on the same held-out prompts as the run, draws all three curves into
`<workdir>/learning_curves.png`, and prints `initial_accuracy=`, `final_accuracy=`,
`sft_only_accuracy=` and `rft_accuracy=` lines.
"""

import pathlib

from absl import app
from absl import flags
from absl import logging as absl_logging
import jax
from ml_collections import config_flags

from rlreason.rl import metrics as metrics_lib
from rlreason.rl import train
from rlreason.rl.rl_batch import decode_completions
from rlreason.rl.run_setup import build, encode_prompts, warm_start_checkpointer
from rlreason.rl.sft import sft_loop
from rlreason.rollout import sampler

_CONFIG = config_flags.DEFINE_config_file('config', 'experiments/demo.py', 'Demo config.')
_WORKDIR = flags.DEFINE_string('workdir', None, 'The workdir of the finished run.')
flags.mark_flags_as_required(['workdir'])


RFT_SAMPLES = 2  # Per prompt: sampling is most of the report's time and scales with this.


def rft_solutions(run, params, rng_key, samples: int = RFT_SAMPLES):
  """A solution function for sft_loop: one verified sample per prompt, or None."""
  calls = [0]

  def solutions(examples, np_rng):
    del np_rng
    calls[0] += 1
    rollout = sampler.generate(
        params, encode_prompts(run, examples), cfg=run.cfg, group_size=samples,
        max_new_tokens=run.config.rl.max_new_tokens, temperature=1.0,
        stop_tokens=tuple(run.tok.eos_ids), pad_id=run.pad_id,
        rng=jax.random.fold_in(rng_key, calls[0]))
    texts = decode_completions(run, rollout)
    items = [{'completion': t, 'answer': examples[n // samples].answer,
              **examples[n // samples].meta} for n, t in enumerate(texts)]
    verdicts = run.pool.score(items, verifier=run.config.verifier.name,
                              deadline_s=run.config.verifier.deadline_s)
    out = [None] * len(examples)
    for n, v in enumerate(verdicts):
      if v.status == 'correct' and out[n // samples] is None:
        out[n // samples] = texts[n]
    return out

  return solutions


def baseline_curve(run, state, *, total_steps, points, solutions=None, seed_offset):
  """(steps done, held-out accuracy) at 0, total/points, ... total extra SFT steps: one
  continuous SFT run (one optimizer state, one compilation), evaluated along the way."""
  curve = [(0, train.evaluate_policy(run, state.params, run.eval_rng)['eval/pass@1'])]
  record = lambda done, params: curve.append(
      (done, train.evaluate_policy(run, params, run.eval_rng)['eval/pass@1']))
  # Rounded up, so that no curve point falls a step or two before the end of the run.
  sft_loop(run, state, steps=total_steps, solutions=solutions, seed_offset=seed_offset,
           every=max(-(-total_steps // points), 1), on_every=record)
  return curve


def main(argv):
  del argv
  absl_logging.set_verbosity(absl_logging.WARNING)
  config, workdir = _CONFIG.value, pathlib.Path(_WORKDIR.value)
  log = metrics_lib.read_jsonl(workdir / 'metrics.jsonl')
  evals = sorted({row['step']: row['eval/pass@1'] for row in log if 'eval/pass@1' in row}.items())
  per_step = config.rl.prompts_per_step * config.rl.group_size
  rl_x = [s * per_step for s, _ in evals]
  rl_y = [a for _, a in evals]

  # The baselines start from the run's step-0 checkpoint (the SFT warm start).
  run = build(config, workdir / 'baselines')
  source = warm_start_checkpointer(workdir)
  fresh, _ = run.restore_or_init()
  abstract = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=x.sharding),
                          fresh)
  _, sft_state, _, _ = source.restore(abstract, step=0)
  source.close()

  total_sequences = config.rl.steps * per_step
  sft_steps = max(total_sequences // config.sft.batch_size, 1)
  points = 3
  with jax.set_mesh(run.mesh):
    sft_curve = baseline_curve(run, sft_state, total_steps=sft_steps, points=points,
                               seed_offset=1000)
    rft_curve = baseline_curve(run, sft_state, total_steps=sft_steps, points=points,
                               seed_offset=2000,
                               solutions=rft_solutions(run, sft_state.params,
                                                       jax.random.key(config.seed + 17)))
  run.close()
  seqs = lambda curve: [done * config.sft.batch_size for done, _ in curve]
  sft_y, rft_y = [a for _, a in sft_curve], [a for _, a in rft_curve]

  import matplotlib
  matplotlib.use('Agg')
  import matplotlib.pyplot as plt
  fig, ax = plt.subplots(figsize=(6.4, 4.2))
  ax.plot(rl_x, rl_y, 'o-', label=f'GRPO ({config.objective.policy_loss})')
  ax.plot(seqs(sft_curve), sft_y, 's--', label='SFT-only continuation (flawed teacher)')
  ax.plot(seqs(rft_curve), rft_y, '^:', label='rejection-sampling fine-tuning (verifier-filtered)')
  ax.set_xlabel('extra training sequences after the SFT warm start')
  ax.set_ylabel(f'greedy pass@1 on {len(run.eval_examples)} held-out problems')
  ax.set_ylim(-0.02, 1.02)
  ax.grid(alpha=0.3)
  ax.legend(loc='lower right', fontsize=8)
  ax.set_title(f'rlreason demo, seed {config.seed}')
  fig.tight_layout()
  plot = workdir / 'learning_curves.png'
  fig.savefig(plot, dpi=120)

  print(f'initial_accuracy={rl_y[0]:.4f}')
  print(f'final_accuracy={rl_y[-1]:.4f}')
  print(f'sft_only_accuracy={sft_y[-1]:.4f}')
  print(f'rft_accuracy={rft_y[-1]:.4f}')
  print(f'plot: {plot}')
  print(f'tensorboard: tensorboard --logdir {workdir / "tensorboard"}')
  print(f'metrics log: {workdir / "metrics.jsonl"}')
  ok = rl_y[-1] >= 0.95 and rl_y[-1] - rl_y[0] >= 0.5 and sft_y[-1] <= sft_y[0] + 0.1
  print(f'demo_targets_met={int(ok)}')


if __name__ == '__main__':
  app.run(main)
