"""Advantage transforms, DAPO and HAPO operators, and the analysis helpers: worked values from
algorithms.md, degenerate groups, Monte-Carlo checks of the closed forms, the registry.

Worked values run with and without jit; property tests run jitted only (see advantages_test).
"""

import functools

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest
import scipy.stats

from rlreason.objectives import advantage_transforms as tr
from rlreason.objectives import advantages as adv

R_1000 = np.array([[1.0, 0.0, 0.0, 0.0]], np.float32)
GRPO_1000 = np.array([[1.5, -0.5, -0.5, -0.5]], np.float32)  # unbiased std, eps = 0.
TIGHT = dict(rtol=1e-6, atol=1e-6)


class FocalTest(chex.TestCase):

  @chex.variants(with_jit=True, without_jit=True)
  def test_worked_values(self):
    # mu = 1/4: gamma = 0.5 -> g = sqrt(3/4) = 0.8660; 1 -> 0.75; 2 -> 0.5625; 0 -> 1.
    for gamma, g in ((0.5, np.sqrt(0.75)), (1.0, 0.75), (2.0, 0.5625), (0.0, 1.0)):
      fn = self.variant(functools.partial(tr.focal_scale, gamma=gamma))
      np.testing.assert_allclose(fn(GRPO_1000, R_1000), g * GRPO_1000, **TIGHT)
    # The same group with +-1 rewards: mu = (mean + 1) / 2 = 1/4 again, same scaled advantages.
    pm = self.variant(functools.partial(tr.focal_scale, gamma=0.5, r_wrong=-1.0))
    np.testing.assert_allclose(pm(GRPO_1000, 2 * R_1000 - 1), np.sqrt(0.75) * GRPO_1000, **TIGHT)

  @chex.variants(with_jit=True)
  def test_weight_range_monotone_and_detached(self):
    rewards_BxG = np.array([[0, 0, 0, 0], [1, 0, 0, 0], [1, 1, 0, 0], [1, 1, 1, 0], [1, 1, 1, 1]],
                           np.float32)
    ones_BxG = np.ones_like(rewards_BxG)
    fn = self.variant(functools.partial(tr.focal_scale, gamma=0.7))
    g_B = np.asarray(fn(ones_BxG, rewards_BxG))[:, 0]
    assert np.all((g_B >= 0) & (g_B <= 1)) and np.all(np.diff(g_B) < 0)
    # All-correct / all-wrong groups: GRPO gives 0 and the transform keeps 0.
    a = fn(adv.grpo(rewards_BxG), rewards_BxG)
    np.testing.assert_array_equal(np.asarray(a)[[0, 4]], 0.0)
    # The weight carries no gradient: d/dR = 0, d/dA = g.
    grad_a, grad_r = jax.grad(lambda a, r: jnp.sum(fn(a, r)), argnums=(0, 1))(ones_BxG, rewards_BxG)
    np.testing.assert_allclose(grad_a, np.repeat(g_B[:, None], 4, 1), **TIGHT)
    np.testing.assert_array_equal(grad_r, 0.0)


