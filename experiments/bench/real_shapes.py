"""One complete RL step at Qwen2.5-0.5B's real shapes on this CPU, timed and measured by phase.

  python -m experiments.bench.real_shapes            # Qwen2.5-0.5B shapes (see below)
  python -m experiments.bench.real_shapes --smoke    # 2 layers of d=64: checks the code path

A random-weight checkpoint with Qwen2.5-0.5B's config (hidden 896, 24 layers, 14 heads, 2 KV
heads of 64, MLP 4864, vocab 151,936, tied embeddings, qkv bias, rope_theta 1e6, RMSNorm eps
1e-6) is built by transformers (`Qwen2ForCausalLM(config).save_pretrained`, bf16 on disk as
Qwen ships it) in a child process, so torch never touches this process's RSS. The step then
runs through the project's own pieces: experiments/grpo_gsm8k.py's qwen2.5-0.5b config with
model.path = that checkpoint (weights.load, params cast to fp32), the real Qwen2.5 tokenizer
and its chat template (the user turn rendered by tokenizer.apply_chat_template, default
system prompt included) from ../shared/data/qwen_tokenizer, 4 GSM8K train prompts x G = 4 x
128 new tokens, the math verifier pool, old log-probs, one update (minibatches=1, the config's
remat='full'): train.build, Run.restore_or_init(release_init_params=True), train.rl_step.

Changed from the config, and why: fp32 compute (`--compute_dtype`; XLA:CPU computes bf16 dots
in f32 with conversions, sampler.py), micro_batches=4 (one group of 4 rows each: the least
activation memory; the config's 2 needs ~4 GB more), XLA_FLAGS gets
`--xla_cpu_enable_concurrency_optimized_scheduler=false` (`--xla_flags`; see below), 2
verifier workers (2 cores), no eval or checkpoints.

Phases: load (train.build: weights, tokenizer, data, verifier pool), init (the TrainState:
takes over the loaded params' buffers, AdamW moments), compile (the sampler's, from
jax.monitoring's compile events; old log-probs and train step compiled ahead of time here, so
their memory_analysis is known), sample, verify, old log-probs, update (each net of its
compile). tokens/s counts sampled tokens for sample and verify, and all N x (P + L) positions
for old log-probs and update.
RSS is polled every 20 ms (per-phase peaks), and the run stops (status 3) past --rss_limit_gb
or when the machine has under 512 MiB available (others' work on a shared machine); ru_maxrss
of the process and of its children (the checkpoint builder, the verifier workers: the largest
single child) are printed apart.
The estimate is rl/memory.step_estimate with the baseline measured after imports and the
JAX backend's start, with remat_hoisted on CPU (rl/memory.py); the last line is
real_shapes_rss_over_estimate = ru_maxrss / estimate.

Measured on the 2-core, 24 GB shared CPU VM (2026-12-02), first attempt (load average 8-18,
`--micro_batches 4`, before the changes below): no complete step. Peak RSS by phase: load
2453 MiB, init 8082 (the TrainState copied Run.init_params, which stayed alive: 2 GB), sample
+ verify 9545, old log-probs 10620 (XLA temp 1761 MiB); the train step compiled in 85 s with
XLA arguments 5654, aliased 5654, temp 9678 MiB, and the RSS guard stopped it at 15370 MiB.
With --micro_batches 2 the kernel's OOM killer ended it at 18.1 GB anonymous RSS.

Where the train step's temp went (compiled on abstract inputs at these shapes, N=16 rows of
T=384, HLO dumps): remat='full' hardly bounded it. XLA:CPU schedules each layer's remat
recomputation in the forward pass next to the layer itself (nothing ties it to the cotangent
that needs it; the optimisation barriers are gone after optimisation) and keeps gate_up and
the MLP hidden of every layer alive until the backward. Temp, MiB: micro_batches=2 14545
(remat 'none' 13615 with the memory-minimising scheduler), micro_batches=4 9678; with
`--xla_cpu_enable_concurrency_optimized_scheduler=false` (only 12 of 24 layers hoisted)
11618 and 7443 (4 layers: 3806 -> 2356). jit's or compile()'s compiler_options with that
option left the temp at 3806 (4 layers): only XLA_FLAGS reaches the scheduler. The rest is
the state-sized gradient and its running sum (2 x 1885 MiB) and three VxD fp32 buffers of the
tied embedding (the transposed copy the log-prob chunks read, token_stats' dW accumulator, the
gather's scatter gradient: 3 x 519 MiB). rl/memory.step_estimate(remat_hoisted=True) models
this: update temp 8022 MiB against 7443 (1.08) and 11141 against 11618 (0.96). Optimization
barriers cannot fix it (XLA:CPU's cse_barrier_expander removes them before scheduling), so
remat='full' is now layers.remat_after_cotangent, a custom VJP whose recomputation reads the
cotangent and whose input cotangent reads the weight gradients through arithmetic zeros;
that jax.checkpoint is remat='full_checkpoint'. Compiled temp at these widths, 16 x 384,
micro_batches=4, 4 layers (default / memory-minimising scheduler, MiB): 'none' 3074 / 2817,
'full_checkpoint' 2963 / 2172, 'full' 2193 / 2038; 24 layers, 'full' 4906 / 5310 (was
9678 / 7443; micro_batches=2: 6067 was 11618, memory-minimising) (rl/memory.py). With it the
default scheduler gives the train step the smaller temp; the flag still shrinks old
log-probs. The complete step below ran before this change, with remat='full_checkpoint''s
behaviour (not rerun).

Then (Run.restore_or_init(release_init_params=True), the scheduler flag, micro_batches=4),
2026-12-02, load average 6-9, others holding 8-17 GB of the 24: one complete step, final line
real_shapes_rss_over_estimate=1.073. Peak RSS by phase, MiB (estimate = baseline + state +
phase, ratio): load 2468, init 6242 (was 8082), sample + verify 6891 (6273, 1.10), old
log-probs 7459 (6640, 1.12; XLA temp 576 MiB, was 1761 under the default scheduler), update
15110 (14088, 1.07; XLA temp 7443 against the estimate's 8022). Seconds (tokens/s): checkpoint
(child) 22.7, load 11.1, init 3.7, compile 80.5 (sampler 39.0, old log-probs 9.0, train step
32.4), sample 97.4 (21.0 tokens/s, 2048 tokens), verify 0.0, old log-probs 98.2 (62.5
positions/s of 16 x 384), update 221.0 (27.8); rl_step 504 s; the process 421 s user + 20 s
system CPU, 9:13 wall. Random weights: reward 0 for all 16 rows, so the advantages, loss and
gradient are all 0 (the update computes them all the same). Four earlier runs of this
version were stopped by the MemAvailable guard (twice in sample + verify at 6.4-6.6 GB, twice
in the update at 14941 and 10717 MiB) while other processes held 8-17 GB. The peak is within
0.25 GB of the default --rss_limit_gb of 15 then, now 16.
"""

