"""Times one training step of rlreason.model against transformers + torch on CPU.

A step is forward, backward and an AdamW update, with the mean next-token
cross-entropy over every position as the loss. Both frameworks start from the
same weights (torch's Qwen2ForCausalLM, copied into our params layout); their
first losses and gradients are checked to agree before anything is timed.

  python -m experiments.bench.forward --configs small,mid --steps 5 --warmup 2

Model FLOPs per step, counted analytically:

  matmul = 6 * tokens * (L * (D*H*Dh + 2*D*K*Dh + H*Dh*D + 3*D*F) + D*V)
  attn   = 6 * 2 * B * T^2 * H * Dh * L

The 6 is 2 (multiply-add) * 3 (forward, then two backward matmuls). Attention is
QK^T and PV at 2*B*T^2*H*Dh each in the forward; causal masking is NOT halved
(both frameworks compute the full TxT scores). Norms, RoPE, softmax, the loss and
the optimizer are left out. MFU divides by the better of the two frameworks'
4096^3 f32 matmul rates, measured in the same run.

The machine may be shared: steps of the two frameworks take turns, so load from
other processes falls on both alike, and the load average is printed with the
table. A busy machine slows torch's OpenMP more than XLA's thread pool, so
compare speedups from quiet runs.
"""

import argparse
import dataclasses
import functools
import os
import statistics
import sys
import time

if __package__ in (None, ''):  # Run as a script: make `rlreason` importable.
  sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

import jax  # noqa: E402  (no backend exists until the first computation)
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
import optax  # noqa: E402

from rlreason import model  # noqa: E402


@dataclasses.dataclass(frozen=True)
class BenchConfig:
  """A Qwen2-style model (qkv bias, untied embeddings) and its batch."""
  name: str
  vocab: int
  hidden: int
  mlp: int
  layers: int
  heads: int
  kv_heads: int
  batch: int
  seq: int

  @property
  def head_dim(self) -> int:
    return self.hidden // self.heads

  def model_config(self, compute_dtype: str = 'float32') -> model.ModelConfig:
    return model.ModelConfig(
        vocab_size=self.vocab, hidden_size=self.hidden, intermediate_size=self.mlp,
        num_layers=self.layers, num_heads=self.heads, num_kv_heads=self.kv_heads,
        head_dim=self.head_dim, qkv_bias=True, tie_embeddings=False, family='qwen2',
        max_position_embeddings=max(self.seq, 4096), rope_theta=10_000.0, rms_norm_eps=1e-6,
        compute_dtype=compute_dtype)

  def flops(self) -> float:
    """Model FLOPs of one training step (see the module docstring)."""
    d, f, h, k, dh = self.hidden, self.mlp, self.heads, self.kv_heads, self.head_dim
    per_layer = d * h * dh + 2 * d * k * dh + h * dh * d + 3 * d * f
    tokens = self.batch * self.seq
    matmul = 6 * tokens * (self.layers * per_layer + d * self.vocab)
    attn = 6 * 2 * self.batch * self.seq**2 * h * dh * self.layers
    return float(matmul + attn)


CONFIGS = {
    'small': BenchConfig('small', vocab=2048, hidden=256, mlp=768, layers=4, heads=4,
                         kv_heads=2, batch=16, seq=256),
    'mid': BenchConfig('mid', vocab=8192, hidden=512, mlp=1536, layers=8, heads=8,
                       kv_heads=4, batch=8, seq=512),
}
LR, BETAS, EPS, WEIGHT_DECAY = 1e-4, (0.9, 0.999), 1e-8, 0.01


# ----------------------------------------------------------------------------- timing


@dataclasses.dataclass
class Result:
  config: str
  framework: str
  step_s: float
  tokens: int
  flops: float
  note: str = ''


def _time_interleaved(steps_by_name, warmup: int, steps: int) -> dict[str, float]:
  """Median wall time per blocking call, the callables taking turns step by step.

  Taking turns spreads load from other processes over all callables alike,
  instead of onto whichever happened to run at the time.
  """
  for _ in range(warmup):
    for step in steps_by_name.values():
      step()
  times = {name: [] for name in steps_by_name}
  for _ in range(steps):
    for name, step in steps_by_name.items():
      start = time.perf_counter()
      step()
      times[name].append(time.perf_counter() - start)
  return {name: statistics.median(t) for name, t in times.items()}


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


