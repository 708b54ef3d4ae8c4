"""experiments/bench/lora.py at its tiny config runs end to end and prints its headline lines.

In a subprocess, so the benchmark's thread confinement and single CPU device do not touch the
test process (conftest.py's 8 fake devices).
"""

import os
import pathlib
import re
import subprocess
import sys

import jax

ROOT = pathlib.Path(__file__).resolve().parents[1]


def test_smoke_prints_the_table_and_ratios():
  env = dict(os.environ)
  # Only the suite's optimisation level (conftest.py): no forced device count, which
  # split_cpu_host refuses and the benchmark does not expect.
  env['XLA_FLAGS'] = '--xla_backend_optimization_level=0'
  env.update(JAX_PLATFORMS='cpu',
             JAX_COMPILATION_CACHE_DIR=str(jax.config.jax_compilation_cache_dir),
             JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS=str(
                 jax.config.jax_persistent_cache_min_compile_time_secs), PYTHONUNBUFFERED='1')
  p = subprocess.run([sys.executable, '-m', 'experiments.bench.lora', '--configs', 'tiny',
                      '--steps', '1', '--warmup', '0', '--quantize', 'int8,nf4'], cwd=ROOT,
                     env=env, capture_output=True, text=True, timeout=300)
  assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
  lines = p.stdout.strip().splitlines()
  for variant in ('full', 'lora r16', 'lora r16+int8', 'lora r16+nf4'):
    assert any(re.match(rf'tiny\s+{re.escape(variant)}\s+\d', line) for line in lines), p.stdout
  assert re.fullmatch(r'lora_step_time_ratio=\d+\.\d{3}', lines[-2]), p.stdout
  # The state ratio is arithmetic on shapes. Tiny: D 64, F 128, 2 heads and 1 kv head of 64,
  # 2 layers, untied vocab 512. Full: 2 * 512*64 (embed, lm_head) + 64 (final norm) + 2 layers
  # * (q, o 8192 each; k, v 4096 each; gate, up, down 8192 each; biases 256; norms 128) =
  # 65536 + 64 + 2 * 49536 = 164672 params. Rank 16 on q/k/v/o/gate/up/down: q 64*16 + 16*128
  # = 3072, k and v 64*16 + 16*64 = 2048, o, gate, up, down 3072 each: 2 * 19456 = 38912.
  # AdamW keeps mu and nu (4 bytes each per param) and an int32 count:
  # (38912 * 12 + 4) / (164672 * 12 + 4) = 0.23630.
  assert lines[-1] == 'lora_state_memory_ratio=0.2363', p.stdout
