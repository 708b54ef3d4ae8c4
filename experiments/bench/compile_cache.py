"""Processes sharing one persistent compilation cache: JAX's own file cache against ours.

  python -m experiments.bench.compile_cache                 # ~2 min on a 2-core machine
  python -m experiments.bench.compile_cache --runlocal      # 3 processes, 6 programs, 1 trial

Each trial starts `--processes` workers on one fresh cache directory (threshold 0, as the test
suite), all compiling and running the same `--programs` small jitted programs; one worker in
two is SIGKILLed at a random moment (as pytest's timeouts, an OOM kill or a preempted host
do). Before them, unless --no-kill_writer, one worker alone SIGKILLs itself inside its first
cache write (the moment a random kill rarely hits: a write takes about a millisecond). Then
a second, warm round of workers (none killed) loads everything. Counted per cache
implementation (`jax`: JAX's LRUCache; `atomic`: rlreason.compile_cache):

  read_errors   JAX's "Error reading persistent compilation cache entry" warnings (a torn
                entry was read: the program is compiled again);
  torn_left     entries in the directory after both rounds that do not decompress;
  wrong / crashed  workers that computed a wrong value / exited non-zero without being killed.

Prints one JSON line per implementation.
"""

import argparse
import json
import os
import pathlib
import random
import signal
import subprocess
import sys
import tempfile
import time
import zlib

if __package__ in (None, ''):  # Run as a script: make `rlreason` importable.
  sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

ROOT = pathlib.Path(__file__).resolve().parents[2]


def _die_in_first_write(impl: str) -> None:
  """Makes this process SIGKILL itself in its first cache write, before the entry is whole:
  half-way through JAX's `write_bytes`, or (atomic) with the temporary written, not renamed."""
  def die():
    os.kill(os.getpid(), signal.SIGKILL)
  if impl == 'atomic':
    os.replace = lambda *args, **kwargs: die()
  else:
    def write_half(self, data):
      with open(self, 'wb') as f:
        f.write(data[:len(data) // 2])
      die()
    import importlib  # JAX writes through etils' epath when installed, else pathlib.
    jax_path = importlib.import_module('jax._src.path').Path
    type(jax_path(tempfile.gettempdir())).write_bytes = write_half


def worker(cache_dir: str, impl: str, programs: int, die_writing: bool = False) -> None:
  """Compiles and runs the programs; prints one JSON line (read errors, values)."""
  import warnings
  import jax
  import jax.numpy as jnp
  if die_writing:
    _die_in_first_write(impl)
  if impl == 'atomic':
    from rlreason import compile_cache
    compile_cache.enable(cache_dir, min_compile_time_s=0.0, min_entry_size_bytes=0)
  else:
    jax.config.update('jax_compilation_cache_dir', cache_dir)
    jax.config.update('jax_persistent_cache_min_compile_time_secs', 0.0)
    jax.config.update('jax_persistent_cache_min_entry_size_bytes', 0)
  print('started', flush=True)
  values = []
  with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter('always')
    for k in range(programs):
      def f(x_N, k=k):
        for i in range(8 + k):  # Distinct programs, unrolled so that entries are not tiny.
          x_N = jnp.tanh(x_N * (1.0 + 0.01 * i)) + jnp.sin(x_N + k)
        return x_N.sum()
      values.append(float(jax.jit(f)(jnp.linspace(0.0, 1.0, 64 + k))))
  errors = sum('Error reading persistent compilation cache' in str(w.message) for w in caught)
  print(json.dumps({'read_errors': errors, 'values': values}), flush=True)


def _spawn(cache_dir, impl, programs, *extra):
  env = dict(os.environ, JAX_PLATFORMS='cpu', PYTHONUNBUFFERED='1')
  return subprocess.Popen([sys.executable, '-m', 'experiments.bench.compile_cache', '--worker',
                           cache_dir, '--impl', impl, '--programs', str(programs), *extra],
                          cwd=ROOT,
                          env=env, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)


def _torn(cache_dir: pathlib.Path) -> int:
  torn = 0
  for entry in cache_dir.glob('*-cache'):
    try:
      zlib.decompress(entry.read_bytes())
    except zlib.error:
      torn += 1
  return torn


def trial(impl: str, *, processes: int, programs: int, rng: random.Random,
          reference: list[float] | None, kill_writer: bool, warm_round: bool = True) -> dict:
  """One cold round with kills, one warm round; counts as in the module docstring."""
  out = dict(read_errors=0, wrong=0, crashed=0, killed=0, died_writing=0, torn_left=0)
  with tempfile.TemporaryDirectory() as d:
    if kill_writer:  # First, alone: a writer that dies in its first write.
      p = _spawn(d, impl, programs, '--die_writing')
      p.communicate(timeout=600)
      out['died_writing'] += p.returncode == -signal.SIGKILL
    for warm in (False, True)[:1 + warm_round]:
      procs = [_spawn(d, impl, programs) for _ in range(processes)]
      victims = [] if warm else procs[1::2]
      for p in victims:  # Somewhere among the compilations.
        p.stdout.readline()  # 'started'
        time.sleep(rng.uniform(0.0, 2.0))
        p.send_signal(signal.SIGKILL)
      for p in procs:
        stdout = p.communicate(timeout=600)[0]
        if p in victims and p.returncode == -signal.SIGKILL:
          out['killed'] += 1
          continue
        if p.returncode != 0:
          out['crashed'] += 1
          continue
        row = json.loads(stdout.strip().splitlines()[-1])
        out['read_errors'] += row['read_errors']
        reference = reference or row['values']
        out['wrong'] += row['values'] != reference
    out['torn_left'] = _torn(pathlib.Path(d))
  return out


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument('--worker', metavar='CACHE_DIR')
  parser.add_argument('--die_writing', action='store_true', help=argparse.SUPPRESS)
  parser.add_argument('--kill_writer', action=argparse.BooleanOptionalAction, default=True,
                      help='start each trial with a writer that dies in its first write')
  parser.add_argument('--impl', choices=('jax', 'atomic'), default=None)
  parser.add_argument('--processes', type=int, default=4)
  parser.add_argument('--programs', type=int, default=12)
  parser.add_argument('--trials', type=int, default=4)
  parser.add_argument('--seed', type=int, default=0)
  parser.add_argument('--runlocal', action='store_true')
  args = parser.parse_args()
  if args.worker:
    worker(args.worker, args.impl, args.programs, args.die_writing)
    return
  if args.runlocal:
    args.processes, args.programs, args.trials = 3, 6, 1
  for impl in [args.impl] if args.impl else ['jax', 'atomic']:
    rng, total, t0 = random.Random(args.seed), {}, time.perf_counter()
    for _ in range(args.trials):
      for k, v in trial(impl, processes=args.processes, programs=args.programs, rng=rng,
                        reference=None, kill_writer=args.kill_writer).items():
        total[k] = total.get(k, 0) + v
    print(json.dumps({'impl': impl, 'trials': args.trials, 'processes': args.processes,
                      'programs': args.programs, **total,
                      'wall_s': round(time.perf_counter() - t0, 1)}), flush=True)


if __name__ == '__main__':
  main()
