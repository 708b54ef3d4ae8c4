"""Times rlreason's grouped sampler against transformers' generate on CPU.

  python -m experiments.bench.sampler --configs small,mid --runs 5

Two tables from one run, on the forward benchmark's small and mid configs (Qwen2-style: qkv
bias, untied embeddings, fp32):

  decode   8 distinct 64-token prompts, G = 8 samples each (64 rows), exactly 128 new tokens
           (no stop tokens), temperature 1, no top-k/top-p. rlreason's `sampler.generate`
           against transformers' `generate` (torch, KV cache, do_sample,
           num_return_sequences=8, min_new_tokens = max_new_tokens = 128) on the same random
           weights, exported with `weights.save` and read back with `from_pretrained`; their
           prompt logits are checked to agree first. Whole calls, prefill included:
           tokens/s = 64 * 128 / median wall time of `--runs` calls after one warm-up.
  prefill  G = 16, 8 prompts of 512 tokens: the sampler's shared prefill (each prompt once,
           its cache shared by its G rows) against naive repetition (the 128 rows passed as
           prompts with group_size=1). Whole calls with max_new_tokens=1, which run no decode
           forward pass: prefill and one sampled token.

Decode time per step is (t(128 new tokens) - t(1 new token)) / 127, set against two floors
measured in the same run:

  FLOP floor    2 * matmul params * rows / the best f32 matmul rate measured (a 4096^3
                matmul in jax and in torch, and the decode step's own [rows x D] @ [D x F]).
  memory floor  (matmul weights + K/V cache slots needed, averaged over the 128 steps: each
                row's sampled tokens so far, and the prompt's slots once per group of G)
                / read bandwidth (best of a numpy and a jax sum over a 1 GiB array).

Attention FLOPs, norms, RoPE and sampling are left out of both floors.

The machine may be shared: the two frameworks take turns call by call, so load from other
processes falls on both alike, and the load average is printed with the tables. torch's
OpenMP workers spin-wait for each other by default, which makes torch many times slower as
soon as other processes hold the cores (measured here: 13x at a load average of 14 on 2
cores); `--torch_omp_wait PASSIVE` (the default) avoids that, `ACTIVE` is torch's default.
"""

import argparse
import contextlib
import dataclasses
import os
import statistics
import sys
import tempfile
import time

if __package__ in (None, ''):  # Run as a script: make `rlreason` importable.
  sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

from rlreason.model import sharding  # noqa: E402
from rlreason.model import transformer  # noqa: E402
from rlreason.model import weights  # noqa: E402
from rlreason.rollout import sampler  # noqa: E402
from rlreason.structs import Prompts  # noqa: E402

# The forward benchmark's configs (experiments/bench/forward.py), architecture only.
CONFIGS = {
    'small': dict(vocab_size=2048, hidden_size=256, intermediate_size=768, num_layers=4,
                  num_heads=4, num_kv_heads=2),
    'mid': dict(vocab_size=8192, hidden_size=512, intermediate_size=1536, num_layers=8,
                num_heads=8, num_kv_heads=4),
}
PROMPTS, GROUP, PROMPT_LEN, NEW_TOKENS = 8, 8, 64, 128
PREFILL_GROUP, PREFILL_LEN = 16, 512


def model_config(name: str) -> transformer.ModelConfig:
  c = CONFIGS[name]
  return transformer.ModelConfig(**c, head_dim=c['hidden_size'] // c['num_heads'], qkv_bias=True,
                           tie_embeddings=False, family='qwen2', rope_theta=10_000.0,
                           rms_norm_eps=1e-6, max_position_embeddings=4096)


def matmul_params(cfg: transformer.ModelConfig) -> int:
  """Weights that every decoded token multiplies (embedding lookup and norms excluded)."""
  d, h, k, dh = cfg.hidden_size, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
  per_layer = d * h * dh + 2 * d * k * dh + h * dh * d + 3 * d * cfg.intermediate_size
  return cfg.num_layers * per_layer + d * cfg.vocab_size


