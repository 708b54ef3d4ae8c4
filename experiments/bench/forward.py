"""Times rlreason's RL train step (update.train_step) against transformers + torch on CPU.

A step is one GRPO-style update on N rows of P prompt + L completion tokens: the PPO-clip
surrogate (eps 0.2, old log-probs from update.logprobs_step at the initial weights, GRPO
advantages of random 0/1 rewards in groups of 4), token-mean aggregation, global-norm
clipping at 1, AdamW, and the non-finite guard. rlreason runs `update.train_step` jitted as
run_setup.build does (state donated), with the optimizer of run_setup.make_optimizer and a
TrainBatch laid out as rl_batch.make_train_batch does. torch runs Qwen2ForCausalLM (the same
weights, copied into our params layout) with the same loss written out as TRL does it
(logits of the completion positions only), clip_grad_norm_ and torch.optim.AdamW, stepping
only when the gradient norm is finite. Completion lengths vary from L/2 to L; the tokens
after a row's end are padding (mask 0) in both. The first losses and gradients are checked to
agree before anything is timed.

  python -m experiments.bench.forward --configs small,mid --steps 5 --warmup 2 [--threads N]
  python -m experiments.bench.forward --configs mid --dtype both   # + the bf16 line

`--remat none|full|dots` sets rlreason's ModelConfig.remat (torch keeps every activation).
The table gives each step's median wall time and the process's CPU time during it (cpu_s):
on a loaded machine wall times stretch unevenly, CPU times much less; the final lines come
as `<name>_cpu_time=` (the CPU-time ratio) followed by `<name>=` (the wall-time ratio).

`--threads N` (default: os.cpu_count()) confines the process to N cores before JAX creates
its backend (XLA sizes its CPU thread pool from the cores it may run on, and cannot use
more) and gives torch N threads, so both frameworks get the same cores.

Model FLOPs per step, counted analytically (N rows, T = P + L):

  matmul = 6 * N * (T * layers * (D*H*Dh + 2*D*K*Dh + H*Dh*D + 3*D*F) + L * D*V)
  attn   = 6 * 2 * N * T^2 * H * Dh * layers

The 6 is 2 (multiply-add) * 3 (forward, then two backward matmuls); the vocabulary
projection runs on the L completion positions only, in both frameworks. Attention is QK^T
and PV at 2*N*T^2*H*Dh each in the forward; causal masking is NOT halved. Norms, RoPE,
softmax, the loss and the optimizer are left out. MFU divides by the better of the two
frameworks' 4096^3 f32 matmul rates, measured in the same run.

The machine may be shared: steps of the two frameworks take turns, so load from other
processes falls on both alike, and the load average is printed with the table. Run as a
command, the bench re-executes itself with host_malloc's glibc tunables (both frameworks
get them): without them XLA:CPU's temp buffers are unmapped after every step, and the jax
step right after torch's ran 1-3 s slower, refaulting pages torch had just freed. A busy
machine slows torch's OpenMP more than XLA's thread pool, so compare speedups from quiet runs.
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
import numpy as np  # noqa: E402

from rlreason import host_malloc  # noqa: E402
from rlreason.model import transformer  # noqa: E402
from rlreason.objectives import advantages  # noqa: E402
from rlreason.objectives import aggregation  # noqa: E402
from rlreason.rl import run_setup  # noqa: E402
from rlreason.rl import update  # noqa: E402
from rlreason.structs import TrainBatch  # noqa: E402


@dataclasses.dataclass(frozen=True)
class BenchConfig:
  """A Qwen2-style model (qkv bias, untied embeddings) and its batch: N=batch rows of
  seq tokens, the last `completion` of them the sampled part."""
  name: str
  vocab: int
  hidden: int
  mlp: int
  layers: int
  heads: int
  kv_heads: int
  batch: int
  seq: int
  completion: int

  @property
  def head_dim(self) -> int:
    return self.hidden // self.heads

  def model_config(self, compute_dtype: str = 'float32',
                   remat: str = 'none') -> transformer.ModelConfig:
    return transformer.ModelConfig(
        vocab_size=self.vocab, hidden_size=self.hidden, intermediate_size=self.mlp,
        num_layers=self.layers, num_heads=self.heads, num_kv_heads=self.kv_heads,
        head_dim=self.head_dim, qkv_bias=True, tie_embeddings=False, family='qwen2',
        max_position_embeddings=max(self.seq, 4096), rope_theta=10_000.0, rms_norm_eps=1e-6,
        compute_dtype=compute_dtype, remat=remat)

  def flops(self) -> float:
    """Model FLOPs of one training step (see the module docstring)."""
    d, f, h, k, dh = self.hidden, self.mlp, self.heads, self.kv_heads, self.head_dim
    per_layer = d * h * dh + 2 * d * k * dh + h * dh * d + 3 * d * f
    matmul = 6 * self.batch * (self.seq * self.layers * per_layer +
                               self.completion * d * self.vocab)
    attn = 6 * 2 * self.batch * self.seq**2 * h * dh * self.layers
    return float(matmul + attn)


CONFIGS = {
    'small': BenchConfig('small', vocab=2048, hidden=256, mlp=768, layers=4, heads=4,
                         kv_heads=2, batch=16, seq=256, completion=128),
    'mid': BenchConfig('mid', vocab=8192, hidden=512, mlp=1536, layers=8, heads=8,
                       kv_heads=4, batch=8, seq=512, completion=256),
}
LR, BETAS, EPS, WEIGHT_DECAY = 1e-4, (0.9, 0.999), 1e-8, 0.01  # EPS: optax.adamw's default.
GROUP, CLIP_EPS, GRAD_CLIP = 4, 0.2, 1.0


def limit_threads(n: int) -> None:
  """Confines this process to its first n allowed cores, before JAX or torch start threads.

  XLA sizes its CPU thread pool from the cores the process may run on when the backend is
  created, and OpenMP (torch) when it is loaded; the affinity also caps whatever threads
  either starts. XLA_FLAGS has no thread count for the CPU client (--xla_cpu_multi_thread_eigen
  is all cores or one; --intra_op_parallelism_threads is an "Unknown flag" to XLA), hence the
  affinity, as `taskset` would set it.
  """
  cores = sorted(os.sched_getaffinity(0))
  if not 1 <= n <= len(cores):
    raise ValueError(f'--threads={n}: this process may use {len(cores)} cores {cores}.')
  os.sched_setaffinity(0, cores[:n])


# ----------------------------------------------------------------------------- timing


@dataclasses.dataclass
class Result:
  config: str
  framework: str
  step_s: float
  tokens: int
  flops: float
  note: str = ''
  cpu_s: float = float('nan')


def _time_interleaved(steps_by_name, warmup: int, steps: int) -> dict[str, float]:
  """Median wall time per blocking call, the callables taking turns step by step.

  Taking turns spreads load from other processes over all callables alike,
  instead of onto whichever happened to run at the time.
  """
  return {name: t[0] for name, t in _time_interleaved_cpu(steps_by_name, warmup, steps).items()}


def _time_interleaved_cpu(steps_by_name, warmup: int,
                          steps: int) -> dict[str, tuple[float, float]]:
  """(median wall, median CPU) seconds per blocking call, taking turns as above.

  CPU time is this process's (every thread's) during the call: under load from other
  processes it grows far less than the wall time, so it compares the frameworks' work.
  """
  for _ in range(warmup):
    for step in steps_by_name.values():
      step()
  times = {name: ([], []) for name in steps_by_name}
  for _ in range(steps):
    for name, step in steps_by_name.items():
      start, start_cpu = time.perf_counter(), time.process_time()
      step()
      times[name][0].append(time.perf_counter() - start)
      times[name][1].append(time.process_time() - start_cpu)
  return {name: (statistics.median(w), statistics.median(c)) for name, (w, c) in times.items()}


def matmul_peaks(n: int = 4096, repeats: int = 3) -> dict[str, float]:
  """Best-of-`repeats` f32 GFLOP/s of an n^3 matmul, as jax and as torch reach it."""
  import torch  # pylint: disable=g-import-not-at-top
  rng = np.random.default_rng(0)
  a, b = (rng.standard_normal((n, n), np.float32) for _ in range(2))
  xa, xb = jnp.asarray(a), jnp.asarray(b)
  mm = jax.jit(jnp.matmul).lower(xa, xb).compile()
  ta, tb = torch.from_numpy(a), torch.from_numpy(b)
  runners = {'jax': lambda: mm(xa, xb).block_until_ready(), 'torch': lambda: ta @ tb}
  best = {name: float('inf') for name in runners}
  for _ in range(repeats):
    t = _time_interleaved(runners, warmup=1 if best['jax'] == float('inf') else 0, steps=1)
    best = {name: min(best[name], t[name]) for name in best}
  return {name: 2.0 * n**3 / s / 1e9 for name, s in best.items()}


# ----------------------------------------------------------------------------- weights


def params_from_torch(tensors, cfg: transformer.ModelConfig):
  """Our params pytree from Qwen2ForCausalLM-named tensors (weights, or their grads)."""
  sd = {k: v.detach().float().numpy() for k, v in tensors.items()}
  d, h, kv, dh = cfg.hidden_size, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
  layers = {}
  for i in range(cfg.num_layers):
    p = f'model.layers.{i}.'
    attn = {  # torch Linear weights are [out, in]; ours are [in, heads, head_dim].
        'q': sd[p + 'self_attn.q_proj.weight'].T.reshape(d, h, dh),
        'k': sd[p + 'self_attn.k_proj.weight'].T.reshape(d, kv, dh),
        'v': sd[p + 'self_attn.v_proj.weight'].T.reshape(d, kv, dh),
        'o': sd[p + 'self_attn.o_proj.weight'].T.reshape(h, dh, d),
        'q_bias': sd[p + 'self_attn.q_proj.bias'].reshape(h, dh),
        'k_bias': sd[p + 'self_attn.k_proj.bias'].reshape(kv, dh),
        'v_bias': sd[p + 'self_attn.v_proj.bias'].reshape(kv, dh),
    }
    mlp = {name: sd[p + f'mlp.{name}_proj.weight'].T for name in ('gate', 'up', 'down')}
    layers[str(i)] = {
        'attn': attn, 'mlp': mlp,
        'attn_norm': {'scale': sd[p + 'input_layernorm.weight']},
        'mlp_norm': {'scale': sd[p + 'post_attention_layernorm.weight']},
    }
  params = {
      'embed': sd['model.embed_tokens.weight'],
      'layers': layers,
      'final_norm': {'scale': sd['model.norm.weight']},
      'lm_head': sd['lm_head.weight'].T,
  }
  # Same tree and shapes as init_params, so apply() takes it unchanged.
  jax.tree.map(lambda r, x: np.testing.assert_equal(r.shape, x.shape),
               transformer.abstract_params(cfg), params)
  return jax.tree.map(lambda x: jnp.asarray(np.ascontiguousarray(x)), params)


def build_torch_model(bc: BenchConfig, attn_impl: str, seed: int = 0):
  import torch  # pylint: disable=g-import-not-at-top
  import transformers  # pylint: disable=g-import-not-at-top
  hf_cfg = transformers.Qwen2Config(
      vocab_size=bc.vocab, hidden_size=bc.hidden, intermediate_size=bc.mlp,
      num_hidden_layers=bc.layers, num_attention_heads=bc.heads, num_key_value_heads=bc.kv_heads,
      max_position_embeddings=max(bc.seq, 4096), rms_norm_eps=1e-6, tie_word_embeddings=False,
      rope_parameters={'rope_type': 'default', 'rope_theta': 10_000.0}, use_cache=False,
      attn_implementation=attn_impl)
  torch.manual_seed(seed)
  net = transformers.Qwen2ForCausalLM(hf_cfg).float()
  # HF inits biases to 0 and norms to 1; perturb them so the weight copy is checked too.
  with torch.no_grad():
    for name, p in net.named_parameters():
      if name.endswith('bias') or name.endswith('norm.weight') or 'layernorm' in name:
        p.add_(0.1 * torch.randn_like(p))
  return net


# ----------------------------------------------------------------------------- batch


def make_batch(bc: BenchConfig, seed: int = 1) -> dict[str, np.ndarray]:
  """Random tokens, completion lengths in [L/2, L] (right padding), 0/1 rewards per row."""
  rng = np.random.default_rng(seed)
  n, t, l = bc.batch, bc.seq, bc.completion
  lengths_N = rng.integers(l // 2, l + 1, n)
  loss_mask_NxL = np.arange(l) < lengths_N[:, None]
  mask_NxT = np.concatenate([np.ones((n, t - l), bool), loss_mask_NxL], axis=1)
  tokens_NxT = np.where(mask_NxT, rng.integers(0, bc.vocab, (n, t)), 0)
  rewards_BxG = rng.integers(0, 2, (n // GROUP, GROUP)).astype(np.float32)
  return dict(tokens_NxT=tokens_NxT, mask_NxT=mask_NxT, loss_mask_NxL=loss_mask_NxL,
              rewards_BxG=rewards_BxG)


# ----------------------------------------------------------------------------- jax step


def make_jax_step(bc: BenchConfig, params, arrays, cfg: transformer.ModelConfig):
  """(train_step jitted as run_setup.build does it, its state, the TrainBatch, objective)."""
  optimizer = run_setup.make_optimizer(lr=LR, warmup_steps=0, b1=BETAS[0], b2=BETAS[1],
                                       weight_decay=WEIGHT_DECAY, grad_clip=GRAD_CLIP)
  objective = update.Objective(policy_loss='ppo_clip',
                               loss_kwargs=(('eps_high', CLIP_EPS), ('eps_low', CLIP_EPS)),
                               aggregation='token_mean', group_size=GROUP)
  tokens_NxT = jnp.asarray(arrays['tokens_NxT'], jnp.int32)
  mask_NxT = jnp.asarray(arrays['mask_NxT'])
  loss_mask_NxL = jnp.asarray(arrays['loss_mask_NxL'])
  # As rl_batch.make_train_batch and advantages_for: old log-probs from the policy that
  # sampled (here the initial weights), the group's advantage on each completion token.
  old_NxL = jax.jit(update.logprobs_step, static_argnames=('cfg', 'completion_len'))(
      params, tokens_NxT, mask_NxT, cfg=cfg, completion_len=bc.completion).logprobs_NxT
  adv_BxG = advantages.grpo(jnp.asarray(arrays['rewards_BxG']))
  batch = TrainBatch(
      tokens_NxT=tokens_NxT, mask_NxT=mask_NxT, loss_mask_NxL=loss_mask_NxL,
      advantages_NxL=adv_BxG.reshape(-1)[:, None] * loss_mask_NxL, old_logprobs_NxL=old_NxL,
      ref_logprobs_NxL=old_NxL, behaviour_logprobs_NxL=old_NxL,
      prefix_mask_NxL=jnp.zeros_like(loss_mask_NxL))
  state = jax.jit(lambda p: update.init_state(p, optimizer))(params)
  step = jax.jit(lambda s, b: update.train_step(s, b, cfg=cfg, objective=objective,
                                                optimizer=optimizer), donate_argnums=0)
  return step, state, batch, objective


def jax_loss_and_grad(params, batch: TrainBatch, objective, cfg: transformer.ModelConfig):
  """train_step's loss and (unclipped) gradient: update.loss_fn over the whole batch."""
  denominator = aggregation.denominators(batch.loss_mask_NxL, mode=objective.aggregation)
  fn = lambda p: update.loss_fn(p, batch, denominator, cfg=cfg, objective=objective)[0]
  return jax.jit(jax.value_and_grad(fn))(params)


