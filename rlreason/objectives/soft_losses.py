"""Policy losses that keep a gradient on every token instead of zeroing it by a hard clip:
CISPO (a clipped, detached importance weight) and SAPO (a smooth sigmoid gate on the ratio).

Signatures and conventions as in losses.py, whose registry lists these. Both can take their
importance ratio per token or per sequence (`level`, TRL's importance_sampling_level).

Deliberately not here: the hard-clipped surrogates (losses.py), QUATRO (trust_region.py).
"""

import jax
import jax.numpy as jnp

from rlreason.objectives import ratios
from rlreason.objectives.aggregation import masked_mean

_sg = jax.lax.stop_gradient
LEVELS = ('token', 'sequence')


def _log_ratio(logprobs_NxL, old_logprobs_NxL, mask_NxL, *, level, log_ratio_clip):
  """Token log-ratios NxL, or each sequence's mean log-ratio repeated over its tokens."""
  if level == 'token':
    return ratios.clipped_log_ratio(logprobs_NxL, old_logprobs_NxL, log_ratio_clip)
  if level == 'sequence':
    log_s_N = ratios.sequence_log_ratio_N(logprobs_NxL, old_logprobs_NxL, mask_NxL)
    log_s_N = jnp.clip(log_s_N, -log_ratio_clip, log_ratio_clip)
    return jnp.broadcast_to(log_s_N[:, None], logprobs_NxL.shape)
  raise ValueError(f'level={level!r}; known: {LEVELS}.')


def cispo(logprobs_NxL, old_logprobs_NxL, advantages_NxL, mask_NxL, *, cap: str,
          eps_low: float = 1.0, eps_high: float | None = None, max_weight: float | None = None,
          level: str = 'token', log_ratio_clip: float = 20.0):
  """CISPO: REINFORCE with a clipped, detached importance weight (arXiv 2506.13585).

  ℓ = −sg(r̂) A lp, gradient −r̂ A ∇lp on every token (never masked). The two conventions for
  r̂ that share the name "ε_high" elsewhere must be chosen explicitly:
    cap='relative': r̂ = clip(r, 1 − ε_low, 1 + ε_high)  (the paper's and verl's; ε_low = 1
                    removes the floor; verl's example ε_high = 0.2 caps at 1.2, F-GRPO's
                    ε_high = 5 at 6);
    cap='absolute': r̂ = min(r, max_weight)               (TRL's `epsilon_high`, e.g. 5.0).
  level='token': r = exp(lp − lp_old) per token; level='sequence': r = s_i = exp((1/|y_i|)
  Σ_t M (lp − lp_old)), one weight per sequence, while lp stays per token (TRL's
  importance_sampling_level='sequence' with loss_type='cispo'). With one token per sequence
  the two levels coincide.
  The loss value is ≈ −A·lp, not a meaningful surrogate; log the weight statistics instead.
  Provenance: paper formula (MiniMax-M1's CISPO objective, verl's relative parameterisation);
  level='sequence' as in the reference code of huggingface/trl (`GRPOTrainer._compute_loss`).

  Returns:
    (loss_NxL, mask_NxL, metrics).
  """
  logprobs_NxL, old_logprobs_NxL, adv_NxL = ratios.masked_inputs(
      logprobs_NxL, old_logprobs_NxL, advantages_NxL, mask_NxL)
  log_ratio_NxL = _log_ratio(logprobs_NxL, old_logprobs_NxL, mask_NxL, level=level,
                             log_ratio_clip=log_ratio_clip)
  ratio_NxL = jnp.exp(_sg(log_ratio_NxL))
  if cap == 'relative':
    if eps_high is None:
      raise ValueError("cispo(cap='relative') needs eps_high (cap 1 + eps_high).")
    low, high = 1.0 - eps_low, 1.0 + eps_high
  elif cap == 'absolute':
    if max_weight is None:
      raise ValueError("cispo(cap='absolute') needs max_weight.")
    low, high = -jnp.inf, max_weight
  else:
    raise ValueError(f"cispo cap={cap!r}; known: 'relative', 'absolute'.")
  weight_NxL = jnp.clip(ratio_NxL, low, high)
  loss_NxL = -weight_NxL * adv_NxL * logprobs_NxL
  metrics = {
      'ratio/mean': masked_mean(ratio_NxL, mask_NxL),
      'cispo/weight_mean': masked_mean(weight_NxL, mask_NxL),
      'cispo/capped_frac_high': masked_mean(ratio_NxL > high, mask_NxL),
      'cispo/capped_frac_low': masked_mean(ratio_NxL < low, mask_NxL),
      'approx_kl': masked_mean(-_sg(log_ratio_NxL), mask_NxL),
  }
  return ratios.masked(loss_NxL, mask_NxL), mask_NxL, metrics


