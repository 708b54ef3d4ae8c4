"""Memory and time of a LoRA train step against full fine-tuning, same run, random weights.

  python -m experiments.bench.lora   # mid + Qwen2.5-0.5B shapes: 5m51s on 2 busy cores
  python -m experiments.bench.lora --configs tiny --steps 1 --warmup 0   # smoke (~20 s)

A step: loss = -mean log pi(token_t+1 | tokens_<=t) over N rows of T random tokens, its gradient
and one optax.adamw update. Variants:
  full       gradient and AdamW over every param (params and optimizer state donated).
  lora       rank 16, alpha 32, on q/k/v/o/gate/up/down of every layer: lora.merge inside the
             step (base under stop_gradient), gradient and AdamW over the adapter only.
  lora+int8  the same over an int8 base (lora.quantize_base: every layer's projections int8
             per output channel; embedding, norms, biases fp32); `--quantize int8,nf4` adds NF4.

Columns: trainable and optimizer-state bytes (optax.adamw's state of the trainable tree), the
frozen base's bytes, XLA's compiled peak for the step (memory_analysis(): argument + output +
temp - alias, the frozen base included), and the median wall time of --steps steps after
--warmup, the variants taking turns step by step (the machine may be shared).

Configs: mid is experiments/bench/forward.py's (vocab 8192, D 512, F 1536, 8 layers, 8 heads,
4 kv heads, untied); qwen0.5b has Qwen2.5-0.5B's shapes (vocab 151936, D 896, F 4864, 24 layers,
14 heads, 2 kv heads, Dh 64, tied embeddings, qkv bias). Last lines, at the last config:
`lora_step_time_ratio=` (lora / full step time) and `lora_state_memory_ratio=` (lora trainable +
optimizer bytes / full's). Target: <= 0.05 at rank 16 on the 0.5B shapes. Merging costs a full
fp32 copy of the targeted weights inside the step, so the compiled peak shrinks much less than
the state (and the int8 base's peak holds its dequantised copy). Nor does merging save the
backward's weight-gradient matmuls: the cotangent of every merged W' (x^T dy, as in full
fine-tuning) is computed before dA and dB; what LoRA saves in time is the optimizer update
over the full params (and the quantised base's smaller reads).

Measured on the shared 2-core box at load average 6-9 (two runs, medians of 3 steps; noisy):
0.5B state ratio 0.0178, compiled peak 0.562 of full (int8 0.432, nf4 0.451), step time
0.79-0.88 of full (int8 0.63-0.69, nf4 0.74); mid state 0.0371, time ~1.0. ~6 min wall there.
"""

import argparse
import dataclasses
import os
import statistics
import sys
import time

if __package__ in (None, ''):  # Run as a script: make `rlreason` importable.
  sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

import jax  # noqa: E402  (no backend exists until the first computation)
import jax.numpy as jnp  # noqa: E402
import optax  # noqa: E402

from rlreason.model import lora  # noqa: E402
from rlreason.model import transformer  # noqa: E402


@dataclasses.dataclass(frozen=True)
class BenchConfig:
  name: str
  model: transformer.ModelConfig
  batch: int
  seq: int


def _model(vocab, d, f, layers, heads, kv, dh, tied):
  return transformer.ModelConfig(vocab_size=vocab, hidden_size=d, intermediate_size=f,
                                 num_layers=layers, num_heads=heads, num_kv_heads=kv, head_dim=dh,
                                 qkv_bias=True, tie_embeddings=tied, family='qwen2')


CONFIGS = {
    'tiny': BenchConfig('tiny', _model(512, 64, 128, 2, 2, 1, 64, False), batch=2, seq=16),
    'mid': BenchConfig('mid', _model(8192, 512, 1536, 8, 8, 4, 64, False), batch=4, seq=128),
    'qwen0.5b': BenchConfig('qwen0.5b', _model(151936, 896, 4864, 24, 14, 2, 64, True),
                            batch=2, seq=64),
}
LR = 1e-4


def limit_threads(n: int) -> None:
  """Confines the process to n of its cores before JAX creates its backend (XLA sizes its
  thread pool from the cores it may run on)."""
  cores = sorted(os.sched_getaffinity(0))
  if not 1 <= n <= len(cores):
    raise ValueError(f'--threads={n}: this process may use {len(cores)} cores {cores}.')
  os.sched_setaffinity(0, cores[:n])


def nll(params, tokens_NxT, cfg):
  logits_NxTxV, _ = transformer.apply(params, tokens_NxT[:, :-1], cfg=cfg)
  logp_NxT = jnp.take_along_axis(jax.nn.log_softmax(logits_NxTxV), tokens_NxT[:, 1:, None],
                                 axis=-1)[..., 0]
  return -jnp.mean(logp_NxT)


@dataclasses.dataclass
class Variant:
  """A jitted step over (trainable, opt_state, *frozen, tokens) and the arrays it runs on."""
  name: str
  step: object
  box: dict  # trainable, opt_state: replaced after every call (donated).
  frozen: tuple
  trainable_bytes: int = 0
  opt_bytes: int = 0
  frozen_bytes: int = 0
  peak_bytes: int = 0
  step_s: float = 0.0


