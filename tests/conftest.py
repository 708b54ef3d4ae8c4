"""Test set-up: 8 fake CPU devices and the persistent compilation cache.

XLA reads its flags once, when JAX first creates a backend, so this runs before any test
module imports jax.
"""

import os
import pathlib

# Optimisation level 0: the suite's tiny models spend most of their time compiling, and LLVM's
# level 0 cut the CPU time of compile-bound tests by about a quarter (a runlocal config 37 -> 28 s,
# two bf16/vocab-parallel tests 48 -> 37 s, measured back to back); the numerics tests pass at
# either level (they compare programs compiled alike). Set XLA_FLAGS to override.
_FLAGS = os.environ.get('XLA_FLAGS', '')
if '--xla_backend_optimization_level' not in _FLAGS:
  _FLAGS += ' --xla_backend_optimization_level=0'
# XLA:CPU's older loop emitter instead of its fusion emitters: the same programs compile faster
# (three runlocal configs from an empty cache, back to back: 69.8 s -> 41.4-51.6 s).
if '--xla_cpu_use_fusion_emitters' not in _FLAGS:
  _FLAGS += ' --xla_cpu_use_fusion_emitters=false'
os.environ['XLA_FLAGS'] = (_FLAGS + ' --xla_force_host_platform_device_count=8').strip()
os.environ.setdefault('JAX_PLATFORMS', 'cpu')

import jax  # noqa: E402  (must come after XLA_FLAGS)
import pytest  # noqa: E402

from rlreason import compile_cache  # noqa: E402

_CACHE = pathlib.Path(os.environ.get('RLREASON_JAX_CACHE',
                                     pathlib.Path(__file__).resolve().parents[1] / '.jax_cache'))
# Shared by the xdist workers and the subprocesses handed it: compile_cache writes whole entries
# (JAX's own cache can leave a torn one that every later process reads, warns on and
# recompiles). Every compiled program is cached, however quick: the suite compiles many
# sub-second programs that other tests (and the notebooks' and benchmarks' subprocesses)
# compile again alike. Six runlocal configs from an empty cache: 86.8 s CPU at a 0.5 s
# threshold, 79.8 s at 0.
_MIN_COMPILE_S = float(os.environ.get('RLREASON_CACHE_MIN_COMPILE_S', 0.0))
compile_cache.enable(_CACHE, min_compile_time_s=_MIN_COMPILE_S, min_entry_size_bytes=0)

SHARED_DATA = pathlib.Path(__file__).resolve().parents[2] / 'shared' / 'data'


@pytest.fixture(autouse=True, scope='module')
def _close_the_shared_answer_pool():
  """Episodes score final answers through one pool per process (envs/answer_scoring.py); it
  is closed after each test module, so its workers never look like another test's strays."""
  yield
  from rlreason.envs import answer_scoring
  answer_scoring.close_pool()


# The longest files first (seconds in a full run, loaded), so `--dist loadfile` does not end
# with one worker running a long file alone; the Makefile turns off xdist's own order (by
# number of tests). Other files keep their collection order after these.
_LONGEST_FIRST = ('train_test.py',  # 774
                  'colab_odd_test.py', 'colab_test.py',  # 498, 482
                  'every_option_test.py', 'model_test.py', 'update_test.py',  # 236, 201, 200
                  'sampler_test.py', 'train_lora_test.py', 'verifiers_pool_test.py',  # 188-147
                  'partial_rollouts_test.py', 'train_episodes_test.py', 'episodes_test.py',
                  'sampler_bf16_test.py', 'moe_test.py', 'checkpoint_crash_test.py')


def pytest_collection_modifyitems(items):
  """Longest files first; RLREASON_TEST_ORDER=reversed reverses the order of the files (tests
  within a file keep theirs), to check that no test depends on what ran before it."""
  rank = {name: i for i, name in enumerate(_LONGEST_FIRST)}
  items.sort(key=lambda item: rank.get(item.path.name, len(rank)))  # stable within a file
  if os.environ.get('RLREASON_TEST_ORDER') == 'reversed':
    files = list(dict.fromkeys(item.path for item in items))
    position = {path: i for i, path in enumerate(reversed(files))}
    items.sort(key=lambda item: position[item.path])
