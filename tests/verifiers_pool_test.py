"""VerifierPool: deadlines, timeouts, crashes, recycling, stats; and the no-JAX rule."""

import os
import pathlib
import signal
import subprocess
import sys
import tempfile
import threading
import time

import pytest

from rlreason.verifiers import pool as pool_lib
from rlreason.verifiers import pool_processes
from rlreason.verifiers import registry
from rlreason.verifiers import verdict as V

import verifiers_sandbox_escapes_test as escapes
from verifiers_sandbox_escapes_test import children_of

F = 'rlreason.verifiers.faults:'
REPO = pathlib.Path(__file__).resolve().parents[1]
OK_ITEM = {'completion': 'so \\boxed{\\frac{1}{2}}', 'answer': '0.5'}


def _multiprocessing_helper(pid: int) -> bool:
  """multiprocessing's own per-process singletons (resource tracker, forkserver)."""
  try:
    with open(f'/proc/{pid}/cmdline', 'rb') as f:
      cmdline = f.read()
  except OSError:
    return False
  return b'multiprocessing.resource_tracker' in cmdline or b'multiprocessing.forkserver' in cmdline


def settle(pool, timeout_s=15.0) -> set[int]:
  """Waits until this process's only descendants are the pool's workers; returns strays."""
  deadline = time.monotonic() + timeout_s
  while True:
    strays = {p for p in children_of(os.getpid()) - set(pool.worker_pids())
              if not _multiprocessing_helper(p)}
    if not strays or time.monotonic() > deadline:
      return strays
    time.sleep(0.1)


def full_crew(pool, timeout_s=60.0) -> set[int]:
  """The pool's worker pids once every worker and spare is up (replacements start in the
  background, so right after a test that lost a worker the pool can be one short)."""
  deadline = time.monotonic() + timeout_s
  while len(pids := pool.worker_pids()) < pool.num_workers + pool.spare_workers:
    assert time.monotonic() < deadline, f'only {len(pids)} workers up after {timeout_s} s'
    time.sleep(0.05)
  return set(pids)


@pytest.fixture(scope='module')
def pool():
  with pool_lib.VerifierPool(num_workers=2, spare_workers=1, item_timeout_s=1.5,
                             default_reward=-1.0) as p:
    yield p


def test_package_never_imports_jax():
  code = ('import sys, rlreason.verifiers, rlreason.verifiers.__main__; '
          'import rlreason.verifiers.faults, rlreason.verifiers.sandbox_init; '
          'assert "jax" not in sys.modules, sorted(m for m in sys.modules if "jax" in m)')
  subprocess.run([sys.executable, '-c', code], check=True, cwd=REPO)


def test_workers_are_jax_free_even_under_a_jax_parent(pool):
  import jax  # noqa: F401  (conftest imported it already; be explicit)
  assert 'jax' in sys.modules
  assert pool.stats().workers_with_jax == 0
  verdicts = pool.score([{}] * 3, verifier=F + 'worker_pid', deadline_s=30)
  assert {v.status for v in verdicts} == {V.CORRECT}


def test_scores_in_order_and_in_parallel(pool):
  items = [{'completion': f'#### {i}', 'answer': str(i % 3)} for i in range(40)]
  verdicts = pool.score(items, verifier='math', deadline_s=30)
  assert [v.status for v in verdicts] == [V.CORRECT if i % 3 == i else V.WRONG
                                          for i in range(40)]
  pids = pool.score([{}] * 20, verifier=F + 'worker_pid', deadline_s=30)
  assert len({v.components['pid'] for v in pids}) >= 2


def test_unknown_verifier_lists_names(pool):
  with pytest.raises(ValueError, match=r"unknown verifier 'nope'; known: .*math.*prolog"):
    pool.score([OK_ITEM], verifier='nope', deadline_s=5)
  with pytest.raises(ValueError, match='countdown'):
    registry.get_verifier('maths')


@pytest.mark.parametrize('fault', ['sleep', 'spin', 'big_power'])
def test_hung_item_times_out_and_worker_is_replaced(pool, fault):
  before = pool.stats().workers_stopped.get('timeout', 0)
  start = time.monotonic()
  verdicts = pool.score([{}, OK_ITEM, OK_ITEM, OK_ITEM], verifier=[F + fault] + ['math'] * 3,
                        deadline_s=20)
  assert time.monotonic() - start < 20 + pool.OVERRUN_SLACK_S
  assert verdicts[0].status == V.TIMEOUT and verdicts[0].reward == -1.0
  # The item timeout (1.5 s) fired, not the 20 s batch deadline; generous for loaded machines.
  assert 1.5 <= verdicts[0].latency_s < 10.0
  assert [v.status for v in verdicts[1:]] == [V.CORRECT] * 3
  assert pool.stats().workers_stopped['timeout'] == before + 1
  assert not settle(pool)


