"""The transformer's layers as flax.nnx modules: RMSNorm, attention, the gated MLP, the block.

Each takes the `transformer.ModelConfig` it is built for; `transformer.Transformer` stacks
them and `transformer.apply` is the forward everyone calls. Attention without a cache is
the training forward (attention.causal_attention, head-major inside); with one it writes
the new keys and reads every segment (attention.cache_attention).
"""

import functools

from flax import nnx
import jax
import jax.numpy as jnp

from rlreason.model import attention
from rlreason.model import dart
from rlreason.model import rope as rope_lib


def param(rngs, shape, axes, dtype, init='normal'):
  if init == 'normal':
    value = 0.02 * jax.random.normal(rngs.params(), shape, jnp.float32)
  elif init == 'ones':
    value = jnp.ones(shape, jnp.float32)
  else:
    value = jnp.zeros(shape, jnp.float32)
  return nnx.Param(value.astype(dtype), axes=axes)


@functools.partial(jax.custom_vjp, nondiff_argnums=(2,))
def project(x, w, contract: int = 1):
  """x's last `contract` dims times w's first ones (`jnp.tensordot(x, w, contract)`), whose
  backward computes dw = x^T g directly, in w's layout.

  JAX's own transpose computes dw^T = g^T x and transposes the result, and XLA:CPU's dot
  wants the token-contracted operand transposed in memory: that copies g (tokens x outputs)
  where this copies x (tokens x inputs). Use it where the outputs are the wider side: the
  MLP's gate/up (measured on bench/forward.py's mid config, 2 cores: the copy of g took 300 ms
  of the step's 7.4 s CPU, the step went 3.50 -> 3.26-3.35 s). Where the inputs are wider
  (down) it is slower; for q/k/v it measured neutral.
  """
  return jnp.tensordot(x, w, contract)


def _project_fwd(x, w, contract):
  return jnp.tensordot(x, w, contract), (x, w)


def _project_bwd(contract, res, g):
  x, w = res
  lead = x.ndim - contract
  dx = jnp.tensordot(g, w, (tuple(range(lead, g.ndim)), tuple(range(contract, w.ndim))))
  dw = jnp.tensordot(x, g, (tuple(range(lead)), tuple(range(lead))))
  return dx.astype(x.dtype), dw.astype(w.dtype)


project.defvjp(_project_fwd, _project_bwd)


class RMSNorm(nnx.Module):

  def __init__(self, dim: int, eps: float, dtype, rngs: nnx.Rngs, axes=('norm',)):
    self.scale = param(rngs, (dim,), axes, dtype, init='ones')
    self.eps = eps

  def __call__(self, x):
    # Normalise in fp32 and cast back before the scale, as HF's Llama/Qwen RMSNorm does.
    x32 = x.astype(jnp.float32)
    y = x32 * jax.lax.rsqrt(jnp.mean(x32 * x32, axis=-1, keepdims=True) + self.eps)
    return self.scale[...].astype(x.dtype) * y.astype(x.dtype)


