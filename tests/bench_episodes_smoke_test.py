"""experiments/bench/episodes.py --smoke runs end to end and prints its headline lines.

In a subprocess: the benchmark confines its process to some cores, sets OMP_WAIT_POLICY
before torch loads, and splits the CPU into its own devices, none of which may touch the test
process (conftest.py's 8 fake devices are already made). The persistent compilation cache
makes reruns take ~15 s instead of ~40 s on 2 cores.
"""

import os
import pathlib
import re
import subprocess
import sys

import jax

ROOT = pathlib.Path(__file__).resolve().parents[1]


def test_smoke_prints_the_table_and_speedups():
  env = dict(os.environ)
  # Only the suite's optimisation level (conftest.py): no forced device count, which
  # split_cpu_host refuses and the benchmark does not expect.
  env['XLA_FLAGS'] = '--xla_backend_optimization_level=0'
  env.update(JAX_PLATFORMS='cpu',
             JAX_COMPILATION_CACHE_DIR=str(jax.config.jax_compilation_cache_dir),
             JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS=str(
                 jax.config.jax_persistent_cache_min_compile_time_secs), PYTHONUNBUFFERED='1')
  # 2 devices: both JAX contenders run data-parallel on a mesh, as on the 2-core benchmark host.
  p = subprocess.run([sys.executable, '-m', 'experiments.bench.episodes', '--smoke',
                      '--cpu_devices', '2', '--threads', '1'], cwd=ROOT, env=env,
                     capture_output=True, text=True, timeout=300)
  assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
  lines = p.stdout.strip().splitlines()
  for name in ('kept cache', 'jax reprefill', 'transformers'):
    assert any(line.startswith(name) and line.endswith('x') for line in lines), p.stdout
  assert re.fullmatch(r'episode_speedup_vs_jax_reprefill=\d+\.\d{3}', lines[-2]), p.stdout
  assert re.fullmatch(r'episode_speedup_vs_reprefill=\d+\.\d{3}', lines[-1]), p.stdout
