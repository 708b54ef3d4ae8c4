"""On-policy distillation's per-token signals: the sampled reverse-KL reward and the
full-vocabulary divergences between a student π_s and a frozen teacher π_t (algorithms.md §26).

With z = logits / τ for each of the two models, log p = z − logsumexp(z):

  sampled reverse KL  r_t = −(log π_s − log π_t)(y_t) on the student's own sampled token y_t
                      [S: Thinking Machines, "On-Policy Distillation", 2025]; E_{y~π_s}[−r_t]
                      is the per-token KL(π_s‖π_t), so a student equal to the teacher gets 0.
  return              A_t = Σ_{u≥t} γ^{u−t} r_u over the row's trained tokens (γ = 0: r_t).
  generalised JSD_β   as TRL's GKDTrainer.generalized_jsd_loss [reference code]:
                      β = 0: forward KL(π_t‖π_s); β = 1: reverse KL(π_s‖π_t); otherwise, with
                      the mixture m = β π_t + (1 − β) π_s,
                      JSD_β = β KL(π_t‖m) + (1 − β) KL(π_s‖m).
                      (TRL special-cases β ∈ {0, 1}: JSD_β itself tends to 0 at both ends.)

Two paths that agree to fp32 rounding, values and gradients (tests/distill_test.py):

  divergence_from_logits(student_NxLxV, teacher_NxLxV, *, beta, temperature)
      from logits in memory (small vocabularies, tests).
  divergence_from_hidden(h_NxLxD, w_DxV, teacher_h_NxLxE, teacher_w_ExV, *, beta, ...)
      from the two models' final hidden states and output matrices, token_chunk positions at a
      time and within a chunk vocab_chunk columns at a time (token_stats.py's blocks): one pass
      for both log-normalisers, one for the divergence, and a custom VJP that recomputes each
      block's logits, so no NxLxV array exists, forward or backward. The teacher gets no
      gradient (it is frozen); the two hidden sizes may differ, the vocabulary may not.

The gradient w.r.t. the student's logits [ours, derived]: with g_v = ∂D/∂p_s,v and
S = Σ_v p_s,v g_v, ∂D/∂z_v = p_s,v (g_v − S); up to a constant in g (which cancels),
forward KL: p_s − p_t; reverse KL: g = log p_s − log p_t (S = the KL itself);
JSD_β: g = (1 − β)(log p_s − log m).

Deliberately not here: the teacher's forward and the mixing with the verifier's advantage
(methods/distill.py); a vocabulary-parallel form (token_stats.py has vocab_parallel.py): with
the output matrices sharded over 'tensor', XLA gathers each column block instead.
"""

import functools

import jax
import jax.numpy as jnp

from rlreason.objectives import token_stats

_NEG = -1e30  # Running-max start, as token_stats.py's.


def sampled_reverse_kl(student_logprobs_NxL, teacher_logprobs_NxL, mask_NxL):
  """r_t = −(log π_s − log π_t)(y_t) on the trained tokens, 0 on every other position."""
  return jnp.where(mask_NxL, teacher_logprobs_NxL - student_logprobs_NxL, 0.0)


def discounted_returns(rewards_NxL, mask_NxL, *, discount: float):
  """A_t = Σ_{u≥t} γ^{u−t} r_u, u running over the row's trained tokens only [ours]: an
  episode's observation tokens (mask 0) pass the return through without a discount step and
  get 0 themselves. γ = 0 gives r_t."""
  if discount == 0.0:
    return jnp.where(mask_NxL, rewards_NxL, 0.0)

  def step(carry_N, x):
    r_N, m_N = x
    g_N = jnp.where(m_N, r_N + discount * carry_N, carry_N)
    return g_N, g_N

  zeros_N = jnp.zeros(rewards_NxL.shape[:1], jnp.float32)
  _, g_LxN = jax.lax.scan(step, zeros_N, (rewards_NxL.T.astype(jnp.float32), mask_NxL.T),
                          reverse=True)
  return jnp.where(mask_NxL, g_LxN.T, 0.0)


def _terms(lp_s, lp_t, beta: float):
  """(per-column contributions to D, per-column contributions to S = Σ p_s g, or None)."""
  p_s, p_t = jnp.exp(lp_s), jnp.exp(lp_t)
  if beta == 0.0:
    return p_t * (lp_t - lp_s), None
  if beta == 1.0:
    kl_s = p_s * (lp_s - lp_t)
    return kl_s, kl_s
  lm = jnp.logaddexp(lp_s + jnp.log1p(-beta), lp_t + jnp.log(beta))
  return beta * p_t * (lp_t - lm) + (1.0 - beta) * p_s * (lp_s - lm), (1.0 - beta) * p_s * (
      lp_s - lm)