class AGRAETest(chex.TestCase):

  @chex.variants(with_jit=True, without_jit=True)
  def test_worked_values(self):
    fn = self.variant(functools.partial(tr.a_grae, eps=0.0))
    # R = [1,0,0,0]: mu = 1/4, sqrt = 1/2 -> E = H = A_hat; batch accuracy 0.4 -> mix = A_hat;
    # positive part x min(1, 0.4) -> [0.6, -0.5, -0.5, -0.5].
    np.testing.assert_allclose(fn(GRPO_1000, R_1000, batch_accuracy=0.4),
                               [[0.6, -0.5, -0.5, -0.5]], **TIGHT)
    # R = [1,1,0,0]: A_hat = +-sqrt(3)/2 = +-0.8660, s = sqrt(1/2);
    # E = A_hat / (2 (1 - s)) = 1.7071 A_hat, H = A_hat / (2 s) = 0.7071 A_hat;
    # batch accuracy 0.2: 0.8 E + 0.2 H = 1.5071 A_hat = +-1.3052; positives x 0.2 -> 0.2610.
    r = np.array([[1.0, 1.0, 0.0, 0.0]], np.float32)
    a_hat = adv.grpo(r, eps=0.0)
    s = np.sqrt(0.5)
    mixed = (0.8 / (2 * (1 - s)) + 0.2 / (2 * s)) * np.sqrt(3) / 2
    np.testing.assert_allclose(fn(a_hat, r, batch_accuracy=0.2),
                               [[0.2 * mixed, 0.2 * mixed, -mixed, -mixed]], rtol=1e-6)
    np.testing.assert_allclose(0.2 * mixed, 0.261, atol=5e-4)  # algorithms.md's rounding.
    np.testing.assert_allclose(mixed, 1.305, atol=5e-4)

  @chex.variants(with_jit=True)
  def test_batch_accuracy_limits_and_default(self):
    # Batch accuracy 1 (alpha = 1): pure hard focus, no suppression, A = A_hat / (2 s).
    fn = self.variant(functools.partial(tr.a_grae, eps=0.0))
    r = np.array([[1.0, 1.0, 0.0, 0.0]], np.float32)
    a_hat = np.asarray(adv.grpo(r, eps=0.0))
    np.testing.assert_allclose(fn(a_hat, r, batch_accuracy=1.0), a_hat / (2 * np.sqrt(0.5)),
                               **TIGHT)
    # Batch accuracy -> 0: positive advantages vanish (pure negative-sample RL).
    a = np.asarray(fn(a_hat, r, batch_accuracy=0.0))
    np.testing.assert_array_equal(a[a_hat > 0], 0.0)
    assert np.all(a[a_hat < 0] < 0)
    # Default batch accuracy = mean success rate over prompts: (0.25 + 0.55) / 2 = 0.4.
    rewards_BxG = np.array([[1, 0, 0, 0], [1, 1, 0.2, 0]], np.float32)
    a_hat = adv.grpo(rewards_BxG, eps=0.0)
    np.testing.assert_allclose(fn(a_hat, rewards_BxG), fn(a_hat, rewards_BxG, batch_accuracy=0.4),
                               **TIGHT)
    # +-1 rewards mapped through r_wrong = -1 give the 0/1 result (the code would take sqrt < 0).
    pm = self.variant(functools.partial(tr.a_grae, r_wrong=-1.0))
    np.testing.assert_allclose(pm(GRPO_1000, 2 * R_1000 - 1, batch_accuracy=0.4),
                               tr.a_grae(GRPO_1000, R_1000, batch_accuracy=0.4), **TIGHT)


class IFPOTest(chex.TestCase):

  @chex.variants(with_jit=True, without_jit=True)
  def test_weights(self):
    weights = self.variant(functools.partial(tr.ifpo_weights, num_modes=2))
    # Balanced -> 1; a mode seen once in G = 8 (K = 2) -> 8 / (2 * 1) = 4, the rest 8 / 14;
    # a single mode -> 8 / (1 * 8) = 1.
    modes_BxG = np.array([[0, 1] * 4, [1] + [0] * 7, [0] * 8])
    expected = np.array([[1.0] * 8, [4.0] + [8 / 14] * 7, [1.0] * 8])
    np.testing.assert_allclose(weights(modes_BxG), expected, **TIGHT)
    # Counted over the batch instead: mode 1 is 5 of 24 -> 24 / (2 * 5), mode 0 -> 24 / 38.
    batch = self.variant(functools.partial(tr.ifpo_weights, num_modes=2, per_group=False))
    np.testing.assert_allclose(batch(modes_BxG), np.where(modes_BxG == 1, 2.4, 24 / 38), **TIGHT)

  @chex.variants(with_jit=True, without_jit=True)
  def test_hand_example(self):
    # R = [1,0,0,0], the success consulted the rules (mode 1): w = [4/(2*1), 4/(2*3) x3]
    # = [2, 2/3 x3] -> [3, -1/3, -1/3, -1/3].
    fn = self.variant(functools.partial(tr.ifpo, num_modes=2))
    np.testing.assert_allclose(fn(GRPO_1000, np.array([[1, 0, 0, 0]])),
                               [[3.0, -1 / 3, -1 / 3, -1 / 3]], **TIGHT)


