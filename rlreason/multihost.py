"""Multi-controller runs: start-up with a timeout, per-process rows, barriers, a peer watchdog.

Every host runs the same `main.py` (JAX's multi-controller runtime, no Pathways). The layout
that the rest of the package relies on:

  * Every process iterates the same global prompt stream and tokenizes the whole batch of B
    prompts (they are small); the sampler's jit places the rows on the devices. So the data a
    run sees does not depend on how many hosts it has, and the data-iterator state that
    process 0 checkpoints is the same on every host.
  * Process p owns rows [p * N / C, (p + 1) * N / C) of every row-major array (C processes),
    which are the rows of its prompts [p * B / C, (p + 1) * B / C). It copies only those to
    the host (`local_rows`), decodes and verifies them in its own verifier pool, and the
    small per-row results (rewards, statuses) are all-gathered (`gather_rows`), so every host
    holds the same global rewards and takes the same host-side decisions.
  * A `Watchdog` thread heartbeats through the coordination service's key-value store. When a
    peer stops (killed, crashed, preempted), the survivors print who is missing and exit
    non-zero within `timeout_s`, instead of waiting forever in a collective.

Deliberately not here: the mesh and rule tables (sharding.py), checkpoint I/O (orbax handles
multi-host saves itself), anything that decides what to train.
"""

from collections.abc import Sequence
import importlib
import logging
import os
import sys
import threading
import time

import jax
import numpy as np

# Survivors of a lost peer exit with this status (EX_TEMPFAIL: a retry may succeed).
PEER_LOST_EXIT = 75
# Start-up gave up waiting for the other processes.
START_TIMEOUT_EXIT = 76
_PREFIX = 'rlreason/watchdog'


def is_multiprocess() -> bool:
  return jax.process_count() > 1


def on_cloud_tpu_vm() -> bool:
  """True on a Cloud TPU VM, where JAX detects the other workers itself (no flags needed)."""
  if ',' in os.environ.get('TPU_WORKER_HOSTNAMES', ''):
    return True
  # Set by `import jax` when libtpu is installed and TPU chips are on the PCI bus. Public
  # alternatives start a backend (jax.devices()), which must wait until after initialize.
  return bool(_jax_private('cloud_tpu_init', 'running_in_cloud_tpu_vm', False))


def _jax_private(module: str, name: str, default):
  """`jax._src.<module>.<name>`, or `default` where a JAX release moved it.

  The only place this package reads JAX internals; JAX 0.10 has no public API for either
  thing read: whether `import jax` found a Cloud TPU VM, and the coordination-service
  client (jax.distributed offers initialize, is_initialized and shutdown only; its key-value
  store and named barriers with a timeout have no public handle, and
  multihost_utils.sync_global_devices is a device collective that a lost peer blocks forever).
  """
  try:
    return getattr(importlib.import_module(f'jax._src.{module}'), name)
  except (ImportError, AttributeError):
    return default


def initialize(*, coordinator_address: str | None = None, num_processes: int | None = None,
               process_id: int | None = None, timeout_s: float = 300.0,
               heartbeat_timeout_s: float = 100.0, shutdown_timeout_s: float = 60.0,
               stream=sys.stderr) -> None:
  """`jax.distributed.initialize`, bounded by `timeout_s`, with a message that says what to check.

  With every argument None, JAX detects them (Cloud TPU VMs, Slurm, Open MPI). Must run
  before anything creates a JAX backend (any jnp call, jax.devices()). When not every process
  has joined in time, JAX's client aborts the process with a C++ stack trace; a timer fires
  just before that, prints which coordinator and process were waiting, and exits with
  START_TIMEOUT_EXIT.
  """
  where = (f'coordinator {coordinator_address or "auto-detected"}, process {process_id} of '
           f'{num_processes}')

  def give_up():
    print(f'rlreason.multihost: not every process joined within {timeout_s:g}s ({where}). '
          "Every worker must run the same command, and process 0 must be reachable at the "
          "coordinator's address and port.", file=stream, flush=True)
    os._exit(START_TIMEOUT_EXIT)

  timer = threading.Timer(timeout_s, give_up)
  timer.daemon = True
  timer.start()
  try:
    jax.distributed.initialize(
        coordinator_address=coordinator_address, num_processes=num_processes,
        process_id=process_id, initialization_timeout=int(timeout_s) + 30,
        heartbeat_timeout_seconds=max(int(heartbeat_timeout_s), 1),
        shutdown_timeout_seconds=max(int(shutdown_timeout_s), 1))
  except Exception as e:  # pylint: disable=broad-except
    raise RuntimeError(f'multi-host start-up failed ({where}): {type(e).__name__}: {e}') from e
  finally:
    timer.cancel()


def row_block(num_rows: int, *, process_index: int | None = None,
              process_count: int | None = None) -> slice:
  """The rows this process owns: block p of C equal blocks."""
  p = jax.process_index() if process_index is None else process_index
  c = jax.process_count() if process_count is None else process_count
  if num_rows % c:
    raise ValueError(f'{num_rows} rows do not split into {c} equal per-process blocks; make '
                     f'the batch (rl.prompts_per_step, eval chunk) a multiple of {c}.')
  size = num_rows // c
  return slice(p * size, (p + 1) * size)


