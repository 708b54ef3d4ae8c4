"""Policy losses and their diagnostics: hand-computed cases (algorithms.md §0–§5, §8, §9,
§14, §15), gradient identities, invariances and NaN safety."""

import functools

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rlreason.objectives import aggregation
from rlreason.objectives import loss_diagnostics
from rlreason.objectives import losses

# Every registered loss (and the library-only is_grpo) with the options it needs; G = 2 groups
# where one is needed.
ALL_LOSSES = {
    'ppo_clip': dict(eps_low=0.2, eps_high=0.28, dual_clip=3.0),
    'cispo': dict(cap='relative', eps_high=0.2),
    'cispo_absolute': dict(cap='absolute', max_weight=5.0),
    'cispo_sequence': dict(cap='absolute', max_weight=5.0, level='sequence'),
    'sapo': dict(),
    'sapo_sequence': dict(level='sequence', tau_pos=2.0, tau_neg=3.0),
    'gspo': dict(),
    'gspo_dual': dict(dual_clip=3.0),
    'gspo_token': dict(dual_clip=3.0),
    'quatro': dict(group_size=2, delta=0.1),
    'quatro_log_target': dict(group_size=2, delta=0.1),
    # δ above the batch's measured KL: λ stays at the flat group's REPS dual, 0.
    'quatro_dual_ascent': dict(group_size=2, delta=10.0, lam_lr=1.0),
    'is_grpo': dict(group_size=2, reward_std_B=jnp.array([0.5, 1.0]),
                    proposal_std_B=jnp.array([0.5, 1.0])),
    'sorl': dict(turn_ids_NxL=jnp.array([[0, 0, 1, 1, 1]] * 4), num_turns=2),
    'prefix_mixed_ppo': dict(prefix_mask_NxL=jnp.array([[1, 1, 0, 0, 0]] * 4),
                             behavior_logprobs_NxL=jnp.full((4, 5), -1.0)),
}
CLIPPED_SURROGATES = [k for k in ALL_LOSSES if not k.startswith('quatro')]


def _fn(key):
  if key == 'is_grpo':  # A library function: no prompt sampler of the loop feeds it yet.
    return losses.is_grpo
  variants = {'cispo_absolute': 'cispo', 'cispo_sequence': 'cispo', 'sapo_sequence': 'sapo',
              'gspo_dual': 'gspo'}
  return losses.get_policy_loss(variants.get(key, key))


def _from_ratios(ratio_NxL, lp=-1.0):
  """(logprobs, old_logprobs) with the given ratios."""
  lp_NxL = jnp.full(np.shape(ratio_NxL), lp)
  return lp_NxL, lp_NxL - jnp.log(jnp.asarray(ratio_NxL, jnp.float32))


def _token_grad(fn, lp, old, adv, mask, **kw):
  """∂/∂lp of Σ_{i,t} w ℓ, the token-sum of the loss (aggregation-free)."""
  def total(lp):
    loss_NxL, weights_NxL, _ = fn(lp, old, adv, mask, **kw)
    return jnp.sum(loss_NxL * weights_NxL)
  return jax.grad(total)(lp)


def _batch(seed=0, n=4, l=5, scale=0.3):
  k = jax.random.split(jax.random.key(seed), 3)
  lp = -jax.random.uniform(k[0], (n, l), minval=0.2, maxval=2.0)
  old = lp + scale * jax.random.normal(k[1], (n, l))
  adv = jax.random.normal(k[2], (n,))
  mask = jnp.array([[1, 1, 1, 1, 1], [1, 1, 1, 0, 0], [1, 1, 1, 1, 0], [1, 1, 0, 0, 0]],
                   jnp.float32)[:n, :l]
  return lp, old, adv, mask


