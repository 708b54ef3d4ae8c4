"""QUATRO: a per-prompt KL trust region enforced through its Lagrangian (arXiv 2602.04620).

The method section of the paper could not be read; everything here is algorithms.md §7's
formalisation [I], built from the abstract's claims (per-prompt KL constraint, per-prompt
dual variables that set the update size, a stabilising log-ratio term):

  per prompt x:  max_π E_π[A]  s.t.  KL(π(·|x) ‖ π_old(·|x)) ≤ δ,
  Lagrangian per sample, with ρ = π/π_old:  ρ A − λ_x ρ log ρ   (E_old[ρ log ρ] = KL(π‖π_old)).

λ_x comes either from the closed-form REPS dual on the group's advantages (`reps_dual`, no
state across steps) or from dual ascent on a table of λ keyed by prompt (`dual_ascent_step`,
the caller keeps the table).

What "δ → 0 gives no update" means here: the surrogate's gradient at ρ = 1 is
−(1/G) Σ_i (A_i − λ) ∇lp_i whatever δ, since the λ term's gradient there, λ·mean ∇lp, is a
control variate with zero *expectation*. The trust region acts on where the surrogate leads:
its minimiser over the group is ρ* ∝ exp(A/λ*) with KL(ρ*/G ‖ uniform) = δ, which tends to
π_old as δ → 0 and to the greedy policy as δ → ∞ (λ* = 0, the unclipped policy gradient).
`stabilizer='kl_generator'` uses ρ log ρ − ρ + 1 instead (same expectation, same minimiser),
which drops that control variate so a large λ adds no finite-sample noise at ρ = 1.

Which stabiliser is the default, settled by colab/05_trust_regions (32 seeds, 4 updates per
batch, rollouts 2 iterations old): 'kl_generator' [I]. §7's ρ log ρ learns far slower at every
lr (final reward 0.51 / 0.79 / 0.11 at Adam lr 0.01 / 0.1 / 1 against 0.95 / 0.997 / 0.44),
since its zero-mean λ term pushes every sampled token down on a finite group. Of all QUATRO
forms, quatro_variants.quatro_log_target was the most stable at lr 1 (3.6% of positions locked
on a wrong token vs 37%, reward 0.70 vs 0.44) and level at 0.01 / 0.1, so it is the default
QUATRO form of experiments/quatro.py; PPO clip stayed ahead of every QUATRO form at lr 1 (0.94).

Deliberately not here: PPO-family losses (losses.py), aggregation (aggregation.py).
"""

import jax
import jax.numpy as jnp

from rlreason.objectives.aggregation import masked_mean

_LAM_RANGE = 1e6  # bisection bracket: λ ∈ [scale/1e6, scale·1e6], scale = max |A − mean A|.


def tilted_kl(advantages_BxG, lam_B, *, mask_BxG=None):
  """KL(softmax(A/λ) ‖ uniform) over each group's valid members (0 where λ = 0).

  The REPS-tilted weights q ∝ exp(A/λ) are the group's optimal reweighting under the
  constraint; this is the KL they have from the uniform (π_old) weights. With x = A/λ,
  KL = Σ q x − log mean exp x; for |x| ≤ 1 both terms use expm1/log1p, because a plain
  Σ q log(nq) loses the ~x²/2 result to fp32 cancellation at small δ.
  """
  valid_BxG = jnp.ones(advantages_BxG.shape, bool) if mask_BxG is None else mask_BxG > 0
  n_B = jnp.maximum(jnp.sum(valid_BxG, axis=-1), 1).astype(jnp.float32)
  adv_BxG = jnp.where(valid_BxG, advantages_BxG, 0.0)
  centred_BxG = jnp.where(valid_BxG, adv_BxG - (jnp.sum(adv_BxG, -1) / n_B)[:, None], 0.0)
  x_BxG = centred_BxG / jnp.where(lam_B > 0, lam_B, 1.0)[:, None]
  # Small |x|: Σ e^x = n + Σ expm1(x), Σ x e^x = Σ x + Σ x·expm1(x).
  em1_BxG = jnp.where(valid_BxG, jnp.expm1(jnp.minimum(x_BxG, 1.0)), 0.0)
  sum_e_B = n_B + jnp.sum(em1_BxG, -1)
  small_kl_B = ((jnp.sum(x_BxG, -1) + jnp.sum(x_BxG * em1_BxG, -1)) / sum_e_B
                - jnp.log1p(jnp.sum(em1_BxG, -1) / n_B))
  # Large |x|: shift by the max.
  m_B = jnp.max(jnp.where(valid_BxG, x_BxG, -jnp.inf), axis=-1)
  e_BxG = jnp.where(valid_BxG, jnp.exp(x_BxG - m_B[:, None]), 0.0)
  big_kl_B = (jnp.sum(e_BxG * x_BxG, -1) / jnp.sum(e_BxG, -1)
              - (m_B + jnp.log(jnp.sum(e_BxG, -1) / n_B)))
  small_B = jnp.max(jnp.abs(x_BxG), axis=-1) <= 1.0
  return jnp.where(lam_B > 0, jnp.where(small_B, small_kl_B, big_kl_B), 0.0)


