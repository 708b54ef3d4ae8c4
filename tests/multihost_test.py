"""Two processes on localhost (4 CPU devices each) against one process with 8 devices.

The expensive test runs `python -m rlreason.main --multihost` twice in subprocesses while the
same config trains here on the 8 fake devices of conftest.py, then restores the two-process
run's orbax checkpoint into the reference's shardings and compares. The fault tests use a
small driver (start-up, watchdog, a loop of cross-process collectives) instead of a whole
run: what they check is how a process dies, not what it computes.
"""

import importlib.util
import os
import pathlib
import signal
import socket
import subprocess
import sys
import textwrap

import jax
import numpy as np
import pytest

from rlreason import multihost
from rlreason.rl import checkpoint
from rlreason.rl import metrics
from rlreason.rl import train

ROOT = pathlib.Path(__file__).resolve().parents[1]
# The tiniest run with a learning signal: demo's runlocal model on Z_2 composition, whose
# verifier takes the last integer of a completion mod 2, so a random policy is right half the
# time and groups have non-zero advantages. Two RL steps, no SFT, 8 rows (one per device).
_TINY = """
from experiments import demo


def get_config(arg=''):
  c = demo.get_config('runlocal')
  c.data.task, c.data.difficulty, c.data.task_options = 'group_composition', 8, {'group': 'Z2'}
  c.data.prompt_buckets = (32,)
  c.verifier.name = 'group_composition'
  c.sft.steps, c.eval.every, c.eval.num_prompts = 0, 0, 2
  c.rl.steps, c.rl.prompts_per_step, c.rl.group_size = 2, 4, 2
  c.optimizer.lr = 1e-2
  if arg == 'host_sampling':  # Per-host weight copies, tensor-parallel over 2 chips.
    c.sample_mesh.kind, c.sample_mesh.tensor = 'host', 2
  return c
"""


def _tiny_config(path, arg=''):
  spec = importlib.util.spec_from_file_location('_multihost_tiny', path)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module.get_config(arg)


def _free_port() -> int:
  with socket.socket() as s:
    s.bind(('localhost', 0))
    return s.getsockname()[1]


def _env(devices: int) -> dict[str, str]:
  # The suite's optimisation level and its compilation cache (rlreason.main turns on
  # compile_cache for JAX_COMPILATION_CACHE_DIR): the two processes compute what the reference
  # computes here.
  level = [f for f in os.environ.get('XLA_FLAGS', '').split()
           if f.startswith('--xla_backend_optimization_level')]
  env = dict(os.environ)
  env.update(JAX_PLATFORMS='cpu',
             XLA_FLAGS=' '.join([f'--xla_force_host_platform_device_count={devices}', *level]),
             JAX_COMPILATION_CACHE_DIR=str(jax.config.jax_compilation_cache_dir),
             JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS=str(
                 jax.config.jax_persistent_cache_min_compile_time_secs), PYTHONUNBUFFERED='1')
  return env


def _spawn(args_for, n: int = 2, *, cwd=ROOT):
  port = _free_port()
  return [subprocess.Popen(args_for(i, port), cwd=cwd, env=_env(4), stdout=subprocess.PIPE,
                           stderr=subprocess.STDOUT, text=True) for i in range(n)]


def _kill_all(procs) -> None:
  for p in procs:
    if p.poll() is None:
      p.kill()
    p.wait()


def test_two_processes_match_one_process_with_eight_devices(tmp_path):
  """2 x 4 devices, sampling on the training mesh, against 1 x 8 devices sampling on a
  per-host mesh (data 1, fsdp 4, tensor 2): both layouts must give the same training."""
  tiny = tmp_path / 'tiny.py'
  tiny.write_text(_TINY)
  procs = _spawn(lambda i, port: [
      sys.executable, '-m', 'rlreason.main', '--config', str(tiny), '--workdir',
      str(tmp_path / 'two'), '--multihost', f'--coordinator_address=localhost:{port}',
      '--num_processes=2', f'--process_id={i}', '--peer_timeout_s=60'])
  try:
    reference, _ = train.train(_tiny_config(tiny, 'host_sampling'), str(tmp_path / 'one'))
    outputs = [p.communicate(timeout=600)[0] for p in procs]
  finally:
    _kill_all(procs)
  for p, out in zip(procs, outputs):
    assert p.returncode == 0, out[-3000:]
  abstract = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=x.sharding),
                          reference)
  ckpt = checkpoint.Checkpointer(tmp_path / 'two', keep=3)
  step, restored, data_state, _ = ckpt.restore(abstract)
  ckpt.close()
  assert step == 2 and int(restored.step) == int(reference.step) == 2
  # Both hosts read the same global stream: the saved iterator state is the reference's.
  assert data_state == checkpoint.Checkpointer(tmp_path / 'one').restore(abstract)[2]
  jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6),
               jax.device_get(restored.params), jax.device_get(reference.params))
  # Not vacuous: the two RL steps moved the weights away from the step-0 state.
  _, initial, _, _ = checkpoint.Checkpointer(tmp_path / 'two' / 'warm_start').restore(abstract)
  moved = max(float(np.abs(a - b).max()) for a, b in zip(
      jax.tree.leaves(jax.device_get(initial.params)),
      jax.tree.leaves(jax.device_get(reference.params))))
  assert moved > 1e-3
  # Each host verified its own rows and the rewards were gathered: the same as one host's,
  # written once (only process 0 writes metrics).
  one = metrics.read_jsonl(tmp_path / 'one' / 'metrics.jsonl')
  two = metrics.read_jsonl(tmp_path / 'two' / 'metrics.jsonl')
  assert [r.get('train/reward') for r in two] == [r.get('train/reward') for r in one]
  assert 0 < one[-1]['train/reward'] < 1


