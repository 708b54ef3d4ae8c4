"""The verifier pool against an in-process loop on 1,000 math completions, 5% of them hostile.

  python -m experiments.bench.verifiers            # ~1 min on a 2-core machine
  python -m experiments.bench.verifiers --runlocal # 200 items, for a quick look

Completions are real reference solutions (MATH-500 first half, GSM8K test first half, from
../shared/data), half paired with their own answer and half with another problem's, so
both the correct and the wrong paths run. 5% are pathological for math-verify: exponent
towers, huge factorials and binomials, (x+1)^2000, LaTeX nested 40 deep, floods of
`\\boxed{`, near-megabyte completions. Unguarded, each of those costs math-verify its full
alarm (5 s by default) or hangs in C; the `math` verifier's guards turn them into
parse_failures in milliseconds.

Phases, in one run:
  1. pool: all 1,000 items through a 2-worker VerifierPool, in batches of 100 under a
     30 s deadline each;
  2. sequential: the same `math` verifier in this process, on the 950 non-pathological
     items only (on the others it is the parser, not the loop, that decides the time);
  3. backstop: one batch of 100 where 5 pathological items run with guards off (so they
     burn CPU until the verifier's 2 s CPU budget or the pool's 3 s deadline stops them),
     to show the deadline holds when the guards do not.

Prints items/s and per-item latency p50/p99 for both, a control (how much faster two
processes of plain Python work run than one, right now: on a machine shared with other
jobs this is well under 2 and bounds any pool), then the overrun count over all pool
batches, then the speedup (pool items/s on all items / sequential items/s on the
non-pathological ones). Target: deadline_overruns=0, verifier_pool_speedup >= 1.5.
"""

import argparse
import json
import multiprocessing
import os
import pathlib
import random
import sys
import time

if __package__ in (None, ''):  # Run as a script: make `rlreason` importable.
  sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

from rlreason.verifiers import math_answer  # noqa: E402
from rlreason.verifiers import pool as pool_lib  # noqa: E402

DATA = pathlib.Path(__file__).resolve().parents[3] / 'shared' / 'data'
BOMBS = [
    '\\boxed{9^{9^{9^9}}}', '\\boxed{10^{10^{10}}}', '\\boxed{2^{2^{2^{2^{2^{2}}}}}}',
    '\\boxed{(10^{10})!}', '\\boxed{100000000!}', '\\boxed{\\binom{10^{10}}{10^5}}',
    '\\boxed{(x+1)^{2000}}', '\\boxed{\\sqrt{10^{10^{9}}}}',
    '\\boxed{' + '\\frac{1}{' * 40 + '2' + '}' * 41, '\\boxed{' * 50_000,
    'The answer is ' + '(' * 5_000 + '1' + ')' * 5_000, 'step. ' * 30_000 + '\\boxed{1}',
]


def reference_items(count: int, rng: random.Random) -> list[dict]:
  math500 = [json.loads(line) for line in (DATA / 'math500' / 'test.first_half.jsonl').open()]
  gsm8k = [json.loads(line) for line in (DATA / 'gsm8k' / 'test.first_half.jsonl').open()]
  pool = ([(r['solution'], r['answer']) for r in math500] +
          [(r['answer'], r['answer'].split('####')[-1].strip().replace(',', '')) for r in gsm8k])
  items = []
  for i in range(count):
    completion, answer = pool[i % len(pool)]
    if i % 2:  # another problem's answer: the wrong path.
      answer = pool[rng.randrange(len(pool))][1]
    items.append({'completion': completion, 'answer': answer})
  return items


def _spin(n: int, go=None, done=None) -> int:
  if go is not None:
    go.wait()  # start timing after the interpreter and imports are up.
  total = 0
  for i in range(n):
    total += i * i % 7
  if done is not None:
    done.put(time.perf_counter())
  return total


def parallel_scaling(n: int = 3_000_000) -> float:
  """Two spawned processes of pure-Python work vs the same work twice in a row.

  The most any 2-process pool can gain on this machine right now: 2.0 on two idle cores,
  less when other jobs take CPU time.
  """
  start = time.perf_counter()
  _spin(n)
  _spin(n)
  sequential_s = time.perf_counter() - start
  ctx = multiprocessing.get_context('spawn')
  go, done = ctx.Event(), ctx.Queue()
  processes = [ctx.Process(target=_spin, args=(n, go, done)) for _ in range(2)]
  for p in processes:
    p.start()
  time.sleep(5.0)  # let both finish starting up.
  start = time.perf_counter()
  go.set()
  end = max(done.get(), done.get())
  for p in processes:
    p.join()
  return sequential_s / (end - start)