def test_items_queued_behind_a_stuck_item_still_finish(pool):
  # Round-robin prefetch puts an item behind the sleeper; once the sleeper counts as stuck
  # (STUCK_S) that item is re-queued to the other workers, well before the deadline.
  assert pool.wait_ready(60)
  items = [{'seconds': 60}] + [OK_ITEM] * 7
  verdicts = pool.score(items, verifier=[F + 'sleep'] + ['math'] * 7,
                        deadline_s=pool.STUCK_S + 1.5)
  assert verdicts[0].status == V.TIMEOUT
  assert [v.status for v in verdicts[1:]] == [V.CORRECT] * 7
  assert not settle(pool)



def test_a_worker_left_with_stale_prefetches_is_not_killed():
  # Round-robin prefetch gives worker A items 0 (2 s) and 2 (0.6 s), worker B items 1 and 3.
  # Once A counts as stuck (STUCK_S), item 2 is stolen and finished by B. When item 0 ends
  # the batch is complete, and A still owes item 2's result, which nobody needs: A must
  # finish it in peace, not be killed and counted as a deadline kill (it met no deadline).
  with pool_lib.VerifierPool(num_workers=2, spare_workers=1, item_timeout_s=30,
                             warmup=False) as p:
    pids = full_crew(p)
    items = [{'seconds': s} for s in (2.0, 0.01, 0.6, 0.01)]
    verdicts = p.score(items, verifier=F + 'sleep', deadline_s=30)
    assert [v.status for v in verdicts] == [V.CORRECT] * 4
    assert p.stats().workers_stopped == {}
    # A's late result for the old batch is dropped; A takes part in the next batch.
    verdicts = p.score([{}] * 12, verifier=F + 'worker_pid', deadline_s=30)
    assert [v.status for v in verdicts] == [V.CORRECT] * 12
    assert p.stats().workers_stopped == {}
    assert set(p.worker_pids()) == pids


def test_a_dead_worker_with_a_deep_tree_left_is_cleaned_up_and_replaced(pool, tmp_path):
  # A worker's private directory holding a tree deeper than the recursion limit and
  # PATH_MAX, a locked directory and a link out: the housekeeper's clean-up once raised
  # RecursionError, which killed its thread, and no worker was ever replaced again.
  canary = tmp_path / 'canary'
  canary.mkdir()
  (canary / 'keep').write_text('k')
  victim = sorted(full_crew(pool))[0]
  top = tempfile.mkdtemp(prefix=f'rlreason-sandbox-{victim}-')
  try:
    escapes.deep_tree(top, canary)
    os.kill(victim, signal.SIGKILL)
    while victim in children_of(os.getpid()):  # dead (a zombie) before the next batch.
      time.sleep(0.01)
    for _ in range(3):  # later batches need the replacements the housekeeper starts.
      verdicts = pool.score([OK_ITEM] * 4, verifier='math', deadline_s=60)
      assert [v.status for v in verdicts] == [V.CORRECT] * 4
    deadline = time.monotonic() + 60
    while os.path.exists(top) and time.monotonic() < deadline:
      time.sleep(0.1)
    assert not os.path.exists(top) and (canary / 'keep').read_text() == 'k'
    assert pool._housekeeper.is_alive()  # pylint: disable=protected-access
    assert victim not in full_crew(pool)
  finally:
    escapes.remove_by_rm(top)


def test_a_slow_clean_up_does_not_hold_up_replacements(pool, monkeypatch):
  # Tens of thousands of directories take minutes to remove on a slow disk; the housekeeper
  # must start replacements meanwhile.
  release = threading.Event()
  monkeypatch.setattr(pool_processes.sandbox, 'remove_worker_dirs',
                      lambda pid: release.wait(120))
  try:
    for _ in range(2):  # the second death comes while the first one's clean-up hangs.
      victim = sorted(full_crew(pool))[0]
      os.kill(victim, signal.SIGKILL)
      while victim in children_of(os.getpid()):
        time.sleep(0.01)
      verdicts = pool.score([OK_ITEM] * 4, verifier='math', deadline_s=60)
      assert [v.status for v in verdicts] == [V.CORRECT] * 4
      assert victim not in full_crew(pool)  # replaced while a clean-up still hangs.
  finally:
    release.set()


