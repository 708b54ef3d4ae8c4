"""`make demo`: the most complete pipeline that exists today, end to end on this machine.

  python -m experiments.demo [--hidden 128 --layers 4 --batch 8 --group 4 --new_tokens 64]

Builds a small Qwen2-style model sharded over every local device, exports it as a Hugging
Face checkpoint and loads it back (weights.py), samples G continuations per prompt with the
sampler (prefill once, repeat the cache G times, a while_loop decode that stops when every
row has emitted EOS), then takes one AdamW train step on the sampled sequences, and prints
throughput for each phase. Runtime on a 2-core CPU: under a minute.

The RL trainer replaces this demo with `python -m rlreason.main` once it lands.
"""

import argparse
import pathlib
import tempfile
import time

import jax
import jax.numpy as jnp
import optax

from rlreason import model
from rlreason import sampler
from rlreason import sharding
from rlreason import weights
from rlreason.structs import Prompts


def train_step(params, opt_state, tokens_NxT, *, cfg, optimizer):
  def loss_fn(params):
    logits = model.apply(params, tokens_NxT[:, :-1], cfg=cfg)[0]
    logp = jax.nn.log_softmax(logits, axis=-1)
    return -jnp.mean(jnp.take_along_axis(logp, tokens_NxT[:, 1:, None], -1))

  loss, grads = jax.value_and_grad(loss_fn)(params)
  updates, opt_state = optimizer.update(grads, opt_state, params)
  return optax.apply_updates(params, updates), opt_state, loss


def main():
  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  ap.add_argument('--hidden', type=int, default=128)
  ap.add_argument('--layers', type=int, default=4)
  ap.add_argument('--vocab', type=int, default=512)
  ap.add_argument('--batch', type=int, default=8)
  ap.add_argument('--group', type=int, default=4)
  ap.add_argument('--prompt_len', type=int, default=32)
  ap.add_argument('--new_tokens', type=int, default=64)
  args = ap.parse_args()

  cfg = model.ModelConfig(vocab_size=args.vocab, hidden_size=args.hidden,
                          intermediate_size=3 * args.hidden, num_layers=args.layers,
                          num_heads=4, num_kv_heads=2, head_dim=args.hidden // 4, qkv_bias=True)
  mesh = sharding.make_mesh({'fsdp': -1})
  print(f'devices: {jax.device_count()} x {jax.devices()[0].platform}, mesh {dict(mesh.shape)}; '
        f'model: {cfg.num_params() / 1e6:.2f}M params')
  train_shardings = sharding.param_shardings(cfg, mesh, sharding.TRAIN_RULES)
  with jax.set_mesh(mesh):
    params = jax.jit(lambda r: model.init_params(cfg, r), out_shardings=train_shardings)(
        jax.random.key(0))

  # Round trip through the Hugging Face format, straight back into the training shardings.
  with tempfile.TemporaryDirectory() as tmp:
    path = pathlib.Path(tmp) / 'ckpt'
    weights.save(path, cfg, params)
    _, params = weights.load(path, mesh=mesh, rules=sharding.TRAIN_RULES)
  print(f'exported and re-imported a HF checkpoint: {len(jax.tree.leaves(params))} tensors')

  rng = jax.random.key(1)
  prompts = jax.random.randint(rng, (args.batch, args.prompt_len), 1, cfg.vocab_size)
  sample_params = sharding.reshard(params, sharding.param_shardings(
      cfg, mesh, sharding.SAMPLE_RULES))
  prompts = Prompts(tokens_BxP=prompts, mask_BxP=jnp.ones(prompts.shape, bool))
  generate = lambda r: sampler.generate(
      sample_params, prompts, cfg=cfg, group_size=args.group, max_new_tokens=args.new_tokens,
      temperature=1.0, top_p=0.95, stop_tokens=(0,), rng=r, mesh=mesh)
  with jax.set_mesh(mesh):
    jax.block_until_ready(generate(rng))  # Compile.
    t0 = time.perf_counter()
    rollout = jax.block_until_ready(generate(jax.random.fold_in(rng, 1)))
    dt = time.perf_counter() - t0
  stats = {k: f'{float(v):.3f}' for k, v in sampler.metrics(rollout).items()}
  tokens = int(rollout.lengths_N.sum())
  print(f'sampled {rollout.tokens_NxL.shape[0]} rows, {tokens} tokens in {dt:.2f}s: '
        f'{tokens / dt:,.0f} tok/s; {stats}')

  optimizer = optax.adamw(1e-3)
  seqs, _ = sampler.sequences(rollout)
  with jax.set_mesh(mesh):
    opt_state = optimizer.init(params)
    # Outputs keep the inputs' layouts, so the donated buffers are reused and step 2 does not
    # recompile for new input shardings.
    state_shardings = jax.tree.map(lambda x: x.sharding, (params, opt_state))
    step = jax.jit(lambda p, o, t: train_step(p, o, t, cfg=cfg, optimizer=optimizer),
                   out_shardings=(*state_shardings, None), donate_argnums=(0, 1))
    params, opt_state, loss0 = step(params, opt_state, seqs)
    t0 = time.perf_counter()
    params, opt_state, loss1 = jax.block_until_ready(step(params, opt_state, seqs))
    dt = time.perf_counter() - t0
  print(f'train step on {seqs.size:,} tokens in {dt:.2f}s: {seqs.size / dt:,.0f} tok/s; '
        f'loss {float(loss0):.4f} -> {float(loss1):.4f}')


if __name__ == '__main__':
  main()