# ----------------------------------------------------------------------------- timing


def time_interleaved(calls, runs: int, warmup: int = 1) -> dict[str, list[float]]:
  """Wall times of each blocking callable, the callables taking turns run by run."""
  for _ in range(warmup):
    for call in calls.values():
      call()
  times = {name: [] for name in calls}
  for _ in range(runs):
    for name, call in calls.items():
      start = time.perf_counter()
      call()
      times[name].append(time.perf_counter() - start)
  return times


def machine_rates(cfg_names) -> tuple[dict[str, float], dict[str, float]]:
  """Best f32 matmul GFLOP/s (jax, torch, decode-step shapes) and read bandwidth in GB/s."""
  import torch  # pylint: disable=g-import-not-at-top
  rng = np.random.default_rng(0)
  rates = {}
  n = 4096
  a, b = (rng.standard_normal((n, n), np.float32) for _ in range(2))
  xa, xb = jnp.asarray(a), jnp.asarray(b)
  mm = jax.jit(jnp.matmul).lower(xa, xb).compile()
  ta, tb = torch.from_numpy(a), torch.from_numpy(b)
  t = time_interleaved({'jax': lambda: mm(xa, xb).block_until_ready(), 'torch': lambda: ta @ tb},
                       runs=3)
  rates['jax 4096^3'] = 2 * n**3 / min(t['jax']) / 1e9
  rates['torch 4096^3'] = 2 * n**3 / min(t['torch']) / 1e9
  # The decode step's own shapes: 64 rows against the MLP's up projection, 20 per call.
  for name in cfg_names:
    cfg = model_config(name)
    rows, d, f = PROMPTS * GROUP, cfg.hidden_size, cfg.intermediate_size
    x = jnp.asarray(rng.standard_normal((rows, d), np.float32))
    w = jnp.asarray(rng.standard_normal((d, f), np.float32) / d)
    chain = jax.jit(lambda x, w: jax.lax.fori_loop(0, 20, lambda _, y: (y @ w)[:, :d], x))
    chain(x, w).block_until_ready()
    t = time_interleaved({'mm': lambda: chain(x, w).block_until_ready()}, runs=5)
    rates[f'jax {rows}x{d}x{f}'] = 20 * 2 * rows * d * f / min(t['mm']) / 1e9
  big = np.ones(2**28, np.float32)  # 1 GiB: larger than the last-level cache.
  big_jax = jnp.asarray(big)
  total = jax.jit(jnp.sum).lower(big_jax).compile()
  t = time_interleaved({'np': big.sum, 'jax': lambda: total(big_jax).block_until_ready()},
                       runs=3)
  bandwidth = {f'{k} sum GB/s': big.nbytes / min(v) / 1e9 for k, v in t.items()}
  return rates, bandwidth


# ----------------------------------------------------------------------------- decode table


@dataclasses.dataclass
class DecodeResult:
  config: str
  jax_s: dict[str, float]  # Per layout ('1 device', 'N devices'): median seconds a call.
  torch_s: float
  jax_first_s: dict[str, float]  # max_new_tokens=1: prefill plus one sampled token.
  compile_s: float
  logit_diff: float

  @property
  def best(self) -> str:
    return min(self.jax_s, key=self.jax_s.get)

  @property
  def speedup(self) -> float:
    return self.torch_s / self.jax_s[self.best]

  @property
  def step_s(self) -> float:
    return (self.jax_s[self.best] - self.jax_first_s[self.best]) / (NEW_TOKENS - 1)


def layouts(cfg: transformer.ModelConfig, params):
  """{layout name: (params, mesh or None)}: one device, and rows data-parallel over all."""
  out = {'1 device': (jax.device_put(params, jax.devices()[0]), None)}
  n = jax.device_count()
  if n > 1:
    mesh = sharding.make_mesh({'data': n, 'fsdp': 1, 'tensor': 1})
    with jax.set_mesh(mesh):
      out[f'{n} devices'] = (jax.device_put(
          params, sharding.param_shardings(cfg, mesh, sharding.SAMPLE_RULES)), mesh)
  return out