class DAPOTest(chex.TestCase):

  @chex.variants(with_jit=True, without_jit=True)
  def test_group_filter(self):
    keep = self.variant(tr.dapo_group_filter)
    accuracy_BxG = np.array([[1, 1, 1, 1], [0, 0, 0, 0], [1, 0, 0, 0]], np.float32)
    np.testing.assert_array_equal(keep(accuracy_BxG), [False, False, True])
    # All wrong, different lengths: the shaped scores differ only through the overlong
    # penalty, which is no outcome signal. Filtering on accuracy drops the group; filtering
    # on the shaped score would wrongly keep it.
    lengths_G = np.array([100, 17000, 100, 100])
    shaped_1xG = np.zeros((1, 4)) + tr.dapo_overlong_penalty(lengths_G, max_length=20480,
                                                             cache_length=4096)
    np.testing.assert_array_equal(keep(np.zeros((1, 4))), [False])
    np.testing.assert_array_equal(keep(shaped_1xG), [True])
    np.testing.assert_array_equal(keep(np.array([[1.0], [0.0]])), [True, True])  # As in verl.

  @chex.variants(with_jit=True, without_jit=True)
  def test_overlong_values(self):
    # L_max = 20480, L_cache = 4096, soft limit 16384: 16384 -> 0; 18432 -> -2048/4096 = -0.5;
    # 20480 -> -1; 20481 -> -1 (clipped).
    fn = self.variant(functools.partial(tr.dapo_overlong_penalty, max_length=20480,
                                        cache_length=4096))
    np.testing.assert_allclose(fn(np.array([100, 16384, 18432, 20480, 20481])),
                               [0.0, 0.0, -0.5, -1.0, -1.0], **TIGHT)
    half = self.variant(functools.partial(tr.dapo_overlong_penalty, max_length=20480,
                                          cache_length=4096, penalty_factor=0.5))
    np.testing.assert_allclose(half(np.array([18432])), [-0.25], **TIGHT)


# Five groups shared by the Beta/HAPO tests, so each compiled betainc is reused.
SUCCESSES_B = np.array([0.0, 0.0, 1.0, 0.0, 4.0], np.float32)
FAILURES_B = np.array([1.0, 8.0, 7.0, 1.0, 0.0], np.float32)


class BetaTest(chex.TestCase):

  @chex.variants(with_jit=True, without_jit=True)
  def test_against_scipy(self):
    a = np.array([1.0, 2.0, 0.5, 9.0, 1.0], np.float32)
    b = np.array([1.0, 5.0, 0.5, 3.0, 9.0], np.float32)
    x = np.array([0.3, 0.2, 0.9, 0.75, 0.05], np.float32)
    q = np.array([0.5, 0.3, 0.99, 0.05, 0.9], np.float32)
    ref = scipy.stats.beta(a, b)
    np.testing.assert_allclose(self.variant(tr.beta_mean)(a, b), ref.mean(), rtol=1e-6)
    np.testing.assert_allclose(self.variant(tr.beta_variance)(a, b), ref.var(), rtol=1e-6)
    np.testing.assert_allclose(self.variant(tr.beta_cdf)(x, a, b), ref.cdf(x), rtol=1e-5)
    np.testing.assert_allclose(self.variant(tr.beta_quantile)(q, a, b), ref.ppf(q), rtol=1e-5,
                               atol=1e-6)
    post = self.variant(functools.partial(tr.beta_posterior, alpha0=0.5, beta0=2.0))
    np.testing.assert_allclose(post(np.array([3.0]), np.array([1.0])), [[3.5], [3.0]], **TIGHT)


