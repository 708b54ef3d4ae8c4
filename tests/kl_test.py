"""KL estimators: hand values, and which KL each one's expected gradient targets, computed by
exact expectation over a 4-way categorical (algorithms.md §0)."""

import functools

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rlreason.objectives import kl

THETA_4 = jnp.array([0.4, -0.3, 1.1, -0.8])  # policy logits
REF_4 = jnp.log(jnp.array([0.1, 0.2, 0.3, 0.4]))  # reference log-probs


def _expected_grad(estimator, theta_4):
  """E_{a~π_θ}[∇_θ k(lp_θ(a), lp_ref(a))]: the sampling weights π(a) carry no gradient."""

  def expected_k(theta_4):
    lp_4 = jax.nn.log_softmax(theta_4)
    return jnp.sum(jax.lax.stop_gradient(jnp.exp(lp_4)) * estimator(lp_4, REF_4))

  return jax.grad(expected_k)(theta_4)


def _kl(p_logits_or_logp, q_logp):
  p_logp = jax.nn.log_softmax(p_logits_or_logp)
  return jnp.sum(jnp.exp(p_logp) * (p_logp - q_logp))


GRAD_REVERSE = jax.grad(lambda th: _kl(th, REF_4))(THETA_4)  # ∇ KL(π‖π_ref)
GRAD_FORWARD = jax.grad(lambda th: _kl(REF_4, jax.nn.log_softmax(th)))(THETA_4)  # ∇ KL(π_ref‖π)


class KlTest(chex.TestCase):

  @chex.variants(with_jit=True, without_jit=True)
  def test_hand_values(self):
    # lp = log 0.5, lp_ref = log 0.25: u = −ln 2 → k1 = 0.693147, k2 = ½ ln²2 = 0.240227,
    # k3 = 0.5 + ln 2 − 1 = 0.193147; k3_k2grad has k3's value.
    lp, ref = jnp.log(jnp.array([[0.5]])), jnp.log(jnp.array([[0.25]]))
    want = {'k1': 0.693147, 'k2': 0.240227, 'k3': 0.193147, 'k3_k2grad': 0.193147,
            'k1_abs': 0.693147}
    for name, value in want.items():
      got = self.variant(kl.get_kl_estimator(name))(lp, ref)
      np.testing.assert_allclose(got, [[value]], atol=1e-6)

  @chex.variants(with_jit=True, without_jit=True)
  def test_k1_abs_is_non_negative_with_sign_gradient(self):
    # verl's "abs": |lp − lp_ref|. lp = log 0.5 vs ref log 0.25: |ln 2| = 0.693147, d/dlp = +1;
    # swapped (lp = log 0.25, ref log 0.5): k1 = −0.693147 but |k1| = 0.693147, d/dlp = −1.
    lp = jnp.log(jnp.array([[0.5, 0.25]]))
    ref = jnp.log(jnp.array([[0.25, 0.5]]))
    fn = self.variant(kl.k1_abs)
    np.testing.assert_allclose(fn(lp, ref), [[0.693147, 0.693147]], atol=1e-6)
    np.testing.assert_allclose(kl.k1(lp, ref), [[0.693147, -0.693147]], atol=1e-6)
    grad = self.variant(jax.grad(lambda x: jnp.sum(kl.k1_abs(x, ref))))(lp)
    np.testing.assert_allclose(grad, [[1.0, -1.0]], atol=1e-6)

  @chex.variants(with_jit=True, without_jit=True)
  def test_expected_gradients_target_the_right_kl(self):
    # The two targets differ here, so matching one excludes the other.
    assert np.abs(GRAD_REVERSE - GRAD_FORWARD).max() > 0.1
    grad = lambda est: self.variant(functools.partial(_expected_grad, est))(THETA_4)
    np.testing.assert_allclose(grad(kl.k1), np.zeros(4), atol=1e-6)
    np.testing.assert_allclose(grad(kl.k2), GRAD_REVERSE, atol=1e-6)
    np.testing.assert_allclose(grad(kl.k3), GRAD_FORWARD, atol=1e-6)
    np.testing.assert_allclose(grad(kl.k3_k2grad), GRAD_REVERSE, atol=1e-6)

  @chex.variants(with_jit=True, without_jit=True)
  def test_expected_values_are_reverse_kl(self):
    # E_π[k1] = E_π[k3] = KL(π‖π_ref) (k3 is unbiased, k2 is not).
    lp_4 = jax.nn.log_softmax(THETA_4)
    target = _kl(THETA_4, REF_4)
    for est in (kl.k1, kl.k3, kl.k3_k2grad):
      value = self.variant(lambda lp: jnp.sum(jnp.exp(lp) * est(lp, REF_4)))(lp_4)
      np.testing.assert_allclose(value, target, atol=1e-6)

  @chex.variants(with_jit=True, without_jit=True)
  def test_kl_reward_is_a_masked_constant(self):
    old = jnp.log(jnp.array([[0.5, 0.2, 0.9]]))
    ref = jnp.log(jnp.array([[0.25, 0.2, 0.3]]))
    mask = jnp.array([[1.0, 1.0, 0.0]])
    f = self.variant(functools.partial(kl.kl_reward, beta=0.1))
    # −β (lp_old − lp_ref): −0.1·ln 2 = −0.0693147, 0, masked → 0.
    np.testing.assert_allclose(f(old, ref, mask), [[-0.0693147, 0.0, 0.0]], atol=1e-7)
    grad = jax.grad(lambda o: jnp.sum(f(o, ref, mask)))(old)
    np.testing.assert_array_equal(grad, np.zeros_like(grad))

  def test_k3_is_non_negative_and_clamped(self):
    lp = jnp.array([[-30.0, 0.0, -1.0]])
    ref = jnp.array([[0.0, -30.0, -1.0]])
    k = kl.k3(lp, ref)
    assert np.all(np.asarray(k) >= 0)
    assert float(k.max()) <= 10.0


def test_unknown_estimator_lists_known_names():
  with pytest.raises(KeyError, match='k3_k2grad'):
    kl.get_kl_estimator('k4')