def percentile(values: list[float], q: float) -> float:
  values = sorted(values)
  return values[min(len(values) - 1, int(q * len(values)))] if values else 0.0


def main() -> None:
  parser = argparse.ArgumentParser()
  parser.add_argument('--items', type=int, default=1000)
  parser.add_argument('--pathological', type=float, default=0.05)
  parser.add_argument('--batch', type=int, default=100)
  parser.add_argument('--deadline-s', type=float, default=30.0)
  parser.add_argument('--workers', type=int, default=2)
  parser.add_argument('--runlocal', action='store_true', help='200 items')
  args = parser.parse_args()
  n = 200 if args.runlocal else args.items
  rng = random.Random(0)
  n_bad = int(round(n * args.pathological))
  normal = reference_items(n - n_bad, rng)
  bad = [{'completion': BOMBS[i % len(BOMBS)], 'answer': '1'} for i in range(n_bad)]
  items = normal + bad
  rng.shuffle(items)
  bad_ids = {id(it) for it in bad}
  is_bad = [id(it) in bad_ids for it in items]
  print(f'{len(items)} items, {n_bad} pathological, {args.workers} workers, '
        f'{os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f}')

  overruns, backstop_line = 0, ''
  with pool_lib.VerifierPool(num_workers=args.workers, spare_workers=1, item_timeout_s=10) as pool:
    pool.score(items[:8], verifier='math', deadline_s=60)  # first-use costs, untimed.
    pool.stats(reset=True)
    verdicts, start = [], time.perf_counter()
    for i in range(0, len(items), args.batch):
      batch_start = time.perf_counter()
      verdicts += pool.score(items[i:i + args.batch], verifier='math', deadline_s=args.deadline_s)
      overruns += time.perf_counter() - batch_start > args.deadline_s + pool.OVERRUN_SLACK_S
    pool_s = time.perf_counter() - start
    stats = pool.stats(reset=True)

    backstop = reference_items(95, random.Random(1)) + [
        {'completion': b, 'answer': '1', 'guards': False} for b in BOMBS[:5]]
    start = time.perf_counter()
    backstop_verdicts = pool.score(backstop, verifier='math', deadline_s=3.0)
    backstop_s = time.perf_counter() - start
    overruns += backstop_s > 3.0 + pool.OVERRUN_SLACK_S
    timed_out = sum(v.status == 'timeout' for v in backstop_verdicts)
    backstop_line = (f'backstop: 100 items, 5 unguarded bombs, 3 s deadline: returned in '
                     f'{backstop_s:.2f}s, {timed_out} timeouts, '
                     f'{sum(v.status == "correct" for v in backstop_verdicts)} correct')

  math_answer.verify_math(items[0])  # same first-use costs as the pool's warm-up.
  seq_latencies, seq_statuses = [], []
  start = time.perf_counter()
  for item, skip in zip(items, is_bad):
    if skip:
      continue
    t = time.perf_counter()
    seq_statuses.append(math_answer.verify_math(item).status)
    seq_latencies.append(time.perf_counter() - t)
  seq_s = time.perf_counter() - start

  pool_rate, seq_rate = len(items) / pool_s, len(seq_latencies) / seq_s
  pool_normal = [v.status for v, b in zip(verdicts, is_bad) if not b]
  print(f'pool:       {pool_rate:8.1f} items/s ({len(items)} items in {pool_s:.2f}s), '
        f'latency p50 {1e3 * stats.latency_p50_s:.2f} ms p99 {1e3 * stats.latency_p99_s:.2f} ms, '
        f'statuses {dict(sorted(stats.statuses.items()))}')
  print(f'sequential: {seq_rate:8.1f} items/s ({len(seq_latencies)} items in {seq_s:.2f}s), '
        f'latency p50 {1e3 * percentile(seq_latencies, .5):.2f} ms '
        f'p99 {1e3 * percentile(seq_latencies, .99):.2f} ms')
  print(f'pathological items: {[v.status for v, b in zip(verdicts, is_bad) if b].count("parse_failure")}'
        f'/{n_bad} rejected as parse_failure; pool and sequential agree on the others: '
        f'{pool_normal == seq_statuses}')
  print(backstop_line)
  control = parallel_scaling()
  print(f'control: 2 processes of pure-Python work run {control:.2f}x faster than 1 on this '
        f'machine now (2.0 on idle cores); the pool reaches {pool_rate / seq_rate / control:.0%} '
        'of that')
  print(f'deadline_overruns={overruns}')
  print(f'verifier_pool_speedup={pool_rate / seq_rate:.2f}')


if __name__ == '__main__':
  main()
