"""Command line of the RL job: `python -m rlreason.main --config experiments/demo.py --workdir DIR`.

Overrides go through ml_collections' config flags (`--config.rl.group_size=16`); a config
file may take an argument (`--config experiments/grpo_gsm8k.py:runlocal`). The resolved
config and the git commit are logged and written to the workdir before anything compiles.
The workdir may be a local path or gs://bucket/run (workdir_paths.py; the 'gcs' extra); a
missing extra is named at start-up.

Multi-host: every host runs the same command. On Cloud TPU VMs the processes find each other
by themselves; elsewhere pass `--multihost --coordinator_address=HOST:PORT --num_processes=C
--process_id=p`. Start-up, the final barrier and a lost peer are all bounded in time
(multihost.py): a process whose peer died exits with status 75 and says which one.

Deliberately not here: anything that runs per step (train.py).
"""

import logging
import os
import sys
import traceback

from absl import app
from absl import flags
from absl import logging as absl_logging
from ml_collections import config_flags

from rlreason import config as config_lib
from rlreason import host_malloc
from rlreason import platforms
from rlreason import workdir_paths

_CONFIG = config_flags.DEFINE_config_file('config', None, 'Experiment config file.')
_WORKDIR = flags.DEFINE_string('workdir', None, 'Where checkpoints and logs go.')
_MULTIHOST = flags.DEFINE_bool(
    'multihost', False, 'Start jax.distributed (implied on Cloud TPU VMs).')
_COORDINATOR = flags.DEFINE_string(
    'coordinator_address', None, 'HOST:PORT of process 0 (auto-detected on TPU VMs).')
_NUM_PROCESSES = flags.DEFINE_integer('num_processes', None, 'Processes in the job.')
_PROCESS_ID = flags.DEFINE_integer('process_id', None, 'This process, in [0, num_processes).')
_INIT_TIMEOUT = flags.DEFINE_float(
    'init_timeout_s', 300.0, 'Give up if not every process has joined within this time.')
_PEER_TIMEOUT = flags.DEFINE_float(
    'peer_timeout_s', 60.0, 'Exit when a peer has sent no heartbeat for this long.')
_CPU_DEVICES = flags.DEFINE_integer(
    'cpu_devices', 0, 'On a CPU host: run as this many single-threaded XLA devices, rows '
    'sharded over them (sharding.split_cpu_host; e.g. $(nproc)). 0 keeps one device.')
flags.mark_flags_as_required(['config', 'workdir'])


def _start_multihost():
  """jax.distributed with bounded waits and a peer watchdog; None on a single host."""
  from rlreason import multihost
  if not (_MULTIHOST.value or multihost.on_cloud_tpu_vm()):
    return None
  # JAX's own heartbeat check aborts with a stack trace; ours fires first with a clear line.
  multihost.initialize(coordinator_address=_COORDINATOR.value,
                       num_processes=_NUM_PROCESSES.value, process_id=_PROCESS_ID.value,
                       timeout_s=_INIT_TIMEOUT.value,
                       heartbeat_timeout_s=max(2 * _PEER_TIMEOUT.value, 10),
                       shutdown_timeout_s=max(_PEER_TIMEOUT.value, 10))
  return multihost.Watchdog(timeout_s=_PEER_TIMEOUT.value).start()


def _check_multihost(config, jax) -> None:
  from rlreason import multihost
  multihost.check_rows([('rl.prompts_per_step', config.rl.prompts_per_step)],
                       process_count=jax.process_count())
  if config.get('judge') and config.judge.get('enabled'):
    raise ValueError('judge.enabled: the model judge scores whole batches on one host and is '
                     'not supported in multi-host runs yet.')


def run(config, workdir) -> dict[str, float]:
  workdir = workdir_paths.check(workdir)
  import jax
  from rlreason.rl import checkpoint
  from rlreason.rl import train
  config_lib.validate(config, num_devices=jax.device_count())
  if jax.process_count() > 1:
    _check_multihost(config, jax)
  workdir.mkdir(parents=True, exist_ok=True)
  logging.info('git commit %s; process %d of %d; config:\n%s', checkpoint.git_commit(),
               jax.process_index(), jax.process_count(), config)
  if config.reward_model.train.enabled:  # Train a reward model, not a policy.
    from rlreason.methods import reward_model
    if jax.process_index() == 0:
      checkpoint.write_run_config(workdir, config.to_dict())
    return reward_model.train(config, workdir)
  _, metrics = train.train(config, workdir)
  return metrics


def main(argv):
  del argv
  # orbax logs every file it writes at INFO; keep the console for the run's own progress.
  absl_logging.set_verbosity(absl_logging.WARNING)
  workdir = workdir_paths.check(_WORKDIR.value)  # A missing 'gcs' extra: before any compile.
  # JAX_COMPILATION_CACHE_DIR, when set, with whole-entry writes: the sampler process
  # (rl.async_mode='process') and the other hosts of a pod read the same directory.
  from rlreason import compile_cache  # Imports JAX: not before platforms and host_malloc.
  compile_cache.enable()
  if _CPU_DEVICES.value:
    from rlreason.model import sharding
    sharding.split_cpu_host(_CPU_DEVICES.value)
  watchdog = _start_multihost()
  try:
    metrics = run(_CONFIG.value, workdir)
    if watchdog is not None:
      from rlreason import multihost
      multihost.barrier('end', timeout_s=_PEER_TIMEOUT.value)
  except BaseException as e:  # pylint: disable=broad-except
    if watchdog is None:
      raise
    # Tell the peers (they exit at once), then exit without jax.distributed's shutdown
    # barrier, which would wait for peers that may be stuck in a collective.
    watchdog.fail(f'{type(e).__name__}: {e}')
    traceback.print_exc()
    sys.stderr.flush()
    os._exit(1)
  if watchdog is not None:
    watchdog.stop()
  print(' '.join(f'{k}={v:.4f}' for k, v in sorted(metrics.items())))


if __name__ == '__main__':
  platforms.default_to_cpu()  # No libtpu probe on a host without an accelerator.
  host_malloc.reexec()  # Once, with GLIBC_TUNABLES set: glibc reads it only at start-up.
  app.run(main)
