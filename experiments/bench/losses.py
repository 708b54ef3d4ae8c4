"""Peak memory and time of a policy loss's log-prob + gradient: chunked path vs full logits.

  python -m experiments.bench.losses               # ~10 min on a shared 2-core CPU box
  python -m experiments.bench.losses --full_time   # + one chunked step at full size (~5 min)
  python -m experiments.bench.losses --vocab_parallel_only   # the tensor-size table (~1 min)

The loss is the vocabulary-touching part of every policy loss in rlreason: a token-mean of
−A·log π(token) over 8 sequences × 2048 tokens, at the mid config's hidden size 512 and
Qwen2.5's vocabulary of 151,936, differentiated w.r.t. the final hidden states h (NxTxD) and
the output projection w (DxV), all fp32:

  naive    logits = transformer.logits_from_hidden(h) (NxTxV) -> token_stats.token_stats (log_softmax)
  naive_lse  the leanest full-logits form: logsumexp(logits) − logits[token]
  chunked  token_stats.token_stats_from_hidden(h, w, tokens, token_chunk, vocab_chunk)

Memory, measured two ways:
  compiled  XLA's buffer assignment for jit(value_and_grad) at the FULL size, ahead of time
            (lower -> compile -> memory_analysis(); nothing runs): argument + output + temp −
            alias bytes, i.e. what must be resident at the peak. Naive needs several NxTxV
            fp32 arrays (~10 GB each here), so it is never executed at full size.
  RSS       the high-water resident set (ru_maxrss) of a fresh subprocess per path that runs the
            step at the timing size, and that minus its RSS just before compiling.
Time: median wall time of --steps steps after --warmup, at --time_seqs sequences (default 1,
where naive fits in the --rss_budget_gb guard), each path in its own subprocess, --rounds
rounds interleaved, best round kept (the machine may be shared). --full_time adds one step
(no warm-up) of the chunked path at the full size, which naive cannot run.

Prints a table, `chunked_logprob_time_ratio=` (chunked / fastest naive at the timing size) and
`chunked_logprob_memory_ratio=` (chunked / smallest naive compiled peak at full size).
Target: memory ≤ 0.25 with time ≤ 1.2.

Vocabulary parallelism (vocab_parallel.py): the compiled per-device peak, at the full size, of
the forward + backward of all three token statistics (−A·log π − 0.01·H + 0.01·Σπ², token mean)
with w's columns split over a ('data', 'fsdp', 'tensor') = (1, 1, tp) mesh of the first tp of
--cpu_devices fake CPU devices (h replicated), for tp = 1, 2, 4, 8. tp = 1 is the unsharded
chunked kernel, the path update.py takes without tensor parallelism. Last line:
`vocab_parallel_peak_ratio_tp8=` (peak at tp = 8 / peak at tp = 1). Compiles only.
"""

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time

if __package__ in (None, ''):  # Run as a script: make `rlreason` importable.
  sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402

from jax.sharding import NamedSharding, PartitionSpec as P  # noqa: E402

from rlreason.model import sharding  # noqa: E402
from rlreason.model import transformer  # noqa: E402
from rlreason.objectives import aggregation  # noqa: E402
from rlreason.objectives import token_stats  # noqa: E402
from rlreason.objectives import vocab_parallel  # noqa: E402

HIDDEN, VOCAB, SEQS, TOKENS = 512, 151_936, 8, 2048
PATHS = ('naive', 'naive_lse', 'chunked')
GB = 1e9


def _cfg():
  """Only the output projection matters here: the mid config's width, Qwen2.5's vocabulary."""
  return transformer.ModelConfig(vocab_size=VOCAB, hidden_size=HIDDEN, intermediate_size=1536,
                           num_layers=1, num_heads=8, num_kv_heads=4, head_dim=64)


