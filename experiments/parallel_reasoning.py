"""Fork/join threads (ThreadWeaver arXiv 2512.07843, DC-CoT) on parallel_sums: SFT in the spawn
format, then GRPO on threaded rollouts (rollout/fork_join.py, methods/threads.py).

  python -m rlreason.main --config experiments/parallel_reasoning.py --workdir /tmp/pr
  python -m rlreason.main --config experiments/parallel_reasoning.py:sequential --workdir /tmp/ps
  python -m rlreason.main --config experiments/parallel_reasoning.py:runlocal --workdir /tmp/x

Hardware: a 2-core CPU. The settings are study 17's (experiments/dynamics/parallel_reasoning.py,
which also says what was measured); 'sequential' is its baseline arm. The loop's evaluation of
the threaded arm forks (rl/evaluate.py, as training samples): eval/pass@1 judges the parent's
text, with eval/longest_path_mean, eval/total_tokens_mean and eval/spawned_frac.
"""

from experiments.dynamics import parallel_reasoning


def get_config(arg: str = ''):
  """'' or 'threaded'; 'sequential'; a 'runlocal' / '_runlocal' suffix shrinks to seconds."""
  known = ('', 'threaded', 'sequential', 'runlocal', 'threaded_runlocal', 'sequential_runlocal')
  if arg not in known:
    raise ValueError(f'experiments/parallel_reasoning.py: arg {arg!r}; known: {known[1:]}')
  arm = 'sequential' if arg.startswith('sequential') else 'threaded'
  return parallel_reasoning.make_config(arm, smoke=arg.endswith('runlocal'))