class Attention(nnx.Module):

  def __init__(self, cfg, rngs: nnx.Rngs):
    d, h, k, dh, pdt = cfg.hidden_size, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim, cfg.param_dtype
    self.q = param(rngs, (d, h, dh), ('embed', 'heads', 'head_dim'), pdt)
    self.k = param(rngs, (d, k, dh), ('embed', 'kv_heads', 'head_dim'), pdt)
    self.v = param(rngs, (d, k, dh), ('embed', 'kv_heads', 'head_dim'), pdt)
    self.o = param(rngs, (h, dh, d), ('heads', 'head_dim', 'embed'), pdt)
    if cfg.qkv_bias:
      self.q_bias = param(rngs, (h, dh), ('heads', 'head_dim'), pdt, init='zeros')
      self.k_bias = param(rngs, (k, dh), ('kv_heads', 'head_dim'), pdt, init='zeros')
      self.v_bias = param(rngs, (k, dh), ('kv_heads', 'head_dim'), pdt, init='zeros')
    if cfg.qk_norm:
      self.q_norm = RMSNorm(dh, cfg.rms_norm_eps, pdt, rngs, axes=('head_dim',))
      self.k_norm = RMSNorm(dh, cfg.rms_norm_eps, pdt, rngs, axes=('head_dim',))
    self.cfg = cfg

  def __call__(self, x_NxTxD, rope, mask_NxT, layer_cache, lr=None, subtree_end_NxT=None):
    """rope: the (cos, sin) tables of this call's positions (`rope_cos_sin`); lr: DART's
    routed adapters of this layer (dart.layer), or None; subtree_end_NxT: a packed trie's
    attention limits (attention.causal_attention), full forward only."""
    cfg, cdt = self.cfg, self.cfg.compute_dtype
    proj = lambda w, eq, name: (jnp.einsum(eq, x_NxTxD, w[...].astype(cdt))
                                + dart.lowrank(lr, 'attn', name, x_NxTxD, 1, cdt))
    q_NxTxHxDh = proj(self.q, 'ntd,dhk->nthk', 'q')
    k_NxTxKxDh = proj(self.k, 'ntd,dhk->nthk', 'k')
    v_NxTxKxDh = proj(self.v, 'ntd,dhk->nthk', 'v')
    if cfg.qkv_bias:
      q_NxTxHxDh += self.q_bias[...].astype(cdt)
      k_NxTxKxDh += self.k_bias[...].astype(cdt)
      v_NxTxKxDh += self.v_bias[...].astype(cdt)
    if cfg.qk_norm:
      q_NxTxHxDh, k_NxTxKxDh = self.q_norm(q_NxTxHxDh), self.k_norm(k_NxTxKxDh)
    q_NxTxHxDh, k_NxTxKxDh = rope_lib.rotate(q_NxTxHxDh, rope), rope_lib.rotate(k_NxTxKxDh, rope)

    n, t, k = x_NxTxD.shape[0], x_NxTxD.shape[1], cfg.num_kv_heads
    q_NxTxKxRxDh = q_NxTxHxDh.reshape(n, t, k, cfg.num_heads // k, cfg.head_dim)
    if layer_cache is None:  # Full forward: keys are this call's tokens, causal in order.
      out_NxTxKxRxDh = attention.causal_attention(q_NxTxKxRxDh, k_NxTxKxDh, v_NxTxKxDh,
                                                  mask_NxT, subtree_end_NxT=subtree_end_NxT)
      out_NxTxHxDh = out_NxTxKxRxDh.reshape(n, t, cfg.num_heads, cfg.head_dim)
      return (jnp.einsum('nthk,hkd->ntd', out_NxTxHxDh, self.o[...].astype(cdt))
              + dart.lowrank(lr, 'attn', 'o', out_NxTxHxDh, 2, cdt)), None

    # Write this call's keys at slots [end, end + T), attend to every valid slot <= own and
    # to the frozen segments' valid slots.
    cache_k, cache_v, cache_mask_NxS, end, frozen = layer_cache
    keys_NxKxDhxS = jax.lax.dynamic_update_slice_in_dim(
        cache_k, k_NxTxKxDh.transpose(0, 2, 3, 1).astype(cache_k.dtype), end, axis=3)
    values_NxKxSxDh = jax.lax.dynamic_update_slice_in_dim(
        cache_v, v_NxTxKxDh.swapaxes(1, 2).astype(cache_v.dtype), end, axis=2)
    slot_S = jnp.arange(cache_mask_NxS.shape[1])
    causal_TxS = slot_S[None, :] <= (end + jnp.arange(t))[:, None]
    segments = [(fk, fv, fmask_AxS[:, None]) for fk, fv, fmask_AxS in frozen]
    segments.append((keys_NxKxDhxS, values_NxKxSxDh, causal_TxS[None] & cache_mask_NxS[:, None]))
    out_NxTxKxRxDh = attention.cache_attention(q_NxTxKxRxDh, segments, dtype=cdt)
    out_NxTxHxDh = out_NxTxKxRxDh.reshape(n, t, cfg.num_heads, cfg.head_dim)
    y_NxTxD = (jnp.einsum('nthk,hkd->ntd', out_NxTxHxDh, self.o[...].astype(cdt))
               + dart.lowrank(lr, 'attn', 'o', out_NxTxHxDh, 2, cdt))
    return y_NxTxD, (keys_NxKxDhxS, values_NxKxSxDh)


class MLP(nnx.Module):

  def __init__(self, cfg, rngs: nnx.Rngs):
    d, f, pdt = cfg.hidden_size, cfg.intermediate_size, cfg.param_dtype
    self.gate = param(rngs, (d, f), ('embed', 'mlp'), pdt)
    self.up = param(rngs, (d, f), ('embed', 'mlp'), pdt)
    self.down = param(rngs, (f, d), ('mlp', 'embed'), pdt)
    self.cdt = cfg.compute_dtype

  def __call__(self, x_NxTxD, lr=None):
    """lr: DART's routed adapters of this layer (dart.layer), or None."""
    low = lambda name, x: dart.lowrank(lr, 'mlp', name, x, 1, self.cdt)
    if x_NxTxD.shape[1] == 1:  # Decoding: stacking would copy both weights every step.
      gate_NxTxF = x_NxTxD @ self.gate[...].astype(self.cdt) + low('gate', x_NxTxD)
      up_NxTxF = x_NxTxD @ self.up[...].astype(self.cdt) + low('up', x_NxTxD)
      hidden_NxTxF = jax.nn.silu(gate_NxTxF) * up_NxTxF
      return hidden_NxTxF @ self.down[...].astype(self.cdt) + low('down', hidden_NxTxF)
    # Training and prefill: one matmul for both input projections, stacked on a new axis so
    # each keeps its own 'mlp' sharding; the backward then sums one product for dx, not two.
    w_Dx2xF = jnp.stack([self.gate[...], self.up[...]], axis=1).astype(self.cdt)
    gate_up_NxTx2xF = project(x_NxTxD, w_Dx2xF)
    hidden_NxTxF = (jax.nn.silu(gate_up_NxTx2xF[..., 0, :] + low('gate', x_NxTxD))
                    * (gate_up_NxTx2xF[..., 1, :] + low('up', x_NxTxD)))
    return hidden_NxTxF @ self.down[...].astype(self.cdt) + low('down', hidden_NxTxF)


class Block(nnx.Module):
  """Pre-norm attention then MLP, residual around each. make_mlp builds the MLP (MLP, or
  moe_layer.MoEMLP for an MoE layer), after the attention so the dense model's random init
  draws its keys in the same order as before MoE existed."""

  def __init__(self, cfg, rngs: nnx.Rngs, make_mlp=None):
    self.attn_norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, cfg.param_dtype, rngs)
    self.attn = Attention(cfg, rngs)
    self.mlp_norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, cfg.param_dtype, rngs)
    self.mlp = (make_mlp or MLP)(cfg, rngs)
    self.sparse = make_mlp is not None and make_mlp is not MLP

  def __call__(self, x_NxTxD, rope, mask_NxT, layer_cache, lr=None, subtree_end_NxT=None,
               forced_ids_NxTxK=None):
    """Returns (x, new (keys, values) or None, the MoE layer's moe.Routed or None when dense).
    forced_ids_NxTxK: expert ids to replay (MoE layers; -1 rows route live)."""
    y_NxTxD, new_kv = self.attn(self.attn_norm(x_NxTxD), rope, mask_NxT, layer_cache, lr,
                                subtree_end_NxT)
    x_NxTxD = x_NxTxD + y_NxTxD
    if self.sparse:
      y_NxTxD, routed = self.mlp(self.mlp_norm(x_NxTxD), forced_ids_NxTxK)
      return x_NxTxD + y_NxTxD, new_kv, routed
    return x_NxTxD + self.mlp(self.mlp_norm(x_NxTxD), lr), new_kv, None


