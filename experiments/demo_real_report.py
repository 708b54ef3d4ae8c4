"""Before/after report of the real-model demo (run after rlreason.main on demo_real.py).

  python -m rlreason.main --config experiments/demo_real.py:0 --workdir /tmp/demo_real
  python -m experiments.demo_real_report --config experiments/demo_real.py:0 \
      --workdir /tmp/demo_real

Greedy-decodes the held-out problems with the released model (the run starts from it: no
SFT) and with the run's newest checkpoint, scores both with the run's verifier, and prints
for each: accuracy, the format-compliance rate (the completion ends with a number: the
verifier's non-parse-failure rate), the accuracy among compliant completions and the mean
response length in tokens. So a gain that only comes from answering at all (format) shows
as a higher compliance rate with an unchanged accuracy among compliant completions.
Writes `<workdir>/transcripts_before.txt` and `transcripts_after.txt` (the first
TRANSCRIPTS problems), `<workdir>/learning_curves.png` (held-out greedy pass@1 and the
training reward per step) and prints `initial_accuracy=`, `final_accuracy=` (the run's own
evaluations, as `make demo`) and the before/after lines.
"""

import json
import pathlib
import resource
import time

from absl import app
from absl import flags
from absl import logging as absl_logging
import jax
import numpy as np
from ml_collections import config_flags

from rlreason.rl import evaluate as evaluate_lib
from rlreason.rl import metrics as metrics_lib
from rlreason.rl.rl_batch import decode_completions
from rlreason.rl.run_setup import build, encode_prompts, prompt_text
from rlreason.rollout import sampler

# Defined when run as a script (below): a test imports `report` into a process whose
# rlreason.main already defined --config.
_CONFIG = _WORKDIR = None

TRANSCRIPTS = 40
GAIN_TARGET = 0.10


def greedy_outcomes(run, params):
  """(completions, verdicts, lengths) of greedy decoding on every held-out prompt."""
  examples, chunk = run.eval_examples, run.eval_chunk
  texts, verdicts, lengths = [], [], []
  for start in range(0, len(examples), chunk):
    part = examples[start:start + chunk]
    padded = part + [part[-1]] * (chunk - len(part))
    rollout = sampler.generate(
        params, encode_prompts(run, padded), cfg=run.cfg, group_size=1,
        max_new_tokens=run.config.rl.max_new_tokens, temperature=0.0,
        stop_tokens=tuple(run.tok.eos_ids), pad_id=run.pad_id, rng=run.eval_rng,
        mesh=run.mesh, max_chunks=run.config.rl.decode_chunks)
    part_texts = decode_completions(run, rollout)[:len(part)]
    items = [{'completion': t, 'answer': ex.answer, **ex.meta} for t, ex in zip(part_texts, part)]
    verdicts += run.pool.score(items, verifier=run.config.verifier.name,
                               deadline_s=run.config.verifier.deadline_s)
    texts += part_texts
    lengths += np.asarray(rollout.lengths_N)[:len(part)].tolist()
  return texts, verdicts, lengths


def summary(verdicts, lengths) -> dict[str, float]:
  correct = np.array([v.status == 'correct' for v in verdicts])
  formatted = np.array([v.status != 'parse_failure' for v in verdicts])
  return {'accuracy': float(correct.mean()), 'format_rate': float(formatted.mean()),
          'accuracy_when_formatted': float(correct[formatted].mean()) if formatted.any() else 0.0,
          'mean_length': float(np.mean(lengths))}


def write_transcripts(path, run, texts, verdicts, title):
  lines = [f'# {title}: greedy, first {TRANSCRIPTS} held-out problems\n']
  for ex, text, v in list(zip(run.eval_examples, texts, verdicts))[:TRANSCRIPTS]:
    lines.append(f'--- {ex.id}  gold={ex.answer}  verdict={v.status}\n'
                 f'PROMPT: {prompt_text(run, ex)!r}\nRESPONSE: {text!r}\n')
  pathlib.Path(path).write_text('\n'.join(lines), encoding='utf-8')