def params_from_torch(tensors, cfg: model.ModelConfig):
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
               model.abstract_params(cfg), params)
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


# ----------------------------------------------------------------------------- jax step


def _shifted_labels(tokens_NxT):
  """Labels for every position (token t+1) and weights that drop the last one."""
  n, t = tokens_NxT.shape
  labels_NxT = jnp.roll(tokens_NxT, -1, axis=1)
  weights_NxT = jnp.broadcast_to(jnp.arange(t) < t - 1, (n, t)).astype(jnp.float32)
  return labels_NxT, weights_NxT


def loss_from_logits(logits_NxTxV, tokens_NxT):
  """Mean next-token cross-entropy from full fp32 logits.

  Runs over all T positions with the last one weighted 0, so neither the forward
  (a [N, T-1, V] slice) nor the backward (a pad) copies the logits, and the
  label's logit is picked by a compare-and-sum that fuses, not a gather whose
  gradient is a scatter.
  """
  labels_NxT, weights_NxT = _shifted_labels(tokens_NxT)
  lse_NxT = jax.nn.logsumexp(logits_NxTxV, axis=-1)
  onehot = labels_NxT[..., None] == jnp.arange(logits_NxTxV.shape[-1])
  picked_NxT = jnp.sum(jnp.where(onehot, logits_NxTxV, 0.0), axis=-1)
  return jnp.sum((lse_NxT - picked_NxT) * weights_NxT) / jnp.sum(weights_NxT)


@jax.custom_vjp
def _lm_head_xent(h_MxD, w_DxV, labels_M, weights_M):
  """sum_i weights_i * CE(h_i @ w, labels_i), logits in fp32."""
  return _lm_head_xent_fwd(h_MxD, w_DxV, labels_M, weights_M)[0]


def _lm_head_xent_fwd(h_MxD, w_DxV, labels_M, weights_M):
  logits_MxV = jnp.dot(h_MxD, w_DxV, preferred_element_type=jnp.float32)
  lse_M = jax.nn.logsumexp(logits_MxV, axis=-1)
  onehot_MxV = labels_M[:, None] == jnp.arange(w_DxV.shape[1])
  picked_M = jnp.sum(jnp.where(onehot_MxV, logits_MxV, 0.0), axis=-1)
  # d loss / d logits, made here in the same pass over the logits; the logits die.
  dlogits_MxV = (jnp.exp(logits_MxV - lse_M[:, None]) - onehot_MxV) * weights_M[:, None]
  return jnp.sum((lse_M - picked_M) * weights_M), (h_MxD, w_DxV, dlogits_MxV)


def _lm_head_xent_bwd(res, g):
  h_MxD, w_DxV, dlogits_MxV = res
  cdt = h_MxD.dtype  # The matmuls run in the compute dtype and accumulate in fp32.
  dlogits_MxV = (dlogits_MxV * g).astype(cdt)
  dh_MxD = jnp.dot(dlogits_MxV, w_DxV.T, preferred_element_type=jnp.float32).astype(cdt)
  # h^T @ dlogits with the activation on the left: XLA then transposes the narrow
  # [M, D] operand, not the [M, V] one (jax's own rule would compute dw^T).
  dw_DxV = jax.lax.dot_general(h_MxD, dlogits_MxV, (((0,), (0,)), ((), ())),
                               preferred_element_type=jnp.float32)
  return dh_MxD, dw_DxV.astype(w_DxV.dtype), None, None


_lm_head_xent.defvjp(_lm_head_xent_fwd, _lm_head_xent_bwd)


def fused_loss(params, tokens_NxT, cfg: model.ModelConfig):
  """The same loss, with the lm_head matmul and cross-entropy fused by hand.

  Takes the final hidden states from model.apply(return_hidden=True) and hands
  back d loss / d logits from the forward pass: the fp32 logits never outlive
  the loss, and no slice, pad or scatter of a [N, T, V] array happens.
  """
  h_NxTxD, _ = model.apply(params, tokens_NxT, cfg=cfg, return_hidden=True)
  n, t, d = h_NxTxD.shape
  labels_NxT, weights_NxT = _shifted_labels(tokens_NxT)
  w_DxV = params['embed'].T if cfg.tie_embeddings else params['lm_head']
  total = _lm_head_xent(h_NxTxD.reshape(n * t, d), w_DxV.astype(cfg.compute_dtype),
                        labels_NxT.reshape(-1), weights_NxT.reshape(-1))
  return total / jnp.sum(weights_NxT)


