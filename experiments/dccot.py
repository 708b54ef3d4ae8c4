"""DC-CoT on parallel_sums: a director warm-started on a small spawn-format demonstration set,
then multi-stage GRPO on threaded rollouts (methods/dccot.py, tasks/dccot_demos.py).

  python -m rlreason.main --config experiments/dccot.py --workdir /tmp/dccot
  python -m rlreason.main --config experiments/dccot.py:single --workdir /tmp/dccot1
  python -m rlreason.main --config experiments/dccot.py:runlocal --workdir /tmp/x

Hardware: a 2-core CPU. Problems have 1-4 independent digit groups; the warm start is SFT on
sft.num_demos = 64 director demonstrations (one worker per group, none for a single group);
RL stage 1 (dccot.stage1_steps = 8) rewards correctness only, stage 2 adds 0.5 * correct *
(1 - longest_path / total_tokens). 'single': correctness only for all rl.steps. The settings
are study 25's (experiments/dynamics/dccot.py, which also says what was measured, from a
sequential-SFT base this config does not train). The loop's own evaluation (eval/pass@1)
samples one thread per answer, without forking; the study's threaded evaluation is the one
to read. runlocal: seconds, 2 RL steps across the stage boundary (stage1_steps = 1).
"""

from experiments.dynamics import dccot


def get_config(arg: str = ''):
  """'' (multi-stage), 'single' (correctness only); a 'runlocal' suffix shrinks to seconds."""
  known = ('', 'single', 'runlocal', 'single_runlocal')
  if arg not in known:
    raise ValueError(f'experiments/dccot.py: arg {arg!r}; known: {known[1:]}')
  c = dccot.make_config(smoke=arg.endswith('runlocal'))
  if arg.startswith('single'):
    c.dccot.stage1_steps = c.rl.steps
  return c
