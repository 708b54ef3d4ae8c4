"""Times one fp32 training step of rlreason.model against transformers + torch on CPU.

A step is forward, backward and an AdamW update, with the mean next-token
cross-entropy over every position as the loss. Both frameworks start from the
same weights (torch's Qwen2ForCausalLM init, copied into our params layout), and
their first losses are checked to agree before anything is timed.

  python -m experiments.bench.forward --configs small,mid --steps 5 --warmup 2

Model FLOPs per step, counted analytically:

  matmul = 6 * tokens * (L * (D*H*Dh + 2*D*K*Dh + H*Dh*D + 3*D*F) + D*V)
  attn   = 6 * 2 * B * T^2 * H * Dh * L

The 6 is 2 (multiply-add) * 3 (forward, then two backward matmuls). Attention is
QK^T and PV at 2*B*T^2*H*Dh each in the forward; causal masking is NOT halved
(both frameworks compute the full TxT scores). Norms, RoPE, softmax, the loss and
the optimizer are left out. MFU divides by the better of the two frameworks'
4096^3 f32 matmul rates measured in the same run.
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

  def model_config(self) -> model.ModelConfig:
    return model.ModelConfig(
        vocab_size=self.vocab, hidden_size=self.hidden, intermediate_size=self.mlp,
        num_layers=self.layers, num_heads=self.heads, num_kv_heads=self.kv_heads,
        head_dim=self.head_dim, qkv_bias=True, tie_embeddings=False, family='qwen2',
        max_position_embeddings=max(self.seq, 4096), rope_theta=10_000.0, rms_norm_eps=1e-6)

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


def _time_steps(step, warmup: int, steps: int) -> float:
  """Median wall time of `steps` calls of `step` (which must block) after `warmup`."""
  return _time_interleaved({'_': step}, warmup, steps)['_']


def _time_interleaved(steps_by_name, warmup: int, steps: int) -> dict[str, float]:
  """Median wall time per blocking call, the callables taking turns step by step.

  Taking turns spreads any load from other processes on the machine over all
  frameworks alike instead of over whichever happened to run at the time.
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
  flops = 2.0 * n**3
  xa, xb = jnp.asarray(a), jnp.asarray(b)
  mm = jax.jit(jnp.matmul).lower(xa, xb).compile()
  ta, tb = torch.from_numpy(a), torch.from_numpy(b)
  best = {'jax': float('inf'), 'torch': float('inf')}
  for _ in range(repeats):  # Best of, alternating, so both see the same machine.
    t = _time_interleaved({'jax': lambda: mm(xa, xb).block_until_ready(), 'torch': lambda: ta @ tb},
                          warmup=0, steps=1)
    best = {k: min(best[k], t[k]) for k in best}
  jax_s, torch_s = best['jax'], best['torch']
  return {'jax': flops / jax_s / 1e9, 'torch': flops / torch_s / 1e9}


# ----------------------------------------------------------------------------- weights


def _params_from_torch(state_dict, cfg: model.ModelConfig):
  """Our params pytree from a torch Qwen2ForCausalLM state_dict (fp32 numpy copies)."""
  sd = {k: v.detach().float().numpy() for k, v in state_dict.items()}
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
  # Same tree structure and shapes as init_params, so apply() accepts it unchanged.
  ref = model.abstract_params(cfg)
  jax.tree.map(lambda r, x: np.testing.assert_equal(r.shape, x.shape), ref, params)
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
  # HF zero-inits the biases; random ones make the weight-copy check see them.
  with torch.no_grad():
    for name, p in net.named_parameters():
      if name.endswith('bias') or name.endswith('norm.weight') or 'layernorm' in name:
        p.add_(0.1 * torch.randn_like(p))
  return net


# ----------------------------------------------------------------------------- steps


def next_token_loss(logits_NxTxV, tokens_NxT):
  """Mean cross-entropy of predicting token t+1 at every position t < T-1."""
  logits = logits_NxTxV[:, :-1]
  labels = tokens_NxT[:, 1:]
  # logsumexp minus the label's logit: one pass over the logits, no log-softmax array.
  lse = jax.nn.logsumexp(logits, axis=-1)
  picked = jnp.take_along_axis(logits, labels[..., None], axis=-1)[..., 0]
  return jnp.mean(lse - picked)


