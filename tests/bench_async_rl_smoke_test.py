"""experiments/bench/async_rl.py --smoke runs both arms end to end and prints its table and
speedup (a number only: the smoke's timing under a loaded CI machine means nothing).

In a subprocess, as tests/bench_rollout_batching_smoke_test.py: the arms get the default XLA
CPU device (conftest.py's 8 fake devices stay in the test process); the persistent
compilation cache makes reruns skip most compilation.
"""

import json
import os
import pathlib
import re
import subprocess
import sys

import jax
import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]


@pytest.mark.skipif(not hasattr(os, 'sched_getaffinity') or
                    not {0, 1} <= os.sched_getaffinity(0), reason='needs CPUs 0 and 1')
def test_smoke_prints_the_table_and_speedup(tmp_path):
  env = dict(os.environ)
  env.pop('XLA_FLAGS', None)
  env.update(JAX_PLATFORMS='cpu',
             JAX_COMPILATION_CACHE_DIR=str(jax.config.jax_compilation_cache_dir),
             JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS='0.5', PYTHONUNBUFFERED='1')
  p = subprocess.run([sys.executable, '-m', 'experiments.bench.async_rl', '--smoke',
                      '--steps', '3', '--workdir', str(tmp_path)],
                     cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)
  assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
  lines = p.stdout.strip().splitlines()
  for arm in ('sync', 'async (staleness 1)'):
    row = [line for line in lines if line.startswith(arm + ' ')]
    assert len(row) == 1, p.stdout
    steps, per_s = row[0][len(arm):].split()[:2]
    assert int(steps) == 3 and float(per_s) > 0, row
  assert re.fullmatch(r'async_speedup=\d+\.\d{3}', lines[-1]), lines[-1]
  # The async arm sampled in its own process, one step behind from step 2 on.
  rows = [json.loads(line) for line in (tmp_path / 'async' / 'metrics.jsonl').open()]
  assert [r['offpolicy/staleness/1'] > 0 for r in rows if r['step'] > 0] == [False, True, True]