# ----------------------------------------------------------------------------- torch step


def make_torch_step(net, optimizer, arrays, old_logprobs_NxL, advantages_NxL, bc: BenchConfig,
                    dtype: str = 'float32'):
  """The same objective in torch, as TRL's GRPO trainer writes it: (step, loss_fn)."""
  import torch  # pylint: disable=g-import-not-at-top
  l = bc.completion
  tokens = torch.from_numpy(arrays['tokens_NxT'].astype(np.int64))
  attention_mask = torch.from_numpy(arrays['mask_NxT'].astype(np.int64))
  mask = torch.from_numpy(arrays['loss_mask_NxL'].astype(np.float32))
  old = torch.from_numpy(np.array(old_logprobs_NxL, np.float32))  # A writable copy.
  adv = torch.from_numpy(np.array(advantages_NxL, np.float32))
  targets = tokens[:, -l:]

  def loss_fn():
    with torch.autocast('cpu', dtype=torch.bfloat16, enabled=dtype == 'bfloat16'):
      # Positions P-1 .. T-2 predict the completion tokens P .. T-1.
      logits = net(input_ids=tokens, attention_mask=attention_mask,
                   logits_to_keep=l + 1).logits[:, :-1]
    logp = torch.log_softmax(logits.float(), -1).gather(-1, targets[..., None]).squeeze(-1)
    ratio = torch.exp(torch.clamp(logp - old, -20.0, 20.0))
    surrogate = torch.minimum(ratio * adv, torch.clamp(ratio, 1 - CLIP_EPS, 1 + CLIP_EPS) * adv)
    return -(surrogate * mask).sum() / mask.sum()

  def step():
    optimizer.zero_grad(set_to_none=True)
    loss = loss_fn()
    loss.backward()
    norm = torch.nn.utils.clip_grad_norm_(net.parameters(), GRAD_CLIP)
    if torch.isfinite(loss) and torch.isfinite(norm):  # train_step's non-finite guard.
      optimizer.step()
    return loss.detach()

  return step, loss_fn


