"""Aggregation of per-token losses into the scalar that is differentiated.

Every mode is a sum over tokens divided by a *global* denominator that the caller computes
once on the whole (mini)batch, before splitting it into micro-batches:

  den = denominators(mask_NxL, mode='token_mean')          # whole batch, outside the step
  loss = Σ_micro aggregate(loss_NxL[micro], mask_NxL[micro], mode='token_mean', denominator=den)

so the loss and its gradient do not depend on the split (algorithms.md §0, §22.1).

| mode                 | loss                                   | denominator            |
|----------------------|----------------------------------------|------------------------|
| token_mean           | Σ_{i,t} M ℓ / den                      | Σ_{i,t} M (global)     |
| seq_mean_token_mean  | Σ_i (Σ_t M ℓ / Σ_t M) / den            | #sequences (global)    |
| seq_mean_token_sum   | Σ_i Σ_t M ℓ / den                      | #sequences (global)    |
| constant_normalizer  | Σ_i Σ_t M ℓ / den                      | #sequences · L_max     |

The per-sequence length in seq_mean_token_mean is the row's own Σ_t M, which a row-wise split
keeps intact. `M` may be a float weight (SORL's reliability weights); a weight that is constant
along a row then cancels in seq_mean_token_mean, so such losses use token_mean.
Sequences count as rows with at least one valid token (verl's convention).

Deliberately not here: verl's `seq-mean-token-sum-norm`, whose divisor is the padded width of
the micro-batch; use `constant_normalizer` (Dr. GRPO's) instead.
"""

from collections.abc import Callable

import jax.numpy as jnp


def masked_mean(x, mask, axis=None):
  """Σ mask·x / Σ mask, 0 where the mask is empty (masked entries may hold NaN)."""
  num = jnp.sum(jnp.where(mask > 0, x * mask, 0.0), axis=axis)
  den = jnp.sum(mask, axis=axis, dtype=jnp.float32)
  return jnp.where(den > 0, num / jnp.where(den > 0, den, 1.0), 0.0)


def _divide(num, denominator):
  denominator = jnp.asarray(denominator, jnp.float32)
  return jnp.where(denominator > 0, num / jnp.where(denominator > 0, denominator, 1.0), 0.0)


def _masked_sum_N(loss_NxL, mask_NxL):
  return jnp.sum(jnp.where(mask_NxL > 0, loss_NxL * mask_NxL, 0.0), axis=-1)


def token_mean(loss_NxL, mask_NxL, *, denominator):
  """Σ_{i,t} M ℓ / den with den = the global token count (DAPO, arXiv 2503.14476).

  Provenance: paper formula (DAPO's token-level loss; verl's and TRL's default mode).
  """
  return _divide(jnp.sum(_masked_sum_N(loss_NxL, mask_NxL)), denominator)


def seq_mean_token_mean(loss_NxL, mask_NxL, *, denominator):
  """Σ_i (1/L_i) Σ_t M ℓ / den with den = the global sequence count (GRPO, arXiv 2402.03300).

  Provenance: paper formula (GRPO's 1/G Σ_i 1/|o_i| Σ_t; algorithms.md tags it [R], recalled).
  """
  per_seq_N = masked_mean(loss_NxL, mask_NxL, axis=-1)
  return _divide(jnp.sum(per_seq_N), denominator)


def seq_mean_token_sum(loss_NxL, mask_NxL, *, denominator):
  """Σ_i Σ_t M ℓ / den with den = the global sequence count.

  Provenance: as in the reference code of volcengine/verl (`agg_loss`, "seq-mean-token-sum").
  """
  return _divide(jnp.sum(_masked_sum_N(loss_NxL, mask_NxL)), denominator)


def constant_normalizer(loss_NxL, mask_NxL, *, denominator):
  """Dr. GRPO's (1/B) Σ_i (1/L_max) Σ_t M ℓ, den = B·L_max (arXiv 2503.20783).

  Every token weighs 1/(B·L_max) whatever its sequence's length. Provenance: as in the
  reference code of sail-sg/understand-r1-zero (`masked_aggregator` with
  `constant_normalizer=generate_max_length`, then the mean over sequences).
  """
  return _divide(jnp.sum(_masked_sum_N(loss_NxL, mask_NxL)), denominator)


AGGREGATIONS: dict[str, Callable] = {
    'token_mean': token_mean,
    'seq_mean_token_mean': seq_mean_token_mean,
    'seq_mean_token_sum': seq_mean_token_sum,
    'constant_normalizer': constant_normalizer,
}


def get_aggregation(name: str) -> Callable:
  """The aggregation registered under `name`; raises listing the known names."""
  if name not in AGGREGATIONS:
    raise KeyError(f'Unknown aggregation {name!r}; known: {sorted(AGGREGATIONS)}.')
  return AGGREGATIONS[name]


def denominators(mask_NxL, *, mode: str, max_len: int | None = None):
  """The global denominator of `mode`, computed on the whole batch before micro-batching.

  Args:
    mask_NxL: loss mask (or float weights) of the whole batch.
    mode: a key of AGGREGATIONS.
    max_len: L_max, required by 'constant_normalizer' (the configured maximum response
      length, not the padded width of some tensor).

  Returns:
    fp32 scalar.
  """
  get_aggregation(mode)
  if mode == 'token_mean':
    return jnp.sum(mask_NxL, dtype=jnp.float32)
  num_seqs = jnp.sum(jnp.sum(mask_NxL, axis=-1) > 0, dtype=jnp.float32)
  if mode == 'constant_normalizer':
    if max_len is None:
      raise ValueError("denominators(mode='constant_normalizer') needs max_len (L_max).")
    return num_seqs * float(max_len)
  return num_seqs


def aggregate(loss_NxL, mask_NxL, *, mode: str, denominator):
  """`get_aggregation(mode)(loss_NxL, mask_NxL, denominator=denominator)`."""
  return get_aggregation(mode)(loss_NxL, mask_NxL, denominator=denominator)