def make_loss(path: str, *, token_chunk: int, vocab_chunk: int):
  cfg = _cfg()

  def logprobs(h_NxTxD, w_DxV, tokens_NxT):
    if path == 'chunked':
      return token_stats.token_stats_from_hidden(
          h_NxTxD, w_DxV, tokens_NxT, token_chunk=token_chunk,
          vocab_chunk=vocab_chunk).logprobs_NxT
    logits_NxTxV = transformer.logits_from_hidden({'lm_head': w_DxV}, h_NxTxD, cfg=cfg)
    if path == 'naive':
      return token_stats.token_stats(logits_NxTxV, tokens_NxT).logprobs_NxT
    picked_NxT = jnp.take_along_axis(logits_NxTxV, tokens_NxT[..., None], axis=-1)[..., 0]
    return picked_NxT - jax.nn.logsumexp(logits_NxTxV, axis=-1)

  def loss(h_NxTxD, w_DxV, tokens_NxT, advantages_N):
    mask_NxT = jnp.ones(tokens_NxT.shape, jnp.float32)
    loss_NxT = -advantages_N[:, None] * logprobs(h_NxTxD, w_DxV, tokens_NxT)
    return aggregation.token_mean(loss_NxT, mask_NxT, denominator=jnp.sum(mask_NxT))

  return jax.jit(jax.value_and_grad(loss, argnums=(0, 1)))


def _shapes(seqs):
  return (jax.ShapeDtypeStruct((seqs, TOKENS, HIDDEN), jnp.float32),
          jax.ShapeDtypeStruct((HIDDEN, VOCAB), jnp.float32),
          jax.ShapeDtypeStruct((seqs, TOKENS), jnp.int32),
          jax.ShapeDtypeStruct((seqs,), jnp.float32))


def compiled_peak(path, seqs, args):
  """(peak bytes, temp bytes) from XLA's memory analysis; compiles, executes nothing."""
  step = make_loss(path, token_chunk=args.token_chunk, vocab_chunk=args.vocab_chunk)
  stats = step.lower(*_shapes(seqs)).compile().memory_analysis()
  peak = (stats.argument_size_in_bytes + stats.output_size_in_bytes + stats.temp_size_in_bytes
          - stats.alias_size_in_bytes)
  return peak, stats.temp_size_in_bytes


def vocab_parallel_peak(tp, args):
  """(peak bytes, temp bytes) per device of all three statistics' loss + gradient, w's
  columns over tp devices; compiles, executes nothing."""
  mesh = sharding.make_mesh((1, 1, tp), devices=jax.devices()[:tp])

  def loss(h_NxTxD, w_DxV, tokens_NxT, advantages_N):
    s = vocab_parallel.token_stats_from_hidden(h_NxTxD, w_DxV, tokens_NxT,
                                               token_chunk=args.token_chunk,
                                               vocab_chunk=args.vocab_chunk)
    mask_NxT = jnp.ones(tokens_NxT.shape, jnp.float32)
    loss_NxT = (-advantages_N[:, None] * s.logprobs_NxT - 0.01 * s.entropy_NxT
                + 0.01 * s.sum_sq_probs_NxT)
    return aggregation.token_mean(loss_NxT, mask_NxT, denominator=jnp.sum(mask_NxT))

  replicated = NamedSharding(mesh, P())
  in_shardings = (replicated, NamedSharding(mesh, P(None, 'tensor')), replicated, replicated)
  with jax.set_mesh(mesh):
    step = jax.jit(jax.value_and_grad(loss, argnums=(0, 1)), in_shardings=in_shardings)
    stats = step.lower(*_shapes(SEQS)).compile().memory_analysis()
  peak = (stats.argument_size_in_bytes + stats.output_size_in_bytes + stats.temp_size_in_bytes
          - stats.alias_size_in_bytes)
  return peak, stats.temp_size_in_bytes