def test_worker_ignoring_sigterm_gets_sigkill(pool):
  verdict, = pool.score([{}], verifier=F + 'ignore_sigterm', deadline_s=10)
  assert verdict.status == V.TIMEOUT
  assert not settle(pool, timeout_s=10.0)  # SIGKILL comes kill_grace_s after SIGTERM.


@pytest.mark.parametrize('fault', ['exit_process', 'segfault'])
def test_dying_worker_loses_only_its_item(pool, fault):
  items = [OK_ITEM] * 6 + [{}] + [OK_ITEM] * 6
  names = ['math'] * 6 + [F + fault] + ['math'] * 6
  verdicts = pool.score(items, verifier=names, deadline_s=30)
  assert verdicts[6].status == V.CRASH and verdicts[6].reward == -1.0
  assert 'worker died' in verdicts[6].detail
  assert [v.status for i, v in enumerate(verdicts) if i != 6] == [V.CORRECT] * 12
  assert not settle(pool)


def test_raising_verifier_is_a_crash_without_killing_the_worker(pool):
  pids = full_crew(pool)
  verdicts = pool.score([{}, {}], verifier=[F + 'raise_error', F + 'not_a_verdict'],
                        deadline_s=10)
  assert [v.status for v in verdicts] == [V.CRASH, V.CRASH]
  assert 'verifier failed on purpose' in verdicts[0].detail
  assert 'return a number or a Verdict' in verdicts[1].detail
  assert set(pool.worker_pids()) == pids


def test_failure_statuses_get_the_default_reward(pool):
  verdicts = pool.score([{'status': s, 'reward': 5.0} for s in V.STATUSES],
                        verifier=F + 'echo', deadline_s=10)
  for status, v in zip(V.STATUSES, verdicts):
    assert v.status == status
    assert v.reward == (-1.0 if status in V.FAILURES else 5.0)


def test_deadline_is_kept_with_everything_hung(pool):
  start = time.monotonic()
  verdicts = pool.score([{'seconds': 60}] * 5, verifier=F + 'sleep', deadline_s=1.0)
  elapsed = time.monotonic() - start
  assert elapsed < 1.0 + pool.OVERRUN_SLACK_S, elapsed
  assert [v.status for v in verdicts] == [V.TIMEOUT] * 5
  assert pool.stats().deadline_overruns == 0
  # The next batch is answered within its own deadline, by replacement workers.
  start = time.monotonic()
  verdicts = pool.score([OK_ITEM] * 4, verifier='math', deadline_s=30)
  assert [v.status for v in verdicts] == [V.CORRECT] * 4
  assert time.monotonic() - start < 30
  assert not settle(pool)


def test_stats_count_statuses_and_latencies(pool):
  pool.stats(reset=True)
  pool.score([OK_ITEM, {'completion': 'no answer', 'answer': '1'}], verifier='math',
             deadline_s=10)
  stats = pool.stats()
  assert stats.items == 2 and stats.batches == 1
  assert stats.statuses == {V.CORRECT: 1, V.PARSE_FAILURE: 1}
  assert 0 < stats.latency_p50_s <= stats.latency_max_s < 5


def test_workers_recycle_after_n_items_and_close_stops_them_all():
  # forkserver: the other start method, whose workers fork from a preloaded server.
  p = pool_lib.VerifierPool(num_workers=1, spare_workers=0, recycle_after=3, warmup=False,
                            start_method='forkserver')
  pids = [p.score([{}], verifier=F + 'worker_pid', deadline_s=30)[0].components['pid']
          for _ in range(7)]
  assert pids[:3] == [pids[0]] * 3 and pids[3:6] == [pids[3]] * 3 and pids[0] != pids[3]
  assert p.stats().workers_stopped['recycle'] == 2
  assert p.stats().workers_with_jax == 0
  p.close()
  assert not {int(x) for x in pids} & children_of(os.getpid())
  with pytest.raises(RuntimeError, match='closed'):
    p.score([OK_ITEM], verifier='math', deadline_s=1)


def test_a_pool_whose_workers_cannot_start_fails_loudly():
  with pytest.raises(RuntimeError, match='failed to start'):
    pool_lib.VerifierPool(num_workers=1, spare_workers=0, preload=('no_such_module_here',),
                          start_timeout_s=60)