def _logit_grad(lp_s, lp_t, s, beta: float):
  """∂D/∂z_s per column, given S = Σ p_s g of the whole row (module docstring)."""
  p_s = jnp.exp(lp_s)
  if beta == 0.0:
    return p_s - jnp.exp(lp_t)
  if beta == 1.0:
    return p_s * (lp_s - lp_t - s)
  lm = jnp.logaddexp(lp_s + jnp.log1p(-beta), lp_t + jnp.log(beta))
  return p_s * ((1.0 - beta) * (lp_s - lm) - s)


def divergence_from_logits(student_NxLxV, teacher_NxLxV, *, beta: float,
                           temperature: float = 1.0):
  """D(π_s, π_t) of each position (fp32 NxL), from logits in memory; β as in the module
  docstring. The plain path: use `divergence_from_hidden` at large vocabularies."""
  lp_s = jax.nn.log_softmax(student_NxLxV.astype(jnp.float32) / temperature, axis=-1)
  lp_t = jax.nn.log_softmax(teacher_NxLxV.astype(jnp.float32) / temperature, axis=-1)
  return jnp.sum(_terms(lp_s, lp_t, float(beta))[0], axis=-1)


def divergence_from_hidden(h_NxLxD, w_DxV, teacher_h_NxLxE, teacher_w_ExV, *, beta: float,
                           temperature: float = 1.0, token_chunk: int = 512,
                           vocab_chunk: int = 8192):
  """`divergence_from_logits(h @ w, teacher_h @ teacher_w)` without NxLxV logits.

  Args:
    h_NxLxD, w_DxV: the student's final hidden states and output matrix (differentiable).
    teacher_h_NxLxE, teacher_w_ExV: the teacher's (no gradient); E may differ from D.
    beta: 0 forward KL, 1 reverse KL, in between TRL's generalised JSD.
    temperature: both models' logits are divided by it.
    token_chunk, vocab_chunk: positions and columns per block (V need not be a multiple).

  Returns:
    fp32 NxL divergences.
  """
  n, l, _ = h_NxLxD.shape
  if w_DxV.shape[1] != teacher_w_ExV.shape[1]:
    raise ValueError(f'divergence_from_hidden: the student has {w_DxV.shape[1]} vocabulary '
                     f'columns, the teacher {teacher_w_ExV.shape[1]}; they must be equal.')
  token_chunk = min(token_chunk, n * l)
  vocab_chunk = min(vocab_chunk, w_DxV.shape[1])
  d_M = _divergence(token_stats.pad_rows(h_NxLxD, token_chunk), w_DxV,
                    token_stats.pad_rows(teacher_h_NxLxE, token_chunk), teacher_w_ExV,
                    float(beta), float(temperature), token_chunk, vocab_chunk)
  return d_M[:n * l].reshape(n, l)


def _logits(h_KxD, w_DxV, k, vocab_chunk, inv_temp):
  start, w_DxC, _, fresh_C = token_stats._vocab_block(w_DxV, k, vocab_chunk)  # pylint: disable=protected-access
  z_KxC = jnp.dot(h_KxD, w_DxC.astype(h_KxD.dtype), preferred_element_type=jnp.float32)
  return start, w_DxC, z_KxC * inv_temp, fresh_C


def _chunk_lse(h_KxD, w_DxV, inv_temp, vocab_chunk):
  """logsumexp of z = h w / τ over all columns, block by block (online)."""

  def body(k, carry):
    m_K, s_K = carry
    _, _, z_KxC, fresh_C = _logits(h_KxD, w_DxV, k, vocab_chunk, inv_temp)
    z_KxC = jnp.where(fresh_C, z_KxC, _NEG)
    new_m_K = jnp.maximum(m_K, jnp.max(z_KxC, axis=-1))
    s_K = s_K * jnp.exp(m_K - new_m_K) + jnp.sum(jnp.exp(z_KxC - new_m_K[:, None]), axis=-1)
    return new_m_K, s_K

  k_ = h_KxD.shape[0]
  init = (jnp.full((k_,), _NEG, jnp.float32), jnp.zeros((k_,), jnp.float32))
  m_K, s_K = jax.lax.fori_loop(0, token_stats._num_blocks(w_DxV, vocab_chunk), body, init)  # pylint: disable=protected-access
  return m_K + jnp.log(s_K)