def local_rows(x: jax.Array) -> np.ndarray:
  """This process's block of rows (leading axis) of a global array, as numpy.

  Copies only addressable shards when they hold the block (rows sharded over data-parallel
  devices, or replicated); otherwise falls back to gathering the whole array.
  """
  if not is_multiprocess() or not isinstance(x, jax.Array):
    return np.asarray(jax.device_get(x))
  block = row_block(x.shape[0])
  out = np.empty((block.stop - block.start,) + x.shape[1:], x.dtype)
  filled = np.zeros(out.shape[0], bool)
  for shard in x.addressable_shards:
    rows = shard.index[0] if shard.index else slice(None)
    lo, hi, _ = rows.indices(x.shape[0])
    a, b = max(lo, block.start), min(hi, block.stop)
    if a >= b or filled[a - block.start:b - block.start].all():
      continue
    data = np.asarray(shard.data)
    rest = shard.index[1:]
    out[(slice(a - block.start, b - block.start),) + tuple(rest)] = data[a - lo:b - lo]
    if all(s == slice(None) or s.indices(n)[:2] == (0, n) for s, n in zip(rest, x.shape[1:])):
      filled[a - block.start:b - block.start] = True
  if filled.all():
    return out
  from jax.experimental import multihost_utils
  logging.warning('local_rows: array of shape %s is not laid out by process blocks; '
                  'gathering it whole.', x.shape)
  return np.asarray(multihost_utils.process_allgather(x, tiled=True))[block]


def gather_rows(local: np.ndarray) -> np.ndarray:
  """Concatenates every process's block (same shape on each) in process order, on every host."""
  if not is_multiprocess():
    return np.asarray(local)
  from jax.experimental import multihost_utils
  return np.asarray(multihost_utils.process_allgather(np.asarray(local), tiled=True))


def gather_verdicts(verdicts: Sequence) -> list:
  """Every process's verifier verdicts, in row order, on every host.

  Rows of other processes come back with their reward, status and latency (the fields the
  loop and evaluation read); their components and detail stay on the host that judged them.
  """
  if not is_multiprocess():
    return list(verdicts)
  from rlreason.verifiers import verdict as verdict_lib
  codes = {s: i for i, s in enumerate(verdict_lib.STATUSES)}
  local = np.array([[v.reward, codes[v.status], v.latency_s] for v in verdicts], np.float32)
  block = row_block(len(verdicts) * jax.process_count())
  everything = gather_rows(local.reshape(-1, 3))
  out = [verdict_lib.Verdict(reward=float(r), status=verdict_lib.STATUSES[int(c)],
                             latency_s=float(t)) for r, c, t in everything]
  out[block] = list(verdicts)
  return out