def make_jax_step(cfg: model.ModelConfig, optimizer):
  """A jitted pure train step; params and optimizer state are donated."""

  def loss_fn(params, tokens_NxT):
    logits_NxTxV, _ = model.apply(params, tokens_NxT, cfg=cfg)
    return next_token_loss(logits_NxTxV, tokens_NxT)

  @functools.partial(jax.jit, donate_argnums=(0, 1))
  def step(params, opt_state, tokens_NxT):
    loss, grads = jax.value_and_grad(loss_fn)(params, tokens_NxT)
    updates, opt_state = optimizer.update(grads, opt_state, params)
    return optax.apply_updates(params, updates), opt_state, loss

  return step, jax.jit(loss_fn)


def make_torch_step(net, optimizer):
  import torch  # pylint: disable=g-import-not-at-top
  import torch.nn.functional as F  # pylint: disable=g-import-not-at-top

  def loss_fn(tokens):
    logits = net(input_ids=tokens).logits
    v = logits.shape[-1]
    return F.cross_entropy(logits[:, :-1].reshape(-1, v).float(), tokens[:, 1:].reshape(-1))

  def step(tokens):
    optimizer.zero_grad(set_to_none=True)
    loss = loss_fn(tokens)
    loss.backward()
    optimizer.step()
    return loss.detach()

  return step, torch.no_grad()(loss_fn)


def bench_config(bc: BenchConfig, args) -> list[Result]:
  import torch  # pylint: disable=g-import-not-at-top
  cfg = bc.model_config()
  tokens = np.random.default_rng(1).integers(0, bc.vocab, (bc.batch, bc.seq), dtype=np.int64)
  net = build_torch_model(bc, args.torch_attn)
  params = _params_from_torch(net.state_dict(), cfg)
  tokens_jax = jnp.asarray(tokens, jnp.int32)
  tokens_torch = torch.from_numpy(tokens)

  optimizer = optax.adamw(LR, b1=BETAS[0], b2=BETAS[1], eps=EPS, weight_decay=WEIGHT_DECAY)
  jax_step, jax_loss = make_jax_step(cfg, optimizer)
  torch_opt = torch.optim.AdamW(net.parameters(), lr=LR, betas=BETAS, eps=EPS,
                                weight_decay=WEIGHT_DECAY)
  torch_step, torch_loss = make_torch_step(net, torch_opt)

  # Same weights, same tokens: the two losses must agree before either is timed.
  l_jax, l_torch = float(jax_loss(params, tokens_jax)), float(torch_loss(tokens_torch))
  print(f'[{bc.name}] initial loss jax={l_jax:.6f} torch={l_torch:.6f} '
        f'|diff|={abs(l_jax - l_torch):.2e}', flush=True)
  if abs(l_jax - l_torch) > args.loss_tol:
    raise SystemExit(f'[{bc.name}] losses disagree by more than {args.loss_tol}')

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
  n_tok = bc.batch * bc.seq
  notes = {'jax': 'fp32', 'torch': f'fp32 {args.torch_attn}'}
  results = []
  for fw, t in times.items():
    results.append(Result(bc.name, fw, t, n_tok, bc.flops(), notes[fw]))
    print(f'[{bc.name}] {fw} step {t:.3f}s', flush=True)
  return results


def print_table(results: list[Result], peaks: dict[str, float]):
  peak = max(peaks.values())
  print(f'\nmatmul peak 4096^3 f32: jax {peaks["jax"]:.1f} GFLOP/s, '
        f'torch {peaks["torch"]:.1f} GFLOP/s (MFU vs {peak:.1f})')
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
  parser.add_argument('--configs', default='small,mid')
  parser.add_argument('--steps', type=int, default=5)
  parser.add_argument('--warmup', type=int, default=2)
  parser.add_argument('--torch_attn', default='sdpa', choices=('sdpa', 'eager'))
  parser.add_argument('--skip_torch', action='store_true')
  parser.add_argument('--loss_tol', type=float, default=1e-4)
  args = parser.parse_args(argv)

  import torch  # pylint: disable=g-import-not-at-top
  torch.set_num_threads(2)
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
