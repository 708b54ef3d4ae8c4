"""Next-token sampling from logits: temperature, top-k, exact top-p, an inverse-CDF draw, and
the log-probs of the sampled token under the plain tempered and the truncated distribution.

  tok_N, plain_logp_N, behaviour_logp_N = sampling.next_token(logits_NxV, key, temperature,
                                                              greedy=False, top_k=0, top_p=1.0)

Pure functions of one step's logits, used inside the sampler's decode loop (sampler.py).
"""

import jax
import jax.numpy as jnp

_CDF_BLOCK = 128  # Tokens per block of the inverse-CDF search (see _categorical).


def truncate_logits(logits_NxV, *, top_k: int, top_p: float):
  """Sets logits outside the top-k / top-p support to -inf (applied in that order, as HF)."""
  v = logits_NxV.shape[-1]
  if top_k and top_k < v:
    _, idx_NxK = jax.lax.top_k(logits_NxV, top_k)
    keep = jnp.zeros(logits_NxV.shape, bool).at[
        jnp.arange(logits_NxV.shape[0])[:, None], idx_NxK].set(True)
    logits_NxV = jnp.where(keep, logits_NxV, -jnp.inf)
  if top_p < 1.0:
    # Token i stays iff the mass of tokens strictly more likely than it is < top_p. That set
    # is {p_i >= t} for a threshold t, found exactly by bisection over the float bit patterns
    # (monotone for non-negative floats): 31 masked sums instead of a vocabulary sort, which
    # is ~50x slower on CPU at V = 8k.
    probs_NxV = jax.nn.softmax(logits_NxV, axis=-1)
    bits_NxV = jax.lax.bitcast_convert_type(probs_NxV, jnp.int32)

    def bisect(_, bounds):
      lo_N, hi_N = bounds
      mid_N = lo_N + (hi_N - lo_N) // 2
      above_N = jnp.sum(jnp.where(bits_NxV > mid_N[:, None], probs_NxV, 0.0), axis=-1)
      ok_N = above_N < top_p
      return jnp.where(ok_N, lo_N, mid_N + 1), jnp.where(ok_N, mid_N, hi_N)

    one = jax.lax.bitcast_convert_type(jnp.float32(1.0), jnp.int32)
    n = logits_NxV.shape[0]
    _, threshold_N = jax.lax.fori_loop(
        0, 31, bisect, (jnp.zeros((n,), jnp.int32), jnp.full((n,), one + 1, jnp.int32)))
    logits_NxV = jnp.where(bits_NxV >= threshold_N[:, None], logits_NxV, -jnp.inf)
  return logits_NxV


def token_logprob(logits_NxV, tok_N):
  return jnp.take_along_axis(jax.nn.log_softmax(logits_NxV, axis=-1), tok_N[:, None], -1)[:, 0]


def _first_hit(hit_NxK, ok_NxK):
  """Per row, the first k with hit & ok, else the last k with ok."""
  k_K = jnp.arange(hit_NxK.shape[-1])
  first_N = jnp.min(jnp.where(hit_NxK & ok_NxK, k_K, k_K.size), axis=-1)
  last_N = jnp.max(jnp.where(ok_NxK, k_K, -1), axis=-1)
  return jnp.where(first_N < k_K.size, first_N, last_N)


def row_keys(rng, rows_N):
  """Each row's own stream: a key per row index (row n = b*G + g), from one key.

  With `step_keys`, a row's draws depend on (its row index, its token index) only, not on
  which batch slot or decode step it ran in: continuous batching (continuous.py) and the
  static sampler's `row_rng=True` then sample the same tokens. Our formalisation.
  """
  return jax.vmap(jax.random.fold_in, (None, 0))(rng, rows_N)


def step_keys(row_keys_N, index_N):
  """The key of each row's token `index_N` (sampled tokens counted from 0, prefix excluded)."""
  return jax.vmap(jax.random.fold_in)(row_keys_N, index_N)


def _categorical(key, weights_NxV, *, per_row: bool = False):
  """Samples token i of each row with probability weights[i] / sum(weights) (inverse CDF).

  One uniform per row: Gumbel-max (`jax.random.categorical`) draws N*V threefry variates per
  step, which on CPU cost as much as a mid-sized model's matmuls. The running sums are taken
  over blocks of tokens, then within the chosen block, so they stay short. The pick is the
  first positive-weight entry whose running sum exceeds u, so a zero-weight (truncated) token
  is never chosen, also when rounding puts u at or past the last running sum.
  """
  n, v = weights_NxV.shape
  block = min(_CDF_BLOCK, v)
  blocks = -(-v // block)
  w_NxBxK = jnp.pad(weights_NxV, ((0, 0), (0, blocks * block - v))).reshape(n, blocks, block)
  mass_NxB = w_NxBxK.sum(axis=-1)
  cum_NxB = jnp.cumsum(mass_NxB, axis=-1)
  if per_row:  # key holds N keys (step_keys): row n's uniform comes from its own key.
    u_N = jax.vmap(lambda k: jax.random.uniform(k, (), jnp.float32))(key) * cum_NxB[:, -1]
  else:
    u_N = jax.random.uniform(key, (n,), jnp.float32) * cum_NxB[:, -1]
  b_N = _first_hit(cum_NxB > u_N[:, None], mass_NxB > 0)
  before_N = jnp.where(
      b_N > 0, jnp.take_along_axis(cum_NxB, jnp.maximum(b_N - 1, 0)[:, None], -1)[:, 0], 0.0)
  w_NxK = jnp.take_along_axis(w_NxBxK, b_N[:, None, None], axis=1)[:, 0]
  k_N = _first_hit(jnp.cumsum(w_NxK, axis=-1) > (u_N - before_N)[:, None], w_NxK > 0)
  return (b_N * block + k_N).astype(jnp.int32)


def next_token(logits_NxV, key, temperature, *, greedy, top_k, top_p, per_row_keys=False):
  """The sampled token per row, its plain tempered log-prob and its behaviour log-prob.

  per_row_keys: `key` is N keys, one per row (`step_keys`), instead of one for all rows.

  One pass of exp over the vocabulary serves both log-probs and the sampler: the behaviour
  distribution is the plain one with truncated tokens' weights zeroed (same max, so the same
  shift), which is what log_softmax of the truncated logits computes.
  """
  plain_NxV = logits_NxV.astype(jnp.float32)
  if not greedy:
    plain_NxV = plain_NxV / temperature
  max_N = jnp.max(plain_NxV, axis=-1)
  weights_NxV = jnp.exp(plain_NxV - max_N[:, None])
  log_mass_N = jnp.log(jnp.sum(weights_NxV, axis=-1))
  if greedy:
    tok_N = jnp.argmax(plain_NxV, axis=-1).astype(jnp.int32)
  else:
    if top_k or top_p < 1.0:
      keep_NxV = jnp.isfinite(truncate_logits(plain_NxV, top_k=top_k, top_p=top_p))
      weights_NxV = jnp.where(keep_NxV, weights_NxV, 0.0)
    tok_N = _categorical(key, weights_NxV, per_row=per_row_keys)
  shifted_N = jnp.take_along_axis(plain_NxV, tok_N[:, None], -1)[:, 0] - max_N
  lp_N = shifted_N - log_mass_N
  if greedy:
    blp_N = jnp.zeros_like(lp_N)  # A deterministic choice has probability 1.
  elif top_k or top_p < 1.0:
    blp_N = shifted_N - jnp.log(jnp.sum(weights_NxV, axis=-1))
  else:
    blp_N = lp_N
  return tok_N, lp_N, blp_N