def round_up(n: int) -> int:
  """The smallest multiple of the process count that is >= n (a per-step batch that pads)."""
  c = jax.process_count()
  return -(-n // c) * c


def replicate_key(key: jax.Array, mesh: jax.sharding.Mesh) -> jax.Array:
  """A PRNG key (same on every host) as a global replicated array on `mesh`.

  `jax.device_put` refuses to place a host-local typed key on devices of other processes;
  its raw key data can be placed, and is then wrapped again.
  """
  if not is_multiprocess():
    return key
  replicated = jax.sharding.NamedSharding(mesh, jax.P())
  data = np.asarray(jax.random.key_data(key))
  return jax.random.wrap_key_data(jax.device_put(data, replicated),
                                  impl=jax.random.key_impl(key))


def sample_mesh(train_mesh: jax.sharding.Mesh, *, kind: str, tensor: int = -1):
  """The mesh the sampler runs on: the training mesh, or per-host replicas ('host').

  'host' puts the processes on 'data' and each host's chips on ('fsdp', 'tensor'), with
  `tensor` chips per weight copy (-1: all of the host's chips). Under SAMPLE_RULES the
  weights are then whole within each host (tensor-parallel over its own chips) and replicated
  across hosts, so decoding never waits on another host; each host samples its own rows.
  """
  if kind == 'train':
    return train_mesh
  if kind != 'host':
    raise ValueError(f"sample_mesh.kind={kind!r}; known: 'train', 'host'.")
  devices = sorted(train_mesh.devices.flat, key=lambda d: (d.process_index, d.id))
  hosts = len({d.process_index for d in devices})
  local = len(devices) // hosts
  tensor = local if tensor == -1 else tensor
  if tensor < 1 or local % tensor:
    raise ValueError(f'sample_mesh.tensor={tensor} does not divide the {local} chips of a '
                     'host.')
  axis_types = (jax.sharding.AxisType.Auto,) * 3
  return jax.sharding.Mesh(np.array(devices).reshape(hosts, local // tensor, tensor),
                           train_mesh.axis_names, axis_types=axis_types)


def _client():
  """The coordination service's client: key-value store and barriers (see _jax_private)."""
  if not jax.distributed.is_initialized():
    raise RuntimeError('multihost: jax.distributed is not initialized (call initialize).')
  client = getattr(_jax_private('distributed', 'global_state', None), 'client', None)
  if client is None:
    raise RuntimeError('multihost: this JAX version moved the coordination service client '
                       '(jax._src.distributed.global_state.client); barriers and the watchdog '
                       'need it.')
  return client


_barrier_count: dict[str, int] = {}


def barrier(name: str, *, timeout_s: float) -> None:
  """Waits until every process reaches barrier `name`, or raises TimeoutError naming it."""
  if not is_multiprocess():
    return
  n = _barrier_count[name] = _barrier_count.get(name, 0) + 1
  try:
    _client().wait_at_barrier(f'rlreason/{name}/{n}', max(int(timeout_s * 1000), 1))
  except Exception as e:  # pylint: disable=broad-except
    raise TimeoutError(f'barrier {name!r}: not all {jax.process_count()} processes arrived '
                       f'within {timeout_s:g}s ({type(e).__name__}: {e}).') from e


class Watchdog:
  """Heartbeats through the coordination service; exits this process when a peer is lost.

  Each process bumps a counter key every `interval_s` and reads everybody's. A peer whose
  counter has not moved for `timeout_s`, a peer that reported a failure (`fail`), or a
  coordination service that stops answering makes this process print the reason to stderr
  and `os._exit(PEER_LOST_EXIT)`: the main thread may be blocked inside a collective that
  will never complete, so nothing short of a hard exit is bounded. A peer that finished
  (`stop`) is no longer watched.
  """

  def __init__(self, *, timeout_s: float = 60.0, interval_s: float = 1.0,
               exit_fn=os._exit, stream=sys.stderr):
    self.timeout_s, self.interval_s = timeout_s, interval_s
    self._exit, self._stream = exit_fn, stream
    self._stop = threading.Event()
    self._thread = None
    self._last_ok = time.monotonic()

  def start(self) -> 'Watchdog':
    if not is_multiprocess():
      return self
    self._me, self._count = jax.process_index(), jax.process_count()
    self._thread = threading.Thread(target=self._run, name='rlreason-watchdog', daemon=True)
    self._thread.start()
    return self

  def _lost(self, reason: str) -> None:
    print(f'rlreason.multihost: process {self._me} of {self._count}: {reason}; exiting with '
          f'status {PEER_LOST_EXIT} instead of waiting for it.', file=self._stream, flush=True)
    self._exit(PEER_LOST_EXIT)

  def _run(self) -> None:
    client = _client()
    beat, seen, changed = 0, {}, {p: time.monotonic() for p in range(self._count)}
    while not self._stop.is_set():
      now = time.monotonic()
      try:
        beat += 1
        client.key_value_set(f'{_PREFIX}/beat/{self._me}', str(beat), allow_overwrite=True)
        entries = dict(client.key_value_dir_get(f'{_PREFIX}/'))
        self._last_ok = now
      except Exception as e:  # pylint: disable=broad-except
        if now - self._last_ok > self.timeout_s:
          return self._lost(f'the coordination service (process 0) has not answered for '
                            f'{now - self._last_ok:.1f}s ({type(e).__name__}: {e})')
        self._stop.wait(self.interval_s)
        continue
      for p in range(self._count):
        if p == self._me or f'{_PREFIX}/done/{p}' in entries:
          continue
        if f'{_PREFIX}/failed/{p}' in entries:
          return self._lost(f'process {p} failed: {entries[f"{_PREFIX}/failed/{p}"]}')
        value = entries.get(f'{_PREFIX}/beat/{p}')
        if value != seen.get(p):
          seen[p], changed[p] = value, now
        elif now - changed[p] > self.timeout_s:
          return self._lost(f'process {p} sent no heartbeat for {now - changed[p]:.1f}s '
                            f'(killed, crashed or preempted)')
      self._stop.wait(self.interval_s)

  def _mark(self, kind: str, value: str) -> None:
    try:
      _client().key_value_set(f'{_PREFIX}/{kind}/{self._me}', value, allow_overwrite=True)
    except Exception as e:  # pylint: disable=broad-except
      logging.warning('watchdog: could not record %s: %s', kind, e)

  def stop(self) -> None:
    """This process finished normally: peers stop watching it."""
    if self._thread is None:
      return
    self._stop.set()
    self._thread.join()
    self._mark('done', '1')

  def fail(self, message: str) -> None:
    """This process is about to exit on an error: peers exit now rather than after a timeout."""
    if self._thread is None:
      return
    self._stop.set()
    self._mark('failed', message[:500])


def check_rows(rows_per_step: Sequence[tuple[str, int]], *, process_count: int) -> None:
  """Raises ValueError naming each per-step count that cannot be split into process blocks."""
  errors = [f'{name}={n} is not divisible by the {process_count} processes (each process '
            f'samples and verifies an equal block of the prompts).'
            for name, n in rows_per_step if n % process_count]
  if errors:
    raise ValueError('multi-host layout:\n  ' + '\n  '.join(errors))