def generate_on(layout, prompts, **kw):
  params, mesh = layout
  with jax.set_mesh(mesh) if mesh is not None else contextlib.nullcontext():
    return jax.block_until_ready(sampler.generate(params, prompts, mesh=mesh, **kw))


def bench_decode(name: str, args) -> DecodeResult:
  import torch  # pylint: disable=g-import-not-at-top
  import transformers  # pylint: disable=g-import-not-at-top
  cfg = model_config(name)
  params = transformer.init_params(cfg, jax.random.key(0))
  # Nonzero biases and norm scales, so that a mis-exported tensor shows in the logit check.
  leaves, treedef = jax.tree_util.tree_flatten_with_path(params)
  params = treedef.unflatten([
      x + 0.1 * jax.random.normal(jax.random.key(i), x.shape)
      if 'bias' in jax.tree_util.keystr(path) or 'scale' in jax.tree_util.keystr(path) else x
      for i, (path, x) in enumerate(leaves)])
  with tempfile.TemporaryDirectory() as tmp:
    weights.save(tmp, cfg, params)
    net = transformers.AutoModelForCausalLM.from_pretrained(tmp, dtype=torch.float32).eval()

  tokens = np.random.default_rng(1).integers(1, cfg.vocab_size, (PROMPTS, PROMPT_LEN))
  prompts = Prompts(tokens_BxP=jnp.asarray(tokens, jnp.int32),
                    mask_BxP=jnp.ones(tokens.shape, bool))
  tokens_torch = torch.from_numpy(tokens)
  with torch.no_grad():
    logits_torch = net(input_ids=tokens_torch).logits.numpy()
  logits_jax = np.asarray(transformer.apply(params, prompts.tokens_BxP, cfg=cfg)[0])
  diff = float(np.abs(logits_torch - logits_jax).max())
  print(f'[{name}] prompt logits |jax - torch| max = {diff:.1e}', flush=True)
  if diff > 1e-3:
    raise SystemExit(f'[{name}] the exported weights do not reproduce the logits')

  on = layouts(cfg, params)

  def run_jax(new_tokens, layout='1 device', seed=[0]):  # pylint: disable=dangerous-default-value
    seed[0] += 1
    return generate_on(on[layout], prompts, cfg=cfg, group_size=GROUP,
                       max_new_tokens=new_tokens, temperature=1.0, rng=jax.random.key(seed[0]))

  @torch.no_grad()
  def run_torch():
    out = net.generate(tokens_torch, attention_mask=torch.ones_like(tokens_torch),
                       do_sample=True, num_return_sequences=GROUP, max_new_tokens=NEW_TOKENS,
                       min_new_tokens=NEW_TOKENS, temperature=1.0, top_k=0, top_p=1.0,
                       use_cache=True, pad_token_id=0, eos_token_id=None)
    assert out.shape == (PROMPTS * GROUP, PROMPT_LEN + NEW_TOKENS), out.shape
    return out

  start = time.perf_counter()
  out = run_jax(NEW_TOKENS)
  compile_s = time.perf_counter() - start
  assert out.tokens_NxL.shape == (PROMPTS * GROUP, NEW_TOKENS) and bool(out.mask_NxL.all())
  print(f'[{name}] rlreason first call (compile + run) {compile_s:.1f}s', flush=True)
  calls = {'torch': run_torch}
  for layout in on:
    run_jax(NEW_TOKENS, layout), run_jax(1, layout)
    calls[layout] = lambda layout=layout: run_jax(NEW_TOKENS, layout)
    calls[f'{layout}, 1 token'] = lambda layout=layout: run_jax(1, layout)
  times = time_interleaved(calls, runs=args.runs)
  for k, v in times.items():
    print(f'[{name}] {k:20s} ' + ' '.join(f'{x:.2f}' for x in v), flush=True)
  med = {k: statistics.median(v) for k, v in times.items()}
  return DecodeResult(name, {k: med[k] for k in on}, med['torch'],
                      {k: med[f'{k}, 1 token'] for k in on}, compile_s, diff)


