"""What to log about a policy update: importance ratios and clipping, zero-variance groups,
entropy and KL to the reference, and OTB's gradient-variance proxies.

Each function returns a flat dict of fp32 scalars over valid tokens (mask > 0), ready to be
written by the training loop. Nothing here carries a gradient.

Deliberately not here: the losses (losses.py, trust_region.py) and the token statistics they
need (token_stats.py).
"""

import jax
import jax.numpy as jnp

from rlreason.objectives import kl
from rlreason.objectives.aggregation import masked_mean


def _per_token(advantages, shape):
  """NxL advantages; per-sequence values (N,) are repeated over tokens."""
  return jnp.broadcast_to(advantages if advantages.ndim == 2 else advantages[:, None], shape)


def _masked_extreme(x, mask, fn, empty):
  valid = mask > 0
  fill = -jnp.inf if fn is jnp.max else jnp.inf
  return jnp.where(jnp.any(valid), fn(jnp.where(valid, x, fill)), empty)


def ratio_metrics(log_ratio_NxL, advantages_NxL, mask_NxL, *, eps_low: float, eps_high: float,
                  dual_clip: float | None = None) -> dict[str, jax.Array]:
  """Raw and clipped ratio statistics and clip fractions per side.

  r = exp(log_ratio). A token is clipped on the high side when A > 0 and r > 1 + ε_high, on
  the low side when A < 0 and r < 1 − ε_low: exactly the tokens whose PPO-clip gradient is
  zero. `dual` counts A < 0 with r > c (dual-clip, arXiv 1912.09729). `approx_kl` is
  mean(−log r), verl's `ppo_kl` (a k1 estimate of KL(π_old‖π) from π_old's samples), and
  `k3_kl` the non-negative mean(r − 1 − log r).
  Provenance: as in the reference code of volcengine/verl (`compute_policy_loss_vanilla`).
  """
  log_ratio_NxL = jax.lax.stop_gradient(log_ratio_NxL)
  adv_NxL = _per_token(advantages_NxL, log_ratio_NxL.shape)
  r_NxL = jnp.exp(log_ratio_NxL)
  high_NxL = (adv_NxL > 0) & (r_NxL > 1.0 + eps_high)
  low_NxL = (adv_NxL < 0) & (r_NxL < 1.0 - eps_low)
  out_NxL = (r_NxL > 1.0 + eps_high) | (r_NxL < 1.0 - eps_low)
  metrics = {
      'ratio/mean': masked_mean(r_NxL, mask_NxL),
      'ratio/max': _masked_extreme(r_NxL, mask_NxL, jnp.max, 1.0),
      'ratio/min': _masked_extreme(r_NxL, mask_NxL, jnp.min, 1.0),
      'ratio/clipped_mean': masked_mean(jnp.clip(r_NxL, 1.0 - eps_low, 1.0 + eps_high),
                                        mask_NxL),
      'ratio/outside_frac': masked_mean(out_NxL, mask_NxL),
      'clip_frac': masked_mean(high_NxL | low_NxL, mask_NxL),
      'clip_frac/high': masked_mean(high_NxL, mask_NxL),
      'clip_frac/low': masked_mean(low_NxL, mask_NxL),
      'approx_kl': masked_mean(-log_ratio_NxL, mask_NxL),
      'k3_kl': masked_mean(r_NxL - 1.0 - log_ratio_NxL, mask_NxL),
  }
  if dual_clip is not None:
    metrics['clip_frac/dual'] = masked_mean((adv_NxL < 0) & (r_NxL > dual_clip), mask_NxL)
  return metrics


