"""Times rlreason's grouped sampler against transformers' generate on CPU.

  python -m experiments.bench.sampler --configs small,mid --runs 5

Two tables from one run, on the forward benchmark's small and mid configs (Qwen2-style: qkv
bias, untied embeddings, fp32):

  decode   8 distinct 64-token prompts, G = 8 samples each (64 rows), exactly 128 new tokens
           (no stop tokens), temperature 1, no top-k/top-p. Six cells on the same random
           weights, taking turns call by call: rlreason's `sampler.generate` fp32-exact and
           with sample_dtype='bfloat16', each on one device and data-parallel on all, and
           transformers' `generate` (torch, KV cache, do_sample, num_return_sequences=8,
           min_new_tokens = max_new_tokens = 128) with the model loaded in fp32 and in bf16
           (weights exported with `weights.save`, read back with `from_pretrained`; the fp32
           prompt logits are checked to agree first). Whole calls, prefill included:
           tokens/s = 64 * 128 / median wall time of `--runs` calls after one warm-up.
           Also the bf16 mode's log-prob gap: its recorded log-probs against an fp32
           teacher-forced recompute of the same tokens (what the learner computes).
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

Attention FLOPs, norms, RoPE and sampling are left out of both floors, which are for fp32.

Final lines, for the mid config: sampler_fp32_speedup_vs_transformers_fp32= (rlreason's exact
mode against transformers fp32) and, last, sampler_speedup_vs_transformers= (rlreason's fastest
cell against transformers' fastest, whatever their dtypes).

bf16 on this CPU: XLA:CPU (jax 0.10.2) computes every bf16 dot in f32: the compiled sampler
converts the bf16 weights back to f32 once, outside the decode loops, and the bf16 KV cache to
f32 at every step, so the bf16 mode cannot beat the fp32 one here (its matmuls are the same
f32 matmuls); it is for TPUs and GPUs. torch runs bf16 matmuls natively (AMX-bf16).

The machine may be shared: the two frameworks take turns call by call, so load from other
processes falls on both alike, and the load average is printed with the tables. torch's
OpenMP workers spin-wait for each other by default, which makes torch many times slower as
soon as other processes hold the cores (measured here: 13x at a load average of 14 on 2
cores); `--torch_omp_wait PASSIVE` (the default) avoids that, `ACTIVE` is torch's default.
"""

import argparse
import contextlib
import dataclasses
import functools
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

from rlreason import host_malloc  # noqa: E402
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


def machine_rates(cfg_names):
  """Best f32 matmul GFLOP/s (jax, torch, decode-step shapes), read bandwidth in GB/s, and
  the decode-step matmul's GFLOP/s in bf16 (jax, torch) and f32 (torch), reported only."""
  import torch  # pylint: disable=g-import-not-at-top
  rng = np.random.default_rng(0)
  rates, bf16_rates = {}, {}
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
    # The same in bf16, both frameworks (XLA:CPU computes a bf16 dot in f32, see the docstring).
    xb16, wb16 = x.astype(jnp.bfloat16), w.astype(jnp.bfloat16)
    tx, tw = (torch.from_numpy(np.array(v)) for v in (x, w))  # Writable copies.
    tx16, tw16 = tx.to(torch.bfloat16), tw.to(torch.bfloat16)
    chain(xb16, wb16).block_until_ready()
    t = time_interleaved({'jax': lambda: chain(xb16, wb16).block_until_ready(),
                          'torch': lambda: [tx @ tw for _ in range(20)],
                          'torch bf16': lambda: [tx16 @ tw16 for _ in range(20)]}, runs=5)
    bf16_rates[f'jax bf16 {rows}x{d}x{f}'] = 20 * 2 * rows * d * f / min(t['jax']) / 1e9
    bf16_rates[f'torch {rows}x{d}x{f}'] = 20 * 2 * rows * d * f / min(t['torch']) / 1e9
    bf16_rates[f'torch bf16 {rows}x{d}x{f}'] = (20 * 2 * rows * d * f / min(t['torch bf16'])
                                                / 1e9)
  big = np.ones(2**28, np.float32)  # 1 GiB: larger than the last-level cache.
  big_jax = jnp.asarray(big)
  total = jax.jit(jnp.sum).lower(big_jax).compile()
  t = time_interleaved({'np': big.sum, 'jax': lambda: total(big_jax).block_until_ready()},
                       runs=3)
  bandwidth = {f'{k} sum GB/s': big.nbytes / min(v) / 1e9 for k, v in t.items()}
  return rates, bandwidth, bf16_rates