def logits_loss(params, tokens_NxT, cfg: model.ModelConfig):
  logits_NxTxV, _ = model.apply(params, tokens_NxT, cfg=cfg)
  return loss_from_logits(logits_NxTxV, tokens_NxT)


LOSSES = {'fused': fused_loss, 'logits': logits_loss}


def make_jax_step(cfg: model.ModelConfig, optimizer, loss: str = 'fused'):
  """A jitted pure train step (params and optimizer state donated), and the loss."""
  loss_fn = functools.partial(LOSSES[loss], cfg=cfg)

  @functools.partial(jax.jit, donate_argnums=(0, 1))
  def step(params, opt_state, tokens_NxT):
    loss, grads = jax.value_and_grad(loss_fn)(params, tokens_NxT)
    updates, opt_state = optimizer.update(grads, opt_state, params)
    return optax.apply_updates(params, updates), opt_state, loss

  return step, jax.jit(jax.value_and_grad(loss_fn))


# ----------------------------------------------------------------------------- torch step


def make_torch_step(net, optimizer, dtype: str = 'float32'):
  import torch  # pylint: disable=g-import-not-at-top
  import torch.nn.functional as F  # pylint: disable=g-import-not-at-top

  def loss_fn(tokens):
    with torch.autocast('cpu', dtype=torch.bfloat16, enabled=dtype == 'bfloat16'):
      logits = net(input_ids=tokens).logits
    v = logits.shape[-1]
    return F.cross_entropy(logits[:, :-1].reshape(-1, v).float(), tokens[:, 1:].reshape(-1))

  def step(tokens):
    optimizer.zero_grad(set_to_none=True)
    loss = loss_fn(tokens)
    loss.backward()
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


def bench_config(bc: BenchConfig, args) -> list[Result]:
  import torch  # pylint: disable=g-import-not-at-top
  cfg = bc.model_config(args.dtype)
  tokens = np.random.default_rng(1).integers(0, bc.vocab, (bc.batch, bc.seq), dtype=np.int64)
  net = build_torch_model(bc, args.torch_attn)
  params = params_from_torch(net.state_dict(), cfg)
  tokens_jax = jnp.asarray(tokens, jnp.int32)
  tokens_torch = torch.from_numpy(tokens)

  optimizer = optax.adamw(LR, b1=BETAS[0], b2=BETAS[1], eps=EPS, weight_decay=WEIGHT_DECAY)
  jax_step, jax_loss_and_grad = make_jax_step(cfg, optimizer, args.loss)
  impl = {'fused': {'fused': True}, 'foreach': {'foreach': True}, 'loop': {'foreach': False}}
  torch_opt = torch.optim.AdamW(net.parameters(), lr=LR, betas=BETAS, eps=EPS,
                                weight_decay=WEIGHT_DECAY, **impl[args.torch_adamw])
  torch_step, torch_loss = make_torch_step(net, torch_opt, args.dtype)

  # Same weights, same tokens: losses and gradients must agree before timing.
  l_jax, g_jax = jax_loss_and_grad(params, tokens_jax)
  net.zero_grad(set_to_none=True)
  l_torch = torch_loss(tokens_torch)
  l_torch.backward()
  g_torch = params_from_torch({k: p.grad for k, p in net.named_parameters()}, cfg)
  net.zero_grad(set_to_none=True)
  l_jax, l_torch = float(l_jax), l_torch.item()
  g_diff, g_where = _max_rel_diff(g_jax, g_torch)
  print(f'[{bc.name}] initial loss jax={l_jax:.6f} torch={l_torch:.6f} '
        f'|diff|={abs(l_jax - l_torch):.1e}; grads max rel diff {g_diff:.1e} at {g_where}',
        flush=True)
  loss_tol, grad_tol = (args.loss_tol, 1e-4) if args.dtype == 'float32' else (5e-2, 1e-1)
  if abs(l_jax - l_torch) > loss_tol or g_diff > grad_tol:
    raise SystemExit(f'[{bc.name}] jax and torch disagree (loss tol {loss_tol}, grad tol '
                     f'{grad_tol}): not the same computation')
  del g_jax, g_torch

  state = {'params': params, 'opt': optimizer.init(params)}
  t0 = time.perf_counter()
  compiled = jax_step.lower(state['params'], state['opt'], tokens_jax).compile()
  print(f'[{bc.name}] jax compile {time.perf_counter() - t0:.1f}s', flush=True)

  def run_jax():
    state['params'], state['opt'], loss = compiled(state['params'], state['opt'], tokens_jax)
    jax.block_until_ready((state['params'], state['opt'], loss))

  runners = {'jax': run_jax}
  if not args.skip_torch:
    runners['torch'] = lambda: torch_step(tokens_torch)
  times = _time_interleaved(runners, args.warmup, args.steps)
  notes = {'jax': f'{args.dtype} loss={args.loss}',
           'torch': f'{args.dtype} {args.torch_attn} adamw={args.torch_adamw}'}
  results = []
  for fw, t in times.items():
    results.append(Result(bc.name, fw, t, bc.batch * bc.seq, bc.flops(), notes[fw]))
    print(f'[{bc.name}] {fw} step {t:.3f}s', flush=True)
  return results