class HAPOTest(chex.TestCase):

  @chex.variants(with_jit=True, without_jit=True)
  def test_gate_probability_closed_form(self):
    # alpha0 = beta0 = 1, an all-fail group of G: P(Beta(1, 1 + G) < tau) = 1 - (1 - tau)^(G+1);
    # groups 0, 1, 3 are all-fail (G = 1, 8, 1). Group 2 (1 success, 7 failures):
    # P(Beta(2, 8) < 0.1) = 1 - 0.9^9 - 9 * 0.1 * 0.9^8 = 0.2252. Group 4 has no failure: 0.
    fn = self.variant(functools.partial(tr.hapo_gate_probability, threshold=0.1))
    expected = [1 - 0.9**2, 1 - 0.9**9, 1 - 0.9**9 - 0.9 * 0.9**8, 1 - 0.9**2, 0.0]
    np.testing.assert_allclose(fn(SUCCESSES_B, FAILURES_B), expected, rtol=1e-5, atol=1e-7)

  @chex.variants(with_jit=True, without_jit=True)
  def test_thompson_gate(self):
    # One call on the five groups tiled T times: the opening frequency per group must match
    # the closed-form gate probability within 5 binomial standard deviations.
    trials = 4000
    gate = self.variant(lambda s, f, tau, k: tr.hapo_gate(s, f, threshold=tau, gate='thompson',
                                                          key=k))
    tiled = (np.tile(SUCCESSES_B, trials), np.tile(FAILURES_B, trials))
    open_TxB = np.asarray(gate(*tiled, 0.3, jax.random.key(0))).reshape(trials, 5)
    p_B = np.asarray(tr.hapo_gate_probability(SUCCESSES_B, FAILURES_B, threshold=0.3))
    tol_B = 5 * np.sqrt(p_B * (1 - p_B) / trials) + 1e-9
    assert np.all(np.abs(open_TxB.mean(0) - p_B) <= tol_B), (open_TxB.mean(0), p_B)
    assert not open_TxB[:, 4].any()  # No failure, no teacher.
    # tau = 0 (after annealing): never opens.
    assert not np.any(gate(*tiled, 0.0, jax.random.key(1)))

  @chex.variants(with_jit=True, without_jit=True)
  def test_confidence_gate(self):
    # P(p < 0.2) for Beta(1, 2), Beta(1, 9), Beta(2, 8), Beta(1, 2), Beta(5, 1):
    # 0.36, 0.866, 0.624, 0.36, 0.0003; open iff >= 0.5 and a failure exists.
    conf = self.variant(lambda s, f, c: tr.hapo_gate(s, f, threshold=0.2, gate='confidence',
                                                     confidence=c))
    np.testing.assert_array_equal(conf(SUCCESSES_B, FAILURES_B, 0.5),
                                  [False, True, True, False, False])
    strict = self.variant(functools.partial(tr.hapo_gate, threshold=0.2, gate='confidence',
                                            confidence=0.5, require_all_fail=True))
    np.testing.assert_array_equal(strict(SUCCESSES_B, FAILURES_B),
                                  [False, True, False, False, False])
    with pytest.raises(ValueError, match="gate='confidence' needs confidence"):
      tr.hapo_gate(SUCCESSES_B, FAILURES_B, threshold=0.2, gate='confidence')
    with pytest.raises(ValueError, match="only it takes one .gate='posterior_mean'"):
      tr.hapo_gate(SUCCESSES_B, FAILURES_B, threshold=0.2, key=jax.random.key(0))
    with pytest.raises(ValueError, match="known: \\('posterior_mean'"):
      tr.hapo_gate(SUCCESSES_B, FAILURES_B, threshold=0.2, gate='sampled')

  @chex.variants(with_jit=True, without_jit=True)
  def test_v1_posterior_mean_gate(self):
    # v1 (algorithms.md §12): open iff (1 + S)/(N + 2) < 0.8 (and a failure exists). N = 8:
    # S = 6: 7/10 = 0.7 < 0.8 open; S = 7: 8/10 = 0.8, not < 0.8, shut; S = 8: 9/10 shut.
    # So S in {0..6} open (mixed groups too), {7, 8} shut.
    gate = self.variant(functools.partial(tr.hapo_gate, threshold=0.8))  # The default gate.
    s_B = np.arange(9, dtype=np.float32)
    np.testing.assert_array_equal(gate(s_B, 8.0 - s_B), [True] * 7 + [False] * 2)
    # The shared groups (S, F) = (0,1), (0,8), (1,7), (0,1), (4,0): means (1 + S)/(N + 2) =
    # 1/3, 1/10, 2/10, 1/3, 5/6. γ = 0.3: shut (1/3 > 0.3), open, open, shut, shut.
    np.testing.assert_array_equal(
        self.variant(functools.partial(tr.hapo_gate, threshold=0.3))(SUCCESSES_B, FAILURES_B),
        [False, True, True, False, False])
    # N = 2, S = 2: 3/4 < 0.8, but with no failure there is nothing to replace: shut.
    assert not bool(gate(np.array([2.0]), np.array([0.0]))[0])
    # A prior Beta(2, 1): (2 + 6)/(3 + 8) = 8/11 = 0.727 < 0.8 open; (2 + 7)/11 = 0.818 shut.
    prior = self.variant(functools.partial(tr.hapo_gate, threshold=0.8, alpha0=2.0))
    np.testing.assert_array_equal(prior(np.array([6.0, 7.0]), np.array([2.0, 1.0])),
                                  [True, False])

  @chex.variants(with_jit=True, without_jit=True)
  def test_threshold_schedule(self):
    fn = self.variant(functools.partial(tr.hapo_threshold, initial=0.3, anneal_steps=100))
    np.testing.assert_allclose(fn(np.array([0, 50, 100, 250])), [0.3, 0.15, 0.0, 0.0], **TIGHT)
    fixed = self.variant(functools.partial(tr.hapo_threshold, initial=0.8, anneal_steps=0))
    np.testing.assert_allclose(fixed(np.array([0, 50, 10_000])), [0.8, 0.8, 0.8], **TIGHT)

  @chex.variants(with_jit=True, without_jit=True)
  def test_replace_lowest_reward(self):
    fn = self.variant(functools.partial(tr.hapo_replace, teacher_reward=1.0))
    rewards_BxG = np.array([[0.5, 0.2, 0.9, 0.3], [0, 0, 0, 0], [1, 1, 1, 1], [0.1, 0, 1, 1]],
                           np.float32)
    open_B = np.array([True, True, True, False])
    new_BxG, injected_BxG = fn(jax.random.key(0), rewards_BxG, open_B)
    injected_BxG = np.asarray(injected_BxG)
    # Argmin of row 0 is slot 1; row 1 gets exactly one injection; the all-success row and the
    # closed row are untouched.
    np.testing.assert_array_equal(injected_BxG[0], [False, True, False, False])
    assert injected_BxG[1].sum() == 1 and not injected_BxG[2:].any()
    np.testing.assert_array_equal(np.asarray(new_BxG)[injected_BxG], 1.0)
    np.testing.assert_array_equal(np.asarray(new_BxG)[~injected_BxG], rewards_BxG[~injected_BxG])
    # Ties are broken at random among the minima only.
    tie_1xG = np.array([[0.0, 1.0, 0.0, 1.0]], np.float32)
    picks = {int(np.argmax(fn(jax.random.key(s), tie_1xG, np.array([True]))[1]))
             for s in range(12)}
    assert picks == {0, 2}

  def test_injection_turns_an_all_fail_group_into_signal(self):
    # R = [0,0,0,0] has A = 0; after injection one success: GRPO gives 1.5 there, -0.5 elsewhere.
    new_BxG, injected_BxG = tr.hapo_replace(jax.random.key(3), np.zeros((1, 4)), np.array([True]))
    a = adv.grpo(new_BxG, eps=0.0)
    np.testing.assert_allclose(np.asarray(a)[np.asarray(injected_BxG)], [1.5], **TIGHT)
    np.testing.assert_allclose(np.sort(np.asarray(a)[0]), [-0.5, -0.5, -0.5, 1.5], **TIGHT)
    # R = [1,0,0,0] with the gate open: a failure is replaced, giving [1,1,0,0] up to order,
    # and GRPO +-sqrt(3)/2 (unbiased std sqrt(1/3)).
    new_BxG, injected_BxG = tr.hapo_replace(jax.random.key(4), R_1000, np.array([True]))
    assert not np.asarray(injected_BxG)[0, 0] and np.asarray(injected_BxG).sum() == 1
    np.testing.assert_allclose(np.sort(np.asarray(adv.grpo(new_BxG, eps=0.0))[0]),
                               np.sqrt(3) / 2 * np.array([-1, -1, 1, 1]), **TIGHT)


