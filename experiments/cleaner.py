"""CLEANER (arXiv 2601.15141): GRPO on episodes whose failed tool calls were rolled back.

  python -m rlreason.main --config experiments/cleaner.py --workdir /tmp/cleaner
  python -m rlreason.main --config experiments/cleaner.py:plain --workdir /tmp/cleaner_plain
  python -m rlreason.main --config experiments/cleaner.py:runlocal --workdir /tmp/x  # smoke

The tool demo's task and model (experiments/demo_tools.py: calc_multiply with 4-digit operands,
the 'tags' format, a character tokenizer, a 2-layer d=64 model) warm-started on a teacher that
calls the calculator in 60% of its traces and writes half of those calls broken first
('1234 * * 5678', the calculator's SyntaxError class), sees the error and writes the right call
(envs/cleaner_traces.py); the other 40% guess the product. Then GRPO with CLEANER's rollback
(env.rollback, rollout/rollback.py): a broken call is regenerated after the error and replaced
by the correction, at most 3 retries per turn; the corrected calls' tokens are off-policy
(sampled with the error in context) and token-level truncated IS (objective.correction
'tis_token', C = 2) weights them by π_old/μ. The feedback is the tool's own error message
(feedback '{error}'): the tiny model learned to correct after that text, the reference's English
instruction means nothing to it. ':plain' is the same run without rollback (plain GRPO on the
raw episodes). The settings are the study's (experiments/dynamics/cleaner_rollback.py, which
runs both arms; colab/09_cleaner_rollback.ipynb).

Measured 2026-12-02, seed 0, 1 CPU process each on the shared 2-core VM (load 20-30): ~5.3
CPU-min and 38-39 min wall per arm. Error-contaminated turns in the trained trajectories 0.24
(plain, flat) vs 0.015 (rollback); first-attempt error rate 0.24 (plain) vs 0.21 -> 0.02
(rollback); training accuracy (T = 1) last 15 steps 0.833 vs 0.855 for 180k vs 128k generated
tokens; greedy pass@1 on 128 held-out problems 1.000 -> 0.930 (plain) vs 1.000 -> 0.977.
"""

from experiments.dynamics import cleaner_rollback


def get_config(arg: str = ''):
  return cleaner_rollback.make_config(rollback=arg != 'plain',
                                      scale='runlocal' if arg == 'runlocal' else 'full')