def zero_variance_group_fraction(rewards_BxG, *, atol: float = 0.0) -> jax.Array:
  """Fraction of prompts whose G rewards are all equal (max − min ≤ atol).

  Such groups give zero group-relative advantage (DAPO filters them, arXiv 2503.14476);
  a singleton group (G = 1) counts as zero-variance. Provenance: paper formula (DAPO's
  dynamic-sampling condition 0 < #correct < G, generalised to any reward).
  """
  spread_B = jnp.max(rewards_BxG, axis=-1) - jnp.min(rewards_BxG, axis=-1)
  return jnp.mean((spread_B <= atol).astype(jnp.float32))


def policy_metrics(mask_NxL, *, entropy_NxL=None, logprobs_NxL=None,
                   ref_logprobs_NxL=None) -> dict[str, jax.Array]:
  """Mean entropy and the k1/k3 estimates of KL(π‖π_ref) over valid tokens, as available."""
  metrics = {}
  if entropy_NxL is not None:
    metrics['entropy'] = masked_mean(jax.lax.stop_gradient(entropy_NxL), mask_NxL)
  if logprobs_NxL is not None and ref_logprobs_NxL is not None:
    lp_NxL = jax.lax.stop_gradient(logprobs_NxL)
    metrics['kl_ref/k1'] = masked_mean(kl.k1(lp_NxL, ref_logprobs_NxL), mask_NxL)
    metrics['kl_ref/k3'] = masked_mean(kl.k3(lp_NxL, ref_logprobs_NxL), mask_NxL)
  return metrics


def otb_variance_proxies(old_logprobs_NxL, sum_sq_probs_NxL, advantages_NxL, mask_NxL, *,
                         grad_norm=None, is_weights_NxL=None) -> dict[str, jax.Array]:
  """OTB's forward-only proxies for the signal and noise of the policy gradient.

  Per token w = 1 − 2π_a + Σπ² (π_a = exp(lp_old); ‖∂ log π_a/∂z‖², algorithms.md §8), per
  sequence W_i = Σ_t M w and Ā_i = masked mean of A, over the N sequences:

    total power  P = (1/N) Σ_i ρ̄_i² Ā_i² max(W_i, 0)      (ρ̄_i = mean IS weight, 1 if none)
    signal       S = ‖ḡ‖² = grad_norm²                      (the step's actual gradient norm)
    noise        max(0, (P − S) / (N − 1))                  (variance of the batch mean)

  plus E[Ā²] and E[W] (with W scaled by the squared IS weights when given). Signal and noise
  are returned only when `grad_norm` is given. OTB: arXiv 2602.07078. Provenance: as in the
  reference code of volcengine/verl (`metric_utils.compute_variance_proxy_metrics`).
  """
  w_NxL = 1.0 - 2.0 * jnp.exp(old_logprobs_NxL) + sum_sq_probs_NxL
  valid_NxL = mask_NxL > 0
  raw_w_N = jnp.sum(jnp.where(valid_NxL, w_NxL, 0.0), axis=-1)
  adv_N = masked_mean(_per_token(advantages_NxL, mask_NxL.shape), mask_NxL, axis=-1)
  if is_weights_NxL is None:
    w_N = raw_w_N
    rho_N = jnp.ones_like(adv_N)
  else:
    w_N = jnp.sum(jnp.where(valid_NxL, w_NxL * is_weights_NxL**2, 0.0), axis=-1)
    rho_N = masked_mean(is_weights_NxL, mask_NxL, axis=-1)
  total = jnp.mean(rho_N**2 * adv_N**2 * jnp.maximum(raw_w_N, 0.0))
  metrics = {'otb/total_power': total, 'otb/expected_a_squared': jnp.mean(adv_N**2),
             'otb/expected_w': jnp.mean(w_N)}
  if grad_norm is not None:
    n = adv_N.shape[0]
    signal = jnp.asarray(grad_norm, jnp.float32)**2
    metrics['otb/signal'] = signal
    # verl reports 0 noise for a batch of one sequence.
    metrics['otb/noise'] = jnp.maximum(0.0, (total - signal) / (n - 1)) if n > 1 else 0.0 * total
  return jax.lax.stop_gradient(metrics)