import argparse
import contextlib
import dataclasses
import os
import resource
import subprocess
import sys
import tempfile
import threading
import time

if __package__ in (None, ''):  # Run as a script: make `rlreason` importable.
  sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

import jax  # noqa: E402
import numpy as np  # noqa: E402

from experiments import grpo_gsm8k  # noqa: E402
from rlreason import host_malloc  # noqa: E402
from rlreason.model import tokenizer as tokenizer_lib  # noqa: E402
from rlreason.rl import memory  # noqa: E402
from rlreason.rl import train  # noqa: E402

QWEN25_05B = dict(hidden_size=896, num_hidden_layers=24, num_attention_heads=14,
                  num_key_value_heads=2, head_dim=64, intermediate_size=4864, vocab_size=151936,
                  tie_word_embeddings=True, rope_theta=1_000_000.0, rms_norm_eps=1e-6,
                  max_position_embeddings=32768, hidden_act='silu')
SMOKE = dict(QWEN25_05B, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
             num_key_value_heads=2, head_dim=16, intermediate_size=128)
MiB = 2 ** 20
# XLA:CPU's default (concurrency-optimised) scheduler runs remat's recomputations during the
# forward pass and keeps them alive; the memory-minimising one does so for fewer layers.
# Only XLA_FLAGS reaches it (jit's compiler_options did not change the schedule).
MEMORY_SCHEDULE = '--xla_cpu_enable_concurrency_optimized_scheduler=false'