class TailMissTest(chex.TestCase):

  @chex.variants(with_jit=True, without_jit=True)
  def test_worked_values(self):
    # mu = 0.6, tau = 0.05: e.g. N = 2: 0.95^2 - 0.55^2 - 0.4^2 = 0.9025 - 0.3025 - 0.16 = 0.44.
    fn = self.variant(functools.partial(tr.tail_miss_probability, mu=0.6, tau=0.05))
    n = np.array([1, 2, 4, 8, 16, 32, 64])
    expected = 0.95**n - 0.55**n - 0.4**n
    np.testing.assert_allclose(fn(n), expected, rtol=1e-5, atol=1e-7)
    np.testing.assert_allclose(expected, [0, 0.44, 0.70, 0.65, 0.44, 0.19, 0.04], atol=5e-3)

  def test_monte_carlo(self):
    # Categorical with rare-correct (tau), common-correct (mu - tau) and wrong (1 - mu) outcomes;
    # the event: >= 1 correct and >= 1 wrong sampled, but no rare-correct one.
    rng = np.random.default_rng(0)
    mu, tau, trials = 0.6, 0.05, 100_000
    for n in (2, 4, 8, 16):
      draws = rng.choice(3, size=(trials, n), p=[tau, mu - tau, 1 - mu])
      event = (~np.any(draws == 0, 1)) & np.any(draws == 1, 1) & np.any(draws == 2, 1)
      p = float(tr.tail_miss_probability(n, mu=mu, tau=tau))
      assert abs(event.mean() - p) <= 5 * np.sqrt(p * (1 - p) / trials), (n, event.mean(), p)


