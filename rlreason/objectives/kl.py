"""Per-token KL estimators between the policy and a reference (Schulman's k1, k2, k3).

With u = lp_ref − lp (log-probs of the sampled token; samples come from the policy):

  k1 = −u    k1_abs = |u|    k2 = ½u²    k3 = eᵘ − u − 1    k3_k2grad = k3 value, k2 gradient

E[k1] = E[k3] = KL(π‖π_ref), but the expected *gradients* differ (algorithms.md §0, tested in
tests/kl_test.py on a 4-way categorical by exact expectation):

  E[∇k1] = 0                 k1 as a loss adds only noise
  E[∇k2] = ∇KL(π‖π_ref)      reverse KL, what a KL penalty usually intends
  E[∇k3] = ∇KL(π_ref‖π)      forward KL, although its value estimates the reverse one
  E[∇k3_k2grad] = ∇KL(π‖π_ref)

Two placements, decided once per experiment:
  in the loss   `loss_NxL + beta * k(logprobs_NxL, ref_logprobs_NxL)`, aggregated with the
                policy loss (GRPO, arXiv 2402.03300);
  in the reward `kl_reward(old_logprobs_NxL, ref_logprobs_NxL, beta=...)`, a per-token
                penalty with no gradient, added to the token rewards (PPO-RLHF).

Deliberately not here: adaptive-β controllers (they belong to the training loop).
"""

from collections.abc import Callable

import jax
import jax.numpy as jnp


def _log_ratio(logprobs_NxL, ref_logprobs_NxL, log_ratio_clip):
  # verl clamps u before exp for stability; jnp.clip also stops the gradient outside.
  return jnp.clip(ref_logprobs_NxL - logprobs_NxL, -log_ratio_clip, log_ratio_clip)


def k1(logprobs_NxL, ref_logprobs_NxL, *, log_ratio_clip: float = 20.0):
  """k1 = lp − lp_ref; unbiased for KL(π‖π_ref), zero expected gradient.

  Schulman, "Approximating KL divergence" (2020), as used by GRPO (arXiv 2402.03300).
  Provenance: as in the reference code of volcengine/verl (`kl_penalty`, "k1").
  """
  return -_log_ratio(logprobs_NxL, ref_logprobs_NxL, log_ratio_clip)


def k1_abs(logprobs_NxL, ref_logprobs_NxL, *, log_ratio_clip: float = 20.0):
  """|k1| = |lp − lp_ref|; a biased, non-negative penalty (verl's "abs").

  Not an unbiased KL estimate (E|u| ≥ |E u|); its gradient is sign(lp − lp_ref) ∇lp, which
  pushes lp toward lp_ref token by token with unit weight. u is clamped to ±20 like the
  others (verl does not clamp "abs"; the values differ only where |u| > 20).
  Provenance: as in the reference code of volcengine/verl (`kl_penalty_forward`, "abs").
  """
  return jnp.abs(_log_ratio(logprobs_NxL, ref_logprobs_NxL, log_ratio_clip))


def k2(logprobs_NxL, ref_logprobs_NxL, *, log_ratio_clip: float = 20.0):
  """k2 = ½ (lp − lp_ref)²; its expected gradient is ∇KL(π‖π_ref).

  Schulman (2020); GRPO family (arXiv 2402.03300).
  Provenance: as in the reference code of volcengine/verl (`kl_penalty`, "k2"/"mse").
  """
  u_NxL = _log_ratio(logprobs_NxL, ref_logprobs_NxL, log_ratio_clip)
  return 0.5 * u_NxL * u_NxL


def k3(logprobs_NxL, ref_logprobs_NxL, *, log_ratio_clip: float = 20.0,
       value_clip: float = 10.0):
  """k3 = exp(u) − u − 1 ≥ 0 with u = lp_ref − lp; expected gradient ∇KL(π_ref‖π).

  The "low_var_kl" of GRPO (arXiv 2402.03300, eq. 4). Provenance: as in the reference code
  of volcengine/verl (`kl_penalty`, "low_var_kl": u clamped to ±20, k3 to ±10).
  """
  u_NxL = _log_ratio(logprobs_NxL, ref_logprobs_NxL, log_ratio_clip)
  return jnp.clip(jnp.exp(u_NxL) - u_NxL - 1.0, -value_clip, value_clip)


def k3_k2grad(logprobs_NxL, ref_logprobs_NxL, *, log_ratio_clip: float = 20.0,
              value_clip: float = 10.0):
  """k3's value with k2's gradient (straight-through): unbiased value and reverse-KL gradient.

  k = sg(k3) + k2 − sg(k2). Schulman (2020); GRPO (arXiv 2402.03300).
  Provenance: as in the reference code of volcengine/verl (`kl_penalty`, "k3+").
  """
  value_NxL = k3(logprobs_NxL, ref_logprobs_NxL, log_ratio_clip=log_ratio_clip,
                 value_clip=value_clip)
  grad_NxL = k2(logprobs_NxL, ref_logprobs_NxL, log_ratio_clip=log_ratio_clip)
  return jax.lax.stop_gradient(value_NxL) + grad_NxL - jax.lax.stop_gradient(grad_NxL)


KL_ESTIMATORS: dict[str, Callable] = {
    'k1': k1,
    'k1_abs': k1_abs,
    'k2': k2,
    'k3': k3,
    'k3_k2grad': k3_k2grad,
}


def get_kl_estimator(name: str) -> Callable:
  """The KL estimator registered under `name`; raises listing the known names."""
  if name not in KL_ESTIMATORS:
    raise KeyError(f'Unknown KL estimator {name!r}; known: {sorted(KL_ESTIMATORS)}.')
  return KL_ESTIMATORS[name]


def kl_reward(old_logprobs_NxL, ref_logprobs_NxL, mask_NxL, *, beta: float,
              estimator: str = 'k1'):
  """Per-token reward penalty −β·k(lp_old, lp_ref) for KL-in-reward, without gradient.

  r_t ← r_t − β (lp_old − lp_ref) with k1 (InstructGPT, arXiv 2203.02155); other estimators
  trade bias for variance. Provenance: as in the reference code of volcengine/verl
  (`apply_kl_penalty`). Masked positions get 0.
  """
  k_NxL = get_kl_estimator(estimator)(old_logprobs_NxL, ref_logprobs_NxL)
  return jax.lax.stop_gradient(jnp.where(mask_NxL > 0, -beta * k_NxL, 0.0))
