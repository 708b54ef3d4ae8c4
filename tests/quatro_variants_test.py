"""QUATRO variants (algorithms.md §7 [I]): the log-space target and measured-KL dual ascent."""

import functools

import chex
import jax
import jax.numpy as jnp
import numpy as np

from rlreason.objectives import quatro_variants
from rlreason.objectives import trust_region


def _token_grad(fn, lp, old, adv, mask, **kw):
  def total(lp):
    loss, w, _ = fn(lp, old, adv, mask, **kw)
    return jnp.sum(loss * w)
  return jax.grad(total)(lp)


class QuatroVariantsTest(chex.TestCase):

  @chex.variants(with_jit=True, without_jit=True)
  def test_log_normaliser_hand_case(self):
    # A = [1.5, −0.5, −0.5, −0.5], λ = 1: c = log((e^1.5 + 3 e^−0.5)/4)
    # = log((4.481689 + 3·0.606531)/4) = log(1.575320) = 0.454459; λ = 0: c = max A = 1.5.
    adv_BxG = jnp.array([[1.5, -0.5, -0.5, -0.5]] * 2)
    c_B = self.variant(quatro_variants.log_normaliser)(adv_BxG, jnp.array([1.0, 0.0]))
    np.testing.assert_allclose(c_B, [0.454459, 1.5], atol=1e-5)

  @chex.variants(with_jit=True, without_jit=True)
  def test_log_target_gradient_does_not_vanish_as_rho_goes_to_zero(self):
    # G = 2, one token each, λ = 1, A = [1, −1]: c = log((e + e^−1)/2) = log cosh 1
    # = log 1.543081 = 0.433781. Gradient on lp: λ log ρ − (A − c).
    # log ρ = [0, −10]: [0 − (1 − 0.433781), −10 − (−1 − 0.433781)] = [−0.566219, −8.566219]:
    # the sample at ρ = e^−10 = 4.54e−5 is pulled back up, harder the further it fell.
    # §7's form at the same point: −ρ(A − λ(log ρ + 1)) = −4.54e−5·(−1 + 9) = −3.63e−4.
    old = jnp.full((2, 1), -1.0)
    lp = old + jnp.array([[0.0], [-10.0]])
    adv, mask, lam = jnp.array([1.0, -1.0]), jnp.ones((2, 1)), jnp.array([1.0])
    grad = self.variant(functools.partial(_token_grad, quatro_variants.quatro_log_target,
                                          group_size=2, lam_B=lam))(lp, old, adv, mask)
    np.testing.assert_allclose(grad[:, 0], [-0.566219, -8.566219], atol=1e-5)
    grad_s7 = _token_grad(trust_region.quatro, lp, old, adv, mask, group_size=2, lam_B=lam,
                          stabilizer='rho_log_rho')
    np.testing.assert_allclose(grad_s7[1, 0], -3.632e-4, rtol=1e-3)

  def test_log_target_gradient_is_zero_at_the_trust_region_optimum(self):
    # log ρ_i = (A_i − c)/λ is the stationary point; beyond it the pull reverses.
    adv = jnp.array([1.5, -0.5, -0.5, -0.5])
    lam = jnp.array([2.0])
    c = quatro_variants.log_normaliser(adv[None], lam)[0]
    old = jnp.full((4, 1), -1.4)
    target = ((adv - c) / lam[0])[:, None]
    kw = dict(group_size=4, lam_B=lam)
    fn = quatro_variants.quatro_log_target
    np.testing.assert_allclose(_token_grad(fn, old + target, old, adv, jnp.ones((4, 1)), **kw),
                               np.zeros((4, 1)), atol=1e-6)
    past = _token_grad(fn, old + target + 0.5, old, adv, jnp.ones((4, 1)), **kw)
    np.testing.assert_allclose(past, np.full((4, 1), 2.0 * 0.5), atol=1e-5)  # λ·0.5: back down.

  def test_log_target_all_equal_advantages_give_zero_update(self):
    # Any constant A: c_x = A (λ > 0) or max A = A (λ = 0, the REPS dual of a flat group), so
    # at ρ = 1 the gradient −(A − c) is 0.
    lp = jnp.full((4, 3), -2.0)
    for kw in (dict(delta=0.1), dict(lam_B=jnp.array([0.7, 3.0]))):
      grad = _token_grad(quatro_variants.quatro_log_target, lp, lp, jnp.full((4,), 0.3),
                         jnp.ones((4, 3)), group_size=2, **kw)
      np.testing.assert_array_equal(grad, np.zeros_like(grad))

  @chex.variants(with_jit=True, without_jit=True)
  def test_dual_ascent_raises_lambda_above_delta_and_lowers_it_below(self):
    # Measured KL̂ = mean ρ log ρ. log ρ = 0.5 everywhere: KL̂ = e^0.5·0.5 = 0.824361 > δ = 0.1,
    # λ' = 1 + 2·(0.824361 − 0.1) = 2.448721. log ρ = 0: KL̂ = 0 < δ, λ' = 1 + 2·(0 − 0.1) = 0.8,
    # and from λ = 0.1: max(0, 0.1 − 0.2) = 0.
    old = jnp.full((2, 1), -1.0)
    adv, mask = jnp.array([1.0, -1.0]), jnp.ones((2, 1))
    f = self.variant(functools.partial(quatro_variants.quatro_dual_ascent, group_size=2,
                                       delta=0.1, lam_lr=2.0))
    for shift, lam, expected in ((0.5, 1.0, 2.448721), (0.0, 1.0, 0.8), (0.0, 0.1, 0.0)):
      _, _, m = f(old + shift, old, adv, mask, lam_B=jnp.array([lam]))
      np.testing.assert_allclose(m['quatro/lambda_mean'], expected, atol=1e-5)
    # The updated λ weighs the loss ('kl_generator'): gradient −ρ(A − λ' log ρ) with ρ = e^0.5
    # = 1.648721: [−1.648721·(1 − 1.224361), −1.648721·(−1 − 1.224361)] = [0.369908, 3.667351].
    grad = _token_grad(quatro_variants.quatro_dual_ascent, old + 0.5, old, adv, mask,
                       group_size=2, delta=0.1, lam_lr=2.0, lam_B=jnp.array([1.0]))
    np.testing.assert_allclose(grad[:, 0], [0.369908, 3.667351], atol=1e-5)

  def test_dual_ascent_step_matches_the_table_update(self):
    # The caller-kept table: λ ← max(0, λ + η(KL̂ − δ)) with η = 0.5, δ = 0.1:
    # [1 + 0.5·0.3, 0.02 + 0.5·(−0.1), 0 + 0.5·0.1] = [1.15, 0 (floored), 0.05].
    lam = trust_region.dual_ascent_step(jnp.array([1.0, 0.02, 0.0]), jnp.array([0.4, 0.0, 0.2]),
                                        delta=0.1, lr=0.5)
    np.testing.assert_allclose(lam, [1.15, 0.0, 0.05], atol=1e-6)

  def test_dual_ascent_all_equal_advantages_give_zero_update(self):
    # A = 0 (a group-centred estimator on a flat group) at ρ = 1: KL̂ = 0 < δ, the REPS start
    # is 0 and λ' = max(0, 0 − η δ) = 0; the loss −(ρ·0 − 0) has zero gradient.
    lp = jnp.full((4, 3), -2.0)
    grad = _token_grad(quatro_variants.quatro_dual_ascent, lp, lp, jnp.zeros((4,)),
                       jnp.ones((4, 3)), group_size=2, delta=0.1, lam_lr=5.0)
    np.testing.assert_array_equal(grad, np.zeros_like(grad))

  def test_padding_is_finite_and_needs_exactly_one_dual_source(self):
    lp = jnp.array([[-1.0, -jnp.inf], [-2.0, -1.0]])
    mask = jnp.array([[1.0, 0.0], [1.0, 1.0]])
    adv = jnp.array([[1.0, jnp.nan], [-1.0, -1.0]])
    for fn, kw in ((quatro_variants.quatro_log_target, dict(delta=0.05)),
                   (quatro_variants.quatro_dual_ascent, dict(delta=0.05, lam_lr=1.0))):
      grad = _token_grad(fn, lp, lp - 0.3, adv, mask, group_size=2, **kw)
      assert np.isfinite(np.asarray(grad)).all()
      assert float(grad[0, 1]) == 0.0
    with np.testing.assert_raises_regex(ValueError, 'exactly one of delta'):
      quatro_variants.quatro_log_target(lp, lp, adv, mask, group_size=2)
