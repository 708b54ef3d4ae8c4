"""The importance ratios the policy losses share: token and sequence log-ratios, PPO's clipped
surrogate, and the input cleaning every loss does first.

Conventions of losses.py: logprobs_NxL carry the gradient, old_logprobs_NxL are π_old's,
advantages are NxL or N (broadcast over tokens), the mask is 1 on trained tokens.

Deliberately not here: the losses themselves (losses.py, soft_losses.py, trust_region.py) and
the diagnostics logged about the ratios (loss_diagnostics.py).
"""

import jax.numpy as jnp

from rlreason.objectives.aggregation import masked_mean


def masked_inputs(logprobs_NxL, old_logprobs_NxL, advantages_NxL, mask_NxL):
  """Log-probs and NxL advantages (per-sequence values repeated) with masked positions zeroed.

  Padding may hold −inf or NaN; replacing it *before* any arithmetic keeps NaN out of both
  the loss and its gradient (a `where` after the fact still back-propagates 0·NaN).
  """
  valid_NxL = mask_NxL > 0
  adv_NxL = jnp.broadcast_to(advantages_NxL if advantages_NxL.ndim == 2 else
                             advantages_NxL[:, None], mask_NxL.shape)
  return (jnp.where(valid_NxL, logprobs_NxL, 0.0), jnp.where(valid_NxL, old_logprobs_NxL, 0.0),
          jnp.where(valid_NxL, adv_NxL, 0.0))


def clipped_log_ratio(logprobs_NxL, base_logprobs_NxL, log_ratio_clip):
  """lp − lp_base clamped to ±log_ratio_clip before any exp (verl: 20)."""
  return jnp.clip(logprobs_NxL - base_logprobs_NxL, -log_ratio_clip, log_ratio_clip)


def sequence_log_ratio_N(logprobs_NxL, old_logprobs_NxL, mask_NxL):
  """log s_i = (1/|y_i|) Σ_t M (lp − lp_old): GSPO's length-normalised sequence log-ratio."""
  return masked_mean(logprobs_NxL - old_logprobs_NxL, mask_NxL, axis=-1)


def clip_surrogate(ratio_NxL, adv_NxL, eps_low, eps_high):
  """−min(r A, clip(r, 1 − ε_low, 1 + ε_high) A); ε may be per-token arrays."""
  clipped_NxL = jnp.clip(ratio_NxL, 1.0 - eps_low, 1.0 + eps_high)
  return -jnp.minimum(ratio_NxL * adv_NxL, clipped_NxL * adv_NxL)


def dual_clipped(loss_NxL, adv_NxL, dual_clip):
  """min(ℓ, −c A) where A < 0 (dual clip, arXiv 1912.09729); c must exceed 1."""
  if dual_clip is None:
    return loss_NxL
  if dual_clip <= 1.0:
    raise ValueError(f'dual_clip={dual_clip} must exceed 1.')
  return jnp.where(adv_NxL < 0, jnp.minimum(loss_NxL, -dual_clip * adv_NxL), loss_NxL)


def masked(loss_NxL, mask_NxL):
  return jnp.where(mask_NxL > 0, loss_NxL, 0.0)