_BUILD = '''
import sys, torch, transformers
torch.manual_seed(0)
torch.set_default_dtype(torch.bfloat16)  # Built in bf16: the child needs 1 GB, not 2.
config = transformers.Qwen2Config(**{kwargs!r}, dtype='bfloat16')
transformers.Qwen2ForCausalLM(config).save_pretrained(sys.argv[1])
'''


class RssMonitor:
  """Polls this process's resident set; `phase(name)` records the peak while it runs."""

  def __init__(self, interval_s: float = 0.02, limit_bytes: int = 0):
    self.peaks, self.current, self.interval_s, self.limit = {}, None, interval_s, limit_bytes
    self._stop = threading.Event()
    self._thread = threading.Thread(target=self._run, daemon=True)
    self._thread.start()

  @staticmethod
  def rss() -> int:
    with open('/proc/self/statm') as f:
      return int(f.read().split()[1]) * os.sysconf('SC_PAGE_SIZE')

  @staticmethod
  def available() -> int:
    """The machine's MemAvailable (bytes): what others on a shared machine leave us."""
    with open('/proc/meminfo') as f:
      return next(int(line.split()[1]) * 1024 for line in f if line.startswith('MemAvailable'))

  def _run(self):
    while not self._stop.wait(self.interval_s):
      rss = self.rss()
      if self.current is not None:
        self.peaks[self.current] = max(self.peaks.get(self.current, 0), rss)
      # Stop before the kernel's OOM killer picks (this process or another one).
      low = self.available() < 2 ** 29
      if (self.limit and rss > self.limit) or low:
        why = 'with < 512 MiB available on the machine' if low else 'over --rss_limit_gb'
        print(f'RSS {rss / MiB:.0f} MiB {why} in phase {self.current}; peaks so far (MiB): '
              f'{ {k: round(v / MiB) for k, v in self.peaks.items()} }', flush=True)
        os._exit(3)

  @contextlib.contextmanager
  def phase(self, name):
    self.current = name
    self.peaks[name] = max(self.peaks.get(name, 0), self.rss())
    try:
      yield
    finally:
      self.peaks[name] = max(self.peaks[name], self.rss())
      self.current = None
      print(f'[{name}] peak RSS {self.peaks[name] / MiB:.0f} MiB', flush=True)

  def close(self):
    self._stop.set()
    self._thread.join()


class CompileClock:
  """Seconds JAX spends tracing, lowering and compiling, from jax.monitoring's events."""
  EVENTS = ('/jax/core/compile/jaxpr_trace_duration',
            '/jax/core/compile/jaxpr_to_mlir_module_duration',
            '/jax/core/compile/backend_compile_duration')

  def __init__(self):
    self.seconds = 0.0
    jax.monitoring.register_event_duration_secs_listener(self._listen)

  def _listen(self, event, duration, **_):
    if event in self.EVENTS:
      self.seconds += duration


