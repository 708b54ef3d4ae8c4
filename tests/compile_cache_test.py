"""The shared persistent compilation cache: whole entries or none, torn ones replaced."""

import random
import warnings
import zlib

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from experiments.bench import compile_cache as stress
from rlreason import compile_cache


@pytest.fixture
def cache_dir(tmp_path):
  """This process's cache moved to a fresh directory for the test, then put back."""
  saved = jax.config.jax_compilation_cache_dir
  compile_cache.enable(tmp_path)
  yield tmp_path
  compile_cache.enable(saved)


def _run(f):
  jax.clear_caches()  # Forget the in-memory executable: the next call reads the disk cache.
  with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter('always')
    value = float(jax.jit(f)(np.arange(16.0, dtype=np.float32)))
  return value, [str(w.message) for w in caught if 'compilation cache' in str(w.message)]


def test_a_torn_entry_is_removed_and_written_again_whole(cache_dir):
  f = lambda x_N: jnp.tanh(x_N * 0.37).sum()
  value, _ = _run(f)
  [entry] = cache_dir.glob('*-cache')
  whole = entry.read_bytes()
  entry.write_bytes(whole[:len(whole) // 2])  # What a writer killed mid-write leaves.
  # JAX's own cache warns here and keeps the torn entry for good (its put skips existing
  # keys), so every later process compiles again; ours removes it and writes it again.
  again, cache_warnings = _run(f)
  assert again == value
  assert cache_warnings == []
  assert len(zlib.decompress(entry.read_bytes())) > 0
  assert [p.name for p in cache_dir.iterdir()] == [entry.name]  # No temporaries left.


def test_processes_sharing_a_directory_never_read_a_torn_entry():
  # Through the bench's stress trial (experiments/bench/compile_cache.py): a writer that
  # SIGKILLs itself inside its first cache write, then 2 processes compiling 3 programs
  # together (one SIGKILLed at a random moment). With JAX's cache the same trial leaves the
  # torn entry and the survivor reports a read error (the bench counts them over more rounds).
  out = stress.trial('atomic', processes=2, programs=3, rng=random.Random(0), reference=None,
                     kill_writer=True, warm_round=False)
  assert out['died_writing'] == 1, out
  assert (out['read_errors'], out['torn_left'], out['wrong'], out['crashed']) == (0, 0, 0, 0), out


def test_enable_refuses_eviction_and_keeps_jax_internals_in_reach(tmp_path):
  compile_cache.check_internals()  # A JAX upgrade that moves them fails here.
  saved = jax.config.jax_compilation_cache_dir
  jax.config.update('jax_compilation_cache_max_size', 1 << 30)
  try:
    with pytest.raises(ValueError, match='jax_compilation_cache_max_size=1073741824'):
      compile_cache.enable(tmp_path)
  finally:
    jax.config.update('jax_compilation_cache_max_size', -1)
  assert jax.config.jax_compilation_cache_dir == saved  # Refused before changing anything.