def reps_dual(advantages_BxG, *, delta: float, mask_BxG=None, num_iters: int = 64):
  """Closed-form per-prompt dual λ_x of the REPS problem, by bisection on log λ.

  λ_x = argmin_{λ ≥ 0} λδ + λ log( (1/G) Σ_i exp(A_i/λ) ), whose solution makes
  KL(softmax(A/λ) ‖ uniform) = δ; λ = 0 when the constraint cannot bind (all-equal
  advantages, or δ ≥ the KL of the greedy weights, e.g. δ ≥ log G with a unique best).
  REPS: Peters et al. 2010; QUATRO: arXiv 2602.04620.
  Provenance: our formalisation (paper not available), algorithms.md §7 option (ii).

  Args:
    advantages_BxG: per-sample advantages of each prompt's group.
    delta: the per-prompt KL radius δ > 0.
    mask_BxG: valid group members (padding rows excluded); default all.
    num_iters: bisection steps on a bracket of 1e12 in λ (64 reach fp32 resolution).

  Returns:
    lam_B, fp32, without gradient.
  """
  adv_BxG = jax.lax.stop_gradient(advantages_BxG).astype(jnp.float32)
  valid_BxG = jnp.ones(adv_BxG.shape, bool) if mask_BxG is None else mask_BxG > 0
  centred_BxG = adv_BxG - masked_mean(adv_BxG, valid_BxG, axis=-1)[:, None]
  scale_B = jnp.max(jnp.where(valid_BxG, jnp.abs(centred_BxG), 0.0), axis=-1)
  safe_scale_B = jnp.where(scale_B > 0, scale_B, 1.0)
  lo_B = jnp.log(safe_scale_B / _LAM_RANGE)
  hi_B = jnp.log(safe_scale_B * _LAM_RANGE)

  def body(_, bracket):
    lo_B, hi_B = bracket
    mid_B = 0.5 * (lo_B + hi_B)
    too_tight_B = tilted_kl(centred_BxG, jnp.exp(mid_B), mask_BxG=valid_BxG) > delta
    return jnp.where(too_tight_B, mid_B, lo_B), jnp.where(too_tight_B, hi_B, mid_B)

  lo_B, hi_B = jax.lax.fori_loop(0, num_iters, body, (lo_B, hi_B))
  lam_B = jnp.exp(0.5 * (lo_B + hi_B))
  floor_kl_B = tilted_kl(centred_BxG, safe_scale_B / _LAM_RANGE, mask_BxG=valid_BxG)
  binds_B = (scale_B > 0) & (floor_kl_B > delta)
  return jnp.where(binds_B, lam_B, 0.0)


def dual_ascent_step(lam_B, kl_B, *, delta: float, lr: float):
  """λ_x ← max(0, λ_x + η (KL̂_x − δ)): projected dual ascent for a λ table keyed by prompt.

  Provenance: our formalisation (paper not available), algorithms.md §7 option (i).
  """
  return jnp.maximum(0.0, lam_B + lr * (jax.lax.stop_gradient(kl_B) - delta))


def _log_ratio(logprobs_NxL, old_logprobs_NxL, mask_NxL, *, ratio_level, log_ratio_clip):
  valid_NxL = mask_NxL > 0
  log_ratio_NxL = jnp.where(valid_NxL, logprobs_NxL - old_logprobs_NxL, 0.0)
  if ratio_level == 'sequence':  # GSPO-style length-normalised sequence ratio.
    log_ratio_NxL = jnp.broadcast_to(masked_mean(log_ratio_NxL, mask_NxL, axis=-1)[:, None],
                                     log_ratio_NxL.shape)
  elif ratio_level != 'token':
    raise ValueError(f"ratio_level={ratio_level!r}; known: 'token', 'sequence'.")
  return jnp.clip(log_ratio_NxL, -log_ratio_clip, log_ratio_clip)


