"""experiments/bench/real_shapes.py --smoke runs its whole code path and prints its table.

2 layers of d=64 with the real vocabulary (151,936) and the real Qwen tokenizer, chat template,
GSM8K prompts and math verifier: 2 prompts x G=2 x 8 new tokens, one update. In a subprocess:
the benchmark builds its checkpoint with torch in a child, and its ru_maxrss must be its own.
Nothing here is timed; the ratio is only checked to be a number.
"""

import os
import pathlib
import re
import subprocess
import sys

import jax

ROOT = pathlib.Path(__file__).resolve().parents[1]


def test_smoke_prints_phases_estimate_and_ratio():
  env = dict(os.environ)
  # Only the suite's optimisation level (conftest.py): no forced device count, which
  # split_cpu_host refuses and the benchmark does not expect.
  env['XLA_FLAGS'] = '--xla_backend_optimization_level=0'
  env.update(JAX_PLATFORMS='cpu',
             JAX_COMPILATION_CACHE_DIR=str(jax.config.jax_compilation_cache_dir),
             JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS=str(
                 jax.config.jax_persistent_cache_min_compile_time_secs), PYTHONUNBUFFERED='1')
  p = subprocess.run([sys.executable, '-m', 'experiments.bench.real_shapes', '--smoke'],
                     cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
  assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
  lines = p.stdout.strip().splitlines()
  assert any(line.startswith('model: ') and 'V=151936' in line and 'tied=True' in line
             for line in lines), p.stdout
  for phase in ('load', 'init', 'compile', 'sample', 'verify', 'old log-probs', 'update'):
    assert any(re.match(rf'{re.escape(phase)}\s+\d+\.\d', line) for line in lines), phase
  for part in ('baseline', 'state/params', 'state/opt_state', 'update/grads', 'total'):
    assert any(line.startswith(part + ' ') for line in lines), part
  assert re.fullmatch(r'real_shapes_rss_over_estimate=\d+\.\d{3}', lines[-1]), p.stdout