# ----------------------------------------------------------------------------- prefill table


def bench_prefill(name: str, args) -> tuple[float, float]:
  """Median seconds of shared and naive prefill calls (max_new_tokens=1)."""
  cfg = model_config(name)
  params = transformer.init_params(cfg, jax.random.key(0))
  tokens = np.random.default_rng(2).integers(1, cfg.vocab_size, (PROMPTS, PREFILL_LEN))
  shared = Prompts(tokens_BxP=jnp.asarray(tokens, jnp.int32),
                   mask_BxP=jnp.ones(tokens.shape, bool))
  naive = Prompts(tokens_BxP=jnp.repeat(shared.tokens_BxP, PREFILL_GROUP, axis=0),
                  mask_BxP=jnp.repeat(shared.mask_BxP, PREFILL_GROUP, axis=0))

  # On every device: one single-threaded device would make prefill's large matmuls serial.
  layout = list(layouts(cfg, params).values())[-1]

  def run(prompts, group_size):
    return generate_on(layout, prompts, cfg=cfg, group_size=group_size, max_new_tokens=1,
                       temperature=1.0, rng=jax.random.key(0))

  # Same key and rows: sharing must not change the sampled token or its log-prob.
  a, b = run(shared, PREFILL_GROUP), run(naive, 1)
  np.testing.assert_array_equal(a.tokens_NxL, b.tokens_NxL)
  np.testing.assert_allclose(a.logprobs_NxL, b.logprobs_NxL, atol=1e-4)
  times = time_interleaved({'shared': lambda: run(shared, PREFILL_GROUP),
                            'naive': lambda: run(naive, 1)}, runs=args.prefill_runs, warmup=0)
  for k, v in times.items():
    print(f'[{name}] prefill {k:6s} ' + ' '.join(f'{x:.2f}' for x in v), flush=True)
  return statistics.median(times['shared']), statistics.median(times['naive'])


# ----------------------------------------------------------------------------- report