def quatro_kl(logprobs_NxL, old_logprobs_NxL, mask_NxL, *, group_size: int,
              ratio_level: str = 'token', log_ratio_clip: float = 20.0):
  """Per-prompt KL̂_x = mean over the group's valid tokens of ρ log ρ (for `dual_ascent_step`).

  Provenance: our formalisation (paper not available), algorithms.md §7.
  """
  log_ratio_NxL = jax.lax.stop_gradient(_log_ratio(
      logprobs_NxL, old_logprobs_NxL, mask_NxL, ratio_level=ratio_level,
      log_ratio_clip=log_ratio_clip))
  kl_NxL = jnp.exp(log_ratio_NxL) * log_ratio_NxL
  n, l = mask_NxL.shape
  return masked_mean(kl_NxL.reshape(n // group_size, group_size * l),
                     mask_NxL.reshape(n // group_size, group_size * l), axis=-1)


def quatro(logprobs_NxL, old_logprobs_NxL, advantages_NxL, mask_NxL, *, group_size: int,
           delta: float | None = None, lam_B=None, ratio_level: str = 'token',
           stabilizer: str = 'kl_generator', log_ratio_clip: float = 20.0):
  """QUATRO per-token loss ℓ = −(ρ A − λ_x ρ log ρ), λ_x per prompt (arXiv 2602.04620).

  Per prompt L_x = −(1/G) Σ_i [ρ_i A_i − λ_x ρ_i log ρ_i] (seq_mean_token_mean aggregation
  gives exactly this average; token_mean weighs tokens). Gradient weight on ∇lp:
  ρ (A − λ (log ρ + 1)), which turns negative once log ρ > A/λ − 1: tokens that left the
  region get a restoring gradient instead of PPO's zero. λ = 0 is the unclipped policy
  gradient −ρA. Provenance: our formalisation (paper not available), algorithms.md §7 (b).

  Args:
    logprobs_NxL: current log-probs (differentiated).
    old_logprobs_NxL: π_old's log-probs of the same tokens.
    advantages_NxL: advantages, NxL or N (rows prompt-major, N = B·G); the dual uses each
      sequence's mean advantage over its valid tokens.
    mask_NxL: loss mask.
    group_size: G.
    delta: KL radius δ for the closed-form dual (`reps_dual`); give this or `lam_B`.
    lam_B: per-prompt duals from a table updated by `dual_ascent_step`.
    ratio_level: 'token' (ρ per token) or 'sequence' (ρ_i = exp(mean_t log ratio), the
      GSPO-style length-normalised ratio, shared by all tokens of the sequence).
    stabilizer: 'kl_generator' (default: ρ log ρ − ρ + 1, gradient weight ρ (A − λ log ρ);
      same expectation and minimiser as §7's, no zero-mean λ term; the module docstring gives
      the evidence) or 'rho_log_rho' (§7 exactly).
    log_ratio_clip: |log ρ| cap before exp.

  Returns:
    (loss_NxL, mask_NxL, metrics).
  """
  if (delta is None) == (lam_B is None):
    raise ValueError('quatro needs exactly one of delta (closed-form dual) or lam_B (dual ascent).')
  if stabilizer not in ('rho_log_rho', 'kl_generator'):
    raise ValueError(f"stabilizer={stabilizer!r}; known: 'rho_log_rho', 'kl_generator'.")
  n, _ = mask_NxL.shape
  # Zero padding before any arithmetic so NaN there cannot reach the loss or its gradient.
  valid_NxL = mask_NxL > 0
  adv_NxL = jnp.where(valid_NxL, jnp.broadcast_to(
      advantages_NxL if advantages_NxL.ndim == 2 else advantages_NxL[:, None], mask_NxL.shape),
                      0.0)
  logprobs_NxL = jnp.where(valid_NxL, logprobs_NxL, 0.0)
  old_logprobs_NxL = jnp.where(valid_NxL, old_logprobs_NxL, 0.0)
  if lam_B is None:
    seq_adv_BxG = masked_mean(adv_NxL, mask_NxL, axis=-1).reshape(n // group_size, group_size)
    seq_valid_BxG = (jnp.sum(mask_NxL, axis=-1) > 0).reshape(n // group_size, group_size)
    lam_B = reps_dual(seq_adv_BxG, delta=delta, mask_BxG=seq_valid_BxG)
  lam_N = jnp.repeat(jax.lax.stop_gradient(lam_B), group_size)
  log_ratio_NxL = _log_ratio(logprobs_NxL, old_logprobs_NxL, mask_NxL, ratio_level=ratio_level,
                             log_ratio_clip=log_ratio_clip)
  rho_NxL = jnp.exp(log_ratio_NxL)
  penalty_NxL = rho_NxL * log_ratio_NxL
  if stabilizer == 'kl_generator':
    penalty_NxL = penalty_NxL - rho_NxL + 1.0
  loss_NxL = -(rho_NxL * adv_NxL - lam_N[:, None] * penalty_NxL)
  loss_NxL = jnp.where(mask_NxL > 0, loss_NxL, 0.0)
  sg_log_ratio_NxL = jax.lax.stop_gradient(log_ratio_NxL)
  pull_NxL = sg_log_ratio_NxL + (1.0 if stabilizer == 'rho_log_rho' else 0.0)
  restoring_NxL = adv_NxL * (adv_NxL - lam_N[:, None] * pull_NxL) < 0
  kl_B = quatro_kl(logprobs_NxL, old_logprobs_NxL, mask_NxL, group_size=group_size,
                   ratio_level=ratio_level, log_ratio_clip=log_ratio_clip)
  metrics = {
      'quatro/lambda_mean': jnp.mean(lam_N),
      'quatro/kl_mean': jnp.mean(kl_B),
      'quatro/restoring_frac': masked_mean(restoring_NxL, mask_NxL),
      'ratio/mean': masked_mean(jax.lax.stop_gradient(rho_NxL), mask_NxL),
      'approx_kl': masked_mean(-sg_log_ratio_NxL, mask_NxL),
  }
  return loss_NxL, mask_NxL, metrics

