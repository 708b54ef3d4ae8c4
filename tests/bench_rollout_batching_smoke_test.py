"""experiments/bench/rollout_batching.py --smoke runs end to end and prints its table and speedup.

In a subprocess, as tests/bench_episodes_smoke_test.py: the benchmark's process gets the
default XLA CPU device (conftest.py's 8 fake devices stay in the test process). The persistent
compilation cache makes reruns skip most of the two samplers' compilation.
"""

import os
import pathlib
import re
import subprocess
import sys

import jax

ROOT = pathlib.Path(__file__).resolve().parents[1]


def test_smoke_prints_the_table_and_speedup():
  env = dict(os.environ)
  # Only the suite's optimisation level (conftest.py): no forced device count, which
  # split_cpu_host refuses and the benchmark does not expect.
  env['XLA_FLAGS'] = '--xla_backend_optimization_level=0'
  env.update(JAX_PLATFORMS='cpu',
             JAX_COMPILATION_CACHE_DIR=str(jax.config.jax_compilation_cache_dir),
             JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS=str(
                 jax.config.jax_persistent_cache_min_compile_time_secs), PYTHONUNBUFFERED='1')
  p = subprocess.run([sys.executable, '-m', 'experiments.bench.rollout_batching', '--smoke'],
                     cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
  assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
  lines = p.stdout.strip().splitlines()
  rows = {path: line for line in lines for path in ('static', 'continuous')
          if line.startswith(f'smoke   {path} ')}
  assert set(rows) == {'static', 'continuous'}, p.stdout
  # Both paths sampled the same number of tokens (the forced per-row stops).
  assert rows['static'].split()[2] == rows['continuous'].split()[2], p.stdout
  assert re.fullmatch(r'continuous_batching_speedup=\d+\.\d{3}', lines[-1]), p.stdout
