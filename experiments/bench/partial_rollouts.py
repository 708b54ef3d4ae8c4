"""Learning with and without partial rollouts on the `make demo` task, from one warm start.

  python -m experiments.bench.partial_rollouts --workdir /tmp/bench_partial   # ~15 min
  python -m experiments.bench.partial_rollouts --smoke --inline                # seconds
  python -m experiments.bench.partial_rollouts --warm_start /tmp/bench_async/sync  # no SFT

Three arms of `python -m rlreason.main --config experiments/demo.py:<seed>`, one after the
other (XLA:CPU single-threaded, each pinned to CPU --cpu unless --inline):

  static       the demo as it is: rl.sampler='static' (every row decoded until the longest
               stops); SFT warm start, then rl.steps RL steps.
  continuous   rl.sampler='continuous' with rl.slots (default: half the step's rows), from a
               copy of the static arm's step-0 checkpoint: the same policy, finished rows'
               slots refilled group by group; still on-policy.
  partial      continuous + rl.partial_rollouts: a step trains on the first
               rl.prompts_per_step groups to finish; the others carry over the update,
               their tokens tagged with the version that sampled them (no correction: the
               demo's objective, PPO-clip against the learner's params).

Columns: greedy pass@1 on eval.num_prompts held-out problems at the middle and the end,
mean train reward over the last 10 steps, seconds per step (steps 2..n), and the staleness of
the trained tokens (fraction of policy tokens 0, 1, 2+ steps old, offpolicy/staleness/*);
for the partial arm, the rows by the staleness of their oldest token with their mean length
(partial/*_by_staleness/*): groups are released in finishing order, so long answers are the
stale ones. On the demo every answer has about the same length (5 columns, ~20 tokens),
so the length bias has little to act on here.

Measured (2026-12-02, seed 0, 80 steps, warm start of bench/async_rl's sync arm, rl.slots
64; load ~15 falling to ~2 during the partial arm, so s/step compares nothing):
  static      pass@1 0.990 (step 40) -> 1.000, reward (last 10 steps) 0.973, all tokens fresh
  continuous  0.984 -> 0.998, 0.970, all fresh
  partial     0.986 -> 0.998, 0.963, 10.8% of trained tokens one step old (none older);
              5816 rows whose tokens are all fresh (mean length 20.0), 4424 with a token
              one step old (20.0): no length bias, as every demo answer is 20 tokens.
One seed: the three are within 0.002 of each other, which says partial rollouts without a
correction do not hurt here, not that they help.

Deliberately not here: several seeds (--seed takes one), corrections (objective.correction),
rl.partial_recompute.
"""

import argparse
import json
import pathlib
import shutil
import tempfile

from experiments.bench.async_rl import ROOT, arm_command, run_arm, run_inline

ARMS = {'static': {},
        'continuous': {'rl.sampler': 'continuous'},
        'partial': {'rl.sampler': 'continuous', 'rl.partial_rollouts': True}}


