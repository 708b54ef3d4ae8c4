"""Two QUATRO variants that test where our formalisation may miss the paper's claim [I].

Both are our formalisation [I] (algorithms.md §7, "Why the [I] form may miss the paper's
claim"); the paper's method section could not be read [S: abstract only], and no reference
code exists [C: none]. `trust_region.quatro` is the §7 (b) form they are compared with.

* `quatro_log_target` (§7 reason 1): the §7 gradient weight ρ (A − λ(log ρ + 1)) vanishes as
  ρ → 0, so a sample pushed far below π_old gets no corrective signal again. Here log ρ_i is
  regressed onto the log-ratio of the exact trust-region optimum π* ∝ π_old·exp(A/λ):
  log ρ*_i = (A_i − c_x)/λ_x with c_x = λ_x log E_old[exp(A/λ_x)]; the pull grows like
  λ|log ρ| instead of vanishing.
* `quatro_dual_ascent` (§7 reason 2): the closed-form REPS dual depends on A and δ only, so
  nothing enforces KL ≤ δ over several updates. Here λ_x moves by projected dual ascent on the
  KL *measured* on the minibatch. The loop keeps no per-prompt state (rl/train.py's minibatch
  loop is not ours to change), so the registered loss takes one ascent step per update from
  the closed-form dual; a caller that keeps a λ table keyed by prompt (the 05 study does, for
  a fixed prompt set, across updates and iterations) passes it as `lam_B` and advances it with
  `trust_region.dual_ascent_step(lam_B, trust_region.quatro_kl(...))` after each update.

Evidence (colab/05_trust_regions, 32 seeds, δ = 0.02, 4 updates per batch on rollouts 2
iterations old): at Adam lr 1 the log-space target locks 3.6% of positions on a wrong token
(reward 0.70) against 37% for the §7 surrogate with 'kl_generator' (0.44) and 36-73% for both
dual-ascent forms (0.19-0.42); at lr 0.01 / 0.1 it is level with them (0.949 / 0.997). So
`quatro_log_target` is the default QUATRO form (experiments/quatro.py); dual ascent on the
measured KL did not help there. PPO clip stayed ahead of every QUATRO form at lr 1 (0.94).

Deliberately not here: the §7 loss and the REPS solver (trust_region.py).
"""

import jax
import jax.numpy as jnp

from rlreason.objectives import trust_region
from rlreason.objectives.aggregation import masked_mean


def log_normaliser(advantages_BxG, lam_B, *, mask_BxG=None):
  """c_x = λ_x log((1/G) Σ_i exp(A_i/λ_x)) over valid members; max_i A_i where λ_x = 0.

  π*(y) = π_old(y) exp((A(y) − c_x)/λ_x) is then normalised on the group's empirical π_old.
  Provenance: our formalisation [I], algorithms.md §7.
  """
  adv_BxG = jax.lax.stop_gradient(advantages_BxG).astype(jnp.float32)
  valid_BxG = jnp.ones(adv_BxG.shape, bool) if mask_BxG is None else mask_BxG > 0
  n_B = jnp.maximum(jnp.sum(valid_BxG, -1), 1).astype(jnp.float32)
  max_B = jnp.max(jnp.where(valid_BxG, adv_BxG, -jnp.inf), -1)
  max_B = jnp.where(jnp.isfinite(max_B), max_B, 0.0)
  safe_lam_B = jnp.where(lam_B > 0, lam_B, 1.0)
  e_BxG = jnp.where(valid_BxG, jnp.exp((adv_BxG - max_B[:, None]) / safe_lam_B[:, None]), 0.0)
  c_B = max_B + safe_lam_B * jnp.log(jnp.sum(e_BxG, -1) / n_B)
  return jnp.where(lam_B > 0, c_B, max_B)