class PolicyLossTest(chex.TestCase):

  @chex.variants(with_jit=True, without_jit=True)
  def test_ppo_clip_hand_cases(self):
    # ε = 0.2. A = +1: r = 1.3 → ℓ = −min(1.3, 1.2) = −1.2, ∂ℓ/∂lp = 0;
    #              r = 0.7 → ℓ = −0.7, ∂ℓ/∂lp = −A r = −0.7 (the low side is not clipped).
    # A = −1: r = 0.7 → ℓ = −min(−0.7, −0.8) = 0.8, grad 0; r = 1.3 → ℓ = 1.3, grad +1.3.
    # Dual clip c = 3, A = −1: r = 4 → ℓ = min(4, 3) = 3, grad 0; r = 2 → ℓ = 2, grad 2.
    lp, old = _from_ratios([[1.3, 0.7, 0.7, 1.3, 4.0, 2.0]])
    adv = jnp.array([[1.0, 1.0, -1.0, -1.0, -1.0, -1.0]])
    mask = jnp.ones((1, 6))
    f = functools.partial(losses.ppo_clip, eps_low=0.2, eps_high=0.2, dual_clip=3.0)
    loss, weights, metrics = self.variant(f)(lp, old, adv, mask)
    np.testing.assert_allclose(loss, [[-1.2, -0.7, 0.8, 1.3, 3.0, 2.0]], rtol=1e-5)
    np.testing.assert_array_equal(weights, mask)
    grad = self.variant(functools.partial(_token_grad, f))(lp, old, adv, mask)
    np.testing.assert_allclose(grad, [[0.0, -0.7, 0.0, 1.3, 0.0, 2.0]], rtol=1e-5, atol=0)
    # Clipped: r = 1.3 (A > 0) high; r = 0.7 (A < 0) low; dual: r = 4 (A < 0).
    np.testing.assert_allclose(metrics['clip_frac/high'], 1 / 6, rtol=1e-6)
    np.testing.assert_allclose(metrics['clip_frac/low'], 1 / 6, rtol=1e-6)
    np.testing.assert_allclose(metrics['clip_frac/dual'], 1 / 6, rtol=1e-6)

  def test_clip_higher(self):
    # A > 0, r = 1.25: clipped (zero gradient) with ε_high = 0.2, live with DAPO's 0.28.
    lp, old = _from_ratios([[1.25]])
    adv, mask = jnp.ones((1, 1)), jnp.ones((1, 1))
    grad = lambda hi: jax.jit(functools.partial(
        _token_grad, functools.partial(losses.ppo_clip, eps_high=hi)))(lp, old, adv, mask)
    np.testing.assert_array_equal(grad(0.2), [[0.0]])
    np.testing.assert_allclose(grad(0.28), [[-1.25]], rtol=1e-6)

  @chex.variants(with_jit=True, without_jit=True)
  def test_ratio_one_gives_reinforce_gradient(self):
    # At θ = θ_old every clipped surrogate's per-token gradient is −A·M (for GSPO:
    # L_i tokens × −A/L_i each through s_i); so is CISPO's (weight 1) and SAPO's
    # (f'(1) = 4 σ(0)(1 − σ(0)) = 1, at either level).
    lp, _, adv, mask = _batch()
    for key in CLIPPED_SURROGATES:
      kw = dict(ALL_LOSSES[key])
      if key == 'prefix_mixed_ppo':  # The prefix's behaviour policy is π_θ too.
        kw['behavior_logprobs_NxL'] = lp
      f = functools.partial(_token_grad, _fn(key), **kw)
      grad = self.variant(f)(lp, lp, adv, mask)
      np.testing.assert_allclose(grad, -adv[:, None] * mask, atol=1e-6, err_msg=key)

  def test_zero_gradient_exactly_in_clipped_regions(self):
    # Column 0: A > 0 with r above 1 + ε; column 1: A < 0 with r below 1 − ε → exactly 0.
    # Column 2: A < 0 with r above 1 + ε is not clipped → −A r.
    lp, old = _from_ratios([[1.5, 0.5, 1.5]])
    adv, mask = jnp.array([[1.0, -1.0, -1.0]]), jnp.ones((1, 3))
    for key in ('ppo_clip', 'prefix_mixed_ppo', 'sorl', 'is_grpo'):
      kw = {'ppo_clip': {}, 'is_grpo': dict(group_size=1, reward_std_B=jnp.ones(1),
                                            proposal_std_B=jnp.ones(1)),
            'sorl': dict(turn_ids_NxL=jnp.array([[0, 1, 2]]), num_turns=3,
                         normalization='none'),
            'prefix_mixed_ppo': dict(prefix_mask_NxL=jnp.array([[1, 0, 0]]),
                                     behavior_logprobs_NxL=old)}[key]
      grad = jax.jit(functools.partial(_token_grad, _fn(key), **kw))(lp, old, adv, mask)
      np.testing.assert_array_equal(grad[:, :2], [[0.0, 0.0]], err_msg=key)
      np.testing.assert_allclose(grad[:, 2], [1.5], rtol=1e-6, err_msg=key)
    # Sequence-level: one sequence per row, every token's log ratio log 1.5 / log 0.5.
    for key in ('gspo', 'gspo_token'):
      lp2, old2 = _from_ratios([[1.5, 1.5], [0.5, 0.5]])
      grad = jax.jit(functools.partial(_token_grad, _fn(key), eps_low=0.2, eps_high=0.2))(
          lp2, old2, jnp.array([1.0, -1.0]), jnp.ones((2, 2)))
      np.testing.assert_array_equal(grad, np.zeros((2, 2)), err_msg=key)

  @chex.variants(with_jit=True, without_jit=True)
  def test_cispo_never_masks_a_token(self):
    # A = +1, r = 2: PPO-clip's gradient is 0; CISPO's is −r̂ A with r̂ = 1.2 (relative,
    # ε_high = 0.2) or r̂ = 2 (absolute cap 5); r = 7 → r̂ = 5 (absolute); r = 0.5 with a
    # relative floor 1 − 0.2 → r̂ = 0.8.
    lp, old = _from_ratios([[2.0, 7.0, 0.5]])
    adv, mask = jnp.ones((1, 3)), jnp.ones((1, 3))
    rel = functools.partial(losses.cispo, cap='relative', eps_low=0.2, eps_high=0.2)
    ab = functools.partial(losses.cispo, cap='absolute', max_weight=5.0)
    g_rel = self.variant(functools.partial(_token_grad, rel))(lp, old, adv, mask)
    g_abs = self.variant(functools.partial(_token_grad, ab))(lp, old, adv, mask)
    np.testing.assert_allclose(g_rel, [[-1.2, -1.2, -0.8]], rtol=1e-6)
    np.testing.assert_allclose(g_abs, [[-2.0, -5.0, -0.5]], rtol=1e-6)
    # Random ratios far outside any trust region: the gradient is −r̂ A, never 0, and no
    # gradient flows through r̂ (it would add −A lp ∂r̂/∂lp).
    lp, old, adv, mask = _batch(scale=2.0)
    for f in (rel, ab):
      grad = self.variant(functools.partial(_token_grad, f))(lp, old, adv, mask)
      ratio = np.exp(np.asarray(lp - old))
      r_hat = np.clip(ratio, 0.8, 1.2) if f is rel else np.minimum(ratio, 5.0)
      np.testing.assert_allclose(grad, -r_hat * np.asarray(adv)[:, None] * np.asarray(mask),
                                 rtol=1e-6)
      assert np.all(np.asarray(grad)[np.asarray(mask) > 0] != 0)

  def test_cispo_requires_an_explicit_cap(self):
    lp, old, adv, mask = _batch()
    with pytest.raises(TypeError):
      losses.cispo(lp, old, adv, mask)
    with pytest.raises(ValueError, match='eps_high'):
      losses.cispo(lp, old, adv, mask, cap='relative')
    with pytest.raises(ValueError, match='max_weight'):
      losses.cispo(lp, old, adv, mask, cap='absolute')

  @chex.variants(with_jit=True, without_jit=True)
  def test_gspo_hand_case_and_length_independence(self):
    # Token log ratios [0.1, 0.3] → s = exp(0.2) = 1.221403 > 1.2 → with A = 1, ε = 0.2 every
    # token carries ℓ = −1.2. With ε = 10 (never clipped) ℓ = −s, and s = e^δ whatever the
    # length when every token's log ratio is δ = 0.05: s = 1.051271.
    f = self.variant(functools.partial(losses.gspo, eps_low=0.2, eps_high=0.2))
    lp = jnp.zeros((1, 2))
    loss, _, _ = f(lp, -jnp.array([[0.1, 0.3]]), jnp.ones(1), jnp.ones((1, 2)))
    np.testing.assert_allclose(loss, [[-1.2, -1.2]], rtol=1e-6)
    g = self.variant(functools.partial(losses.gspo, eps_low=10.0, eps_high=10.0))
    mask = jnp.array([[1, 1, 0, 0, 0, 0], [1, 1, 1, 1, 1, 1]], jnp.float32)
    loss, _, _ = g(jnp.zeros((2, 6)), jnp.full((2, 6), -0.05), jnp.ones(2), mask)
    np.testing.assert_allclose(loss, -1.051271 * mask, rtol=1e-6)

  def test_gspo_token_equals_gspo_with_sequence_advantages(self):
    lp, old, adv, mask = _batch(scale=0.01)
    for mode in ('seq_mean_token_mean', 'token_mean'):
      den = aggregation.denominators(mask, mode=mode)

      def agg(fn, lp):
        loss_NxL, w_NxL, _ = fn(lp, old, adv, mask, eps_low=3e-3, eps_high=4e-3)
        return aggregation.aggregate(loss_NxL, w_NxL, mode=mode, denominator=den)

      for fn in (losses.gspo, losses.gspo_token):
        assert float(fn(lp, old, adv, mask, eps_low=3e-3, eps_high=4e-3)[2]['clip_frac']) > 0
      v1, g1 = jax.jit(jax.value_and_grad(functools.partial(agg, losses.gspo)))(lp)
      v2, g2 = jax.jit(jax.value_and_grad(functools.partial(agg, losses.gspo_token)))(lp)
      np.testing.assert_allclose(v2, v1, rtol=1e-6)
      np.testing.assert_allclose(g2, g1, atol=1e-7, rtol=1e-5)

  def test_gspo_paper_epsilon_clips_off_policy_sequences(self):
    # Sequence ratios with per-token noise 0.05 over 64 tokens move s by ~6e-3: ε = 3e-4/4e-4
    # clips some, ε = 0.2 none (algorithms.md §5).
    k = jax.random.split(jax.random.key(1), 2)
    lp = -jnp.ones((16, 64))
    old = lp + 0.05 * jax.random.normal(k[0], (16, 64))
    adv, mask = jax.random.normal(k[1], (16,)), jnp.ones((16, 64))
    clip_frac = jax.jit(lambda lo, hi: losses.gspo(lp, old, adv, mask, eps_low=lo,
                                                   eps_high=hi)[2]['clip_frac'])
    assert float(clip_frac(3e-4, 4e-4)) > 0
    assert float(clip_frac(0.2, 0.2)) == 0

  @chex.variants(with_jit=True, without_jit=True)
  def test_sorl_hand_case(self):
    # One row, A = 1, ε = 0.2. Turn 0: log ratios [0.1, 0.3] → ρ0 = e^0.2 = 1.221403 > 1.2,
    # both tokens clipped (ℓ = −1.2, grad 0); turn 1: [−0.2] → ρ1 = e^−0.2 = 0.818731 (ℓ = −ρ1,
    # grad −ρ1). A masked observation token (index 2, log ratio 5) enters no ratio.
    # reliability: ω = 1 − 2/3 = 1/3. clip_bias: b = 2·(1.221403 − 1.2)/3 = 0.0142687 →
    # 1/(1 + b) = 0.985932. exact turn ratio: ρ0 = e^0.4 = 1.491825.
    lp = jnp.zeros((1, 4))
    old = -jnp.array([[0.1, 0.3, 5.0, -0.2]])
    mask, turns = jnp.array([[1.0, 1.0, 0.0, 1.0]]), jnp.array([[0, 0, 0, 1]])
    f = lambda **kw: self.variant(functools.partial(
        losses.sorl, turn_ids_NxL=turns, num_turns=2, **kw))(lp, old, jnp.ones(1), mask)
    loss, w, _ = f(normalization='reliability')
    np.testing.assert_allclose(loss, [[-1.2, -1.2, 0.0, -0.818731]], rtol=1e-6)
    np.testing.assert_allclose(w, [[1 / 3, 1 / 3, 0.0, 1 / 3]], rtol=1e-6)
    np.testing.assert_allclose(f(normalization='clip_bias')[1][0, 0], 0.985932, rtol=1e-6)
    np.testing.assert_allclose(f(normalization='none')[1], mask)
    grad = self.variant(functools.partial(_token_grad, losses.sorl, turn_ids_NxL=turns,
                                          num_turns=2))(lp, old, jnp.ones(1), mask)
    np.testing.assert_allclose(grad, [[0.0, 0.0, 0.0, -0.818731 / 3]], rtol=1e-6)
    big = functools.partial(losses.sorl, turn_ids_NxL=turns, num_turns=2, eps_high=1.0,
                            turn_ratio='exact')
    np.testing.assert_allclose(big(lp, old, jnp.ones(1), mask)[0][0, 0], -1.491825, rtol=1e-6)

  def test_sorl_one_turn_is_gspo_token_and_no_clip_is_plain(self):
    lp, old, adv, mask = _batch(scale=0.02)
    one_turn = functools.partial(losses.sorl, turn_ids_NxL=jnp.zeros((4, 5), jnp.int32),
                                 num_turns=1, eps_low=3e-4, eps_high=4e-4, normalization='none')
    tok = functools.partial(losses.gspo_token, eps_low=3e-4, eps_high=4e-4)
    np.testing.assert_allclose(jax.jit(one_turn)(lp, old, adv, mask)[0],
                               tok(lp, old, adv, mask)[0], rtol=1e-6)
    np.testing.assert_allclose(jax.jit(functools.partial(_token_grad, one_turn))(
        lp, old, adv, mask), _token_grad(tok, lp, old, adv, mask), rtol=1e-6, atol=1e-7)
    # With a wide region nothing clips: reliability weights are the mask.
    wide = functools.partial(losses.sorl, turn_ids_NxL=jnp.zeros((4, 5), jnp.int32),
                             num_turns=1, eps_low=0.9, eps_high=10.0)
    np.testing.assert_allclose(jax.jit(wide)(lp, old, adv, mask)[1], mask)

  @chex.variants(with_jit=True, without_jit=True)
  def test_prefix_ratios_use_behaviour_logprobs(self):
    # Prefix token: lp = log 0.5, behaviour log 0.4, old log 0.25, A = 1, ε = 0.2:
    # r = 1.25 (not 2) → clipped to 1.2 → ℓ = −1.2, grad 0; with prefix ε_high = 0.3 → ℓ = −1.25,
    # grad −1.25. Continuation token: r = 0.5/0.25 = 2 → ℓ = −1.2.
    lp = jnp.log(jnp.array([[0.5, 0.5]]))
    old = jnp.log(jnp.array([[0.25, 0.25]]))
    beh = jnp.log(jnp.array([[0.4, 0.9]]))
    args = (lp, old, jnp.ones(1), jnp.ones((1, 2)))
    kw = dict(prefix_mask_NxL=jnp.array([[1, 0]]), behavior_logprobs_NxL=beh)
    f = self.variant(functools.partial(losses.prefix_mixed_ppo, **kw))
    np.testing.assert_allclose(f(*args)[0], [[-1.2, -1.2]], rtol=1e-6)
    g = functools.partial(losses.prefix_mixed_ppo, prefix_eps_high=0.3, **kw)
    np.testing.assert_allclose(self.variant(g)(*args)[0], [[-1.25, -1.2]], rtol=1e-6)
    np.testing.assert_allclose(self.variant(functools.partial(_token_grad, g))(*args),
                               [[-1.25, 0.0]], rtol=1e-6)
    loss, w, _ = self.variant(functools.partial(losses.prefix_mixed_ppo, train_prefix=False,
                                                **kw))(*args)
    np.testing.assert_array_equal(w, [[0.0, 1.0]])
    np.testing.assert_allclose(loss, [[0.0, -1.2]], rtol=1e-6)

  def test_prefix_reduces_to_ppo_clip(self):
    # No prefix, or a prefix whose behaviour policy is π_old: exactly PPO-clip.
    lp, old, adv, mask = _batch()
    want = losses.ppo_clip(lp, old, adv, mask)[0]
    for prefix in (jnp.zeros((4, 5)), jnp.ones((4, 5))):
      f = functools.partial(losses.prefix_mixed_ppo, prefix_mask_NxL=prefix,
                            behavior_logprobs_NxL=old)
      np.testing.assert_allclose(jax.jit(f)(lp, old, adv, mask)[0], want, rtol=1e-6)

  def test_is_grpo_expected_update_is_parallel_to_full_gradient(self):
    # Toy: 3 prompts, G = 4, one token each, lp_i = θ·f_i (θ ∈ R^5), at θ = θ_old. The full
    # gradient is ∇J = Σ_x p_x Σ_i (R_i − μ_x) f_i / G. Prompts are drawn from
    # q ∝ p σ̂ (σ̂ ≠ σ: a stale estimate); IS-GRPO's loss weight σ_x/σ̂_x makes E_q[update]
    # exactly parallel to ∇J; plain GRPO on the same q-sampled prompts is not.
    feats = jax.random.normal(jax.random.key(2), (12, 5))
    rewards_BxG = jnp.array([[1.0, 0.0, 0.0, 0.0], [1.0, 1.0, 0.0, 0.0], [1.0, 1.0, 1.0, 0.0]])
    mu_B, sigma_B = rewards_BxG.mean(-1), rewards_BxG.std(-1)
    adv_N = ((rewards_BxG - mu_B[:, None]) / sigma_B[:, None]).reshape(12)
    std_hat_B = jnp.array([0.2, 0.5, 0.3])
    q_B = losses.is_grpo_prompt_probs(std_hat_B)

    def update(proposal_std_B, theta):
      lp = (feats @ theta)[:, None]
      loss, w, _ = losses.is_grpo(lp, jax.lax.stop_gradient(lp), adv_N, jnp.ones((12, 1)),
                                  group_size=4, reward_std_B=sigma_B,
                                  proposal_std_B=proposal_std_B)
      per_prompt_B = jnp.sum((loss * w).reshape(3, 4), axis=-1) / 4
      return -jnp.sum(q_B * per_prompt_B)  # E_q of the (ascent) update

    full = ((rewards_BxG - mu_B[:, None]).reshape(12)[:, None] * feats).reshape(3, 4, 5)
    full = jnp.mean(full.sum(1) / 4, axis=0)
    cos = lambda a, b: float(a @ b / jnp.linalg.norm(a) / jnp.linalg.norm(b))
    g_is = jax.jit(jax.grad(functools.partial(update, std_hat_B)))(jnp.zeros(5))
    g_plain = jax.jit(jax.grad(functools.partial(update, sigma_B)))(jnp.zeros(5))
    np.testing.assert_allclose(cos(g_is, full), 1.0, atol=1e-6)
    assert cos(g_plain, full) < 0.999

  def test_all_equal_singleton_and_padded_groups_are_finite(self):
    # All-equal groups have A = 0; padding holds −inf log-probs and NaN advantages.
    lp, old, _, mask = _batch()
    lp = jnp.where(mask > 0, lp, -jnp.inf)
    old = jnp.where(mask > 0, old, -jnp.inf)
    adv = jnp.where(mask > 0, 0.0, jnp.nan)
    cases = dict(ALL_LOSSES, quatro_singleton=dict(group_size=1, delta=0.1))

    @jax.jit
    def everything(lp, old, adv, mask):
      out = {}
      for key, kw in cases.items():
        fn = _fn(key.removesuffix('_singleton'))
        loss, w, metrics = fn(lp, old, adv, mask, **kw)
        out[key] = (_token_grad(fn, lp, old, adv, mask, **kw), loss * w, metrics)
      return out

    for key, (grad, loss, metrics) in everything(lp, old, adv, mask).items():
      np.testing.assert_array_equal(grad, np.zeros_like(grad), err_msg=key)
      assert np.isfinite(np.asarray(loss)).all(), key
      assert all(np.isfinite(np.asarray(v)).all() for v in metrics.values()), key


