"""QUATRO (algorithms.md §7, our formalisation): the REPS dual, the limits δ → ∞ / δ → 0,
the restoring gradient, dual ascent, and that the loss's minimiser sits on the KL ball."""

import functools

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rlreason.objectives import trust_region

A_4 = jnp.array([1.5, -0.5, -0.5, -0.5])  # GRPO advantages of R = [1, 0, 0, 0], unbiased std


def _token_grad(lp, old, adv, mask, **kw):
  def total(lp):
    loss, w, _ = trust_region.quatro(lp, old, adv, mask, **kw)
    return jnp.sum(loss * w)
  return jax.grad(total)(lp)


def _group_loss(theta_4, delta, stabilizer='rho_log_rho'):
  """Exact E_{π_old}: π_old uniform over 4 outcomes, the group enumerates each once."""
  lp_Nx1 = jax.nn.log_softmax(theta_4)[:, None]
  old_Nx1 = jnp.full((4, 1), jnp.log(0.25))
  loss, w, _ = trust_region.quatro(lp_Nx1, old_Nx1, A_4, jnp.ones((4, 1)), group_size=4,
                                   delta=delta, stabilizer=stabilizer)
  return jnp.mean(loss * w)


def _kl_from_uniform(theta_4):
  """KL(softmax(θ) ‖ uniform) in float64 numpy (fp32 loses it to cancellation at 1e-6)."""
  theta = np.asarray(theta_4, np.float64)
  logp = theta - theta.max() - np.log(np.sum(np.exp(theta - theta.max())))
  return float(np.sum(np.exp(logp) * (logp - np.log(0.25))))


