"""glibc malloc settings for CPU hosts: freed memory is kept for the next step, not unmapped.

XLA:CPU allocates each execution's temporary buffers with malloc and frees them when the
execution ends. glibc serves blocks over 32 MiB with mmap and unmaps them on free, so every
train step faults its whole temp back in, page by page, and the kernel zeroes each page.
Measured on `experiments/bench/forward.py`'s mid config (2 cores, fp32): 682k minor faults and
~1 s of system time per 3.8 s step; after torch's step had run (the bench takes turns) the
next jax step took 4.7-7 s. With these settings: 0 faults, 3.2 s, no turn-taking penalty.

  glibc.malloc.mmap_max=0          no mmap'd chunks: large blocks come from the heap and stay;
  glibc.malloc.arena_max=1         XLA's worker threads share that heap (a thread's own arena
                                   is capped at 64 MiB and would fall back to mmap);
  glibc.malloc.trim_threshold=2^40 the heap's top is never given back;
  glibc.malloc.hugetlb=1           the heap is madvised for transparent huge pages (glibc 2.35+;
                                   older glibc ignores it).

The cost: the process keeps its peak heap (as an accelerator's caching allocator does), so
RSS stays at the step's peak between steps. GLIBC_TUNABLES is read when the process starts,
hence `reexec()`: the command lines (`rlreason.main`, the benches) re-execute themselves
once with it set. Set RLREASON_HOST_MALLOC=default to keep glibc's defaults; a
GLIBC_TUNABLES that already names one of these tunables is left as it is.
"""

import os
import sys

TUNABLES = {
    'glibc.malloc.mmap_max': '0',
    'glibc.malloc.arena_max': '1',
    'glibc.malloc.trim_threshold': str(1 << 40),
    'glibc.malloc.hugetlb': '1',
}
OPT_OUT = 'RLREASON_HOST_MALLOC'


def _glibc() -> bool:
  try:
    return os.confstr('CS_GNU_LIBC_VERSION').startswith('glibc')
  except (AttributeError, ValueError, OSError):
    return False


def tuned_env(environ, *, glibc: bool | None = None) -> dict[str, str] | None:
  """`environ` with TUNABLES added to GLIBC_TUNABLES, or None when nothing is to change.

  None when: not glibc, RLREASON_HOST_MALLOC=default, or GLIBC_TUNABLES already names any of
  them (the user chose). An unknown RLREASON_HOST_MALLOC value is an error naming it.
  """
  mode = environ.get(OPT_OUT, 'retain')
  if mode not in ('retain', 'default'):
    raise ValueError(f"{OPT_OUT}={mode!r}: expected 'retain' (keep freed memory, the "
                     "default) or 'default' (glibc's own malloc settings).")
  if mode == 'default' or not (_glibc() if glibc is None else glibc):
    return None
  current = environ.get('GLIBC_TUNABLES', '')
  named = {item.split('=', 1)[0] for item in current.split(':') if item}
  if named & TUNABLES.keys():
    return None
  ours = ':'.join(f'{k}={v}' for k, v in TUNABLES.items())
  return {**environ, 'GLIBC_TUNABLES': f'{current}:{ours}' if current else ours}


def reexec() -> None:
  """Re-executes this Python command line with tuned_env's GLIBC_TUNABLES; returns if set.

  Call it first thing in a command line's entry point: everything before it runs twice.
  """
  env = tuned_env(os.environ)
  if env is None:
    return
  sys.stdout.flush()
  sys.stderr.flush()
  os.execve(sys.executable, [sys.executable, *sys.orig_argv[1:]], env)
