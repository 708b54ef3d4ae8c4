"""Toy-loop helpers: exact pass@k, hand-derived bandit updates, Monte-Carlo tail miss, staleness.

The one-step checks use the softmax-bandit identity ∂ log π(a)/∂z = e_a − π: one SGD step of
size η on the token-mean loss −(1/N) Σ_i A_i log π(a_i) at r = 1 moves the logits by
Δz = (η/N) Σ_i A_i (e_{a_i} − π), so an unsampled answer j moves by −(η/N) π_j Σ_i A_i.
"""


import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from rlreason.dynamics import bandit as dyn
from rlreason.objectives import advantage_transforms as tr
from rlreason.objectives import advantages as adv
from rlreason.objectives import losses

PROBS_3 = np.array([0.4, 0.35, 0.25])  # answer 0 correct, 1 and 2 wrong.
CORRECT_3 = np.array([[[1.0, 0.0, 0.0]]], np.float32)


def _first_mixed_key(logits_BxLxV, *, group_size):
  """The first seed whose first group (keys split as make_train does) has both outcomes and
  leaves a wrong answer unsampled, so that every branch of the hand derivation is exercised."""
  for seed in range(100):
    key = jax.random.split(jax.random.key(seed), 1)[0]
    tokens_G = np.asarray(dyn.sample_answers(key, logits_BxLxV, group_size=group_size))[:, 0]
    correct_G = tokens_G == 0
    if 0 < correct_G.sum() < group_size and len(set(tokens_G)) < 3:
      return seed, tokens_G, correct_G.astype(np.float64)
  raise AssertionError('no suitable group in 100 seeds')


def test_exact_pass_at_k_hand_case():
  logits = dyn.bandit_logits(probs_BxLxV=np.array([[[0.2, 0.3, 0.5]]]))
  correct = np.array([[[1.0, 0.0, 0.0]]], np.float32)
  p_B = dyn.success_probability(logits, correct)
  np.testing.assert_allclose(p_B, [0.2], rtol=1e-6)
  # 1 - 0.8^k: k = 1 -> 0.2, 2 -> 0.36, 5 -> 1 - 0.32768 = 0.67232.
  np.testing.assert_allclose(dyn.pass_at_k_exact(p_B, ks=[1, 2, 5]), [[0.2, 0.36, 0.67232]],
                             rtol=1e-5)


def test_exact_metrics_hand_case():
  logits = dyn.bandit_logits(probs_BxLxV=np.array([[[0.5, 0.5]], [[1.0, 0.0]]]))
  # Entropy log 2 and 0; KL([.5, .5] || [.5, .5]) = 0, KL([1, 0] || [.5, .5]) = log 2.
  entropy, kl = jax.jit(lambda z: (dyn.entropy(z), dyn.kl_divergence(z, jnp.zeros_like(z))))(
      logits)
  np.testing.assert_allclose(entropy, [[np.log(2)], [0.0]], atol=1e-6)
  np.testing.assert_allclose(kl, [0.0, np.log(2)], atol=1e-6)
  # Two positions: reward = fraction correct, 0.5 * (0.5 + 1.0) = 0.75.
  two_pos = dyn.bandit_logits(probs_BxLxV=np.array([[[0.5, 0.5], [0.0, 1.0]]]))
  np.testing.assert_allclose(dyn.success_probability(two_pos, np.array([[[1, 0], [0, 1]]])),
                             [0.75], atol=1e-6)
  tokens = jnp.array([[0, 1], [1, 0]])
  np.testing.assert_allclose(dyn.answer_rewards(np.array([[[1, 0], [0, 1]]]), tokens,
                                                group_size=2), [[1.0, 0.0]])