def summary(workdir: pathlib.Path, steps: int) -> dict:
  rows = [json.loads(line) for line in (workdir / 'metrics.jsonl').read_text().splitlines()]
  rl = [r for r in rows if r['step'] > 0]
  evals = {r['step']: r['eval/pass@1'] for r in rl if 'eval/pass@1' in r}
  timed = [r['time/step_s'] for r in rl if 'time/step_s' in r][1:]
  tail = [r['train/reward'] for r in rl if 'train/reward' in r][-10:]
  total = lambda key: sum(r.get(key, 0) for r in rl)
  tokens = [total(f'offpolicy/staleness/{k}') for k in range(5)]
  n = max(sum(tokens), 1)
  out = dict(mid=evals.get(steps // 2, float('nan')), final=evals.get(steps, float('nan')),
             reward=sum(tail) / max(len(tail), 1), step_s=sum(timed) / max(len(timed), 1),
             stale0=tokens[0] / n, stale1=tokens[1] / n, stale2=sum(tokens[2:]) / n)
  for s in range(3):
    count = total(f'partial/rows_by_staleness/{s}')
    length = sum(r.get(f'partial/rows_by_staleness/{s}', 0) *
                 r.get(f'partial/length_by_staleness/{s}', 0) for r in rl)
    out[f'rows{s}'], out[f'len{s}'] = count, length / count if count else float('nan')
  return out


def main(argv=None) -> dict:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument('--smoke', action='store_true', help='runlocal model, 2 RL steps')
  parser.add_argument('--inline', action='store_true', help='the arms in this process')
  parser.add_argument('--seed', type=int, default=0)
  parser.add_argument('--steps', type=int, default=0, help='RL steps (0: 80, smoke 2)')
  parser.add_argument('--slots', type=int, default=0,
                      help='rl.slots of the continuous arms (0: half the rows of a step)')
  parser.add_argument('--warm_start', default='',
                      help="a workdir of this config's whose step-0 checkpoint all three arms "
                      'start from (e.g. bench/async_rl\'s sync arm), instead of an SFT here')
  parser.add_argument('--cpu', type=int, default=0, help='the CPU the arms are pinned to')
  parser.add_argument('--workdir', default='', help='kept if given, else a temporary dir')
  args = parser.parse_args(argv)
  config_arg = 'runlocal' if args.smoke else str(args.seed)
  config = str(ROOT / 'experiments' / 'demo.py') + ':' + config_arg
  from experiments import demo  # pylint: disable=import-outside-toplevel
  rl = demo.get_config(config_arg).rl
  steps = args.steps or (2 if args.smoke else 80)
  slots = args.slots or max(rl.group_size, rl.prompts_per_step * rl.group_size // 2)
  root = pathlib.Path(args.workdir or tempfile.mkdtemp(prefix='bench_partial_'))
  root.mkdir(parents=True, exist_ok=True)
  results = {}
  for name, extra in ARMS.items():
    workdir = root / name
    shutil.rmtree(workdir, ignore_errors=True)
    # One step-0 policy for all three: --warm_start's, or the static arm's SFT.
    source = pathlib.Path(args.warm_start) if args.warm_start else root / 'static'
    if name != 'static' or args.warm_start:
      shutil.copytree(source / 'warm_start', workdir / 'warm_start')
      shutil.copytree(source / 'checkpoints' / '0', workdir / 'checkpoints' / '0')
    overrides = {'rl.steps': steps, 'eval.every': max(steps // 2, 1), 'checkpoint.every': 0,
                 **extra, **({'rl.slots': slots} if extra else {})}
    if args.inline:
      run_inline(config_arg, workdir, overrides)
    else:
      run_arm(arm_command(config, workdir, overrides), cpu=args.cpu, log=root / f'{name}.log')
    results[name] = summary(workdir, steps)
  print(f'demo seed {args.seed}, {steps} RL steps, rl.slots={slots} in the continuous arms')
  print(f"{'arm':11s} {'pass@1 mid':>10s} {'final':>6s} {'reward':>6s} {'s/step':>6s} "
        f"{'stale 0':>7s} {'1':>5s} {'2+':>5s}   rows (mean length) by oldest token 0 / 1 / 2+")
  for name, r in results.items():
    rows = ' / '.join(f"{r[f'rows{s}']:.0f} ({r[f'len{s}']:.1f})" for s in range(3))
    print(f"{name:11s} {r['mid']:10.3f} {r['final']:6.3f} {r['reward']:6.3f} "
          f"{r['step_s']:6.2f} {r['stale0']:7.3f} {r['stale1']:5.3f} {r['stale2']:5.3f}   "
          + (rows if name == 'partial' else '-'))
  gap = results['partial']['final'] - results['static']['final']
  print(f'partial_minus_static_pass@1={gap:+.3f}')
  if not args.workdir:
    shutil.rmtree(root, ignore_errors=True)
  return results


if __name__ == '__main__':
  main()