def print_table(results: list[Result], peaks: dict[str, float]):
  peak = max(peaks.values())
  print(f'\nmatmul peak 4096^3 f32: jax {peaks["jax"]:.1f} GFLOP/s, '
        f'torch {peaks["torch"]:.1f} GFLOP/s (MFU vs {peak:.1f}); '
        f'load average {" ".join(f"{x:.2f}" for x in os.getloadavg())}')
  header = (f'{"config":<7} {"framework":<9} {"step_s":>8} {"tokens/s":>9} '
            f'{"GFLOP/s":>8} {"MFU":>6}  note')
  print(header)
  print('-' * len(header))
  for r in results:
    gflops = r.flops / r.step_s / 1e9
    print(f'{r.config:<7} {r.framework:<9} {r.step_s:>8.3f} {r.tokens / r.step_s:>9.0f} '
          f'{gflops:>8.1f} {gflops / peak:>6.1%}  {r.note}')


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  parser.add_argument('--configs', default='small,mid', help='comma-separated: small, mid')
  parser.add_argument('--steps', type=int, default=5, help='timed steps per framework')
  parser.add_argument('--warmup', type=int, default=2, help='untimed steps first')
  parser.add_argument('--dtype', default='float32', choices=('float32', 'bfloat16'),
                      help='compute dtype (params stay fp32); torch uses autocast for bf16')
  parser.add_argument('--loss', default='fused', choices=tuple(LOSSES),
                      help='jax loss: fused lm_head+CE, or CE over materialised logits')
  parser.add_argument('--torch_attn', default='sdpa', choices=('sdpa', 'eager'))
  parser.add_argument('--torch_adamw', default='fused', choices=('fused', 'foreach', 'loop'),
                      help="torch AdamW kernel ('loop' is torch's CPU default)")
  parser.add_argument('--xla_flags', default='', help='appended to XLA_FLAGS')
  parser.add_argument('--skip_torch', action='store_true')
  parser.add_argument('--loss_tol', type=float, default=1e-4)
  args = parser.parse_args(argv)

  # XLA reads XLA_FLAGS once, when the first computation creates the backend.
  if args.xla_flags:
    os.environ['XLA_FLAGS'] = f'{os.environ.get("XLA_FLAGS", "")} {args.xla_flags}'.strip()
  import torch  # pylint: disable=g-import-not-at-top
  torch.set_num_threads(2)
  print(f'jax {jax.__version__} ({jax.devices()[0].platform}), torch {torch.__version__}, '
        f'XLA_FLAGS={os.environ.get("XLA_FLAGS", "")!r}', flush=True)
  peaks = matmul_peaks()
  results = []
  for name in args.configs.split(','):
    results += bench_config(CONFIGS[name], args)
  print_table(results, peaks)
  by = {(r.config, r.framework): r.step_s for r in results}
  if ('mid', 'jax') in by and ('mid', 'torch') in by:
    print(f'train_step_speedup_vs_torch={by["mid", "torch"] / by["mid", "jax"]:.3f}')


if __name__ == '__main__':
  main()