def print_vocab_parallel(args):
  """The per-device peak by tensor size, and the final `vocab_parallel_peak_ratio_tp8=`."""
  sizes = [tp for tp in (1, 2, 4, 8) if tp <= jax.device_count()]
  print(f'\nvocab-parallel token stats (log π, H, Σπ²) loss+grad, full size {SEQS}x{TOKENS}, '
        f'mesh (1, 1, tp) of {jax.device_count()} {jax.devices()[0].platform} devices', flush=True)
  header = f'{"tp":>3} {"peak GB/device (compiled)":>26} {"temp GB/device":>15}'
  print(header + '\n' + '-' * len(header))
  peaks = {}
  for tp in sizes:
    peaks[tp], temp = vocab_parallel_peak(tp, args)
    print(f'{tp:>3} {peaks[tp] / GB:>26.3f} {temp / GB:>15.3f}', flush=True)
  if 8 in peaks:
    print(f'vocab_parallel_peak_ratio_tp8={peaks[8] / peaks[1]:.4f}')
  else:
    print(f'vocab_parallel_peak_ratio_tp8=n/a (only {jax.device_count()} devices)')


def _rss_bytes():
  return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux reports KiB.


def _current_rss_bytes():
  with open('/proc/self/statm') as f:
    return int(f.read().split()[1]) * os.sysconf('SC_PAGE_SIZE')


def worker(args):
  """Runs one path at --seqs sequences in this (fresh) process; prints one JSON line."""
  keys = jax.random.split(jax.random.key(0), 4)
  h = jax.random.normal(keys[0], (args.seqs, TOKENS, HIDDEN), jnp.float32)
  w = 0.02 * jax.random.normal(keys[1], (HIDDEN, VOCAB), jnp.float32)
  tokens = jax.random.randint(keys[2], (args.seqs, TOKENS), 0, VOCAB)
  adv = jax.random.normal(keys[3], (args.seqs,), jnp.float32)
  jax.block_until_ready((h, w, tokens, adv))
  base = _current_rss_bytes()
  step = make_loss(args.worker, token_chunk=args.token_chunk, vocab_chunk=args.vocab_chunk)
  compiled = step.lower(h, w, tokens, adv).compile()
  for _ in range(args.warmup):
    jax.block_until_ready(compiled(h, w, tokens, adv))
  times = []
  for _ in range(args.steps):
    start = time.perf_counter()
    loss, _ = jax.block_until_ready(compiled(h, w, tokens, adv))
    times.append(time.perf_counter() - start)
  print(json.dumps({'path': args.worker, 'seqs': args.seqs, 'loss': float(loss),
                    'median_s': statistics.median(times), 'rss_peak': _rss_bytes(),
                    'rss_base': base}), flush=True)