def make_variants(bc: BenchConfig, quantize_modes, rank: int) -> list[Variant]:
  cfg = bc.model
  optimizer = optax.adamw(LR)
  params = jax.jit(transformer.init_params, static_argnums=0)(cfg, jax.random.key(0))

  def full_step(p, opt, tokens_NxT):
    loss, grads = jax.value_and_grad(nll)(p, tokens_NxT, cfg)
    updates, opt = optimizer.update(grads, opt, p)
    return optax.apply_updates(p, updates), opt, loss

  def lora_step(lora_cfg):
    def step(adapter, opt, base, tokens_NxT):
      loss_fn = lambda a: nll(lora.merge(base, a, cfg, lora_cfg), tokens_NxT, cfg)
      loss, grads = jax.value_and_grad(loss_fn)(adapter)
      updates, opt = optimizer.update(grads, opt, adapter)
      return optax.apply_updates(adapter, updates), opt, loss
    return step

  variants = []
  for mode in ('', *quantize_modes):
    lora_cfg = lora.LoraConfig(rank=rank, alpha=2.0 * rank, quantize=mode)
    base = jax.jit(lora.quantize_base, static_argnums=(1, 2))(
        jax.tree.map(jnp.copy, params), cfg, lora_cfg)  # Its own copy: full's is donated.
    adapter = lora.init(cfg, lora_cfg, jax.random.key(1))
    variants.append(Variant(f'lora r{rank}' + (f'+{mode}' if mode else ''),
                            jax.jit(lora_step(lora_cfg), donate_argnums=(0, 1)),
                            {'trainable': adapter, 'opt': optimizer.init(adapter)}, (base,)))
  variants.insert(0, Variant('full', jax.jit(full_step, donate_argnums=(0, 1)),
                             {'trainable': params, 'opt': optimizer.init(params)}, ()))
  return variants


def run_config(bc: BenchConfig, args) -> list[Variant]:
  tokens_NxT = jax.random.randint(jax.random.key(2), (bc.batch, bc.seq), 0, bc.model.vocab_size)
  variants = make_variants(bc, [m for m in args.quantize.split(',') if m], args.rank)
  for v in variants:
    v.trainable_bytes = lora.num_bytes(v.box['trainable'])
    v.opt_bytes = lora.num_bytes(v.box['opt'])
    v.frozen_bytes = lora.num_bytes(v.frozen)
    t0 = time.perf_counter()
    v.step = v.step.lower(v.box['trainable'], v.box['opt'], *v.frozen, tokens_NxT).compile()
    stats = v.step.memory_analysis()
    v.peak_bytes = (stats.argument_size_in_bytes + stats.output_size_in_bytes +
                    stats.temp_size_in_bytes - stats.alias_size_in_bytes)
    print(f'[{bc.name}] {v.name}: compiled in {time.perf_counter() - t0:.1f}s', flush=True)

  def call(v):
    v.box['trainable'], v.box['opt'], loss = v.step(v.box['trainable'], v.box['opt'], *v.frozen,
                                                    tokens_NxT)
    jax.block_until_ready((v.box, loss))
    return float(loss)

  for _ in range(args.warmup):
    for v in variants:
      call(v)
  times = {v.name: [] for v in variants}
  for _ in range(args.steps):
    for v in variants:
      t0 = time.perf_counter()
      loss = call(v)
      times[v.name].append(time.perf_counter() - t0)
      if not jnp.isfinite(loss):
        raise SystemExit(f'[{bc.name}] {v.name}: non-finite loss {loss}')
  for v in variants:
    v.step_s = statistics.median(times[v.name])
  return variants


def print_table(rows: list[tuple[str, list[Variant]]]):
  mb = lambda b: f'{b / 2**20:,.1f}'
  header = (f'{"config":<9} {"variant":<13} {"trainable_MB":>12} {"optimizer_MB":>12} '
            f'{"state_ratio":>11} {"frozen_MB":>10} {"peak_MB":>10} {"peak_ratio":>10} '
            f'{"step_s":>8} {"time_ratio":>10}')
  print(header)
  print('-' * len(header))
  for name, variants in rows:
    full = variants[0]
    for v in variants:
      state = (v.trainable_bytes + v.opt_bytes) / (full.trainable_bytes + full.opt_bytes)
      print(f'{name:<9} {v.name:<13} {mb(v.trainable_bytes):>12} {mb(v.opt_bytes):>12} '
            f'{state:>11.4f} {mb(v.frozen_bytes):>10} {mb(v.peak_bytes):>10} '
            f'{v.peak_bytes / full.peak_bytes:>10.3f} {v.step_s:>8.3f} '
            f'{v.step_s / full.step_s:>10.3f}')


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  parser.add_argument('--configs', default='mid,qwen0.5b', help=f'comma-separated: {list(CONFIGS)}')
  parser.add_argument('--rank', type=int, default=16)
  parser.add_argument('--quantize', default='int8', help="base modes besides fp32: 'int8,nf4'")
  parser.add_argument('--steps', type=int, default=3, help='timed steps per variant')
  parser.add_argument('--warmup', type=int, default=1, help='untimed steps first')
  parser.add_argument('--threads', type=int, default=len(os.sched_getaffinity(0)))
  args = parser.parse_args(argv)
  limit_threads(args.threads)
  print(f'jax {jax.__version__} ({jax.devices()[0].platform}), threads {args.threads}, '
        f'load average {" ".join(f"{x:.2f}" for x in os.getloadavg())}', flush=True)
  rows = []
  for name in args.configs.split(','):
    bc = CONFIGS[name]
    print(f'[{name}] {bc.model.num_params() / 1e6:.1f}M params, batch {bc.batch}x{bc.seq}',
          flush=True)
    rows.append((name, run_config(bc, args)))
  print()
  print_table(rows)
  print(f'load average {" ".join(f"{x:.2f}" for x in os.getloadavg())}')
  full, low = rows[-1][1][0], rows[-1][1][1]
  print(f'lora_step_time_ratio={low.step_s / full.step_s:.3f}')
  print(f'lora_state_memory_ratio='
        f'{(low.trainable_bytes + low.opt_bytes) / (full.trainable_bytes + full.opt_bytes):.4f}')


if __name__ == '__main__':
  main()
