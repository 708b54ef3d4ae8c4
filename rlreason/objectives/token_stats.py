"""Per-token statistics of a tempered softmax policy: log π(token), entropy and Σπ².

With z = logits / τ and π = softmax(z), for each position and its given token a:

  logprob      = z_a − logsumexp(z)
  entropy      = −Σ_v π_v log π_v
  sum_sq_probs = Σ_v π_v² = exp(logsumexp(2z) − 2 logsumexp(z))

Σπ² is what OTB's logit-gradient proxy needs: ‖∂ log π_a / ∂z‖² = 1 − 2π_a + Σπ²
(arXiv 2602.07078; `logit_grad_energy`). Everything is computed in fp32.

Two paths that agree to fp32 rounding, values and gradients:

  token_stats(logits_NxTxV, tokens_NxT, *, temperature)
      from logits already in memory; plain `log_softmax`.
  token_stats_from_hidden(h_NxTxD, w_DxV, tokens_NxT, *, temperature, token_chunk, vocab_chunk)
      from final hidden states and the output projection (`params['lm_head']`, or
      `params['embed'].T` when embeddings are tied). Tokens are processed `token_chunk` at a
      time and, within a chunk, the vocabulary `vocab_chunk` columns at a time with an online
      logsumexp, so no NxTxV array exists in the forward pass. A custom VJP recomputes each
      chunk's logits in the backward pass instead of storing them, so the gradients w.r.t. h
      and w never hold NxTxV either: scratch memory is O(token_chunk · vocab_chunk) beyond
      the D×V gradient itself. The price is one extra logits matmul (four instead of three),
      which on CPU is more than repaid by never streaming NxTxV arrays through memory
      (experiments/bench/losses.py).

With the output matrix sharded over its vocabulary (tensor parallelism), vocab_parallel.py runs
the same kernels (`vocab_partials`, `finish`, `logit_backward`) on each device's columns.

Deliberately not here: sampling, the policy losses (losses.py), OTB's baseline itself.
"""

import functools

import flax
import jax
import jax.numpy as jnp

_NEG = -1e30  # Finite start for the running max: exp(_NEG - m) underflows to 0 without NaNs.


@flax.struct.dataclass
class TokenStats:
  """Per-position statistics of softmax(logits / temperature), all fp32."""
  logprobs_NxT: jax.Array
  entropy_NxT: jax.Array
  sum_sq_probs_NxT: jax.Array


def token_stats(logits_NxTxV, tokens_NxT, *, temperature: float = 1.0) -> TokenStats:
  """Log-prob of `tokens_NxT`, entropy and Σπ² of softmax(logits / temperature).

  The plain path: materialises fp32 log-probabilities of the whole NxTxV array (and, under
  `jax.grad`, its cotangent). Use `token_stats_from_hidden` at large vocabularies.

  Args:
    logits_NxTxV: logits, any float dtype (upcast to fp32).
    tokens_NxT: int token ids whose log-prob is returned.
    temperature: the policy is softmax(logits / temperature).

  Returns:
    TokenStats with NxT arrays.
  """
  z_NxTxV = logits_NxTxV.astype(jnp.float32) / temperature
  logp_NxTxV = jax.nn.log_softmax(z_NxTxV, axis=-1)
  logprobs_NxT = jnp.take_along_axis(logp_NxTxV, tokens_NxT[..., None], axis=-1)[..., 0]
  p_NxTxV = jnp.exp(logp_NxTxV)
  return TokenStats(logprobs_NxT=logprobs_NxT,
                    entropy_NxT=-jnp.sum(p_NxTxV * logp_NxTxV, axis=-1),
                    sum_sq_probs_NxT=jnp.sum(p_NxTxV * p_NxTxV, axis=-1))


def logit_grad_energy(logprobs_NxT, sum_sq_probs_NxT):
  """OTB's per-token energy 1 − 2π_a + Σπ² = ‖∂ log π_a / ∂z‖² (arXiv 2602.07078).

  As in the reference code of volcengine/verl (`compute_optimal_token_baseline_advantage`):
  π_a = exp(logprobs) of the sampled token, Σπ² from `token_stats*`.
  """
  return 1.0 - 2.0 * jnp.exp(logprobs_NxT) + sum_sq_probs_NxT