# ----------------------------------------------------------------------------- decode table


@dataclasses.dataclass
class DecodeResult:
  """Median seconds a whole call of each cell, e.g. 'rlreason fp32, 1 device' or
  'transformers bf16'; rlreason cells also have their 1-token call (prefill and one token)."""
  config: str
  call_s: dict[str, float]
  first_s: dict[str, float]
  compile_s: float
  logit_diff: float
  gap: dict[str, float]  # The bf16 mode's recorded log-probs against the fp32 recompute.

  def best(self, prefix: str) -> str:
    cells = [k for k in self.call_s if k.startswith(prefix)]
    return min(cells, key=self.call_s.get)

  def speedup(self, ours: str = 'rlreason', theirs: str = 'transformers') -> float:
    return self.call_s[self.best(theirs)] / self.call_s[self.best(ours)]

  def step_s(self, cell: str) -> float:
    return (self.call_s[cell] - self.first_s[cell]) / (NEW_TOKENS - 1)


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


def logprob_gap(params, cfg, rollout) -> dict[str, float]:
  """Recorded log-probs against the fp32 teacher-forced recompute of the same tokens (what
  the learner computes), over sampled tokens: mean |gap| and mean behaviour minus learner."""
  tokens, mask = sampler.sequences(rollout)
  logits = transformer.apply(params, tokens, cfg=cfg, mask_NxT=mask)[0]  # Temperature 1.
  lp = jnp.take_along_axis(jax.nn.log_softmax(logits[:, PROMPT_LEN - 1:-1], -1),
                           rollout.tokens_NxL[..., None], -1)[..., 0]
  sampled = np.asarray(rollout.mask_NxL)
  gap = (np.asarray(rollout.logprobs_NxL) - np.asarray(lp))[sampled]
  return {'abs': float(np.abs(gap).mean()), 'mean': float(gap.mean()),
          'max_abs': float(np.abs(gap).max())}


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
  nets = {}
  with tempfile.TemporaryDirectory() as tmp:
    weights.save(tmp, cfg, params)
    for dtype in ('fp32', 'bf16'):
      torch_dtype = torch.float32 if dtype == 'fp32' else torch.bfloat16
      nets[dtype] = transformers.AutoModelForCausalLM.from_pretrained(
          tmp, dtype=torch_dtype).eval()

  tokens = np.random.default_rng(1).integers(1, cfg.vocab_size, (PROMPTS, PROMPT_LEN))
  prompts = Prompts(tokens_BxP=jnp.asarray(tokens, jnp.int32),
                    mask_BxP=jnp.ones(tokens.shape, bool))
  tokens_torch = torch.from_numpy(tokens)
  logits_jax = np.asarray(transformer.apply(params, prompts.tokens_BxP, cfg=cfg)[0])
  with torch.no_grad():
    logits_torch = {k: net(input_ids=tokens_torch).logits.float().numpy()
                    for k, net in nets.items()}
  diff = float(np.abs(logits_torch['fp32'] - logits_jax).max())
  print(f'[{name}] prompt logits |jax - torch| max = {diff:.1e} (fp32); torch bf16 vs fp32 '
        f'{np.abs(logits_torch["bf16"] - logits_jax).max():.1e}', flush=True)
  if diff > 1e-3:
    raise SystemExit(f'[{name}] the exported weights do not reproduce the logits')

  on = layouts(cfg, params)
  modes = {'fp32': None, 'bf16': 'bfloat16'}

  def run_jax(new_tokens, layout, mode, seed=[0]):  # pylint: disable=dangerous-default-value
    seed[0] += 1
    return generate_on(on[layout], prompts, cfg=cfg, group_size=GROUP,
                       max_new_tokens=new_tokens, temperature=1.0, rng=jax.random.key(seed[0]),
                       sample_dtype=modes[mode])

  @torch.no_grad()
  def run_torch(dtype):
    out = nets[dtype].generate(
        tokens_torch, attention_mask=torch.ones_like(tokens_torch), do_sample=True,
        num_return_sequences=GROUP, max_new_tokens=NEW_TOKENS, min_new_tokens=NEW_TOKENS,
        temperature=1.0, top_k=0, top_p=1.0, use_cache=True, pad_token_id=0, eos_token_id=None)
    assert out.shape == (PROMPTS * GROUP, PROMPT_LEN + NEW_TOKENS), out.shape
    return out

  start = time.perf_counter()
  out = run_jax(NEW_TOKENS, '1 device', 'fp32')
  compile_s = time.perf_counter() - start
  assert out.tokens_NxL.shape == (PROMPTS * GROUP, NEW_TOKENS) and bool(out.mask_NxL.all())
  print(f'[{name}] rlreason first call (compile + run) {compile_s:.1f}s', flush=True)
  gap = logprob_gap(params, cfg, run_jax(NEW_TOKENS, '1 device', 'bf16'))
  fp32_gap = logprob_gap(params, cfg, out)
  print(f'[{name}] recorded minus fp32 teacher-forced log-prob over sampled tokens: bf16 mode '
        f'mean |gap| {gap["abs"]:.2e}, mean {gap["mean"]:+.2e}, max |gap| {gap["max_abs"]:.2e}; '
        f'fp32 mode mean |gap| {fp32_gap["abs"]:.1e}', flush=True)
  calls = {}
  for dtype in nets:
    calls[f'transformers {dtype}'] = functools.partial(run_torch, dtype)
  for mode in modes:
    for layout in on:
      cell = f'rlreason {mode}, {layout}'
      run_jax(NEW_TOKENS, layout, mode), run_jax(1, layout, mode)  # Compile outside the timing.
      calls[cell] = functools.partial(run_jax, NEW_TOKENS, layout, mode)
      calls[f'{cell}, 1 token'] = functools.partial(run_jax, 1, layout, mode)
  times = time_interleaved(calls, runs=args.runs)
  for k, v in times.items():
    print(f'[{name}] {k:32s} ' + ' '.join(f'{x:.2f}' for x in v), flush=True)
  med = {k: statistics.median(v) for k, v in times.items()}
  first = {k[:-len(', 1 token')]: v for k, v in med.items() if k.endswith(', 1 token')}
  return DecodeResult(name, {k: v for k, v in med.items() if not k.endswith(', 1 token')},
                      first, compile_s, diff, gap)


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