class TrustRegionTest(chex.TestCase):

  @chex.variants(with_jit=True, without_jit=True)
  def test_reps_dual_hand_case(self):
    # algorithms.md §7 [V]: A = [1.5, −0.5, −0.5, −0.5], δ = 0.1 → λ* ≈ 2.162 with
    # KL(softmax(A/λ*) ‖ uniform) = 0.1000.
    lam = self.variant(functools.partial(trust_region.reps_dual, delta=0.1))(A_4[None])
    np.testing.assert_allclose(lam, [2.162], atol=1e-3)
    np.testing.assert_allclose(trust_region.tilted_kl(A_4[None], lam), [0.1], atol=1e-6)

  def test_solved_dual_puts_tilted_weights_on_the_kl_ball(self):
    adv_BxG = jax.random.normal(jax.random.key(0), (5, 8))
    mask_BxG = jnp.ones((5, 8)).at[0, 6:].set(0.0)  # prompt 0 has 6 valid samples
    for delta in (1e-4, 0.05, 0.5):
      f = jax.jit(functools.partial(trust_region.reps_dual, delta=delta))
      lam_B = f(adv_BxG, mask_BxG=mask_BxG)
      assert np.all(np.asarray(lam_B) > 0)
      kl_B = trust_region.tilted_kl(adv_BxG, lam_B, mask_BxG=mask_BxG)
      np.testing.assert_allclose(kl_B, np.full(5, delta), rtol=1e-4)

  def test_slack_constraint_gives_zero_dual(self):
    # δ = 10 > log 4: even the greedy reweighting is inside the ball. All-equal advantages
    # never bind. A singleton group has KL 0 for every λ.
    f = jax.jit(functools.partial(trust_region.reps_dual, delta=10.0))
    np.testing.assert_array_equal(f(A_4[None]), [0.0])
    g = jax.jit(functools.partial(trust_region.reps_dual, delta=0.1))
    np.testing.assert_array_equal(g(jnp.full((2, 4), 0.7)), [0.0, 0.0])
    np.testing.assert_array_equal(g(jnp.array([[0.3], [-1.0]])), [0.0, 0.0])

  def test_infinite_delta_is_the_unclipped_policy_gradient(self):
    # λ = 0: per-token gradient −ρA at any ρ, for token and sequence ratios.
    k = jax.random.split(jax.random.key(1), 3)
    lp = -jax.random.uniform(k[0], (4, 3), minval=0.1, maxval=2.0)
    old = lp + 0.5 * jax.random.normal(k[1], (4, 3))
    adv, mask = jax.random.normal(k[2], (4,)), jnp.ones((4, 3))
    grad = jax.jit(functools.partial(_token_grad, group_size=2, delta=100.0))
    np.testing.assert_allclose(grad(lp, old, adv, mask), -jnp.exp(lp - old) * adv[:, None],
                               rtol=1e-5)
    seq = jax.jit(functools.partial(_token_grad, group_size=2, delta=100.0,
                                         ratio_level='sequence'))
    rho_N = jnp.exp(jnp.mean(lp - old, axis=-1))
    np.testing.assert_allclose(seq(lp, old, adv, mask),
                               jnp.broadcast_to((-rho_N * adv)[:, None], (4, 3)), rtol=1e-5)

  def test_minimiser_is_on_the_kl_ball_and_vanishes_as_delta_goes_to_zero(self):
    # Stationarity of the group loss at θ* = A/λ* (π* ∝ exp(A/λ*)), KL(π*‖π_old) = δ, and
    # π* → π_old as δ → 0 (no update); both stabilizers share the minimiser.
    grad = jax.jit(jax.grad(_group_loss), static_argnums=2)  # δ traced: one compile each
    reps = jax.jit(lambda a, d: trust_region.reps_dual(a, delta=d))
    for delta in (0.1, 0.01, 1e-6):
      lam = float(reps(A_4[None], delta)[0])
      theta_star = A_4 / lam
      for stabilizer in ('rho_log_rho', 'kl_generator'):
        # The gradient sums per-sample terms of size ~λ that cancel at θ*; fp32 keeps ~1e-7
        # of each, so zero is checked relative to that scale.
        np.testing.assert_allclose(grad(theta_star, delta, stabilizer), np.zeros(4),
                                   atol=1e-6 * (1.0 + lam))
      np.testing.assert_allclose(_kl_from_uniform(theta_star), delta, rtol=1e-3)
    assert np.abs(np.asarray(jax.nn.softmax(theta_star)) - 0.25).max() < 1e-3

  def test_gradient_descent_from_old_policy_converges_to_the_ball(self):
    # Minimising the loss from θ_old lands on KL = δ; for δ → 0 it barely moves.
    def descend(delta, lr, steps):
      step = lambda _, th: th - lr * jax.grad(_group_loss)(th, delta)
      return jax.jit(lambda th: jax.lax.fori_loop(0, steps, step, th))(jnp.zeros(4))
    np.testing.assert_allclose(_kl_from_uniform(descend(0.1, 1.0, 400)), 0.1, rtol=1e-3)
    assert _kl_from_uniform(descend(1e-6, 1e-3, 400)) < 2e-6

  @chex.variants(with_jit=True, without_jit=True)
  def test_restoring_gradient(self):
    # A = 1, λ = 1, log ρ = 1: weight ρ(A − λ(log ρ + 1)) = −e → ∂ℓ/∂lp = +e = 2.718282 (descent
    # lowers lp, back toward ρ = 1; PPO-clip would give 0). With 'kl_generator':
    # ρ(A − λ log ρ) = 0 → 0.
    lp, old = jnp.zeros((1, 1)), -jnp.ones((1, 1))
    f = self.variant(functools.partial(_token_grad, group_size=1, lam_B=jnp.ones(1),
                                       stabilizer='rho_log_rho'))
    np.testing.assert_allclose(f(lp, old, jnp.ones(1), jnp.ones((1, 1))), [[np.e]], rtol=1e-6)
    g = self.variant(functools.partial(_token_grad, group_size=1, lam_B=jnp.ones(1),
                                       stabilizer='kl_generator'))
    np.testing.assert_allclose(g(lp, old, jnp.ones(1), jnp.ones((1, 1))), [[0.0]], atol=1e-6)

  def test_zero_advantages_give_no_update(self):
    # An all-equal GRPO group (A = 0): λ = 0 and the gradient is exactly 0, even off-policy.
    h = jax.jit(functools.partial(_token_grad, group_size=4, delta=0.1))
    lp4 = -jax.random.uniform(jax.random.key(3), (4, 3))
    np.testing.assert_array_equal(h(lp4, lp4 - 0.3, jnp.zeros(4), jnp.ones((4, 3))),
                                  np.zeros((4, 3)))

  @chex.variants(with_jit=True, without_jit=True)
  def test_dual_ascent_and_group_kl(self):
    # λ ← max(0, λ + η(KL̂ − δ)): [0.5 + 0.2, max(0, 0.1 − 0.1 − ...)] = [0.7, 0.0].
    step = self.variant(functools.partial(trust_region.dual_ascent_step, delta=0.1, lr=1.0))
    np.testing.assert_allclose(step(jnp.array([0.5, 0.1]), jnp.array([0.3, 0.0])), [0.7, 0.0],
                               rtol=1e-6)
    # One prompt, G = 2: log ρ = [ln 2, 0] and [0, masked]: ρ log ρ = [2 ln 2, 0, 0] →
    # KL̂ = 2 ln 2 / 3 = 0.462098.
    lp = jnp.log(jnp.array([[0.5, 0.3], [0.3, 0.9]]))
    old = jnp.log(jnp.array([[0.25, 0.3], [0.3, 0.1]]))
    mask = jnp.array([[1.0, 1.0], [1.0, 0.0]])
    kl = self.variant(functools.partial(trust_region.quatro_kl, group_size=2))(lp, old, mask)
    np.testing.assert_allclose(kl, [0.462098], rtol=1e-5)

  def test_lam_table_matches_closed_form_and_arguments_are_exclusive(self):
    lp = -jax.random.uniform(jax.random.key(4), (4, 3))
    old, adv, mask = lp - 0.1, jnp.array([1.0, -1.0, 0.5, 0.2]), jnp.ones((4, 3))
    @jax.jit
    def both(lp, old, adv, mask):
      lam_B = trust_region.reps_dual(adv.reshape(2, 2), delta=0.05)
      return (trust_region.quatro(lp, old, adv, mask, group_size=2, delta=0.05)[0],
              trust_region.quatro(lp, old, adv, mask, group_size=2, lam_B=lam_B)[0])

    a, b = both(lp, old, adv, mask)
    np.testing.assert_allclose(a, b, rtol=1e-6)
    with pytest.raises(ValueError, match='exactly one'):
      trust_region.quatro(lp, old, adv, mask, group_size=2)
