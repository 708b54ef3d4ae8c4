"""The persistent compilation cache, safe to share between processes and hosts.

JAX's file cache (`jax._src.lru_cache.LRUCache` with eviction off, the default) writes an entry
with one plain `write_bytes` to its final name. A process that reads the entry meanwhile gets a
prefix, and a writer killed midway (SIGKILL, OOM, preemption, a full disk) leaves a torn entry
behind for good: `put` skips a key whose file exists, so every later process fails to read it,
warns, and compiles again. JAX catches the read error (zlib's checksum rejects the prefix), so
a torn entry costs a recompilation and a warning per process, not a wrong program.

`enable` installs `AtomicFileCache` instead: an entry is written to a temporary file in the
same directory and renamed onto its name (`os.replace`, atomic on a local or NFS file system),
so a reader sees the whole entry or none; an entry that fails to decompress (left by another
writer) is removed, so the next compilation writes it again. Processes that share a directory
(the suite's xdist workers and subprocesses, `rl.async_mode='process'`'s sampler, the hosts of
a pod) all call `enable`.

Deliberately not here: eviction (`jax_compilation_cache_max_size` must stay -1) and remote
paths (`gs://...` keep JAX's own cache).
"""

import importlib
import logging
import os
import pathlib
import tempfile
import time

import jax

_SUFFIX = '-cache'  # JAX's entry name: f'{key}-cache' (lru_cache._CACHE_SUFFIX).
_jax_get_file_cache = None  # JAX's own factory, kept for remote paths (set by enable).


def _jax_private(module: str):
  """`jax._src.<module>`: JAX 0.10 has no public way to choose the cache implementation.

  The only place this module reads JAX internals; `check_internals` fails loudly when a JAX
  upgrade moves them."""
  return importlib.import_module(f'jax._src.{module}')


class AtomicFileCache:
  """JAX's CacheInterface over a local directory: whole entries or none, torn ones removed."""

  def __init__(self, path: str | os.PathLike):
    self.path = self._path = pathlib.Path(path)
    self.path.mkdir(parents=True, exist_ok=True)

  def _entry(self, key: str) -> pathlib.Path:
    if not key:
      raise ValueError('compile_cache: the cache key is empty.')
    return self.path / f'{key}{_SUFFIX}'

  def get(self, key: str) -> bytes | None:
    entry = self._entry(key)
    try:
      with open(entry, 'rb') as f:
        inode = os.fstat(f.fileno()).st_ino
        value = f.read()
    except FileNotFoundError:
      return None
    try:
      _jax_private('compilation_cache').decompress_executable(value)
    except Exception as e:  # pylint: disable=broad-except  (zlib.error, zstd errors)
      logging.warning('compile_cache: removing the unreadable entry %s (%d bytes: %s); it is '
                      'compiled again.', entry, len(value), e)
      _remove_if_same(entry, inode)
      return None
    return value

  def put(self, key: str, value: bytes) -> None:
    entry = self._entry(key)
    if entry.exists():  # As JAX's cache: the first complete entry for a key stays.
      return
    fd, tmp = tempfile.mkstemp(dir=self.path, prefix=f'.{entry.name}.', suffix='.tmp')
    try:
      with os.fdopen(fd, 'wb') as f:
        f.write(value)
      os.replace(tmp, entry)
    except BaseException:
      pathlib.Path(tmp).unlink(missing_ok=True)
      raise


def _remove_if_same(entry: pathlib.Path, inode: int) -> None:
  """Removes `entry` unless another process has meanwhile renamed a new file onto it."""
  try:
    if os.stat(entry).st_ino == inode:
      entry.unlink()
  except FileNotFoundError:
    pass


def enable(cache_dir: str | os.PathLike | None = None, *, min_compile_time_s: float | None = None,
           min_entry_size_bytes: int | None = None) -> pathlib.Path | None:
  """Turns on the persistent cache in `cache_dir` with atomic entries; returns the directory.

  Without `cache_dir`, keeps the directory JAX is configured with (JAX_COMPILATION_CACHE_DIR)
  and returns None when there is none. The thresholds, when given, set
  `jax_persistent_cache_min_compile_time_secs` and `..._min_entry_size_bytes`.
  """
  if jax.config.jax_compilation_cache_max_size != -1:
    raise ValueError(f'compile_cache: jax_compilation_cache_max_size='
                     f'{jax.config.jax_compilation_cache_max_size} (eviction) is not supported '
                     'by the shared cache; leave it at -1.')
  if cache_dir is not None:
    jax.config.update('jax_compilation_cache_dir', str(cache_dir))
  if min_compile_time_s is not None:
    jax.config.update('jax_persistent_cache_min_compile_time_secs', float(min_compile_time_s))
  if min_entry_size_bytes is not None:
    jax.config.update('jax_persistent_cache_min_entry_size_bytes', int(min_entry_size_bytes))
  path = jax.config.jax_compilation_cache_dir
  if not path:
    return None
  global _jax_get_file_cache
  cc = _jax_private('compilation_cache')
  if cc.get_file_cache is not _atomic_file_cache:
    _jax_get_file_cache, cc.get_file_cache = cc.get_file_cache, _atomic_file_cache
  current = cc._cache  # pylint: disable=protected-access
  if current is not None and getattr(current, 'path', None) != _local(path):
    cc.reset_cache()  # Built before enable (a compile already ran): rebuilt at the next one.
  if _local(path) is None:
    return None
  _remove_stale_temporaries(_local(path))
  return _local(path)


def _local(path) -> pathlib.Path | None:
  """The directory of a local cache path (plain or file://), None for a remote one."""
  path = str(path)
  if '://' in path and not path.startswith('file://'):
    return None
  return pathlib.Path(path.removeprefix('file://'))


def _remove_stale_temporaries(directory: pathlib.Path, *, age_s: float = 3600.0) -> None:
  """Deletes temporaries over an hour old: left by writers killed before their rename."""
  now = time.time()
  for tmp in directory.glob(f'.*{_SUFFIX}.*.tmp'):
    try:
      if now - tmp.stat().st_mtime > age_s:
        tmp.unlink()
    except FileNotFoundError:
      pass


def _atomic_file_cache(path: str):
  """Replaces `jax._src.compilation_cache.get_file_cache` (called when JAX builds its cache);
  a remote path (gs://...) keeps JAX's own cache."""
  if _local(path) is None:
    return _jax_get_file_cache(path)
  cc = _jax_private('compilation_cache')
  cache = AtomicFileCache(_local(path))
  if jax.config.jax_compilation_cache_check_contents:
    return cc.VerificationCache(cache), path
  return cache, path


def check_internals() -> None:
  """Raises when this JAX release moved what `enable` replaces (tests call it)."""
  cc = _jax_private('compilation_cache')
  for name in ('get_file_cache', '_cache', 'reset_cache', 'decompress_executable',
               'VerificationCache'):
    if not hasattr(cc, name):
      raise RuntimeError(f'compile_cache: jax._src.compilation_cache.{name} is gone in jax '
                         f'{jax.__version__}; rlreason/compile_cache.py needs updating.')