class PeerOptionTest(chex.TestCase):
  """SAPO, sequence-level CISPO and GSPO's dual clip (issue #21), against verl's and TRL's code."""

  @chex.variants(with_jit=True, without_jit=True)
  def test_sapo_hand_cases(self):
    # ℓ = −σ(τ(r − 1))·4/τ·A, τ = 1 for A > 0, 1.05 for A ≤ 0 (the defaults).
    #   A = +1, r = 2: −4σ(1) = −4 · 0.7310586 = −2.924234;
    #   A = −1, r = 2: +σ(1.05)·4/1.05 = 0.7407750 · 3.809524 = 2.822000;
    #   A = +1, r = 1: −2σ(0)·2 = −2 (f(1) = 2/τ).
    # d ℓ / d lp = −A · 4σ(1 − σ) · r: −4 · 0.7310586 · 0.2689414 · 2 = −1.572895;
    #   +4 · 0.7407750 · 0.2592250 · 2 = 1.536220; at r = 1: −A = −1 (REINFORCE's).
    lp, old = _from_ratios([[2.0, 2.0, 1.0]])
    adv, mask = jnp.array([[1.0, -1.0, 1.0]]), jnp.ones((1, 3))
    loss, w, metrics = self.variant(losses.sapo)(lp, old, adv, mask)
    np.testing.assert_allclose(loss, [[-2.924234, 2.822000, -2.0]], rtol=1e-5)
    np.testing.assert_array_equal(w, mask)
    grad = self.variant(functools.partial(_token_grad, losses.sapo))(lp, old, adv, mask)
    np.testing.assert_allclose(grad, [[-1.572895, 1.536220, -1.0]], rtol=1e-5)
    np.testing.assert_allclose(metrics['ratio/mean'], 5 / 3, rtol=1e-6)
    # Sequence level: token log ratios [ln 2, 0] → s = exp(ln 2 / 2) = sqrt 2; A = 1, τ = 1:
    # ℓ = −4σ(0.414214) = −4 · 0.6020978 = −2.408391 on both tokens.
    lp2, old2 = _from_ratios([[2.0, 1.0]])
    seq = self.variant(functools.partial(losses.sapo, level='sequence'))
    loss, _, _ = seq(lp2, old2, jnp.ones(1), jnp.ones((1, 2)))
    np.testing.assert_allclose(loss, [[-2.408391, -2.408391]], rtol=1e-5)

  @chex.variants(with_jit=True, without_jit=True)
  def test_sapo_temperature_sharpens_the_gate(self):
    # Far off-policy (r = 3, A = 1) the gradient 4σ(1 − σ)·r decays faster with a larger τ:
    # τ = 1: 4 · 0.8807971 · 0.1192029 · 3 = 1.259903;  τ = 4: 4 · σ(8)(1 − σ(8)) · 3 = 0.004023.
    lp, old = _from_ratios([[3.0]])
    for tau, want in ((1.0, 1.259903), (4.0, 0.004023)):
      f = functools.partial(_token_grad, losses.sapo, tau_pos=tau)
      grad = self.variant(f)(lp, old, jnp.ones((1, 1)), jnp.ones((1, 1)))
      np.testing.assert_allclose(grad, [[-want]], rtol=1e-3)

  @chex.variants(with_jit=True, without_jit=True)
  def test_cispo_sequence_hand_case(self):
    # Token log ratios [ln 4, 0] → s = exp(ln 4 / 2) = 2; relative cap ε_high = 0.2 → weight
    # 1.2 on both tokens (token level: [1.2, 1.0]). lp = [−1, −2], A = 1: ℓ = −w A lp =
    # [1.2, 2.4] (token level [1.2, 2.0]); gradient −w A = [−1.2, −1.2].
    lp = jnp.array([[-1.0, -2.0]])
    old = lp - jnp.log(jnp.array([[4.0, 1.0]]))
    kw = dict(cap='relative', eps_high=0.2)
    seq = self.variant(functools.partial(losses.cispo, level='sequence', **kw))
    loss, _, metrics = seq(lp, old, jnp.ones(1), jnp.ones((1, 2)))
    np.testing.assert_allclose(loss, [[1.2, 2.4]], rtol=1e-6)
    np.testing.assert_allclose(metrics['cispo/weight_mean'], 1.2, rtol=1e-6)
    tok = self.variant(functools.partial(losses.cispo, **kw))
    np.testing.assert_allclose(tok(lp, old, jnp.ones(1), jnp.ones((1, 2)))[0], [[1.2, 2.0]],
                               rtol=1e-6)
    grad = self.variant(functools.partial(_token_grad, losses.cispo, level='sequence', **kw))(
        lp, old, jnp.ones(1), jnp.ones((1, 2)))
    np.testing.assert_allclose(grad, [[-1.2, -1.2]], rtol=1e-6)

  @chex.variants(with_jit=True)
  def test_sequence_level_with_one_token_per_sequence_is_token_level(self):
    lp, old, adv, _ = _batch(scale=1.0)
    mask = jnp.zeros_like(lp).at[:, 2].set(1.0)  # One valid token per row.
    for fn, kw in ((losses.cispo, dict(cap='relative', eps_high=0.2)),
                   (losses.cispo, dict(cap='absolute', max_weight=1.1)),
                   (losses.sapo, dict(tau_pos=2.0))):
      token = self.variant(functools.partial(fn, **kw))(lp, old, adv, mask)[0]
      seq = self.variant(functools.partial(fn, level='sequence', **kw))(lp, old, adv, mask)[0]
      np.testing.assert_allclose(seq, token, rtol=1e-6, atol=1e-7)
      g_tok = self.variant(functools.partial(_token_grad, fn, **kw))(lp, old, adv, mask)
      g_seq = self.variant(functools.partial(_token_grad, fn, level='sequence', **kw))(
          lp, old, adv, mask)
      np.testing.assert_allclose(g_seq, g_tok, rtol=1e-6, atol=1e-7)
    with pytest.raises(ValueError, match="level='turn'"):
      losses.sapo(lp, old, adv, mask, level='turn')

  @chex.variants(with_jit=True, without_jit=True)
  def test_gspo_dual_clip_on_the_sequence_ratio(self):
    # Each row one sequence with every token log ratio δ: s = e^δ. A = −1, s = e^1.5 = 4.481689:
    # ℓ = −min(−s, −clip(s)) = s, capped by the dual clip at −c A = 3 (gradient 0). A = −1,
    # s = 2 < c: ℓ = 2 (unchanged). A = +1, s = 4.48: clipped at 1 + 4e-4, no dual clip.
    lp, old = _from_ratios([[np.exp(1.5)] * 2, [2.0] * 2, [np.exp(1.5)] * 2])
    adv, mask = jnp.array([-1.0, -1.0, 1.0]), jnp.ones((3, 2))
    for fn in (losses.gspo, losses.gspo_token):
      f = self.variant(functools.partial(fn, dual_clip=3.0))
      loss, _, metrics = f(lp, old, adv, mask)
      np.testing.assert_allclose(loss, [[3.0] * 2, [2.0] * 2, [-1.0004] * 2], rtol=1e-6)
      np.testing.assert_allclose(metrics['clip_frac/dual'], 1 / 3, rtol=1e-6)
      grad = self.variant(functools.partial(_token_grad, fn, dual_clip=3.0))(lp, old, adv, mask)
      np.testing.assert_array_equal(grad[0], [0.0, 0.0])
      assert np.all(np.asarray(grad[1]) > 0)  # −A · s / L_i per token, through s.
      plain = self.variant(fn)(lp, old, adv, mask)[0]
      np.testing.assert_allclose(plain[0], [np.exp(1.5)] * 2, rtol=1e-6)

  @chex.variants(with_jit=True)
  def test_gspo_dual_clip_equals_trl_delta(self):
    # TRL (loss_type='grpo', importance_sampling_level='sequence', delta=δ):
    # ℓ = −min(min(s, δ) A, clip(s, 1 − ε_low, 1 + ε_high) A), the same loss as the dual clip
    # c = δ whenever δ ≥ 1 + ε_high.
    lp, old, adv, mask = _batch(seed=3, scale=1.0)
    loss, _, _ = self.variant(functools.partial(losses.gspo, dual_clip=1.5))(lp, old, adv, mask)
    log_s = jnp.sum((lp - old) * mask, -1) / jnp.sum(mask, -1)
    s = jnp.exp(log_s)
    trl_N = -jnp.minimum(jnp.minimum(s, 1.5) * adv, jnp.clip(s, 1 - 3e-4, 1 + 4e-4) * adv)
    np.testing.assert_allclose(loss, trl_N[:, None] * mask, rtol=1e-5, atol=1e-6)
    # Row 1 (s = 2.28, A < 0) is capped at 1.5; row 0 (s = 1.46, A < 0) is not.
    assert bool(jnp.any((s > 1.5) & (adv < 0))) and bool(jnp.any((s < 1.5) & (adv < 0)))