def _prepare(logprobs_NxL, old_logprobs_NxL, advantages_NxL, mask_NxL, *, group_size, delta,
             lam_B):
  """Padding zeroed, advantages per token, and λ_B (given, or the REPS dual for δ)."""
  n, _ = mask_NxL.shape
  valid_NxL = mask_NxL > 0
  adv_NxL = jnp.where(valid_NxL, jnp.broadcast_to(
      advantages_NxL if advantages_NxL.ndim == 2 else advantages_NxL[:, None], mask_NxL.shape),
                      0.0)
  seq_adv_BxG = masked_mean(adv_NxL, mask_NxL, axis=-1).reshape(n // group_size, group_size)
  seq_valid_BxG = (jnp.sum(mask_NxL, axis=-1) > 0).reshape(n // group_size, group_size)
  if lam_B is None:
    lam_B = trust_region.reps_dual(seq_adv_BxG, delta=delta, mask_BxG=seq_valid_BxG)
  return (jnp.where(valid_NxL, logprobs_NxL, 0.0), jnp.where(valid_NxL, old_logprobs_NxL, 0.0),
          adv_NxL, seq_adv_BxG, seq_valid_BxG, jax.lax.stop_gradient(jnp.asarray(lam_B)))


def _one_of(delta, lam_B, name):
  if (delta is None) == (lam_B is None):
    raise ValueError(f'{name} needs exactly one of delta (closed-form dual) or lam_B (a table).')


def quatro_log_target(logprobs_NxL, old_logprobs_NxL, advantages_NxL, mask_NxL, *,
                      group_size: int, delta: float | None = None, lam_B=None,
                      ratio_level: str = 'token'):
  """ℓ = (λ_x/2)(log ρ)² − (A − c_x) log ρ: log ρ regressed onto (A − c_x)/λ_x [I].

  Equals (λ_x/2)(log ρ − (A − c_x)/λ_x)² up to a constant in θ, and stays defined at λ_x = 0.
  Gradient weight on ∇lp: λ_x log ρ − (A − c_x). At ρ = 1 that is the policy gradient with
  baseline c_x (REPS's log-normaliser, `log_normaliser`); it changes sign once log ρ passes
  the optimum's (A − c_x)/λ_x, from either side, and its pull grows like λ_x |log ρ| as
  ρ → 0 where §7's ρ (A − λ(log ρ + 1)) vanishes. No ρ = exp(·) enters the loss, so no
  log-ratio cap is needed. λ_x = 0 (δ too loose to bind) gives −(A − max A) log ρ, the greedy
  limit; all-equal advantages give c_x = A and a zero gradient at ρ = 1.
  Provenance: our formalisation [I], algorithms.md §7 ("a log-space stabiliser whose pull
  does not vanish as ρ → 0"); QUATRO: arXiv 2602.04620.

  Args:
    logprobs_NxL, old_logprobs_NxL, advantages_NxL (NxL or N), mask_NxL: as `quatro`.
    group_size: G.
    delta: KL radius δ of the closed-form dual (`trust_region.reps_dual`); or
    lam_B: per-prompt duals from a table.
    ratio_level: 'token' (each token's log ρ regressed onto its sequence's target) or
      'sequence' (the length-normalised sequence log-ratio, GSPO-style).

  Returns:
    (loss_NxL, mask_NxL, metrics).
  """
  _one_of(delta, lam_B, 'quatro_log_target')
  lp_NxL, old_NxL, adv_NxL, seq_adv_BxG, seq_valid_BxG, lam_B = _prepare(
      logprobs_NxL, old_logprobs_NxL, advantages_NxL, mask_NxL, group_size=group_size,
      delta=delta, lam_B=lam_B)
  c_B = log_normaliser(seq_adv_BxG, lam_B, mask_BxG=seq_valid_BxG)
  lam_Nx1 = jnp.repeat(lam_B, group_size)[:, None]
  c_Nx1 = jnp.repeat(c_B, group_size)[:, None]
  # A cap far outside any trained ratio: the loss is polynomial in log ρ, the cap only keeps
  # a -inf log-prob (a masked vocabulary entry) finite.
  log_ratio_NxL = trust_region._log_ratio(lp_NxL, old_NxL, mask_NxL, ratio_level=ratio_level,
                                          log_ratio_clip=1e4)
  loss_NxL = 0.5 * lam_Nx1 * log_ratio_NxL**2 - (adv_NxL - c_Nx1) * log_ratio_NxL
  loss_NxL = jnp.where(mask_NxL > 0, loss_NxL, 0.0)
  sg_log_ratio_NxL = jax.lax.stop_gradient(log_ratio_NxL)
  target_NxL = jnp.where(lam_Nx1 > 0, (adv_NxL - c_Nx1) / jnp.where(lam_Nx1 > 0, lam_Nx1, 1.0),
                         0.0)
  kl_B = trust_region.quatro_kl(lp_NxL, old_NxL, mask_NxL, group_size=group_size,
                                ratio_level=ratio_level)
  metrics = {
      'quatro/lambda_mean': jnp.mean(lam_B),
      'quatro/kl_mean': jnp.mean(kl_B),
      'quatro/target_gap': masked_mean(jnp.abs(sg_log_ratio_NxL - target_NxL), mask_NxL),
      'ratio/mean': masked_mean(jnp.exp(jnp.clip(sg_log_ratio_NxL, -20.0, 20.0)), mask_NxL),
      'approx_kl': masked_mean(-sg_log_ratio_NxL, mask_NxL),
  }
  return loss_NxL, mask_NxL, metrics


def quatro_dual_ascent(logprobs_NxL, old_logprobs_NxL, advantages_NxL, mask_NxL, *,
                       group_size: int, delta: float, lam_lr: float, lam_B=None,
                       stabilizer: str = 'kl_generator', ratio_level: str = 'token',
                       log_ratio_clip: float = 20.0):
  """`trust_region.quatro` with λ_x ← max(0, λ_x + η_λ (KL̂_x − δ)) on the measured KL [I].

  KL̂_x = mean over the prompt's valid tokens of ρ log ρ (`trust_region.quatro_kl`), measured
  with the current parameters on this minibatch: after every update trained so far in the
  step (earlier minibatches, earlier epochs), before this one. λ_x starts from `lam_B` (a
  table the caller keeps) or, without one, from the closed-form REPS dual for δ: one ascent
  step per update, no state across minibatches or steps (the loop keeps none; see the module
  docstring). The updated λ_x then weighs the §7 surrogate −(ρA − λ_x·stabiliser).
  Provenance: our formalisation [I], algorithms.md §7 option (i) and "dual ascent on the
  measured per-prompt KL after every minibatch"; QUATRO: arXiv 2602.04620.

  Args:
    logprobs_NxL, old_logprobs_NxL, advantages_NxL, mask_NxL, group_size, ratio_level,
      stabilizer, log_ratio_clip: as `trust_region.quatro`.
    delta: the per-prompt KL radius δ.
    lam_lr: the dual step η_λ > 0.
    lam_B: the caller's λ table entries for this minibatch's prompts; default the REPS dual.

  Returns:
    (loss_NxL, mask_NxL, metrics).
  """
  lp_NxL, old_NxL, _, _, _, lam_B = _prepare(
      logprobs_NxL, old_logprobs_NxL, advantages_NxL, mask_NxL, group_size=group_size,
      delta=delta if lam_B is None else None, lam_B=lam_B)
  kl_B = trust_region.quatro_kl(lp_NxL, old_NxL, mask_NxL, group_size=group_size,
                                ratio_level=ratio_level, log_ratio_clip=log_ratio_clip)
  lam_B = trust_region.dual_ascent_step(lam_B, kl_B, delta=delta, lr=lam_lr)
  loss_NxL, weights_NxL, metrics = trust_region.quatro(
      logprobs_NxL, old_logprobs_NxL, advantages_NxL, mask_NxL, group_size=group_size,
      lam_B=lam_B, ratio_level=ratio_level, stabilizer=stabilizer,
      log_ratio_clip=log_ratio_clip)
  metrics['quatro/over_delta_frac'] = jnp.mean((kl_B > delta).astype(jnp.float32))
  return loss_NxL, weights_NxL, metrics