def _chunk_forward(h_KxD, w_DxV, th_KxE, tw_ExV, beta, inv_temp, vocab_chunk):
  """(D, S, lse_s, lse_t) of K positions."""
  lse_s, lse_t = (_chunk_lse(h_KxD, w_DxV, inv_temp, vocab_chunk),
                  _chunk_lse(th_KxE, tw_ExV, inv_temp, vocab_chunk))

  def body(k, carry):
    d_K, s_K = carry
    _, _, z_KxC, fresh_C = _logits(h_KxD, w_DxV, k, vocab_chunk, inv_temp)
    _, _, zt_KxC, _ = _logits(th_KxE, tw_ExV, k, vocab_chunk, inv_temp)
    d_KxC, s_KxC = _terms(z_KxC - lse_s[:, None], zt_KxC - lse_t[:, None], beta)
    d_K = d_K + jnp.sum(jnp.where(fresh_C, d_KxC, 0.0), axis=-1)
    if s_KxC is not None:
      s_K = s_K + jnp.sum(jnp.where(fresh_C, s_KxC, 0.0), axis=-1)
    return d_K, s_K

  zeros = jnp.zeros(lse_s.shape, jnp.float32)
  d_K, s_K = jax.lax.fori_loop(0, token_stats._num_blocks(w_DxV, vocab_chunk), body,  # pylint: disable=protected-access
                               (zeros, zeros))
  return d_K, s_K, lse_s, lse_t


def _blocks(x, token_chunk):
  return x.reshape(x.shape[0] // token_chunk, token_chunk, *x.shape[1:])


def _forward_all(h_MxD, w_DxV, th_MxE, tw_ExV, beta, temperature, token_chunk, vocab_chunk):
  inv_temp = 1.0 / temperature
  out = jax.lax.map(
      lambda a: _chunk_forward(a[0], w_DxV, a[1], tw_ExV, beta, inv_temp, vocab_chunk),
      (_blocks(h_MxD, token_chunk), _blocks(th_MxE, token_chunk)))
  return tuple(x.reshape(-1) for x in out)


@functools.partial(jax.custom_vjp, nondiff_argnums=(4, 5, 6, 7))
def _divergence(h_MxD, w_DxV, th_MxE, tw_ExV, beta, temperature, token_chunk, vocab_chunk):
  return _forward_all(h_MxD, w_DxV, th_MxE, tw_ExV, beta, temperature, token_chunk,
                      vocab_chunk)[0]


def _divergence_fwd(h_MxD, w_DxV, th_MxE, tw_ExV, beta, temperature, token_chunk, vocab_chunk):
  d_M, s_M, lse_s, lse_t = _forward_all(h_MxD, w_DxV, th_MxE, tw_ExV, beta, temperature,
                                        token_chunk, vocab_chunk)
  return d_M, (h_MxD, w_DxV, th_MxE, tw_ExV, s_M, lse_s, lse_t)


def _divergence_bwd(beta, temperature, token_chunk, vocab_chunk, residuals, g_M):
  """Recomputes each block's logits: dz = g · ∂D/∂z / τ, then dh = dz wᵀ and dw = hᵀ dz."""
  h_MxD, w_DxV, th_MxE, tw_ExV, s_M, lse_s, lse_t = residuals
  inv_temp = 1.0 / temperature

  def chunk(dw_DxV, xs):
    h_KxD, th_KxE, s_K, ls_K, lt_K, g_K = xs

    def body(k, carry):
      dh_KxD, dw_DxV = carry
      start, w_DxC, z_KxC, fresh_C = _logits(h_KxD, w_DxV, k, vocab_chunk, inv_temp)
      _, _, zt_KxC, _ = _logits(th_KxE, tw_ExV, k, vocab_chunk, inv_temp)
      dz_KxC = _logit_grad(z_KxC - ls_K[:, None], zt_KxC - lt_K[:, None], s_K[:, None], beta)
      dz_KxC = jnp.where(fresh_C, dz_KxC * (g_K[:, None] * inv_temp), 0.0).astype(h_KxD.dtype)
      dh_KxD = dh_KxD + jnp.dot(dz_KxC, w_DxC.T.astype(h_KxD.dtype),
                                preferred_element_type=jnp.float32)
      dw_DxC = jnp.dot(h_KxD.T, dz_KxC, preferred_element_type=jnp.float32)
      old_DxC = jax.lax.dynamic_slice_in_dim(dw_DxV, start, vocab_chunk, axis=1)
      dw_DxV = jax.lax.dynamic_update_slice_in_dim(dw_DxV, old_DxC + dw_DxC, start, axis=1)
      return dh_KxD, dw_DxV

    dh_KxD = jnp.zeros(h_KxD.shape, jnp.float32)
    dh_KxD, dw_DxV = jax.lax.fori_loop(0, token_stats._num_blocks(w_DxV, vocab_chunk), body,  # pylint: disable=protected-access
                                       (dh_KxD, dw_DxV))
    return dw_DxV, dh_KxD

  xs = tuple(_blocks(x, token_chunk) for x in (h_MxD, th_MxE, s_M, lse_s, lse_t, g_M))
  dw_DxV, dh_CxKxD = jax.lax.scan(chunk, jnp.zeros(w_DxV.shape, jnp.float32), xs)
  # The teacher is frozen: no cotangent for its hidden states or output matrix.
  return (dh_CxKxD.reshape(h_MxD.shape).astype(h_MxD.dtype), dw_DxV.astype(w_DxV.dtype),
          None, None)


_divergence.defvjp(_divergence_fwd, _divergence_bwd)