_DRIVER = textwrap.dedent('''
    import sys, time
    from rlreason import compile_cache, multihost
    compile_cache.enable()  # The suite's, from the environment.
    pid, port, mode = int(sys.argv[1]), sys.argv[2], sys.argv[3]
    multihost.initialize(coordinator_address=f'localhost:{port}', num_processes=2,
                         process_id=pid, timeout_s=60, heartbeat_timeout_s=120)
    watchdog = multihost.Watchdog(timeout_s=5.0, interval_s=0.2).start()
    import jax, numpy as np
    mesh = jax.make_mesh((8,), ('data',), axis_types=(jax.sharding.AxisType.Auto,))
    rows = jax.sharding.NamedSharding(mesh, jax.P('data'))
    total = jax.jit(lambda x: x.sum(), out_shardings=jax.sharding.NamedSharding(mesh, jax.P()))
    for step in range(100000):
      x = jax.make_array_from_process_local_data(rows, np.ones((4,), np.float32), (8,))
      assert float(total(x)) == 8.0  # A cross-process reduction: blocks if a peer is gone.
      print(f'step {step}', flush=True)
      if mode == 'raise' and pid == 1 and step == 3:
        watchdog.fail('ValueError: bad batch')
        raise SystemExit(1)
      time.sleep(0.05)
''')


@pytest.mark.parametrize('mode, reason', [
    ('kill', 'process 1 sent no heartbeat'),
    ('raise', 'process 1 failed: ValueError: bad batch'),
])
def test_survivor_exits_with_a_clear_error_when_a_peer_dies(mode, reason):
  procs = _spawn(lambda i, port: [sys.executable, '-c', _DRIVER, str(i), str(port), mode])
  try:
    for p in procs:  # Both are past start-up and inside the loop of collectives.
      for line in p.stdout:
        if line.startswith('step 3'):
          break
    if mode == 'kill':
      procs[1].send_signal(signal.SIGKILL)
    out = procs[0].communicate(timeout=120)[0]  # Bounded: the watchdog's 5 s, with slack.
  finally:
    _kill_all(procs)
  assert procs[0].returncode == multihost.PEER_LOST_EXIT, out[-2000:]
  assert reason in out, out[-2000:]


def test_start_up_gives_up_with_a_clear_error_when_a_peer_never_comes():
  code = ('from rlreason import multihost; multihost.initialize(coordinator_address='
          f'"localhost:{_free_port()}", num_processes=2, process_id=1, timeout_s=2)')
  p = subprocess.run([sys.executable, '-c', code], cwd=ROOT, env=_env(4), capture_output=True,
                     text=True, timeout=120)
  assert p.returncode == multihost.START_TIMEOUT_EXIT, p.stderr[-2000:]
  assert 'not every process joined within 2s' in p.stderr


def test_row_blocks_and_layout_errors_on_one_host():
  assert multihost.row_block(8, process_index=1, process_count=2) == slice(4, 8)
  with pytest.raises(ValueError, match='6 rows do not split into 4'):
    multihost.row_block(6, process_index=0, process_count=4)
  with pytest.raises(ValueError, match='rl.prompts_per_step=6 is not divisible by the 4'):
    multihost.check_rows([('rl.prompts_per_step', 6)], process_count=4)
  # On one process every helper is the identity.
  x = jax.device_put(np.arange(8), jax.sharding.NamedSharding(
      jax.make_mesh((8,), ('d',)), jax.P('d')))
  np.testing.assert_array_equal(multihost.local_rows(x), np.arange(8))
  np.testing.assert_array_equal(multihost.gather_rows(np.arange(3)), np.arange(3))


def test_jax_internals_are_read_in_one_place_and_still_exist(monkeypatch):
  source = pathlib.Path(multihost.__file__).read_text()
  assert 'from jax._src' not in source and 'import jax._src' not in source
  assert source.count('import_module(') == 1  # in _jax_private.
  # A JAX upgrade that moves them fails here, not silently on a TPU VM or in the watchdog.
  assert isinstance(multihost._jax_private('cloud_tpu_init', 'running_in_cloud_tpu_vm', None),
                    bool)
  assert hasattr(multihost._jax_private('distributed', 'global_state', None), 'client')
  assert multihost._jax_private('distributed', 'no_such_name', 'default') == 'default'
  assert multihost._jax_private('no_such_module', 'x', 'default') == 'default'
  # Single process, jax.distributed not initialized (the public check).
  assert not jax.distributed.is_initialized()
  with pytest.raises(RuntimeError, match='not initialized'):
    multihost._client()
  monkeypatch.setenv('TPU_WORKER_HOSTNAMES', 'host-a,host-b')
  assert multihost.on_cloud_tpu_vm()