class DiagnosticsTest(chex.TestCase):

  @chex.variants(with_jit=True, without_jit=True)
  def test_ratio_metrics_hand_case(self):
    # r = [1.3, 0.7, 1.0, 0.5], A = [1, −1, 1, 1], ε = 0.2: high = {1.3}, low = {0.7};
    # outside = {1.3, 0.7, 0.5}; mean r = 0.875; clipped mean = (1.2 + 0.8 + 1 + 0.8)/4 = 0.95;
    # approx_kl = −mean log r = 0.196865; k3 = mean(r − 1 − log r) = 0.0718645.
    lr = jnp.log(jnp.array([[1.3, 0.7, 1.0, 0.5]]))
    adv, mask = jnp.array([[1.0, -1.0, 1.0, 1.0]]), jnp.ones((1, 4))
    m = self.variant(functools.partial(loss_diagnostics.ratio_metrics, eps_low=0.2,
                                       eps_high=0.2))(lr, adv, mask)
    want = {'clip_frac/high': 0.25, 'clip_frac/low': 0.25, 'clip_frac': 0.5,
            'ratio/outside_frac': 0.75, 'ratio/mean': 0.875, 'ratio/max': 1.3, 'ratio/min': 0.5,
            'ratio/clipped_mean': 0.95, 'approx_kl': 0.196865, 'k3_kl': 0.0718645}
    for k, v in want.items():
      np.testing.assert_allclose(m[k], v, rtol=1e-5, err_msg=k)

  @chex.variants(with_jit=True, without_jit=True)
  def test_zero_variance_group_fraction(self):
    # [1,1,1,1] and [0,0,0,0] have no spread, [1,0,0,0] does → 2/3; singletons → 1.
    f = self.variant(loss_diagnostics.zero_variance_group_fraction)
    rewards = jnp.array([[1.0, 1.0, 1.0, 1.0], [0.0, 0.0, 0.0, 0.0], [1.0, 0.0, 0.0, 0.0]])
    np.testing.assert_allclose(f(rewards), 2 / 3, rtol=1e-6)
    np.testing.assert_allclose(f(jnp.array([[0.3], [1.0]])), 1.0)

  @chex.variants(with_jit=True, without_jit=True)
  def test_otb_variance_proxies_hand_case(self):
    # Row 1: π_a = 0.5, Σπ² = 0.5 → w = 1 − 1 + 0.5 = 0.5 per token, W = 1.0, A = +1.
    # Row 2: π_a = 0.9, Σπ² = 0.82 → w = 0.02, W = 0.04, A = −1.
    # P = (1·1.0 + 1·0.04)/2 = 0.52 = E[W]; E[A²] = 1; grad_norm 0.5 → S = 0.25,
    # noise = (0.52 − 0.25)/(2 − 1) = 0.27. IS weights 2 on row 1: P = (4·1.0 + 0.04)/2 = 2.02,
    # E[W] with squared IS weights = (4·1.0 + 0.04)/2 = 2.02.
    old = jnp.log(jnp.array([[0.5, 0.5], [0.9, 0.9]]))
    sq = jnp.array([[0.5, 0.5], [0.82, 0.82]])
    adv, mask = jnp.array([1.0, -1.0]), jnp.ones((2, 2))
    f = self.variant(functools.partial(loss_diagnostics.otb_variance_proxies, grad_norm=0.5))
    m = f(old, sq, adv, mask)
    for k, v in {'otb/total_power': 0.52, 'otb/expected_w': 0.52, 'otb/expected_a_squared': 1.0,
                 'otb/signal': 0.25, 'otb/noise': 0.27}.items():
      np.testing.assert_allclose(m[k], v, rtol=1e-5, err_msg=k)
    m = f(old, sq, adv, mask, is_weights_NxL=jnp.array([[2.0, 2.0], [1.0, 1.0]]))
    np.testing.assert_allclose(m['otb/total_power'], 2.02, rtol=1e-5)
    np.testing.assert_allclose(m['otb/expected_w'], 2.02, rtol=1e-5)

  def test_policy_metrics(self):
    # Entropy mean over valid tokens (1 and 3 → 2); k1 of lp − lp_ref = ln 2 on each token.
    mask = jnp.array([[1.0, 1.0, 0.0]])
    m = loss_diagnostics.policy_metrics(
        mask, entropy_NxL=jnp.array([[1.0, 3.0, 100.0]]),
        logprobs_NxL=jnp.log(jnp.full((1, 3), 0.5)),
        ref_logprobs_NxL=jnp.log(jnp.full((1, 3), 0.25)))
    np.testing.assert_allclose(m['entropy'], 2.0)
    np.testing.assert_allclose(m['kl_ref/k1'], np.log(2), rtol=1e-6)