# ----------------------------------------------------------------------------- driver


def _max_rel_diff(a, b) -> tuple[float, str]:
  """Largest |a-b|/|b| (Frobenius norms) over the leaves of two params trees, and where.

  k_bias is skipped: it shifts each query's scores by a constant, which softmax
  ignores, so its exact gradient is 0 and both frameworks return rounding noise.
  """
  def rel(path, x, y):
    if 'k_bias' in jax.tree_util.keystr(path):
      return (0.0, '')
    return (float(jnp.linalg.norm(x - y) / (jnp.linalg.norm(y) + 1e-30)),
            jax.tree_util.keystr(path))
  diffs = jax.tree_util.tree_map_with_path(rel, a, b)
  return max(jax.tree.leaves(diffs, is_leaf=lambda x: isinstance(x, tuple)))


def bench_config(bc: BenchConfig, args, dtype: str) -> list[Result]:
  import torch  # pylint: disable=g-import-not-at-top
  cfg = bc.model_config(dtype, args.remat)
  arrays = make_batch(bc)
  net = build_torch_model(bc, args.torch_attn)
  params = params_from_torch(net.state_dict(), cfg)
  jax_step, state, batch, objective = make_jax_step(bc, params, arrays, cfg)
  impl = {'fused': {'fused': True}, 'foreach': {'foreach': True}, 'loop': {'foreach': False}}
  torch_opt = torch.optim.AdamW(net.parameters(), lr=LR, betas=BETAS, eps=EPS,
                                weight_decay=WEIGHT_DECAY, **impl[args.torch_adamw])
  torch_step, torch_loss = make_torch_step(net, torch_opt, arrays, batch.old_logprobs_NxL,
                                           batch.advantages_NxL, bc, dtype)

  # Same weights, same batch: losses and gradients must agree before timing.
  l_jax, g_jax = jax_loss_and_grad(params, batch, objective, cfg)
  net.zero_grad(set_to_none=True)
  l_torch = torch_loss()
  l_torch.backward()
  g_torch = params_from_torch({k: p.grad for k, p in net.named_parameters()}, cfg)
  net.zero_grad(set_to_none=True)
  l_jax, l_torch = float(l_jax), l_torch.item()
  g_diff, g_where = _max_rel_diff(g_jax, g_torch)
  print(f'[{bc.name}] initial loss jax={l_jax:.6f} torch={l_torch:.6f} '
        f'|diff|={abs(l_jax - l_torch):.1e}; grads max rel diff {g_diff:.1e} at {g_where}',
        flush=True)
  loss_tol, grad_tol = (args.loss_tol, 1e-4) if dtype == 'float32' else (5e-2, 1e-1)
  if abs(l_jax - l_torch) > loss_tol or g_diff > grad_tol:
    raise SystemExit(f'[{bc.name}] jax and torch disagree (loss tol {loss_tol}, grad tol '
                     f'{grad_tol}): not the same computation')
  del g_jax, g_torch, params

  box = {'state': state}
  t0 = time.perf_counter()
  compiled = jax_step.lower(state, batch).compile()
  print(f'[{bc.name}] jax compile {time.perf_counter() - t0:.1f}s', flush=True)

  def run_jax():
    box['state'], metrics = compiled(box['state'], batch)
    jax.block_until_ready((box['state'], metrics))

  runners = {'jax': run_jax}
  if not args.skip_torch:
    runners['torch'] = torch_step
  times = _time_interleaved_cpu(runners, args.warmup, args.steps)
  skipped = int(box['state'].skipped)
  if skipped:
    raise SystemExit(f'[{bc.name}] train_step skipped {skipped} non-finite updates')
  remat = '' if args.remat == 'none' else f' remat={args.remat}'
  notes = {'jax': f'{dtype} update.train_step{remat}',
           'torch': f'{dtype} {args.torch_attn} adamw={args.torch_adamw}'}
  results = []
  for fw, (t, cpu) in times.items():
    name = bc.name if dtype == 'float32' else f'{bc.name}/bf16'
    results.append(Result(name, fw, t, bc.batch * bc.seq, bc.flops(), notes[fw], cpu))
    print(f'[{bc.name}] {fw} step {t:.3f}s (CPU {cpu:.3f}s)', flush=True)
  return results