# The loop is always a lax.scan (traced even without an outer jit), so `use_jit=False` checks
# that make_train's function also runs un-jitted; one transform is enough for that.
@pytest.mark.parametrize('transform,use_jit', [('grpo', False), ('a_grae', True)])
def test_one_step_matches_hand_derivation(transform, use_jit):
  g, lr = 4, 0.5
  logits = dyn.bandit_logits(probs_BxLxV=PROBS_3[None, None])
  seed, tokens_G, rewards_G = _first_mixed_key(logits, group_size=g)
  if transform == 'grpo':
    advantage_fn = adv.grpo
  else:
    advantage_fn = lambda r: tr.a_grae(adv.grpo(r), r)  # noqa: E731
  train = dyn.make_train(correct_BxLxV=CORRECT_3, init_params=logits, advantage_fn=advantage_fn,
                         loss_fn=losses.ppo_clip, optimizer=optax.sgd(lr), group_size=g,
                         num_iterations=1)
  state, metrics = (jax.jit(train) if use_jit else train)(jax.random.key(seed))
  # GRPO by hand (unbiased std); A-GRAE with one prompt: mu_bar = mu, sqrt(mu) = s,
  # A = ((1 - mu)/(1 - s) + mu/s) A_hat / 2, positives times min(1, mu).
  mu = rewards_G.mean()
  a_G = (rewards_G - mu) / (rewards_G.std(ddof=1) + 1e-6)
  if transform == 'a_grae':
    s = np.sqrt(mu)
    a_G = 0.5 * a_G * ((1 - mu) / (1 - s + 1e-6) + mu / (s + 1e-6))
    a_G = np.where(a_G > 0, a_G * min(1.0, mu), a_G)
  onehot_GxV = np.eye(3)[tokens_G]
  delta_V = lr / g * np.sum(a_G[:, None] * (onehot_GxV - PROBS_3), 0)
  np.testing.assert_allclose(state.params[0, 0] - logits[0, 0], delta_V, atol=1e-5)
  assert delta_V[0] > 0  # the correct answer goes up.
  if transform == 'grpo':  # symmetric advantages sum to 0: unsampled logits stay put.
    assert abs(a_G.sum()) < 1e-5
  else:  # suppressed positives: Σ A < 0, every unsampled logit rises by (η/N) π_j |Σ A|.
    assert a_G.sum() < -1e-3
  unsampled = np.setdiff1d(np.arange(3), tokens_G)
  if unsampled.size:
    np.testing.assert_allclose(delta_V[unsampled], -lr / g * PROBS_3[unsampled] * a_G.sum(),
                               atol=1e-6)
    np.testing.assert_allclose(metrics['unsampled_correct_logit_delta'][0], 0.0)  # 0 is sampled.
  np.testing.assert_allclose(metrics['reward'][0], mu, rtol=1e-6)


def test_tail_miss_monte_carlo_within_binomial_ci():
  group_sizes, mu, tau, m = (1, 2, 4, 8, 16, 32), 0.6, 0.05, 20000
  freq_J = np.asarray(dyn.tail_miss_monte_carlo(jax.random.key(0), group_sizes=group_sizes,
                                                mu=mu, tau=tau, num_groups=m))
  exact_J = np.asarray(tr.tail_miss_probability(np.array(group_sizes), mu=mu, tau=tau))
  # algorithms.md §11: 0, 0.44, 0.70, 0.65, 0.44, 0.19 for N = 1, 2, 4, 8, 16, 32.
  np.testing.assert_allclose(exact_J, [0, 0.44, 0.70, 0.65, 0.44, 0.19], atol=0.006)
  sigma_J = np.sqrt(exact_J * (1 - exact_J) / m)
  assert freq_J[0] == 0.0
  assert np.all(np.abs(freq_J - exact_J) <= 4 * sigma_J + 1e-9), (freq_J, exact_J)
  with pytest.raises(ValueError, match='tau <= mu'):
    dyn.tail_miss_monte_carlo(jax.random.key(0), group_sizes=(2,), mu=0.1, tau=0.2,
                              num_groups=10)