def test_registry_lists_known_names():
  assert set(losses.POLICY_LOSSES) == {'ppo_clip', 'cispo', 'gspo', 'gspo_token', 'quatro',
                                       'quatro_log_target', 'quatro_dual_ascent', 'sorl',
                                       'prefix_mixed_ppo', 'sapo'}
  assert set(losses.LIBRARY_ONLY) == {'is_grpo'}
  with pytest.raises(KeyError, match='gspo_token'):
    losses.get_policy_loss('grpo')


@pytest.mark.parametrize('jit', [False, True])
def test_sorl_one_turn_episode_equals_the_single_turn_form(jit):
  # A one-turn episode (turn ids all 0, num_turns = 1), the loop's single-turn input: SORL's
  # geometric turn ratio is GSPO's sequence ratio, so without its normalisation it is
  # gspo_token, value and gradient.
  k1, k2, k3 = jax.random.split(jax.random.key(3), 3)
  lp = -jax.random.uniform(k1, (4, 5), minval=0.1, maxval=2.0)
  old = lp + 0.2 * jax.random.normal(k2, (4, 5))
  adv = jax.random.normal(k3, (4, 1)) * jnp.ones((4, 5))
  mask = jnp.array([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1], [1, 0, 0, 0, 0], [1, 1, 0, 0, 0]])
  sorl = functools.partial(losses.sorl, turn_ids_NxL=jnp.zeros((4, 5), jnp.int32), num_turns=1,
                           normalization='none', eps_low=0.2, eps_high=0.2)
  gspo = functools.partial(losses.gspo_token, eps_low=0.2, eps_high=0.2, log_ratio_clip=20.0)
  total = lambda fn: lambda x: jnp.sum(fn(x, old, adv, mask)[0])
  maybe_jit = jax.jit if jit else (lambda f: f)
  for out in (total, lambda fn: jax.grad(total(fn))):
    np.testing.assert_allclose(maybe_jit(out(sorl))(lp), maybe_jit(out(gspo))(lp), rtol=1e-6,
                               atol=1e-7)