def token_stats_from_hidden(h_NxTxD, w_DxV, tokens_NxT, *, temperature: float = 1.0,
                            token_chunk: int = 1024, vocab_chunk: int = 16384) -> TokenStats:
  """`token_stats(h @ w, tokens)` without ever holding the NxTxV logits.

  Args:
    h_NxTxD: final hidden states (`transformer.apply(..., return_hidden=True)`); any float dtype.
    w_DxV: output projection; the matmul accumulates in fp32 like `transformer.logits_from_hidden`.
    tokens_NxT: int token ids whose log-prob is returned.
    temperature: the policy is softmax(h @ w / temperature).
    token_chunk: positions per chunk (the N*T positions are padded up to a multiple).
    vocab_chunk: vocabulary columns per step of the online logsumexp; V need not be a
      multiple (the last block is shifted left to end at V and its overlap is masked).

  Returns:
    TokenStats with NxT arrays; differentiable w.r.t. h_NxTxD and w_DxV.
  """
  n, t, _ = h_NxTxD.shape
  token_chunk = min(token_chunk, n * t)
  stats_M = _stats_from_hidden(pad_rows(h_NxTxD, token_chunk),
                               w_DxV, pad_rows(tokens_NxT.astype(jnp.int32), token_chunk),
                               float(temperature), token_chunk, min(vocab_chunk, w_DxV.shape[1]))
  lp_NxT, ent_NxT, sq_NxT = (s_M[:n * t].reshape(n, t) for s_M in stats_M)
  return TokenStats(logprobs_NxT=lp_NxT, entropy_NxT=ent_NxT, sum_sq_probs_NxT=sq_NxT)


def pad_rows(x_NxTx, token_chunk):
  """N x T x ... -> M x ...: positions flattened and zero-padded to a multiple of token_chunk."""
  n, t = x_NxTx.shape[:2]
  x_Mx = x_NxTx.reshape(n * t, *x_NxTx.shape[2:])
  return jnp.pad(x_Mx, [(0, -(n * t) % token_chunk)] + [(0, 0)] * (x_Mx.ndim - 1))


# ----------------------------------------------------------------------------- chunked kernel


def _vocab_block(w_DxV, k, vocab_chunk):
  """Block k of the vocabulary: columns [start, start + vocab_chunk), with the columns
  that block k owns (`fresh`); the last block starts at V - vocab_chunk so slices stay
  static-size, and the columns it shares with block k-1 are not fresh."""
  v = w_DxV.shape[1]
  start = jnp.minimum(k * vocab_chunk, v - vocab_chunk)
  w_DxC = jax.lax.dynamic_slice_in_dim(w_DxV, start, vocab_chunk, axis=1)
  col_C = start + jnp.arange(vocab_chunk)
  return start, w_DxC, col_C, col_C >= k * vocab_chunk