def _float_leaves(tree):
  return [x for x in jax.tree.leaves(tree) if jnp.issubdtype(x.dtype, jnp.floating)]


def _after(tree, dependency):
  """`tree` unchanged in value, but computed from a zero that XLA cannot fold: 0 times the sum
  of `dependency`'s float leaves (fp `x * 0` is not simplified: NaN and inf). Its float
  leaves then depend on every one of `dependency`'s, which no scheduler can reorder; an
  optimization barrier can't do this on XLA:CPU (its barrier expander drops them before
  scheduling)."""
  zero = sum(jnp.sum(x, dtype=jnp.float32) for x in _float_leaves(dependency)) * 0.0
  return jax.tree.map(lambda x: x + zero.astype(x.dtype)
                      if jnp.issubdtype(x.dtype, jnp.floating) else x, tree)


def remat_after_cotangent(block: Block, *args):
  """`block(*args)` whose backward recomputes the block only once its output's cotangent exists.

  [F] Full remat as a custom VJP: the forward keeps the block's inputs (its params and
  activations in) and nothing else; the backward reruns the block under `jax.vjp` from inputs
  made to depend on the incoming cotangent, and makes the input cotangent it hands down
  depend on the params' cotangents. So the recomputation can't run during the forward pass,
  and the layer below can't start before this layer's weight gradients are done (which frees
  the recomputed activations). `jax.checkpoint` (remat='full_checkpoint') ties the
  recomputation to nothing: XLA:CPU keeps each layer's recomputed activations alive until
  late in the backward (rl/memory.py). Gradients equal plain autodiff's up to adding zeros:
  the same function is differentiated, once, at the same inputs. Not forward-differentiable
  (custom_vjp).
  """
  graphdef, state = nnx.split(block)
  run = lambda state, args: nnx.merge(graphdef, state)(*args)

  @jax.custom_vjp
  def call(state, args):
    return run(state, args)

  def fwd(state, args):
    return run(state, args), (state, args)

  def bwd(saved, cotangent):
    state, args = saved
    d_state, d_args = jax.vjp(run, state, _after(args, cotangent))[1](cotangent)
    return d_state, _after(d_args, d_state)

  call.defvjp(fwd, bwd)
  return call(state, args)