class Timed:
  """A jitted function compiled ahead of time on its first call (timed apart, memory
  analysed), then run and waited for; `seconds` is execution only."""

  def __init__(self, jitted, compile_clock, static_tail=0, **keywords):
    self.jitted, self.static_tail, self.keywords = jitted, static_tail, keywords
    self.compiled, self.compile_s, self.seconds, self.calls = None, 0.0, 0.0, 0
    self.clock = compile_clock

  def __call__(self, *args):
    dynamic = args[:len(args) - self.static_tail]  # Compiled calls take no static args.
    if self.compiled is None:
      start, before = time.perf_counter(), self.clock.seconds
      self.compiled = self.jitted.lower(*args, **self.keywords).compile()
      self.compile_s = time.perf_counter() - start
      self.clock.seconds = before  # Counted here, not as the enclosing phase's compile.
      a = self.compiled.memory_analysis()
      print(f'compiled in {self.compile_s:.1f}s: XLA arguments {a.argument_size_in_bytes / MiB:.0f}, '
            f'outputs {a.output_size_in_bytes / MiB:.0f}, aliased {a.alias_size_in_bytes / MiB:.0f}, '
            f'temp {a.temp_size_in_bytes / MiB:.0f} MiB; RSS now {RssMonitor.rss() / MiB:.0f} MiB',
            flush=True)
    start = time.perf_counter()
    out = jax.block_until_ready(self.compiled(*dynamic, **self.keywords))
    self.seconds += time.perf_counter() - start
    self.calls += 1
    return out


def build_checkpoint(path: str, arch: dict) -> float:
  """Qwen2ForCausalLM(config).save_pretrained(path) in a child process: its seconds."""
  start = time.perf_counter()
  subprocess.run([sys.executable, '-c', _BUILD.format(kwargs=arch), path], check=True,
                 env={**os.environ, 'CUDA_VISIBLE_DEVICES': ''})
  return time.perf_counter() - start


