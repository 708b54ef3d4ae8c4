"""host_malloc: the GLIBC_TUNABLES the command lines re-execute with, and what they change."""

import os
import subprocess
import sys

import pytest

from rlreason import host_malloc

# A child that mallocs, touches and frees 256 MiB, then mallocs and touches it again, printing
# the page faults of the second time and its GLIBC_TUNABLES.
_CHILD = '''
import ctypes, os, resource
from rlreason import host_malloc
host_malloc.reexec()
libc = ctypes.CDLL(None)
libc.malloc.restype, libc.malloc.argtypes = ctypes.c_void_p, [ctypes.c_size_t]
libc.free.argtypes = [ctypes.c_void_p]
size = 256 << 20
libc.free(ctypes.memset(libc.malloc(size), 1, size))
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
ctypes.memset(libc.malloc(size), 1, size)
print(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
print(os.environ.get('GLIBC_TUNABLES', ''))
'''


def test_tuned_env_adds_every_tunable_once():
  env = host_malloc.tuned_env({'PATH': '/bin'}, glibc=True)
  assert env['PATH'] == '/bin'
  items = dict(item.split('=') for item in env['GLIBC_TUNABLES'].split(':'))
  assert items == host_malloc.TUNABLES
  assert host_malloc.tuned_env(env, glibc=True) is None  # Re-executed: nothing more to do.


def test_tuned_env_keeps_the_users_choices():
  env = host_malloc.tuned_env({'GLIBC_TUNABLES': 'glibc.rtld.nns=2'}, glibc=True)
  assert env['GLIBC_TUNABLES'].startswith('glibc.rtld.nns=2:glibc.malloc.')
  assert host_malloc.tuned_env({'GLIBC_TUNABLES': 'glibc.malloc.arena_max=4'},
                               glibc=True) is None
  assert host_malloc.tuned_env({'RLREASON_HOST_MALLOC': 'default'}, glibc=True) is None
  assert host_malloc.tuned_env({}, glibc=False) is None  # musl, macOS: nothing to set.
  with pytest.raises(ValueError, match='RLREASON_HOST_MALLOC=.keep.'):
    host_malloc.tuned_env({'RLREASON_HOST_MALLOC': 'keep'}, glibc=True)


@pytest.mark.skipif(host_malloc.tuned_env({}) is None, reason='not glibc')
def test_reexec_keeps_freed_memory_mapped():
  def run(mode):
    env = {k: v for k, v in os.environ.items() if k != 'GLIBC_TUNABLES'}
    out = subprocess.run([sys.executable, '-c', _CHILD], env={**env, 'RLREASON_HOST_MALLOC': mode},
                         check=True, capture_output=True, text=True).stdout.split('\n')
    return int(out[0]), out[1]
  faults, tunables = run('retain')
  assert tunables == host_malloc.tuned_env({}, glibc=True)['GLIBC_TUNABLES']
  assert faults < 1000, faults  # The block is reused: no page is faulted in again.
  faults, tunables = run('default')
  assert tunables == ''
  assert faults > 16_000, faults  # 256 MiB unmapped and mapped again, page by page.
