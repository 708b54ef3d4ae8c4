"""Advantage estimators: hand-computed cases from algorithms.md, invariances, degenerate groups,
GAE against a hand-unrolled loop, OTB's proxy identity and alignment, the registry.

Hand-computed cases run with and without jit; property tests run jitted only, since the eager
path is already covered by the hand cases and compiles op by op (3-5x the time).
"""

import functools

import chex
import jax
import numpy as np
import pytest

from rlreason.objectives import advantages as adv

R_1000 = np.array([[1.0, 0.0, 0.0, 0.0]], np.float32)
TIGHT = dict(rtol=1e-6, atol=1e-6)


class GroupEstimatorTest(chex.TestCase):

  @chex.variants(with_jit=True, without_jit=True)
  def test_grpo_hand_example(self):
    # mean 0.25; deviations [0.75, -0.25 x3]; sum of squares 0.75.
    # Unbiased std sqrt(0.75/3) = 0.5 -> [1.5, -0.5 x3];
    # population std sqrt(0.75/4) = sqrt(3)/4 -> [sqrt(3), -1/sqrt(3) x3].
    unbiased = self.variant(functools.partial(adv.grpo, std_ddof=1, eps=0.0))
    population = self.variant(functools.partial(adv.grpo, std_ddof=0, eps=0.0))
    default = self.variant(adv.grpo)  # std_ddof=1, eps=1e-6: 0.75 / (0.5 + 1e-6), ...
    np.testing.assert_allclose(unbiased(R_1000), [[1.5, -0.5, -0.5, -0.5]], **TIGHT)
    s3 = np.sqrt(3.0)
    np.testing.assert_allclose(population(R_1000), [[s3, -1 / s3, -1 / s3, -1 / s3]], **TIGHT)
    np.testing.assert_allclose(default(R_1000), np.array([[0.75, -0.25, -0.25, -0.25]]) / 0.500001,
                               **TIGHT)

  @chex.variants(with_jit=True)
  def test_grpo_binary_closed_form(self):
    # Population std, k = 3 successes of G = 8, p = 3/8:
    # A+ = sqrt((1-p)/p) = sqrt(5/3), A- = -sqrt(p/(1-p)) = -sqrt(3/5).
    rewards_BxG = np.array([[1, 1, 1, 0, 0, 0, 0, 0]], np.float32)
    a = self.variant(functools.partial(adv.grpo, std_ddof=0, eps=0.0))(rewards_BxG)
    np.testing.assert_allclose(a, [[np.sqrt(5 / 3)] * 3 + [-np.sqrt(3 / 5)] * 5], **TIGHT)

  @chex.variants(with_jit=True)
  def test_grpo_zero_sum_and_affine_invariance(self):
    rewards_BxG = np.random.default_rng(0).normal(size=(3, 5)).astype(np.float32)
    grpo = self.variant(functools.partial(adv.grpo, eps=0.0))
    a = grpo(rewards_BxG)
    np.testing.assert_allclose(np.sum(a, -1), 0.0, atol=1e-6)
    np.testing.assert_allclose(grpo(2.5 * rewards_BxG - 7.0), a, rtol=1e-5, atol=1e-5)

  @chex.variants(with_jit=True, without_jit=True)
  def test_dr_grpo(self):
    # R - mean = [0.75, -0.25 x3]; no scale invariance: 2R doubles A; shift-invariant.
    dr = self.variant(adv.dr_grpo)
    np.testing.assert_allclose(dr(R_1000), [[0.75, -0.25, -0.25, -0.25]], **TIGHT)
    np.testing.assert_allclose(dr(2 * R_1000), [[1.5, -0.5, -0.5, -0.5]], **TIGHT)
    np.testing.assert_allclose(dr(R_1000 + 3.0), dr(R_1000), **TIGHT)

  @chex.variants(with_jit=True, without_jit=True)
  def test_rloo(self):
    # Leave-one-out means: [0, 1/3, 1/3, 1/3] -> A = [1, -1/3, -1/3, -1/3].
    rloo = self.variant(adv.rloo)
    np.testing.assert_allclose(rloo(R_1000), [[1.0, -1 / 3, -1 / 3, -1 / 3]], **TIGHT)
    rewards_BxG = np.random.default_rng(1).normal(size=(2, 5)).astype(np.float32)
    others = (rewards_BxG.sum(-1, keepdims=True) - rewards_BxG) / 4
    np.testing.assert_allclose(rloo(rewards_BxG), rewards_BxG - others, rtol=1e-5, atol=1e-5)

  @chex.variants(with_jit=True, without_jit=True)
  def test_reinforce_pp_baseline_hand_example(self):
    # Centred [0.75, -0.25 x3] has batch mean 0 and unbiased variance 0.75/3 = 0.25:
    # A = c / sqrt(0.25 + 1e-8) = [1.5, -0.5 x3] up to 2e-8 relative.
    a = self.variant(adv.reinforce_pp_baseline)(R_1000)
    np.testing.assert_allclose(a, [[1.5, -0.5, -0.5, -0.5]], **TIGHT)

  @chex.variants(with_jit=True, without_jit=True)
  def test_reinforce_pp_baseline_reproduces_verl_token_whitening(self):
    rng = np.random.default_rng(2)
    rewards_BxG = rng.integers(0, 2, size=(3, 4)).astype(np.float32)
    lengths_N = rng.integers(1, 7, size=12)
    # verl: centred score broadcast over each response's tokens, masked_whiten over all
    # valid tokens (unbiased variance, rsqrt(var + 1e-8)).
    centred_N = (rewards_BxG - rewards_BxG.mean(-1, keepdims=True)).reshape(-1)
    mask_NxL = (np.arange(6)[None] < lengths_N[:, None]).astype(np.float64)
    tokens_NxL = centred_N[:, None] * mask_NxL
    count = mask_NxL.sum()
    mean = (tokens_NxL * mask_NxL).sum() / count
    var = (((tokens_NxL - mean)**2) * mask_NxL).sum() / count * count / (count - 1)
    expected_N = (centred_N - mean) / np.sqrt(var + 1e-8)
    fn = self.variant(adv.reinforce_pp_baseline)
    a = fn(rewards_BxG, weights_BxG=lengths_N.reshape(3, 4).astype(np.float32))
    np.testing.assert_allclose(a.reshape(-1), expected_N, rtol=1e-5, atol=1e-5)
    tokens = self.variant(functools.partial(adv.reinforce_pp_baseline, whiten_over='tokens'))
    a = tokens(rewards_BxG, lengths_BxG=lengths_N.reshape(3, 4).astype(np.float32))
    np.testing.assert_allclose(a.reshape(-1), expected_N, rtol=1e-5, atol=1e-5)

  @chex.variants(with_jit=True, without_jit=True)
  def test_reinforce_pp_baseline_token_whitening_hand_example(self):
    # Centred c = [[0.5, -0.5], [0, 0]], lengths [[3, 1], [2, 2]] (8 tokens): mean
    # (1.5 - 0.5) / 8 = 0.125; deviations [0.375, -0.625, -0.125, -0.125]; variance
    # (3·0.140625 + 0.390625 + 4·0.015625) / 7 = 0.875 / 7 = 0.125, std 0.353553:
    # A = [[1.060660, -1.767767], [-0.353553, -0.353553]].
    fn = self.variant(functools.partial(adv.reinforce_pp_baseline, whiten_over='tokens'))
    a = fn(np.array([[1.0, 0.0], [0.0, 0.0]], np.float32),
           lengths_BxG=np.array([[3.0, 1.0], [2.0, 2.0]], np.float32))
    np.testing.assert_allclose(a, [[1.060660, -1.767767], [-0.353553, -0.353553]], rtol=1e-5)
    with pytest.raises(ValueError, match="whiten_over='tokens'"):
      adv.reinforce_pp_baseline(np.zeros((1, 2), np.float32), whiten_over='tokens')

  @chex.variants(with_jit=True)
  def test_reinforce_pp_baseline_weights_and_invariance(self):
    rewards_BxG = np.random.default_rng(3).normal(size=(4, 3)).astype(np.float32)
    fn = self.variant(functools.partial(adv.reinforce_pp_baseline, eps=0.0))
    valid_BxG = np.ones((4, 3), np.float32)
    valid_BxG[3] = 0.0
    a = fn(rewards_BxG, weights_BxG=valid_BxG)
    # Excluded prompts get 0 and do not enter the statistics; shift/scale of R cancel.
    np.testing.assert_array_equal(a[3], 0.0)
    np.testing.assert_allclose(a[:3], fn(rewards_BxG[:3]), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(fn(3 * rewards_BxG + 1), fn(rewards_BxG), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(np.mean(a[:3]), 0.0, atol=1e-6)
    np.testing.assert_allclose(np.std(a[:3], ddof=1), 1.0, rtol=1e-5)

  @chex.variants(with_jit=True, without_jit=True)
  def test_r2po_rarity(self):
    rarity = self.variant(adv.r2po_rarity)
    # u = [1, 1/3, 1/3, 1/3]: mean 1/2, unbiased std 1/3 -> [1.5, -0.5 x3] (std + 1e-6).
    expected = np.array([[0.5, -1 / 6, -1 / 6, -1 / 6]]) / (1 / 3 + 1e-6)
    np.testing.assert_allclose(rarity(R_1000), expected, **TIGHT)
    # The rare outcome wins even when it is the wrong one.
    np.testing.assert_allclose(rarity(1 - R_1000), expected, **TIGHT)
    # Equally frequent outcomes: all u = 1/2 -> 0. Any injective map of R changes nothing.
    np.testing.assert_array_equal(rarity(np.array([[1.0, 1.0, 0.0, 0.0]])), 0.0)
    np.testing.assert_allclose(rarity(5 * R_1000 - 2), expected, **TIGHT)


DEGENERATE = {
    'all_equal': np.full((2, 4), 0.3, np.float32),
    'all_zero': np.zeros((2, 4), np.float32),
    'singleton': np.array([[0.7], [0.0]], np.float32),
}
GROUP_ESTIMATORS = {
    'grpo': adv.grpo,
    'grpo_eps0': functools.partial(adv.grpo, eps=0.0),
    'dr_grpo': adv.dr_grpo,
    'rloo': adv.rloo,
    'reinforce_pp_baseline': adv.reinforce_pp_baseline,
    'r2po_rarity': adv.r2po_rarity,
    'grpo_batch': functools.partial(adv.grpo, scale='batch', eps=0.0),
    'grpo_nan_ignore': functools.partial(adv.grpo, nan_rewards='ignore'),
    'opo': lambda r: adv.opo(r, lengths_BxG=np.arange(r.size, dtype=np.float32).reshape(r.shape)),
}


@pytest.mark.parametrize('wrap', [jax.jit, lambda f: f], ids=['jit', 'eager'])
@pytest.mark.parametrize('name', sorted(GROUP_ESTIMATORS))
@pytest.mark.parametrize('case', sorted(DEGENERATE))
def test_degenerate_groups_are_finite(wrap, name, case):
  rewards_BxG = DEGENERATE[case]
  a = np.asarray(wrap(GROUP_ESTIMATORS[name])(rewards_BxG))
  assert np.all(np.isfinite(a))
  if case != 'singleton':
    np.testing.assert_array_equal(a, 0.0)  # Exactly 0, not eps-sized noise.
  elif name == 'r2po_rarity':
    np.testing.assert_array_equal(a, 0.0)
  elif name == 'reinforce_pp_baseline':
    # No group baseline for a singleton; the batch whitening of [0.7, 0]: +-1/sqrt(2).
    np.testing.assert_allclose(a, [[1 / np.sqrt(2)], [-1 / np.sqrt(2)]], rtol=1e-6)
  else:
    np.testing.assert_array_equal(a, rewards_BxG)  # verl: a singleton has A = R.


def _two_way_energy_inputs(probs):
  """logprobs and Σπ² of a 2-way softmax whose sampled token has probability p: w = 2(1-p)^2."""
  probs = np.asarray(probs, np.float32)
  return np.log(probs), probs**2 + (1 - probs)**2


# w = 0.5 needs p = 0.5; w = 0.1 needs 2(1-p)^2 = 0.1, p = 1 - sqrt(0.05).
P_HALF, P_TENTH = 0.5, 1 - np.sqrt(0.05)


class OTBTest(chex.TestCase):

  @chex.variants(with_jit=True, without_jit=True)
  def test_hand_example(self):
    # algorithms.md §8: R = [1, 0], w = [0.5, 0.5] and [0.1, 0.1] -> W = [0.5, 1.0], [0.1, 0.2];
    # returns [1, 1], [0, 0]; B_0 = 0.5/0.6 = 5/6, B_1 = 1.0/1.2 = 5/6;
    # A_1 = [1/6, 1/6], A_2 = [-5/6, -5/6] (a group mean baseline would give +-0.5).
    # A padded third position (0 advantage) keeps the shape of the other OTB tests.
    mask_NxL = np.array([[1, 1, 0], [1, 1, 0]], np.float32)
    rewards_NxL = adv.outcome_token_rewards(np.array([1.0, 0.0]), mask_NxL)
    logprobs_NxL, sum_pi_sq_NxL = _two_way_energy_inputs([[P_HALF] * 3, [P_TENTH] * 3])
    expected = [[1 / 6, 1 / 6, 0], [-5 / 6, -5 / 6, 0]]
    for multi_turn in (False, True):
      fn = self.variant(functools.partial(adv.otb, group_size=2, zero_tail=False,
                                          multi_turn=multi_turn))
      np.testing.assert_allclose(fn(rewards_NxL, logprobs_NxL, sum_pi_sq_NxL, mask_NxL), expected,
                                 rtol=1e-5, atol=1e-6)

  @chex.variants(with_jit=True, without_jit=True)
  def test_multi_turn_aligns_by_valid_token_index(self):
    # The same two responses with a tool-output gap at different places: by valid-token index
    # they line up as in the hand example; by absolute position they would not.
    mask_NxL = np.array([[1, 0, 1], [1, 1, 0]], np.float32)
    rewards_NxL = adv.outcome_token_rewards(np.array([1.0, 0.0]), mask_NxL)
    logprobs_NxL, sum_pi_sq_NxL = _two_way_energy_inputs([[P_HALF] * 3, [P_TENTH] * 3])
    fn = self.variant(functools.partial(adv.otb, group_size=2, zero_tail=False, multi_turn=True))
    a = fn(rewards_NxL, logprobs_NxL, sum_pi_sq_NxL, mask_NxL)
    np.testing.assert_allclose(a, [[1 / 6, 0, 1 / 6], [-5 / 6, -5 / 6, 0]], rtol=1e-5, atol=1e-6)

  @chex.variants(with_jit=True)
  def test_multi_turn_equals_single_turn_on_compacted_rows(self):
    rng = np.random.default_rng(4)
    n, length = 6, 7
    mask_NxL = (rng.random((n, length)) < 0.7).astype(np.float32)
    mask_NxL[:, 0] = 1.0
    rewards_NxL = rng.normal(size=(n, length)).astype(np.float32)
    logprobs_NxL = np.log(rng.uniform(0.05, 1.0, (n, length))).astype(np.float32)
    sum_pi_sq_NxL = rng.uniform(0.2, 1.0, (n, length)).astype(np.float32)

    def compact(x_NxL):
      out = np.zeros_like(x_NxL)
      for i in range(n):
        valid = x_NxL[i][mask_NxL[i] > 0]
        out[i, :len(valid)] = valid
      return out

    lengths_N = mask_NxL.sum(-1).astype(int)
    compact_mask_NxL = (np.arange(length)[None] < lengths_N[:, None]).astype(np.float32)
    kw = dict(group_size=3, zero_tail=True)
    compact_a = self.variant(functools.partial(adv.otb, **kw))(
        compact(rewards_NxL), compact(logprobs_NxL), compact(sum_pi_sq_NxL), compact_mask_NxL)
    expected = np.zeros((n, length), np.float32)
    for i in range(n):
      expected[i, mask_NxL[i] > 0] = compact_a[i, :lengths_N[i]]
    a = self.variant(functools.partial(adv.otb, multi_turn=True, **kw))(
        rewards_NxL, logprobs_NxL, sum_pi_sq_NxL, mask_NxL)
    np.testing.assert_allclose(a, expected, rtol=1e-6, atol=1e-6)

  @chex.variants(with_jit=True, without_jit=True)
  def test_zero_tail(self):
    # Lengths 3 and 1, R = [1, 0]. At t = 1, 2 only response 1 is active: without the flag the
    # baseline is its own return (A = 1 * 1e-8 / (W + 1e-8) ~ 0); with it the baseline is 0
    # (A = 1). At t = 0 (w = 0.5 each, W = 0.5): B = 0.5 -> A = [0.5, -0.5] either way.
    mask_NxL = np.array([[1, 1, 1], [1, 0, 0]], np.float32)
    rewards_NxL = adv.outcome_token_rewards(np.array([1.0, 0.0]), mask_NxL)
    logprobs_NxL, sum_pi_sq_NxL = _two_way_energy_inputs(np.full((2, 3), P_HALF))
    for multi_turn in (False, True):
      for zero_tail, tail in ((False, 0.0), (True, 1.0)):
        fn = self.variant(functools.partial(adv.otb, group_size=2, zero_tail=zero_tail,
                                            multi_turn=multi_turn))
        np.testing.assert_allclose(fn(rewards_NxL, logprobs_NxL, sum_pi_sq_NxL, mask_NxL),
                                   [[0.5, tail, tail], [-0.5, 0, 0]], rtol=1e-6, atol=1e-6)

  @chex.variants(with_jit=True)
  def test_equal_energy_gives_group_mean_and_is_weights_enter_squared(self):
    mask_NxL = np.ones((4, 3), np.float32)
    rewards_NxL = adv.outcome_token_rewards(R_1000[0], mask_NxL)
    logprobs_NxL, sum_pi_sq_NxL = _two_way_energy_inputs(np.full((4, 3), 0.3))
    fn = self.variant(functools.partial(adv.otb, group_size=4, zero_tail=False))
    # Equal W for all responses: B_t = mean of returns = 0.25, i.e. Dr. GRPO per token.
    expected = np.repeat(adv.dr_grpo(R_1000).reshape(4, 1), 3, 1)
    np.testing.assert_allclose(fn(rewards_NxL, logprobs_NxL, sum_pi_sq_NxL, mask_NxL), expected,
                               rtol=1e-6, atol=1e-6)
    # Hand example again, now with equal proxies (0.1) and rho^2 = 5 on response 1 restoring
    # w = [0.5, 0.1]: A_1 = 1/6, A_2 = -5/6.
    mask2 = np.ones((2, 2), np.float32)
    rewards2 = adv.outcome_token_rewards(np.array([1.0, 0.0]), mask2)
    lp2, sq2 = _two_way_energy_inputs(np.full((2, 2), P_TENTH))
    rho2 = np.array([[np.sqrt(5)] * 2, [1.0] * 2], np.float32)
    fn2 = self.variant(functools.partial(adv.otb, group_size=2, zero_tail=False))
    np.testing.assert_allclose(fn2(rewards2, lp2, sq2, mask2, is_weights_NxL=rho2),
                               [[1 / 6, 1 / 6], [-5 / 6, -5 / 6]], rtol=1e-5, atol=1e-6)

  @chex.variants(with_jit=True)
  def test_baseline_is_convex_combination_and_padding_is_zero(self):
    rng = np.random.default_rng(5)
    lengths_N = rng.integers(1, 9, size=8)
    mask_NxL = (np.arange(8)[None] < lengths_N[:, None]).astype(np.float32)
    rewards_NxL = np.asarray(adv.outcome_token_rewards(rng.normal(size=8), mask_NxL))
    logprobs_NxL = np.log(rng.uniform(0.05, 1.0, (8, 8))).astype(np.float32)
    sum_pi_sq_NxL = rng.uniform(0.3, 1.0, (8, 8)).astype(np.float32)
    fn = self.variant(functools.partial(adv.otb, group_size=4, zero_tail=False))
    a = np.asarray(fn(rewards_NxL, logprobs_NxL, sum_pi_sq_NxL, mask_NxL))
    np.testing.assert_array_equal(a[mask_NxL == 0], 0.0)
    returns = np.flip(np.cumsum(np.flip(rewards_NxL, -1), -1), -1).reshape(2, 4, 8)
    base = (returns - a.reshape(2, 4, 8))
    m = mask_NxL.reshape(2, 4, 8) > 0
    for b in range(2):
      for t in range(8):
        active = m[b, :, t]
        if active.any():
          lo, hi = returns[b, active, t].min(), returns[b, active, t].max()
          assert np.all((base[b, active, t] >= lo - 1e-5) & (base[b, active, t] <= hi + 1e-5))

  @chex.variants(with_jit=True)
  def test_lone_members_have_no_baseline(self):
    mask_NxL = np.array([[1, 1, 0], [0, 0, 0]], np.float32)
    rewards_NxL = np.array([[0.0, 2.0, 0.0], [0.0, 0.0, 0.0]], np.float32)
    lp, sq = _two_way_energy_inputs(np.full((2, 3), P_HALF))
    expected = [[2, 2, 0], [0, 0, 0]]
    # G = 1: A = returns [2, 2].
    single = self.variant(functools.partial(adv.otb, group_size=1, zero_tail=True))
    np.testing.assert_allclose(single(rewards_NxL, lp, sq, mask_NxL), expected, **TIGHT)
    # Multi-turn drops the empty response from the group, leaving A = returns; single-turn
    # keeps it as a member, so the baseline is the lone active return: A ~ 0.
    kw = dict(group_size=2, zero_tail=False)
    multi = self.variant(functools.partial(adv.otb, multi_turn=True, **kw))
    np.testing.assert_allclose(multi(rewards_NxL, lp, sq, mask_NxL), expected, **TIGHT)
    flat = self.variant(functools.partial(adv.otb, **kw))
    np.testing.assert_allclose(flat(rewards_NxL, lp, sq, mask_NxL), 0.0, atol=1e-6)


@pytest.mark.parametrize('wrap', [jax.jit, lambda f: f], ids=['jit', 'eager'])
def test_otb_energy_is_squared_logit_gradient_norm(wrap):
  # ||d log softmax(z)[a] / dz||^2 = ||e_a - pi||^2 = 1 - 2 pi_a + sum pi^2, for every token a.
  logits_V = np.random.default_rng(9).normal(size=11) * 2.0
  grads_VxV = jax.jit(jax.jacrev(jax.nn.log_softmax))(logits_V.astype(np.float32))
  logprobs_V = logits_V - np.log(np.sum(np.exp(logits_V)))
  sum_pi_sq = np.sum(np.exp(2 * logprobs_V))
  w_V = wrap(adv.otb_token_energy)(logprobs_V.astype(np.float32), np.float32(sum_pi_sq))
  np.testing.assert_allclose(w_V, np.sum(np.asarray(grads_VxV)**2, -1), rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize('wrap', [jax.jit, lambda f: f], ids=['jit', 'eager'])
def test_outcome_token_rewards_on_last_valid_token(wrap):
  mask_NxL = np.array([[1, 1, 0], [0, 1, 1], [0, 0, 0]])
  rewards_NxL = wrap(adv.outcome_token_rewards)(np.array([2.0, 3.0, 4.0]), mask_NxL)
  np.testing.assert_array_equal(rewards_NxL, [[0, 2, 0], [0, 0, 3], [0, 0, 0]])


def _gae_loop(rewards_NxL, values_NxL, mask_NxL, gamma, lam):
  """verl's loop, unrolled by hand in float64."""
  n, length = rewards_NxL.shape
  adv_NxL = np.zeros((n, length))
  next_value, last = np.zeros(n), np.zeros(n)
  for t in reversed(range(length)):
    delta = rewards_NxL[:, t] + gamma * next_value - values_NxL[:, t]
    new = delta + gamma * lam * last
    next_value = values_NxL[:, t] * mask_NxL[:, t] + (1 - mask_NxL[:, t]) * next_value
    last = new * mask_NxL[:, t] + (1 - mask_NxL[:, t]) * last
    adv_NxL[:, t] = last
  count = mask_NxL.sum()
  mean = (adv_NxL * mask_NxL).sum() / count
  var = ((adv_NxL - mean)**2 * mask_NxL).sum() / (count - 1)
  white_NxL = (adv_NxL - mean) / np.sqrt(var + 1e-8)
  return adv_NxL * mask_NxL, (adv_NxL + values_NxL) * mask_NxL, white_NxL * mask_NxL


class GAETest(chex.TestCase):

  @chex.variants(with_jit=True, without_jit=True)
  def test_matches_hand_unrolled_loop(self):
    rng = np.random.default_rng(6)
    mask_NxL = (rng.random((5, 9)) < 0.75).astype(np.float32)  # gaps = tool output.
    rewards_NxL = rng.normal(size=(5, 9)).astype(np.float32)
    values_NxL = rng.normal(size=(5, 9)).astype(np.float32)
    raw, returns, white = _gae_loop(rewards_NxL, values_NxL, mask_NxL, 0.9, 0.8)
    for whiten, expected in ((False, raw), (True, white)):
      fn = self.variant(functools.partial(adv.gae, gamma=0.9, lam=0.8, whiten=whiten))
      a, r = fn(rewards_NxL, values_NxL, mask_NxL)
      np.testing.assert_allclose(a, expected, rtol=1e-5, atol=1e-5)
      np.testing.assert_allclose(r, returns, rtol=1e-5, atol=1e-5)

  @chex.variants(with_jit=True)
  def test_special_cases_and_padding(self):
    rng = np.random.default_rng(7)
    mask_NxL = np.array([[1, 1, 1, 1], [1, 1, 0, 0]], np.float32)
    rewards_NxL = adv.outcome_token_rewards(np.array([1.0, -1.0]), mask_NxL)
    values_NxL = rng.normal(size=(2, 4)).astype(np.float32)
    # gamma = lam = 1: A_t = R_final - V_t on valid tokens.
    mc = self.variant(functools.partial(adv.gae, whiten=False))
    a, _ = mc(rewards_NxL, values_NxL, mask_NxL)
    np.testing.assert_allclose(a, (np.array([[1.0], [-1.0]]) - values_NxL) * mask_NxL, **TIGHT)
    # lam = 0: A_t = delta_t = r_t + gamma V_{t+1} - V_t (V after the last valid token is 0).
    td = self.variant(functools.partial(adv.gae, gamma=0.5, lam=0.0, whiten=False))
    a, _ = td(rewards_NxL, values_NxL, mask_NxL)
    v = values_NxL
    next_v = np.array([[v[0, 1], v[0, 2], v[0, 3], 0], [v[1, 1], 0, 0, 0]], np.float32)
    np.testing.assert_allclose(a, (rewards_NxL + 0.5 * next_v - values_NxL) * mask_NxL, **TIGHT)
    # Garbage in padded positions changes nothing; whitening: zero mean, unit (unbiased) std.
    noisy_values = np.where(mask_NxL > 0, values_NxL, 123.0).astype(np.float32)
    white = self.variant(functools.partial(adv.gae, gamma=0.9, lam=0.95))
    a, _ = white(rewards_NxL, values_NxL, mask_NxL)
    a_noisy, _ = white(rewards_NxL, noisy_values, mask_NxL)
    np.testing.assert_allclose(a_noisy, a, **TIGHT)
    valid = np.asarray(a)[mask_NxL > 0]
    np.testing.assert_allclose([valid.mean(), valid.std(ddof=1)], [0.0, 1.0], atol=1e-5)
    # R = [1,0,0,0] on 2-token responses, V = 0, gamma = lam = 1: A = R on every token.
    # Whitened over the 8 tokens: mean 1/4, unbiased variance (2 (3/4)^2 + 6 (1/4)^2)/7 = 3/14.
    mask_4x2 = np.ones((4, 2), np.float32)
    rewards_4x2 = adv.outcome_token_rewards(R_1000[0], mask_4x2)
    raw, _ = mc(rewards_4x2, np.zeros((4, 2), np.float32), mask_4x2)
    np.testing.assert_allclose(raw, np.repeat(R_1000.T, 2, 1), **TIGHT)
    whitened, _ = self.variant(adv.gae)(rewards_4x2, np.zeros((4, 2), np.float32), mask_4x2)
    expected = (np.repeat(R_1000.T, 2, 1) - 0.25) / np.sqrt(3 / 14 + 1e-8)
    np.testing.assert_allclose(whitened, expected, rtol=1e-5)


def test_sharded_batch_gives_the_same_advantages():
  # 8 fake devices: rows of B split across them; batch statistics must stay global.
  mesh = jax.make_mesh((8,), ('data',))
  sharding = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec('data'))
  rewards_BxG = np.random.default_rng(8).normal(size=(16, 4)).astype(np.float32)
  sharded_BxG = jax.device_put(rewards_BxG, sharding)
  np.testing.assert_allclose(jax.jit(adv.reinforce_pp_baseline)(sharded_BxG),
                             jax.jit(adv.reinforce_pp_baseline)(rewards_BxG), rtol=1e-6, atol=1e-6)


def test_registry():
  assert adv.get_estimator('grpo') is adv.grpo
  assert set(adv.ESTIMATORS) >= {'grpo', 'dr_grpo', 'rloo', 'reinforce_pp_baseline', 'otb',
                                 'r2po_rarity', 'gae', 'opo', 'grpo_passk', 'reinforce_pp'}
  with pytest.raises(ValueError, match=r"'ppo_magic'.*dr_grpo.*gae.*grpo.*otb"):
    adv.get_estimator('ppo_magic')


def test_grpo_rejects_impossible_ddof():
  with pytest.raises(ValueError, match='std_ddof'):
    adv.grpo(R_1000, std_ddof=4)


class PeerOptionTest(chex.TestCase):
  """TRL's scale_rewards and NaN handling, verl's OPO, pass@k and REINFORCE++ (issue #21)."""

  @chex.variants(with_jit=True, without_jit=True)
  def test_grpo_batch_scale_hand_example(self):
    # R = [[1, 0], [1, 1]]: centred per group [[0.5, -0.5], [0, 0]]. Batch std of the raw
    # rewards [1, 0, 1, 1]: mean 0.75, squares 0.0625 + 0.5625 + 0.0625 + 0.0625 = 0.75,
    # / (4 - 1) = 0.25, std 0.5 -> A = [[1, -1], [0, 0]]. (Group std of [1, 0]: sqrt(0.5),
    # A = +-0.7071.)
    rewards_BxG = np.array([[1.0, 0.0], [1.0, 1.0]], np.float32)
    batch = self.variant(functools.partial(adv.grpo, scale='batch', eps=0.0))
    np.testing.assert_allclose(batch(rewards_BxG), [[1.0, -1.0], [0.0, 0.0]], **TIGHT)
    trl = self.variant(functools.partial(adv.grpo, scale='batch', eps=1e-4))  # TRL's eps.
    np.testing.assert_allclose(trl(rewards_BxG), [[0.5, -0.5], [0, 0]] / np.float32(0.5001),
                               **TIGHT)
    group = self.variant(functools.partial(adv.grpo, eps=0.0))
    np.testing.assert_allclose(group(rewards_BxG), [[0.5**0.5, -0.5**0.5], [0, 0]], **TIGHT)

  @chex.variants(with_jit=True)
  def test_batch_scaling_equals_group_scaling_for_one_group(self):
    rewards_1xG = np.random.default_rng(1).normal(size=(1, 6)).astype(np.float32)
    for ddof in (0, 1):
      batch = self.variant(functools.partial(adv.grpo, scale='batch', std_ddof=ddof))
      group = self.variant(functools.partial(adv.grpo, scale='group', std_ddof=ddof))
      np.testing.assert_allclose(batch(rewards_1xG), group(rewards_1xG), rtol=1e-6, atol=1e-6)
    none = self.variant(functools.partial(adv.grpo, scale='none'))
    np.testing.assert_allclose(none(rewards_1xG), adv.dr_grpo(rewards_1xG), **TIGHT)
    # Several groups: batch scaling is the centred rewards over one common std.
    rewards_BxG = np.random.default_rng(2).normal(size=(3, 4)).astype(np.float32)
    batch = self.variant(functools.partial(adv.grpo, scale='batch', eps=0.0))(rewards_BxG)
    np.testing.assert_allclose(batch, adv.dr_grpo(rewards_BxG) / rewards_BxG.std(ddof=1),
                               rtol=1e-5)

  @chex.variants(with_jit=True, without_jit=True)
  def test_nan_rewards_ignored_hand_example(self):
    # Group 0 [1, NaN, 0, 0]: valid [1, 0, 0], mean 1/3, centred [2/3, -1/3, -1/3], unbiased
    # std sqrt((4/9 + 1/9 + 1/9) / 2) = sqrt(1/3): A = [2/sqrt3, 0, -1/sqrt3, -1/sqrt3].
    # Group 1 [0.5, 1, NaN, NaN]: mean 0.75, centred [-0.25, 0.25], std sqrt(0.125 / 1):
    # A = [-1/sqrt2, 1/sqrt2, 0, 0]. Group 2, all NaN, and group 3, one valid reward: 0.
    rewards_BxG = np.array([[1.0, np.nan, 0.0, 0.0], [0.5, 1.0, np.nan, np.nan],
                            [np.nan] * 4, [np.nan, 0.3, np.nan, np.nan]], np.float32)
    fn = self.variant(functools.partial(adv.grpo, eps=0.0, nan_rewards='ignore'))
    s3, s2 = np.sqrt(3), np.sqrt(2)
    np.testing.assert_allclose(fn(rewards_BxG), [[2 / s3, 0, -1 / s3, -1 / s3],
                                                 [-1 / s2, 1 / s2, 0, 0], [0] * 4, [0] * 4],
                               **TIGHT)
    dr = self.variant(functools.partial(adv.dr_grpo, nan_rewards='ignore'))
    np.testing.assert_allclose(dr(rewards_BxG[:2]), [[2 / 3, 0, -1 / 3, -1 / 3],
                                                     [-0.25, 0.25, 0, 0]], **TIGHT)

  @chex.variants(with_jit=True)
  def test_nan_rows_get_zero_and_leave_the_others_unchanged(self):
    # One NaN per group (column 2): the others' advantages equal those of the groups without it.
    rewards_BxG = np.random.default_rng(3).normal(size=(3, 5)).astype(np.float32)
    with_nan_BxG = rewards_BxG.copy()
    with_nan_BxG[:, 2] = np.nan
    without_BxG = np.delete(rewards_BxG, 2, axis=1)
    for scale in adv.GRPO_SCALES:
      fn = self.variant(functools.partial(adv.grpo, scale=scale, nan_rewards='ignore'))
      a = np.asarray(fn(with_nan_BxG))
      np.testing.assert_array_equal(a[:, 2], 0.0)
      np.testing.assert_allclose(np.delete(a, 2, axis=1), adv.grpo(without_BxG, scale=scale),
                                 rtol=1e-5, atol=1e-6)
      # Without NaN, 'ignore' is the default computation.
      np.testing.assert_allclose(fn(rewards_BxG), adv.grpo(rewards_BxG, scale=scale), **TIGHT)

  def test_nan_rewards_are_an_error_naming_the_rows(self):
    rewards_BxG = np.array([[1.0, np.nan, 0.0], [0.0, 0.0, np.nan]], np.float32)
    lengths_BxG = np.ones((2, 3), np.float32)
    for fn in (adv.grpo, adv.dr_grpo, adv.rloo, adv.reinforce_pp_baseline, adv.grpo_passk,
               functools.partial(adv.opo, lengths_BxG=lengths_BxG)):
      with pytest.raises(ValueError, match=r'rows 1 \(prompt 0, sample 1\), 5 \(prompt 1, '
                                           r"sample 2\).*nan_rewards='ignore'"):
        fn(rewards_BxG)
    with pytest.raises(ValueError, match="nan_rewards='skip'"):
      adv.grpo(rewards_BxG, nan_rewards='skip')
    with pytest.raises(ValueError, match="scale='prompt'"):
      adv.grpo(rewards_BxG, scale='prompt')

  @chex.variants(with_jit=True, without_jit=True)
  def test_opo_hand_example(self):
    # b = Σ L R / Σ L. Group 0: R [1, 0, 0, 0], L [1, 2, 3, 4]: b = 1/10, A = [0.9, -0.1 x3]
    # (a mean baseline would give [0.75, -0.25 x3]). Group 1 all equal: 0. Group 2 with every
    # length 0: the plain mean, [0.75, -0.25 x3].
    rewards_BxG = np.array([[1, 0, 0, 0], [0.5] * 4, [1, 0, 0, 0]], np.float32)
    lengths_BxG = np.array([[1, 2, 3, 4], [5, 1, 1, 1], [0, 0, 0, 0]], np.float32)
    fn = self.variant(adv.opo)
    np.testing.assert_allclose(fn(rewards_BxG, lengths_BxG=lengths_BxG),
                               [[0.9, -0.1, -0.1, -0.1], [0] * 4, [0.75, -0.25, -0.25, -0.25]],
                               **TIGHT)
    # Equal lengths: the mean baseline, Dr. GRPO's advantage. A singleton: A = R.
    np.testing.assert_allclose(fn(rewards_BxG, lengths_BxG=np.full((3, 4), 7.0)),
                               adv.dr_grpo(rewards_BxG), **TIGHT)
    one = np.array([[0.7]], np.float32)
    np.testing.assert_array_equal(fn(one, lengths_BxG=np.array([[3.0]])), one)

  @chex.variants(with_jit=True, without_jit=True)
  def test_grpo_passk_hand_example(self):
    # R = [0.2, 1.0, 0.5, 0.0]: best is slot 1, margin 1.0 - 0.5 = 0.5. Unbiased std: mean
    # 0.425, squares 0.050625 + 0.330625 + 0.005625 + 0.180625 = 0.5675, / 3 = 0.189167,
    # std 0.434933 -> A_1 = 0.5 / 0.434934 = 1.149600; every other slot 0.
    # Ties at the top ([1, 1, 0, 0]): margin 0, all 0.
    rewards_BxG = np.array([[0.2, 1.0, 0.5, 0.0], [1.0, 1.0, 0.0, 0.0]], np.float32)
    fn = self.variant(adv.grpo_passk)
    np.testing.assert_allclose(fn(rewards_BxG), [[0, 1.149600, 0, 0], [0] * 4], rtol=1e-5)
    unscaled = self.variant(functools.partial(adv.grpo_passk, scale='none'))
    np.testing.assert_allclose(unscaled(rewards_BxG), [[0, 0.5, 0, 0], [0] * 4], **TIGHT)

  def test_grpo_passk_needs_two_samples(self):
    with pytest.raises(ValueError, match='at least 2 samples'):
      adv.grpo_passk(np.array([[1.0]], np.float32))

  @chex.variants(with_jit=True, without_jit=True)
  def test_reinforce_pp_hand_example(self):
    # Rows: mask [1, 1, 0] with R = 1 on t = 1; mask [1, 1, 1] with R = 0. γ = 1: returns
    # [[1, 1, 0], [0, 0, 0]]; whitened over the 5 valid tokens [1, 1, 0, 0, 0]: mean 0.4,
    # variance (0.36·2 + 0.16·3) / 4 = 0.3: A = 0.6/sqrt(0.3) = 1.095445 and
    # -0.4/sqrt(0.3) = -0.730297; padding 0.
    mask_NxL = np.array([[1, 1, 0], [1, 1, 1]], np.float32)
    rewards_NxL = np.array([[0, 1, 0], [0, 0, 0]], np.float32)
    a, ret = self.variant(adv.reinforce_pp)(rewards_NxL, mask_NxL)
    np.testing.assert_allclose(ret, [[1, 1, 0], [0, 0, 0]], **TIGHT)
    np.testing.assert_allclose(a, [[1.095445, 1.095445, 0], [-0.730297] * 3], rtol=1e-5)
    # γ = 0.5 and an observation token (mask 0 at t = 1) between two model tokens, R = 1 at
    # t = 2: G_2 = 1, t = 1 is skipped (its return 0, the running return carried),
    # G_0 = 0 + 0.5 · 1 = 0.5.
    half = self.variant(functools.partial(adv.reinforce_pp, gamma=0.5))
    _, ret = half(np.array([[0, 0, 1.0]]), np.array([[1, 0, 1.0]]))
    np.testing.assert_allclose(ret, [[0.5, 0.0, 1.0]], **TIGHT)

  @chex.variants(with_jit=True, without_jit=True)
  def test_otb_returns_as_verl_returns_them(self):
    # The OTB hand example (R = [1, 0], two tokens each): returns [[1, 1], [0, 0]], and the
    # advantages are the plain call's.
    logp, sumsq = _two_way_energy_inputs([[P_HALF, P_HALF], [P_TENTH, P_TENTH]])
    mask = np.ones((2, 2), np.float32)
    rewards = adv.outcome_token_rewards(np.array([1.0, 0.0]), mask)
    fn = self.variant(functools.partial(adv.otb, group_size=2, zero_tail=False,
                                        with_returns=True))
    a, ret = fn(rewards, logp, sumsq, mask)
    np.testing.assert_allclose(ret, [[1, 1], [0, 0]], **TIGHT)
    np.testing.assert_allclose(a, adv.otb(rewards, logp, sumsq, mask, group_size=2,
                                          zero_tail=False), **TIGHT)
    # Multi-turn: model, observation, model, padding; R = 1 on t = 2. The observation token
    # carries the return after it (1), padding 0 -- verl's returns are not masked.
    mask_mt = np.array([[1, 0, 1, 0], [1, 1, 0, 0]], np.float32)
    rewards_mt = adv.outcome_token_rewards(np.array([1.0, 0.0]), mask_mt)
    logp_mt, sumsq_mt = _two_way_energy_inputs(np.full((2, 4), 0.5))
    mt = self.variant(functools.partial(adv.otb, group_size=2, zero_tail=False, multi_turn=True,
                                        with_returns=True))
    a_mt, ret_mt = mt(rewards_mt, logp_mt, sumsq_mt, mask_mt)
    np.testing.assert_allclose(ret_mt, [[1, 1, 1, 0], [0, 0, 0, 0]], **TIGHT)
    np.testing.assert_array_equal(np.asarray(a_mt)[mask_mt == 0], 0.0)


def test_batch_scaled_grpo_is_global_on_a_sharded_batch():
  mesh = jax.make_mesh((8,), ('data',))
  sharding = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec('data'))
  rewards_BxG = np.random.default_rng(9).normal(size=(16, 4)).astype(np.float32)
  fn = jax.jit(functools.partial(adv.grpo, scale='batch'))
  np.testing.assert_allclose(fn(jax.device_put(rewards_BxG, sharding)), fn(rewards_BxG),
                             rtol=1e-6, atol=1e-6)