def make_config(args, model_path: str):
  c = grpo_gsm8k.get_config('qwen2.5-0.5b')
  shared = grpo_gsm8k._SHARED  # pylint: disable=protected-access
  c.model.path = model_path
  c.model.compute_dtype = args.compute_dtype
  c.tokenizer.path = str(shared / 'qwen_tokenizer')
  c.data.path = str(shared / 'gsm8k' / 'train.jsonl')
  c.data.eval_path = ''
  tok = tokenizer_lib.load(c.tokenizer.path)
  user = ('{prompt}\nReason step by step, then give the final answer after "####".')
  c.data.prompt_template = tok.apply_chat_template([{'role': 'user', 'content': user}],
                                                   add_generation_prompt=True)
  c.rl.steps, c.rl.prompts_per_step, c.rl.group_size = 1, args.prompts, args.group
  c.rl.max_new_tokens, c.rl.minibatches = args.new_tokens, 1
  c.rl.micro_batches = args.micro_batches
  c.verifier.workers = 2
  c.eval.every, c.checkpoint.every = 0, 0
  return c


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  parser.add_argument('--smoke', action='store_true', help='2 layers of d=64, 8 new tokens')
  parser.add_argument('--compute_dtype', default='float32', choices=('float32', 'bfloat16'))
  parser.add_argument('--prompts', type=int, default=4)
  parser.add_argument('--group', type=int, default=4)
  parser.add_argument('--new_tokens', type=int, default=128)
  parser.add_argument('--micro_batches', type=int, default=4)
  parser.add_argument('--xla_flags', default=MEMORY_SCHEDULE,
                      help='appended to XLA_FLAGS before the backend starts')
  parser.add_argument('--rss_limit_gb', type=float, default=16.0,
                      help='exit (status 3) when RSS passes this, before the OOM killer does')
  args = parser.parse_args(argv)
  if args.smoke:
    args.prompts, args.group, args.new_tokens, args.micro_batches = 2, 2, 8, 1
  arch = SMOKE if args.smoke else QWEN25_05B

  # XLA reads XLA_FLAGS once, when the first computation creates the backend.
  if args.xla_flags:
    os.environ['XLA_FLAGS'] = f'{os.environ.get("XLA_FLAGS", "")} {args.xla_flags}'.strip()
  monitor = RssMonitor(limit_bytes=int(args.rss_limit_gb * 2 ** 30))
  clock = CompileClock()
  jax.devices()  # The backend's own memory belongs to the baseline.
  baseline = monitor.rss()
  seconds, tokens = {}, {}
  with tempfile.TemporaryDirectory() as tmp:
    ckpt, workdir = os.path.join(tmp, 'ckpt'), os.path.join(tmp, 'work')
    seconds['checkpoint (child)'] = build_checkpoint(ckpt, arch)
    disk = sum(os.path.getsize(os.path.join(ckpt, f)) for f in os.listdir(ckpt))
    children_after_build = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024
    config = make_config(args, ckpt)

    with monitor.phase('load'):
      start = time.perf_counter()
      run = train.build(config, workdir)
      seconds['load'] = time.perf_counter() - start
    with monitor.phase('init'):
      start = time.perf_counter()
      state, _ = run.restore_or_init(release_init_params=True)
      state = jax.block_until_ready(state)
      seconds['init'] = time.perf_counter() - start
    released = isinstance(run.init_params['embed'], jax.ShapeDtypeStruct)
    logprobs = Timed(run.logprobs, clock, static_tail=1)  # completion_len is static.
    stage = run.schedule.stage(1)  # The plain schedule's one stage holds the jitted step.
    step_timed = Timed(stage.train_step.func, clock, **stage.train_step.keywords)
    times, sample_compile, prompt_len = {}, 0.0, 0

    # Per-phase RSS: rl_step's phases, told apart by wrapping the pieces it calls.
    generate = train.sample_and_verify

    def sample_and_verify(*a, **kw):
      nonlocal sample_compile, prompt_len
      before = clock.seconds
      with monitor.phase('sample + verify'):
        rollout, scores = generate(*a, **kw)
      sample_compile = clock.seconds - before
      prompt_len = rollout.prompts.tokens_BxP.shape[1]
      return rollout, scores

    def wrap_phase(fn, name):
      def wrapped(*a):
        with monitor.phase(name):
          return fn(*a)
      return wrapped

    train.sample_and_verify = sample_and_verify
    run.logprobs = wrap_phase(logprobs, 'old log-probs')
    # rl_step updates through run.schedule.stage(step).train_step, not run.train_step.
    timed_stage = dataclasses.replace(stage, train_step=wrap_phase(step_timed, 'update'))
    run.schedule.stage = lambda _: timed_stage
    start = time.perf_counter()
    try:
      with jax.set_mesh(run.mesh):
        state, metrics = train.rl_step(run, state, 1, times)
      state = jax.block_until_ready(state)
    finally:
      train.sample_and_verify = generate
    step_s = time.perf_counter() - start
    run.close()
    children = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    monitor.close()

  cfg = run.cfg
  b, g, l = args.prompts, args.group, args.new_tokens
  n = b * g
  p = prompt_len
  t = p + l
  sampled = int(times.get('tokens/generate', 0))
  gen_s = times['time/generate_s'] - sample_compile
  compile_s = sample_compile + logprobs.compile_s + step_timed.compile_s
  seconds.update({
      'compile': compile_s, 'sample': gen_s, 'verify': times['time/verify_s'],
      'old log-probs': logprobs.seconds, 'update': step_timed.seconds})
  tokens.update({'sample': sampled, 'verify': sampled, 'old log-probs': n * t,
                 'update': n * t})

  print(f'\nmodel: {cfg.num_params() / 1e6:.1f}M params, d={cfg.hidden_size}, '
        f'{cfg.num_layers} layers, {cfg.num_heads}/{cfg.num_kv_heads} heads of {cfg.head_dim}, '
        f'F={cfg.intermediate_size}, V={cfg.vocab_size}, tied={cfg.tie_embeddings}, '
        f'rope_theta={cfg.rope_theta:g}, eps={cfg.rms_norm_eps:g}; params {cfg.param_dtype}, '
        f'compute {cfg.compute_dtype}, remat {cfg.remat}; checkpoint bf16 on disk '
        f'{disk / MiB:.0f} MiB')
  print(f'step: {b} GSM8K prompts (chat template, bucket P={p}) x G={g} x {l} new tokens '
        f'= {n} rows of T={t}; {sampled} tokens sampled; micro_batches={args.micro_batches}; '
        f'reward mean {float(metrics["train/reward"]):.3f}, loss {float(metrics["loss"]):.4g}, '
        f'grad_norm {float(metrics["grad_norm"]):.4g}; Run.init_params '
        f'{"released (donated to the TrainState)" if released else "kept"}; '
        f'XLA_FLAGS={os.environ.get("XLA_FLAGS", "")!r}'
        f', GLIBC_TUNABLES={os.environ.get("GLIBC_TUNABLES", "")!r}; '
        f'{jax.device_count()} device(s), '
        f'{os.cpu_count()} cores, '
        f'load average {" ".join(f"{x:.1f}" for x in os.getloadavg())}')
  print(f'\n{"phase":<20} {"seconds":>8} {"tokens":>7} {"tokens/s":>9} {"peak RSS MiB":>13}')
  rss_of = {'sample': 'sample + verify', 'verify': 'sample + verify'}
  for name, s in seconds.items():
    tok = tokens.get(name)
    rss = monitor.peaks.get(rss_of.get(name, name))
    print(f'{name:<20} {s:>8.1f} {tok if tok else "":>7} '
          f'{f"{tok / s:.1f}" if tok else "":>9} {f"{rss / MiB:.0f}" if rss else "":>13}')
  print(f'{"rl_step (all)":<20} {step_s:>8.1f}')
  print(f'compile: sampler {sample_compile:.1f}s, old log-probs {logprobs.compile_s:.1f}s, '
        f'train step {step_timed.compile_s:.1f}s; sample and update net of it; verify '
        'includes decoding the completions')

  hoisted = jax.default_backend() == 'cpu' and cfg.remat != 'none'
  est = memory.step_estimate(config, cfg, prompt_len=p, baseline_bytes=baseline,
                             keeps_init_params=not released, remat_hoisted=hoisted)
  phases = memory.phase_totals(est)
  print(f'\n{"estimate part":<32} {"MiB":>9}')
  for k, x in est.items():
    if k != 'total' and x:
      print(f'{k:<32} {x / MiB:>9.1f}')
  print(f'{"total":<32} {est["total"] / MiB:>9.1f}')
  resident = est['total'] - max(phases[k] for k in ('sample', 'logprobs', 'update'))
  print('\nper phase: estimate (baseline + state + phase) against measured peak RSS, MiB')
  for name, measured in (('sample', 'sample + verify'), ('logprobs', 'old log-probs'),
                         ('update', 'update')):
    e = resident + phases[name]
    m = monitor.peaks.get(measured, 0)
    print(f'  {name:<9} estimate {e / MiB:>8.0f}  measured {m / MiB:>8.0f}  ratio {m / e:.3f}')
  for name, timed in (('old log-probs', logprobs), ('train step', step_timed)):
    a = timed.compiled.memory_analysis()
    print(f'XLA memory_analysis {name}: arguments {a.argument_size_in_bytes / MiB:.0f}, '
          f'outputs {a.output_size_in_bytes / MiB:.0f}, aliased {a.alias_size_in_bytes / MiB:.0f}, '
          f'temp {a.temp_size_in_bytes / MiB:.0f} MiB; peak {memory.compiled_peak(timed.compiled) / MiB:.0f} MiB')
  upd = phases['update'] - est['update/batch']
  print(f'update temp: estimate {upd / MiB:.0f} MiB against XLA '
        f'{step_timed.compiled.memory_analysis().temp_size_in_bytes / MiB:.0f} MiB')
  print(f'\nbaseline RSS after imports and backend start {baseline / MiB:.0f} MiB; peak RSS '
        f'(ru_maxrss) self {peak / MiB:.0f} MiB; children {children / MiB:.0f} MiB (largest '
        f'single child; the checkpoint builder alone {children_after_build / MiB:.0f} MiB)')
  print(f'peak RSS over estimate without the baseline: '
        f'{(peak - baseline) / (est["total"] - baseline):.3f}')
  ratio = peak / est['total']
  print(f'real_shapes_rss_over_estimate={ratio:.3f}')
  return ratio


if __name__ == '__main__':
  host_malloc.reexec()  # Once, with GLIBC_TUNABLES set: glibc reads it only at start-up.
  main()