def print_report(decode, prefill, rates, bandwidth, args):
  load = ' '.join(f'{x:.1f}' for x in os.getloadavg())
  print(f'\nload average {load} on {os.cpu_count()} cores; threads {args.threads} (torch '
        f'threads, and the cores {sorted(os.sched_getaffinity(0))} XLA may use), '
        f'OMP_WAIT_POLICY={os.environ.get("OMP_WAIT_POLICY")}; '
        f'XLA_FLAGS={os.environ.get("XLA_FLAGS", "")!r}')
  print('f32 matmul GFLOP/s: ' + ', '.join(f'{k} {v:.0f}' for k, v in rates.items()))
  print('read bandwidth: ' + ', '.join(f'{k} {v:.1f}' for k, v in bandwidth.items()))
  peak, bw = max(rates.values()), max(bandwidth.values())
  rows = PROMPTS * GROUP
  if decode:
    print(f'\ndecode: {PROMPTS} prompts x {PROMPT_LEN} tokens, G={GROUP} ({rows} rows), '
          f'{NEW_TOKENS} new tokens, median of {args.runs} after a warm-up (whole calls)')
    names = list(decode[0].jax_s)
    header = (f'{"config":<7} ' + ' '.join(f'{"rlreason " + k:>20}' for k in names) +
              f' {"transformers":>12} {"speedup":>8} {"compile s":>9} {"ms/step":>8} '
              f'{"FLOP floor":>10} {"mem floor":>9}')
    print(header)
    print('-' * len(header))
    for r in decode:
      cfg = model_config(r.config)
      w = matmul_params(cfg)
      flop_floor = 2 * w * rows / (peak * 1e9)
      # K and V of every layer, at the average number of slots a row needs over the steps:
      # its sampled tokens so far, and the prompt's read once per group of G rows.
      slots = PROMPT_LEN / GROUP + (NEW_TOKENS + 1) / 2
      kv_bytes = 2 * cfg.num_layers * rows * slots * cfg.num_kv_heads * cfg.head_dim * 4
      mem_floor = (4 * w + kv_bytes) / (bw * 1e9)
      print(f'{r.config:<7} ' + ' '.join(f'{rows * NEW_TOKENS / r.jax_s[k]:>20.0f}'
                                          for k in names) +
            f' {rows * NEW_TOKENS / r.torch_s:>12.0f} {r.speedup:>7.2f}x {r.compile_s:>9.1f} '
            f'{r.step_s * 1e3:>8.2f} {flop_floor * 1e3:>8.2f}ms {mem_floor * 1e3:>7.2f}ms')
    print('tokens/s; speedup and ms/step are for the faster rlreason layout of each config; '
          'ms/step = decode time per step, (t(128) - t(1)) / 127; floors per step: '
          f'FLOPs at {peak:.0f} GFLOP/s, weights + average K/V bytes at {bw:.1f} GB/s.')
  if prefill:
    print(f'\nprefill: {PROMPTS} prompts x {PREFILL_LEN} tokens, G={PREFILL_GROUP}, whole '
          f'generate calls with max_new_tokens=1, median of {args.prefill_runs}')
    header = f'{"config":<7} {"shared s":>9} {"naive s":>9} {"speedup":>8}'
    print(header)
    print('-' * len(header))
    for name, (shared_s, naive_s) in prefill.items():
      print(f'{name:<7} {shared_s:>9.3f} {naive_s:>9.3f} {naive_s / shared_s:>7.2f}x')
  for r in decode:
    if r.config == 'mid':
      print(f'mid: the faster layout is {r.best}')
      print(f'sampler_speedup_vs_transformers={r.speedup:.3f}')


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  parser.add_argument('--configs', default='small,mid')
  parser.add_argument('--runs', type=int, default=5)
  parser.add_argument('--prefill_configs', default=None,
                      help='configs for the prefill table (default: --configs; "" skips it)')
  parser.add_argument('--prefill_runs', type=int, default=3)
  parser.add_argument('--skip_decode', action='store_true')
  parser.add_argument('--torch_omp_wait', default='PASSIVE', choices=('PASSIVE', 'ACTIVE'))
  parser.add_argument('--cpu_devices', type=int, default=os.cpu_count(),
                      help='sharding.split_cpu_host(N): the CPU as N single-threaded devices, '
                      'rlreason timed on one of them and data-parallel on all (1: XLA default)')
  parser.add_argument('--threads', type=int, default=os.cpu_count(),
                      help='cores for the process: torch threads and the cores XLA may use '
                      '(forward.limit_threads)')
  args = parser.parse_args(argv)
  from experiments.bench import forward  # pylint: disable=g-import-not-at-top
  forward.limit_threads(args.threads)  # Before torch loads OpenMP and JAX creates its backend.
  if args.cpu_devices > 1:
    sharding.split_cpu_host(args.cpu_devices)

  # Read by OpenMP when torch first loads it, so it must be set before the first import.
  os.environ['OMP_WAIT_POLICY'] = args.torch_omp_wait
  import torch  # pylint: disable=g-import-not-at-top
  torch.set_num_threads(args.threads)

  names = [c for c in args.configs.split(',') if c]
  prefill_names = names if args.prefill_configs is None else [
      c for c in args.prefill_configs.split(',') if c]
  rates, bandwidth = machine_rates(names)
  decode = [] if args.skip_decode else [bench_decode(name, args) for name in names]
  prefill = {name: bench_prefill(name, args) for name in prefill_names}
  print_report(decode, prefill, rates, bandwidth, args)


if __name__ == '__main__':
  main()