def plot(workdir, log, title):
  import matplotlib
  matplotlib.use('Agg')
  import matplotlib.pyplot as plt
  evals = sorted({r['step']: r['eval/pass@1'] for r in log if 'eval/pass@1' in r}.items())
  reward_key = next((k for k in ('train/reward', 'train/accuracy') if any(k in r for r in log)),
                    None)
  fig, ax = plt.subplots(figsize=(6.4, 4.2))
  ax.plot([s for s, _ in evals], [a for _, a in evals], 'o-',
          label='greedy pass@1, held-out problems')
  if reward_key:
    rewards = sorted({r['step']: r[reward_key] for r in log if reward_key in r}.items())
    ax.plot([s for s, _ in rewards], [a for _, a in rewards], '.:', alpha=0.7,
            label=f'training {reward_key} (sampled)')
  ax.set_xlabel('GRPO step')
  ax.set_ylabel('accuracy')
  ax.set_ylim(-0.02, 1.02)
  ax.grid(alpha=0.3)
  ax.legend(loc='upper left', fontsize=8)
  ax.set_title(title)
  fig.tight_layout()
  path = pathlib.Path(workdir) / 'learning_curves.png'
  fig.savefig(path, dpi=120)
  return path


def report(config, workdir) -> dict:
  """Greedy before/after on the held-out problems, transcripts, plot; returns the numbers."""
  workdir = pathlib.Path(workdir)
  log = metrics_lib.read_jsonl(workdir / 'metrics.jsonl')
  evals = sorted({r['step']: r['eval/pass@1'] for r in log if 'eval/pass@1' in r}.items())
  if not evals:
    raise SystemExit(f'{workdir / "metrics.jsonl"}: no eval/pass@1 rows; did the run finish?')
  run = build(config, workdir)
  results = {'initial_accuracy': evals[0][1], 'final_accuracy': evals[-1][1]}
  try:
    step, trained = evaluate_lib.restore_params(run)
    with jax.set_mesh(run.mesh):
      for name, params in (('before', run.init_params), ('after', run.policy(trained))):
        texts, verdicts, lengths = greedy_outcomes(run, params)
        results[name] = summary(verdicts, lengths)
        write_transcripts(workdir / f'transcripts_{name}.txt', run, texts, verdicts,
                          'released model' if name == 'before' else f'after GRPO step {step}')
  finally:
    run.close()
  (workdir / 'before_after.json').write_text(json.dumps(results, indent=2) + '\n')
  results['plot'] = str(plot(workdir, log, f'SmolLM2-135M-Instruct, {config.data.task}, '
                                           f'seed {config.seed}'))
  return results


def main(argv):
  del argv
  absl_logging.set_verbosity(absl_logging.WARNING)
  config, workdir = _CONFIG.value, pathlib.Path(_WORKDIR.value)
  wall, cpu = time.time(), time.process_time()
  results = report(config, workdir)
  initial, final = results['initial_accuracy'], results['final_accuracy']
  print(f'initial_accuracy={initial:.4f}')
  print(f'final_accuracy={final:.4f}')
  for name in ('before', 'after'):
    print(' '.join(f'{name}_{k}={v:.4f}' for k, v in results[name].items()))
  print(f'report_wall_s={time.time() - wall:.0f} report_cpu_s={time.process_time() - cpu:.0f} '
        f'peak_rss_mib={resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024}')
  print(f'plot: {results["plot"]}')
  print(f'transcripts: {workdir / "transcripts_before.txt"} {workdir / "transcripts_after.txt"}')
  print(f'tensorboard: tensorboard --logdir {workdir / "tensorboard"}')
  print(f'metrics log: {workdir / "metrics.jsonl"}')
  print(f'demo_real_targets_met={int(final - initial >= GAIN_TARGET)}')


if __name__ == '__main__':
  _CONFIG = config_flags.DEFINE_config_file('config', 'experiments/demo_real.py', 'Demo config.')
  _WORKDIR = flags.DEFINE_string('workdir', None, 'The workdir of the finished run.')
  flags.mark_flags_as_required(['workdir'])
  app.run(main)