DEGENERATE = {
    'all_zero': np.zeros((2, 4), np.float32),
    'all_one': np.ones((2, 4), np.float32),  # mu_x = 1: A-GRAE's 1 - sqrt(mu) is 0.
    'singleton': np.array([[1.0], [0.0]], np.float32),
}
TRANSFORM_CALLS = {
    'f_grpo': lambda a, r: tr.focal_scale(a, r, gamma=0.5),
    'a_grae': lambda a, r: tr.a_grae(a, r),
    'a_grae_eps0': lambda a, r: tr.a_grae(a, r, eps=0.0),
    'ifpo': lambda a, r: tr.ifpo(a, (r > 0.5).astype(jnp.int32), num_modes=2),
}


@pytest.mark.parametrize('wrap', [jax.jit, lambda f: f], ids=['jit', 'eager'])
@pytest.mark.parametrize('name', sorted(TRANSFORM_CALLS))
@pytest.mark.parametrize('case', sorted(DEGENERATE))
def test_degenerate_groups_are_finite(wrap, name, case):
  rewards_BxG = DEGENERATE[case]
  advantages_BxG = adv.grpo(rewards_BxG)
  a = np.asarray(wrap(TRANSFORM_CALLS[name])(advantages_BxG, rewards_BxG))
  assert np.all(np.isfinite(a))
  if case != 'singleton':
    np.testing.assert_array_equal(a, 0.0)


def test_registry():
  assert tr.get_transform('f_grpo') is tr.focal_scale
  assert set(tr.TRANSFORMS) == {'f_grpo', 'a_grae', 'ifpo'}
  with pytest.raises(ValueError, match=r"'focal'.*a_grae.*f_grpo.*ifpo"):
    tr.get_transform('focal')