def run_worker(path, seqs, args):
  cmd = [sys.executable, '-m', 'experiments.bench.losses', '--worker', path, '--seqs', str(seqs),
         '--steps', str(args.steps), '--warmup', str(args.warmup),
         '--token_chunk', str(args.token_chunk), '--vocab_chunk', str(args.vocab_chunk)]
  root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
  out = subprocess.run(cmd, cwd=root, capture_output=True, text=True, check=False)
  if out.returncode:
    return {'path': path, 'seqs': seqs, 'error': f'exit {out.returncode}: {out.stderr[-300:]}'}
  return json.loads(out.stdout.strip().splitlines()[-1])


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  parser.add_argument('--time_seqs', type=int, default=1)
  parser.add_argument('--steps', type=int, default=2)
  parser.add_argument('--warmup', type=int, default=1)
  parser.add_argument('--rounds', type=int, default=1)
  parser.add_argument('--token_chunk', type=int, default=1024)
  parser.add_argument('--vocab_chunk', type=int, default=16384)
  parser.add_argument('--rss_budget_gb', type=float, default=12.0)
  parser.add_argument('--full_time', action='store_true')
  parser.add_argument('--cpu_devices', type=int, default=8,
                      help='fake CPU devices for the vocab-parallel table (jax_num_cpu_devices '
                      'in this process only; the timing workers keep one device)')
  parser.add_argument('--vocab_parallel_only', action='store_true')
  parser.add_argument('--worker', choices=PATHS)
  parser.add_argument('--seqs', type=int)
  args = parser.parse_args(argv)
  if args.worker:
    return worker(args)
  # Not sharding.split_cpu_host: its single-threaded-kernel flag would reach the timing
  # workers through the environment. Compiled memory does not depend on threading.
  if args.cpu_devices > 1:
    jax.config.update('jax_num_cpu_devices', args.cpu_devices)  # Before the backend starts.
  if args.vocab_parallel_only:
    return print_vocab_parallel(args)

  print(f'loss+grad wrt h [N,T,{HIDDEN}] and w [{HIDDEN},{VOCAB}], fp32, full size '
        f'{SEQS}x{TOKENS}, timing size {args.time_seqs}x{TOKENS}, token_chunk {args.token_chunk}, '
        f'vocab_chunk {args.vocab_chunk}', flush=True)
  full = {p: compiled_peak(p, SEQS, args) for p in PATHS}
  at_time_size = {p: compiled_peak(p, args.time_seqs, args)[0] for p in PATHS}
  runs = {p: [] for p in PATHS}
  for _ in range(args.rounds):
    for p in PATHS:
      if at_time_size[p] > args.rss_budget_gb * GB:
        runs[p].append({'error': f'compiled peak {at_time_size[p] / GB:.1f} GB > budget'})
        continue
      runs[p].append(run_worker(p, args.time_seqs, args))
      print(f'  {p}: {runs[p][-1]}', flush=True)
  best = {p: min((r for r in runs[p] if 'error' not in r), key=lambda r: r['median_s'],
                 default=runs[p][-1]) for p in PATHS}
  full_time = None
  if args.full_time:
    full_time = run_worker('chunked', SEQS, argparse.Namespace(**{**vars(args), 'steps': 1,
                                                                  'warmup': 0}))
  finished = [best[p]['loss'] for p in PATHS if 'error' not in best[p]]
  if finished and max(finished) - min(finished) > 1e-4 * max(1.0, abs(finished[0])):
    raise SystemExit(f'paths disagree on the loss: {[best[p] for p in PATHS]}')

  header = (f'{"path":<10} {"peak GB full (compiled)":>24} {"temp GB full":>13} '
            f'{"peak GB @time (compiled)":>25} {"RSS GB @time":>13} {"RSS-base GB":>12} '
            f'{"time s @time":>13}')
  print('\n' + header + '\n' + '-' * len(header))
  for p in PATHS:
    r = best[p]
    rss = (f'{r["rss_peak"] / GB:>13.2f} {(r["rss_peak"] - r["rss_base"]) / GB:>12.2f} '
           f'{r["median_s"]:>13.2f}' if 'error' not in r else f'{r["error"]:>40}')
    print(f'{p:<10} {full[p][0] / GB:>24.2f} {full[p][1] / GB:>13.2f} '
          f'{at_time_size[p] / GB:>25.2f} {rss}')
  if full_time is not None and 'error' not in full_time:
    print(f'chunked at full size {SEQS}x{TOKENS}: one step {full_time["median_s"]:.1f} s, '
          f'RSS {full_time["rss_peak"] / GB:.2f} GB')
  elif full_time is not None:
    print(f'chunked at full size {SEQS}x{TOKENS}: {full_time["error"]}')
  naive_times = [best[p]['median_s'] for p in ('naive', 'naive_lse') if 'error' not in best[p]]
  if naive_times and 'error' not in best['chunked']:
    print(f'chunked_logprob_time_ratio={best["chunked"]["median_s"] / min(naive_times):.3f}')
  naive_peak = min(full['naive'][0], full['naive_lse'][0])
  print(f'chunked_logprob_memory_ratio={full["chunked"][0] / naive_peak:.4f}')
  print_vocab_parallel(args)


if __name__ == '__main__':
  main()
