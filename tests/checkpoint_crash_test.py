"""Crash-safe checkpoints: a run SIGKILLed while writing one resumes bit-exactly from the
previous, and a full disk while saving is a clear error that leaves the previous intact."""

import errno
import os
import pathlib
import signal
import subprocess
import sys
import textwrap

import chex
import jax
import numpy as np
import pytest

from rlreason.rl import checkpoint
from rlreason.rl import train
from train_test import tiny_config  # 1 layer, d = 32, arithmetic, 8 fake devices.

ROOT = pathlib.Path(__file__).resolve().parents[1]

# A tiny run (tests/train_test.py's config, 2 RL steps, a checkpoint every step) that SIGKILLs
# itself while writing step 2's checkpoint, at `point`:
#   item: half-way through writing an item's file (the data-iterator state's JSON);
#   commit: every file written, just before orbax renames the step's directory into place.
_KILLED_RUN = textwrap.dedent('''
    import importlib.util, os, signal, sys
    from rlreason import compile_cache
    compile_cache.enable()
    from orbax.checkpoint._src.handlers import json_checkpoint_handler
    from orbax.checkpoint._src.path import async_path
    from rlreason.rl import train
    workdir, point = sys.argv[1], sys.argv[2]
    spec = importlib.util.spec_from_file_location('train_test', sys.argv[3])
    train_test = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(train_test)
    step_2 = os.path.join(workdir, 'checkpoints', '2.orbax-checkpoint-tmp')
    die = lambda: os.kill(os.getpid(), signal.SIGKILL)
    if point == 'item':
      Handler = json_checkpoint_handler.JsonCheckpointHandler
      def half_then_die(self, x, directory, save=Handler._save_fn):
        if str(directory).startswith(os.path.join(step_2, 'data.')):
          (directory / 'metadata').write_text('{"next_ind')
          die()
        return save(self, x, directory)
      Handler._save_fn = half_then_die
    else:
      rename = async_path.rename
      async def rename_or_die(src, dst):
        if str(src) == step_2:  # Its items are renamed into place first.
          die()
        return await rename(src, dst)
      async_path.rename = rename_or_die
    train.train(train_test.tiny_config(steps=2), workdir)
''')


@pytest.fixture(scope='module')
def straight(tmp_path_factory):
  """The run that nothing interrupts."""
  state, _ = train.train(tiny_config(steps=2), str(tmp_path_factory.mktemp('straight')))
  return jax.device_get((state.params, state.opt_state))


@pytest.mark.parametrize('point', ['item', 'commit'])
def test_a_run_killed_while_saving_resumes_bit_exactly_from_the_previous(
    tmp_path, point, straight):
  env = dict(os.environ, JAX_COMPILATION_CACHE_DIR=str(jax.config.jax_compilation_cache_dir),
             JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS=str(
                 jax.config.jax_persistent_cache_min_compile_time_secs))
  killed = subprocess.run([sys.executable, '-c', _KILLED_RUN, str(tmp_path / 'resumed'), point,
                           str(ROOT / 'tests' / 'train_test.py')], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=600)
  assert killed.returncode == -signal.SIGKILL, killed.stderr[-3000:]
  ckpt = checkpoint.Checkpointer(tmp_path / 'resumed')
  assert ckpt.steps() == [0, 1]  # Step 2 was never committed.
  ckpt.close()
  resumed, _ = train.train(tiny_config(steps=2), str(tmp_path / 'resumed'))
  chex.assert_trees_all_equal(jax.device_get((resumed.params, resumed.opt_state)), straight)
  assert sorted(os.listdir(tmp_path / 'resumed' / 'checkpoints')) == ['0', '1', '2']


@pytest.fixture
def small_disk(tmp_path):
  """A 1 MiB tmpfs at tmp_path / 'disk' (we run as root in CI), or None where mounting is
  not allowed: the test then makes orbax's writes raise ENOSPC instead."""
  disk = tmp_path / 'disk'
  disk.mkdir()
  mounted = subprocess.run(['mount', '-t', 'tmpfs', '-o', 'size=1m', 'tmpfs', str(disk)],
                           capture_output=True).returncode == 0
  yield disk if mounted else None
  if mounted:
    subprocess.run(['umount', '-l', str(disk)], check=True)


def test_a_full_disk_is_a_clear_error_and_the_previous_checkpoint_stays(
    small_disk, tmp_path, monkeypatch):
  workdir = small_disk or tmp_path / 'disk'
  ckpt = checkpoint.Checkpointer(workdir, keep=3)
  # 160k random float32s: 640 KiB, which fits once in 1 MiB, not twice.
  w_N = np.random.default_rng(0).standard_normal(160_000).astype(np.float32)
  ckpt.save(1, {'w': w_N}, data_state={'next_index': 1}, config={'a': 1})
  ckpt.wait()
  if small_disk is None:  # No tmpfs: the second save's writes fail as a full disk's would.
    from orbax.checkpoint._src.handlers import json_checkpoint_handler
    def full(*args, **kwargs):
      raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
    monkeypatch.setattr(json_checkpoint_handler.JsonCheckpointHandler, '_save_fn', full)
  with pytest.raises(checkpoint.DiskFullError) as raised:
    ckpt.save(2, {'w': w_N + 1}, data_state={'next_index': 2}, config={'a': 1})
    ckpt.wait()
  message = str(raised.value)
  assert f'checkpoint at step 2 not saved: no space left on the disk holding {workdir}' in message
  assert 'the previous checkpoint (step 1) is intact' in message
  ckpt.close()
  # The partial step is gone (its space freed) and step 1 restores whole, in a fresh process'
  # view of the directory.
  assert sorted(p.name for p in (workdir / 'checkpoints').iterdir()) == ['1']
  again = checkpoint.Checkpointer(workdir, keep=3)
  step, restored, data_state, config = again.restore({'w': jax.ShapeDtypeStruct((160_000,),
                                                                                np.float32)})
  assert (step, data_state, config) == (1, {'next_index': 1}, {'a': 1})
  np.testing.assert_array_equal(restored['w'], w_N)
  again.close()


def test_files_beside_the_checkpoints_are_written_whole_or_not_at_all(tmp_path, monkeypatch):
  path = tmp_path / 'config.json'
  checkpoint.write_text_atomic(path, '{"old": 1}')
  def interrupted(*args):  # The process dies after writing the new text, before the rename.
    raise KeyboardInterrupt
  monkeypatch.setattr(os, 'replace', interrupted)  # workdir_paths.write_atomic's rename.
  with pytest.raises(KeyboardInterrupt):
    checkpoint.write_text_atomic(path, '{"new": 2}')
  assert path.read_text() == '{"old": 1}'
  assert os.listdir(tmp_path) == ['config.json']
  monkeypatch.undo()
  checkpoint.write_text_atomic(path, '{"new": 2}')
  assert path.read_text() == '{"new": 2}'