def sapo_gate(ratio_NxL, tau_NxL):
  """f(r) = σ(τ (r − 1)) · 4/τ: f(1) = 2/τ, f'(1) = 1 (the unclipped gradient at r = 1)."""
  return jax.nn.sigmoid(tau_NxL * (ratio_NxL - 1.0)) * (4.0 / tau_NxL)


def sapo(logprobs_NxL, old_logprobs_NxL, advantages_NxL, mask_NxL, *, tau_pos: float = 1.0,
         tau_neg: float = 1.05, level: str = 'token', log_ratio_clip: float = 20.0):
  """SAPO: a temperature-controlled sigmoid gate instead of PPO's hard clip (arXiv 2511.20347).

  ℓ = −f(r; τ) A with f(r; τ) = σ(τ (r − 1)) · 4/τ, τ = τ_pos where A > 0 and τ_neg where
  A ≤ 0. The gradient −A · 4σ(1 − σ) · r ∇lp equals REINFORCE's at r = 1 and decays smoothly
  (never exactly 0) as r leaves 1; a larger τ decays faster. level='token' is verl's ratio
  (log-ratio clamped to ±20); level='sequence' gates GSPO's sequence ratio s_i, with its
  gradient through the mean log-ratio (TRL's importance_sampling_level='sequence'). Both
  references aggregate SAPO with seq_mean_token_mean (verl forces it).
  Defaults τ_pos = 1.0, τ_neg = 1.05: verl's tau_pos/tau_neg and TRL's
  sapo_temperature_pos/neg (the paper's values for Qwen3-30B-A3B-Base, per verl's config).
  Provenance: as in the reference code of volcengine/verl (`compute_policy_loss_sapo`) and
  huggingface/trl (`GRPOTrainer._compute_loss`, loss_type='sapo').

  Returns:
    (loss_NxL, mask_NxL, metrics).
  """
  if tau_pos <= 0 or tau_neg <= 0:
    raise ValueError(f'sapo: tau_pos={tau_pos}, tau_neg={tau_neg} must be > 0.')
  logprobs_NxL, old_logprobs_NxL, adv_NxL = ratios.masked_inputs(
      logprobs_NxL, old_logprobs_NxL, advantages_NxL, mask_NxL)
  log_ratio_NxL = _log_ratio(logprobs_NxL, old_logprobs_NxL, mask_NxL, level=level,
                             log_ratio_clip=log_ratio_clip)
  ratio_NxL = jnp.exp(log_ratio_NxL)
  tau_NxL = jnp.where(adv_NxL > 0, tau_pos, tau_neg)
  gate_NxL = sapo_gate(ratio_NxL, tau_NxL)
  r_NxL = _sg(ratio_NxL)
  metrics = {
      'ratio/mean': masked_mean(r_NxL, mask_NxL),
      'approx_kl': masked_mean(-_sg(log_ratio_NxL), mask_NxL),
      # d f / d r at the current ratio: 1 on-policy, toward 0 far from it.
      'sapo/gate_slope_mean': masked_mean(4.0 * _sg(jax.nn.sigmoid(tau_NxL * (r_NxL - 1.0))
                                                    * jax.nn.sigmoid(-tau_NxL * (r_NxL - 1.0))),
                                          mask_NxL),
  }
  return ratios.masked(-gate_NxL * adv_NxL, mask_NxL), mask_NxL, metrics