def print_report(decode, prefill, rates, bandwidth, bf16_rates, args):
  load = ' '.join(f'{x:.1f}' for x in os.getloadavg())
  print(f'\nload average {load} on {os.cpu_count()} cores; threads {args.threads} (torch '
        f'threads, and the cores {sorted(os.sched_getaffinity(0))} XLA may use), '
        f'OMP_WAIT_POLICY={os.environ.get("OMP_WAIT_POLICY")}; '
        f'XLA_FLAGS={os.environ.get("XLA_FLAGS", "")!r}'
        f', GLIBC_TUNABLES={os.environ.get("GLIBC_TUNABLES", "")!r}')
  print('f32 matmul GFLOP/s: ' + ', '.join(f'{k} {v:.0f}' for k, v in rates.items()))
  print('decode-step matmul GFLOP/s (not in the floors): '
        + ', '.join(f'{k} {v:.0f}' for k, v in bf16_rates.items()))
  print('read bandwidth: ' + ', '.join(f'{k} {v:.1f}' for k, v in bandwidth.items()))
  peak, bw = max(rates.values()), max(bandwidth.values())
  rows = PROMPTS * GROUP
  if decode:
    print(f'\ndecode: {PROMPTS} prompts x {PROMPT_LEN} tokens, G={GROUP} ({rows} rows), '
          f'{NEW_TOKENS} new tokens, median of {args.runs} after a warm-up (whole calls, '
          'every cell taking turns call by call)')
    header = f'{"config":<7} {"cell":<28} {"tokens/s":>9} {"s/call":>7} {"ms/step":>8}'
    print(header)
    print('-' * len(header))
    for r in decode:
      for cell, t in r.call_s.items():
        step = f'{r.step_s(cell) * 1e3:>8.2f}' if cell in r.first_s else f'{"":>8}'
        print(f'{r.config:<7} {cell:<28} {rows * NEW_TOKENS / t:>9.0f} {t:>7.2f} {step}')
    print('ms/step = decode time per step, (t(128) - t(1)) / 127 (rlreason only).')
    print(f'\n{"config":<7} {"best/best":>9} {"fp32/fp32":>9} {"bf16/fp32 step":>14} '
          f'{"compile s":>9} {"FLOP floor":>10} {"mem floor":>9} {"bf16 |gap|":>10} '
          f'{"bf16 gap":>9}')
    for r in decode:
      cfg = model_config(r.config)
      w = matmul_params(cfg)
      flop_floor = 2 * w * rows / (peak * 1e9)
      # K and V of every layer, at the average number of slots a row needs over the steps:
      # its sampled tokens so far, and the prompt's read once per group of G rows.
      slots = PROMPT_LEN / GROUP + (NEW_TOKENS + 1) / 2
      kv_bytes = 2 * cfg.num_layers * rows * slots * cfg.num_kv_heads * cfg.head_dim * 4
      mem_floor = (4 * w + kv_bytes) / (bw * 1e9)
      step_ratio = (r.step_s(r.best('rlreason bf16')) / r.step_s(r.best('rlreason fp32')))
      print(f'{r.config:<7} {r.speedup():>8.2f}x '
            f'{r.speedup("rlreason fp32", "transformers fp32"):>8.2f}x {step_ratio:>14.2f} '
            f'{r.compile_s:>9.1f} {flop_floor * 1e3:>8.2f}ms {mem_floor * 1e3:>7.2f}ms '
            f'{r.gap["abs"]:>10.2e} {r.gap["mean"]:>+9.2e}')
    print('best/best: the fastest transformers cell over the fastest rlreason cell; fp32/fp32: '
          'the same in fp32 only (rlreason\'s exact mode); bf16/fp32 step: rlreason\'s best '
          'bf16 ms/step over its best fp32 ms/step; floors per fp32 step: FLOPs at '
          f'{peak:.0f} GFLOP/s, weights + average K/V bytes at {bw:.1f} GB/s; bf16 |gap|, gap: '
          'mean |recorded - fp32 teacher-forced| and mean (recorded - fp32 teacher-forced) '
          'log-prob of the bf16 mode over its sampled tokens.')
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
      print(f'mid: rlreason\'s best cell is {r.best("rlreason")}, transformers\' '
            f'{r.best("transformers")}')
      print('sampler_fp32_speedup_vs_transformers_fp32='
            f'{r.speedup("rlreason fp32", "transformers fp32"):.3f}')
      print(f'sampler_speedup_vs_transformers={r.speedup():.3f}')


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

  print('load average at start ' + ' '.join(f'{x:.1f}' for x in os.getloadavg()), flush=True)
  names = [c for c in args.configs.split(',') if c]
  prefill_names = names if args.prefill_configs is None else [
      c for c in args.prefill_configs.split(',') if c]
  rates, bandwidth, bf16_rates = machine_rates(names)
  decode = [] if args.skip_decode else [bench_decode(name, args) for name in names]
  prefill = {name: bench_prefill(name, args) for name in prefill_names}
  print_report(decode, prefill, rates, bandwidth, bf16_rates, args)


if __name__ == '__main__':
  host_malloc.reexec()  # Once, with GLIBC_TUNABLES set: glibc reads it only at start-up.
  main()