def print_table(results: list[Result], peaks: dict[str, float], threads: int):
  peak = max(peaks.values())
  print(f'\nmatmul peak 4096^3 f32: jax {peaks["jax"]:.1f} GFLOP/s, '
        f'torch {peaks["torch"]:.1f} GFLOP/s (MFU vs {peak:.1f}); threads {threads} '
        f'(cores {sorted(os.sched_getaffinity(0))} of {os.cpu_count()}); '
        f'load average {" ".join(f"{x:.2f}" for x in os.getloadavg())}')
  header = (f'{"config":<10} {"framework":<9} {"step_s":>8} {"cpu_s":>8} {"tokens/s":>9} '
            f'{"GFLOP/s":>8} {"MFU":>6}  note')
  print(header)
  print('-' * len(header))
  for r in results:
    gflops = r.flops / r.step_s / 1e9
    print(f'{r.config:<10} {r.framework:<9} {r.step_s:>8.3f} {r.cpu_s:>8.3f} '
          f'{r.tokens / r.step_s:>9.0f} '
          f'{gflops:>8.1f} {gflops / peak:>6.1%}  {r.note}')


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  parser.add_argument('--configs', default='small,mid', help='comma-separated: small, mid')
  parser.add_argument('--steps', type=int, default=5, help='timed steps per framework')
  parser.add_argument('--warmup', type=int, default=2, help='untimed steps first')
  parser.add_argument('--dtype', default='float32', choices=('float32', 'bfloat16', 'both'),
                      help='compute dtype (params stay fp32; torch uses autocast for bf16); '
                           "'both' runs fp32 then bf16 and prints both final lines")
  parser.add_argument('--remat', default='none', choices=('none', 'full', 'dots'),
                      help="ModelConfig.remat of rlreason's step (torch keeps its activations)")
  parser.add_argument('--torch_attn', default='sdpa', choices=('sdpa', 'eager'))
  parser.add_argument('--torch_adamw', default='fused', choices=('fused', 'foreach', 'loop'),
                      help="torch AdamW kernel ('loop' is torch's CPU default)")
  parser.add_argument('--xla_flags', default='', help='appended to XLA_FLAGS')
  parser.add_argument('--skip_torch', action='store_true')
  parser.add_argument('--loss_tol', type=float, default=1e-4)
  parser.add_argument('--threads', type=int, default=os.cpu_count(),
                      help='cores for the process: torch threads and the cores XLA may use')
  args = parser.parse_args(argv)
  limit_threads(args.threads)  # Before torch loads OpenMP and JAX creates its backend.

  # XLA reads XLA_FLAGS once, when the first computation creates the backend.
  if args.xla_flags:
    os.environ['XLA_FLAGS'] = f'{os.environ.get("XLA_FLAGS", "")} {args.xla_flags}'.strip()
  import torch  # pylint: disable=g-import-not-at-top
  torch.set_num_threads(args.threads)
  print(f'jax {jax.__version__} ({jax.devices()[0].platform}), torch {torch.__version__}, '
        f'threads {args.threads}, XLA_FLAGS={os.environ.get("XLA_FLAGS", "")!r}'
        f', GLIBC_TUNABLES={os.environ.get("GLIBC_TUNABLES", "")!r}', flush=True)
  peaks = matmul_peaks()
  results = []
  dtypes = ('float32', 'bfloat16') if args.dtype == 'both' else (args.dtype,)
  for dtype in dtypes:
    for name in args.configs.split(','):
      results += bench_config(CONFIGS[name], args, dtype)
  print_table(results, peaks, args.threads)
  by = {(r.config, r.framework): r for r in results}
  for config, line in (('mid', 'train_step_speedup_vs_torch'),
                       ('mid/bf16', 'train_step_bf16_speedup_vs_torch')):
    if (config, 'jax') in by and (config, 'torch') in by:  # Mixed precision: bf16 compute,
      # fp32 master weights and log-softmax, against torch.autocast(bfloat16).
      jax_r, torch_r = by[config, 'jax'], by[config, 'torch']
      print(f'{line}_cpu_time={torch_r.cpu_s / jax_r.cpu_s:.3f}')
      print(f'{line}={torch_r.step_s / jax_r.step_s:.3f}')


if __name__ == '__main__':
  host_malloc.reexec()  # Once, with GLIBC_TUNABLES set: glibc reads it only at start-up.
  main()