def _num_blocks(w_DxV, vocab_chunk):
  return -(-w_DxV.shape[1] // vocab_chunk)


@flax.struct.dataclass
class VocabPartials:
  """Online-logsumexp sums of z = logits / τ over some vocabulary columns, per position.

  Relative to the max m over those columns: s = Σ e^{z−m}, u = Σ e^{z−m}(z−m),
  q = Σ e^{2(z−m)}, and `picked` = z of the position's token if it is among the columns, else
  0. Then lse = m + log s, entropy = log s − u/s, Σπ² = q/s² (`finish`); keeping u relative to
  m avoids the cancellation of lse − Σπz on peaked distributions. Partials of disjoint column
  sets merge exactly (the block loop below; vocab_parallel.py across devices).
  """
  max_M: jax.Array
  sum_exp_M: jax.Array
  sum_exp_z_M: jax.Array
  sum_exp2_M: jax.Array
  picked_M: jax.Array


def finish(p: VocabPartials):
  """(logprobs, entropy, Σπ², logsumexp) from partials over the whole vocabulary."""
  log_s = jnp.log(p.sum_exp_M)
  lse_M = p.max_M + log_s
  return (p.picked_M - lse_M, log_s - p.sum_exp_z_M / p.sum_exp_M,
          p.sum_exp2_M / (p.sum_exp_M * p.sum_exp_M), lse_M)


def _chunk_forward(h_KxD, w_DxV, tokens_K, inv_temp, vocab_chunk) -> VocabPartials:
  """Online logsumexp over vocabulary blocks for K positions (VocabPartials' carries)."""

  def body(k, carry):
    m_K, s_K, u_K, q_K, picked_K = carry
    _, w_DxC, col_C, fresh_C = _vocab_block(w_DxV, k, vocab_chunk)
    z_KxC = jnp.dot(h_KxD, w_DxC.astype(h_KxD.dtype), preferred_element_type=jnp.float32) * inv_temp
    new_m_K = jnp.maximum(m_K, jnp.max(jnp.where(fresh_C, z_KxC, _NEG), axis=-1))
    shift_K = m_K - new_m_K
    scale_K = jnp.exp(shift_K)
    d_KxC = jnp.where(fresh_C, z_KxC - new_m_K[:, None], 0.0)
    e_KxC = jnp.where(fresh_C, jnp.exp(d_KxC), 0.0)
    s_new = scale_K * s_K + jnp.sum(e_KxC, axis=-1)
    u_new = scale_K * (u_K + shift_K * s_K) + jnp.sum(e_KxC * d_KxC, axis=-1)
    q_new = scale_K * scale_K * q_K + jnp.sum(e_KxC * e_KxC, axis=-1)
    hit_KxC = fresh_C & (col_C == tokens_K[:, None])
    picked_K = picked_K + jnp.sum(jnp.where(hit_KxC, z_KxC, 0.0), axis=-1)
    return new_m_K, s_new, u_new, q_new, picked_K

  k_ = h_KxD.shape[0]
  zeros = jnp.zeros((k_,), jnp.float32)
  init = (jnp.full((k_,), _NEG, jnp.float32), zeros, zeros, zeros, zeros)
  return VocabPartials(*jax.lax.fori_loop(0, _num_blocks(w_DxV, vocab_chunk), body, init))


def _chunk_backward(h_KxD, tokens_K, lse_K, ent_K, sq_K, g_lp_K, g_ent_K, g_sq_K, *, w_DxV,
                    dw_DxV, inv_temp, vocab_chunk):
  """Cotangents of one token chunk, recomputing its logits block by block.

  With π = softmax(z): ∂lp/∂z = e_a − π, ∂H/∂z = −π (log π + H), ∂Σπ²/∂z = 2π (π − Σπ²).
  """

  def body(k, carry):
    dh_KxD, dw_DxV = carry
    start, w_DxC, col_C, fresh_C = _vocab_block(w_DxV, k, vocab_chunk)
    z_KxC = jnp.dot(h_KxD, w_DxC.astype(h_KxD.dtype), preferred_element_type=jnp.float32) * inv_temp
    logp_KxC = z_KxC - lse_K[:, None]
    p_KxC = jnp.exp(logp_KxC)
    onehot_KxC = (col_C == tokens_K[:, None]).astype(jnp.float32)
    dz_KxC = (g_lp_K[:, None] * (onehot_KxC - p_KxC)
              - g_ent_K[:, None] * p_KxC * (logp_KxC + ent_K[:, None])
              + 2.0 * g_sq_K[:, None] * p_KxC * (p_KxC - sq_K[:, None]))
    dz_KxC = jnp.where(fresh_C, dz_KxC * inv_temp, 0.0).astype(h_KxD.dtype)
    dh_KxD = dh_KxD + jnp.dot(dz_KxC, w_DxC.T.astype(h_KxD.dtype),
                              preferred_element_type=jnp.float32)
    dw_DxC = jnp.dot(h_KxD.T, dz_KxC, preferred_element_type=jnp.float32)
    old_DxC = jax.lax.dynamic_slice_in_dim(dw_DxV, start, vocab_chunk, axis=1)
    dw_DxV = jax.lax.dynamic_update_slice_in_dim(dw_DxV, old_DxC + dw_DxC, start, axis=1)
    return dh_KxD, dw_DxV

  dh_KxD = jnp.zeros(h_KxD.shape, jnp.float32)
  return jax.lax.fori_loop(0, _num_blocks(w_DxV, vocab_chunk), body, (dh_KxD, dw_DxV))


def _split(x, token_chunk):
  return x.reshape(x.shape[0] // token_chunk, token_chunk, *x.shape[1:])


def vocab_partials(h_MxD, w_DxV, tokens_M, *, temperature, token_chunk,
                   vocab_chunk) -> VocabPartials:
  """VocabPartials over all columns of w for M positions (M a multiple of token_chunk)."""
  inv_temp = 1.0 / temperature
  out = jax.lax.map(lambda a: _chunk_forward(a[0], w_DxV, a[1], inv_temp, vocab_chunk),
                    (_split(h_MxD, token_chunk), _split(tokens_M, token_chunk)))
  return jax.tree.map(lambda x: x.reshape(-1), out)


def logit_backward(h_MxD, w_DxV, tokens_M, lse_M, ent_M, sq_M, g_lp_M, g_ent_M, g_sq_M, *,
                   temperature, token_chunk, vocab_chunk):
  """fp32 (dh_MxD, dw_DxV) through the columns of w, given the full-vocabulary lse, entropy
  and Σπ² of each position and the cotangents of its three statistics.

  Over a slice of the vocabulary (a device's shard in vocab_parallel.py) this is that slice's
  share: dh is then a partial sum over slices, dw the slice's columns.
  """
  inv_temp = 1.0 / temperature
  per_chunk = tuple(_split(x, token_chunk) for x in (h_MxD, tokens_M, lse_M, ent_M, sq_M,
                                                     g_lp_M, g_ent_M, g_sq_M))

  def step(dw_DxV, xs):
    dh_KxD, dw_DxV = _chunk_backward(*xs, w_DxV=w_DxV, dw_DxV=dw_DxV, inv_temp=inv_temp,
                                     vocab_chunk=vocab_chunk)
    return dw_DxV, dh_KxD

  dw_DxV, dh_CxKxD = jax.lax.scan(step, jnp.zeros(w_DxV.shape, jnp.float32), per_chunk)
  return dh_CxKxD.reshape(h_MxD.shape), dw_DxV


def _forward_all(h_MxD, w_DxV, tokens_M, temperature, token_chunk, vocab_chunk):
  return finish(vocab_partials(h_MxD, w_DxV, tokens_M, temperature=temperature,
                               token_chunk=token_chunk, vocab_chunk=vocab_chunk))


@functools.partial(jax.custom_vjp, nondiff_argnums=(3, 4, 5))
def _stats_from_hidden(h_MxD, w_DxV, tokens_M, temperature, token_chunk, vocab_chunk):
  lp, ent, sq, _ = _forward_all(h_MxD, w_DxV, tokens_M, temperature, token_chunk, vocab_chunk)
  return lp, ent, sq


def _stats_fwd(h_MxD, w_DxV, tokens_M, temperature, token_chunk, vocab_chunk):
  lp, ent, sq, lse = _forward_all(h_MxD, w_DxV, tokens_M, temperature, token_chunk, vocab_chunk)
  return (lp, ent, sq), (h_MxD, w_DxV, tokens_M, lse, ent, sq)


def _stats_bwd(temperature, token_chunk, vocab_chunk, residuals, cotangents):
  h_MxD, w_DxV = residuals[:2]
  dh_MxD, dw_DxV = logit_backward(*residuals, *cotangents, temperature=temperature,
                                  token_chunk=token_chunk, vocab_chunk=vocab_chunk)
  return dh_MxD.astype(h_MxD.dtype), dw_DxV.astype(w_DxV.dtype), None


_stats_from_hidden.defvjp(_stats_fwd, _stats_bwd)