@pytest.mark.parametrize('jit', [False, True])
def test_value_loss_hand_case(jit):
  # Clip ε_v = 0.5, V_old = 0 everywhere; the 4th column is padding (ignored).
  #   token 0: V = 1, R = 0.5: (V-R)^2 = 0.25, clip(V) = 0.5 -> 0;     ½ max = 0.125
  #   token 1: V = 0, R = 1:   (V-R)^2 = 1,    clip(V) = 0   -> 1;     ½ max = 0.5
  #   token 2: V = 1, R = 2:   (V-R)^2 = 1,    clip(V) = 0.5 -> 2.25;  ½ max = 1.125 (clipped)
  # clip_frac = 1/3. Gradient dℓ/dV: V - R = 0.5, -1 (both branches agree), 0 (the clipped
  # branch is flat in V). explained_var = 1 - Var(R - V) / Var(R): R - V = [-0.5, 1, 1] has
  # variance 0.5, R = [0.5, 1, 2] has 7/18, so 1 - 9/7 = -2/7.
  v = jnp.array([[1.0, 0.0, 1.0, 5.0]])
  old, ret = jnp.zeros((1, 4)), jnp.array([[0.5, 1.0, 2.0, 9.0]])
  mask = jnp.array([[1, 1, 1, 0]])
  fn = lambda v: losses.value_loss(v, old, ret, mask, clip=0.5)
  fn = jax.jit(fn) if jit else fn
  loss, metrics = fn(v)
  np.testing.assert_allclose(loss, [[0.125, 0.5, 1.125, 0.0]], rtol=1e-6)
  np.testing.assert_allclose(metrics['value/clip_frac'], 1 / 3, rtol=1e-6)
  np.testing.assert_allclose(metrics['value/explained_var'], -2 / 7, rtol=1e-5)
  grad = jax.grad(lambda v: jnp.sum(fn(v)[0]))(v)
  np.testing.assert_allclose(grad, [[0.5, -1.0, 0.0, 0.0]], atol=1e-7)
  # Without clipping: ½ (V - R)^2 = [0.125, 0.5, 0.5].
  plain, _ = losses.value_loss(v, old, ret, mask, clip=None)
  np.testing.assert_allclose(plain, [[0.125, 0.5, 0.5, 0.0]], rtol=1e-6)