def test_staleness_and_shared_parameters():
  # With staleness s, iteration i samples from the policy after iteration i - s - 1 (the initial
  # one when that is negative); kl_behaviour is KL(π after i ‖ that policy), exactly.
  # The policy is logits_b = shared + own_b, so ∂L/∂shared = Σ_b ∂L/∂own_b at every SGD step
  # and, summed over the steps, Δshared = Σ_b Δown_b.
  s, iters = 2, 5
  logits, correct = dyn.difficulty_ladder(success_B=[0.3, 0.6], num_answers=5, num_correct=2)
  params = {'shared': jnp.zeros((1, 1, 5)), 'own': logits}
  train = dyn.make_train(correct_BxLxV=correct, init_params=params, advantage_fn=adv.grpo,
                         loss_fn=losses.ppo_clip, optimizer=optax.sgd(1.0), group_size=4,
                         num_iterations=iters, staleness=s, record_probs=True,
                         logits_fn=lambda p: p['shared'] + p['own'])
  state_R, metrics_RxI = dyn.run_seeds(train, seed=1, num_seeds=1)
  metrics = jax.tree.map(lambda x: x[0], metrics_RxI)
  d_own = state_R.params['own'][0] - logits
  assert float(jnp.max(jnp.abs(d_own))) > 1e-3  # the steps did something.
  np.testing.assert_allclose(state_R.params['shared'][0, 0], jnp.sum(d_own, 0), atol=1e-5)
  logits_IxBxLxV = jnp.log(metrics['probs_BxLxV'])
  for i in range(iters):
    base = logits if i - s - 1 < 0 else logits_IxBxLxV[i - s - 1]
    want = jnp.mean(dyn.kl_divergence(logits_IxBxLxV[i], base))
    np.testing.assert_allclose(metrics['kl_behaviour'][i], want, rtol=1e-4, atol=1e-7)
  assert float(metrics['kl_behaviour'][-1]) > 0


def test_run_grid_shares_seeds_across_configurations():
  logits, correct = dyn.two_answer_bandit(num_answers=6, common_mass=0.3, rare_mass=0.05)

  def train_for(gamma, key):
    fn = lambda r: tr.focal_scale(adv.grpo(r), r, gamma=gamma)  # noqa: E731
    return dyn.make_train(correct_BxLxV=correct, init_params=logits, advantage_fn=fn,
                          loss_fn=losses.ppo_clip, optimizer=optax.sgd(1.0), group_size=4,
                          num_iterations=3)(key)

  _, grid = dyn.run_grid(train_for, jnp.array([0.0, 1.0, 0.0]), seed=3, num_seeds=2)
  np.testing.assert_array_equal(grid['success_B'][0], grid['success_B'][2])  # same config.
  assert not np.allclose(grid['success_B'][0, 0], grid['success_B'][0, 1])  # different seeds.
  np.testing.assert_array_equal(grid['reward'][0, :, 0], grid['reward'][1, :, 0])  # same draws.
  assert not np.allclose(grid['success_B'][0], grid['success_B'][1])  # γ = 1 damps the step.


def test_bandit_constructors():
  logits, correct = dyn.two_answer_bandit(num_answers=5, common_mass=0.5, rare_mass=0.1)
  np.testing.assert_allclose(jax.nn.softmax(logits)[0, 0], [0.5, 0.1, 0.4 / 3, 0.4 / 3, 0.4 / 3],
                             rtol=1e-6)
  np.testing.assert_array_equal(correct[0, 0], [1, 1, 0, 0, 0])
  with pytest.raises(ValueError, match='rare_mass'):
    dyn.two_answer_bandit(num_answers=5, common_mass=0.95, rare_mass=0.1)
  logits, correct = dyn.difficulty_ladder(success_B=[0.2, 0.8], num_answers=4, num_correct=2,
                                          position_count=3)
  assert logits.shape == correct.shape == (2, 3, 4)
  np.testing.assert_allclose(dyn.success_probability(logits, correct), [0.2, 0.8], rtol=1e-6)
  with pytest.raises(ValueError, match='success_B'):
    dyn.difficulty_ladder(success_B=[0.0], num_answers=4, num_correct=2)


def test_update_share_hand_case():
  # Run 0: iteration 0 moves [1, 3] -> shares [.25, .75], iteration 1 moves nothing (skipped);
  # run 1: [.5, .5] both times. Mean over the runs that moved: [.375, .625] and [.5, .5].
  norms_RxIxB = np.array([[[1.0, 3.0], [0.0, 0.0]], [[1.0, 1.0], [2.0, 2.0]]])
  np.testing.assert_allclose(dyn.update_share(norms_RxIxB), [[0.375, 0.625], [0.5, 0.5]])
  assert np.all(np.isnan(dyn.update_share(np.zeros((2, 1, 3)))))

