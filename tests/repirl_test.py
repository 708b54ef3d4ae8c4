"""rePIRL: the IRL objectives by hand (objectives/irl.py), the tabular MDP check
(dynamics/tabular_irl.py) and the per-token PRM on the transformer (methods/repirl.py)."""

import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rlreason.dynamics import tabular_irl
from rlreason.objectives import irl


@pytest.mark.parametrize('use_jit', [False, True])
def test_log_partition_and_weights_by_hand(use_jit):
  # R = (0, log 2), q = (1/2, 1/2): Ẑ = (1/2)(e^0 / .5 + 2 / .5) = 3; w̃ ∝ (2, 4) = (1/3, 2/3).
  r = jnp.array([[0.0, np.log(2.0)]])
  log_q = jnp.log(jnp.array([[0.5, 0.5]]))
  f = jax.jit(irl.log_partition) if use_jit else irl.log_partition
  np.testing.assert_allclose(f(r, log_q), [np.log(3.0)], rtol=1e-6)
  np.testing.assert_allclose(irl.importance_weights(r, log_q), [[1 / 3, 2 / 3]], rtol=1e-6)
  # Dropping the second sample: Ẑ = e^0 / .5 = 2 over M = 1.
  np.testing.assert_allclose(irl.log_partition(r, log_q, jnp.array([[True, False]])),
                             [np.log(2.0)], rtol=1e-6)


def test_prm_loss_value_and_gradient_by_hand():
  # Expert return 1: loss = log 3 - 1. d loss / d R_sample = w̃ = (1/3, 2/3); d / d R_expert = -1.
  r = jnp.array([[0.0, np.log(2.0)]])
  log_q = jnp.log(jnp.array([[0.5, 0.5]]))
  loss, metrics = irl.prm_loss(jnp.array([[1.0]]), r, log_q)
  np.testing.assert_allclose(loss, np.log(3.0) - 1.0, rtol=1e-6)
  np.testing.assert_allclose(metrics['irl/ess'], (1 / (1 / 9 + 4 / 9)) / 2, rtol=1e-6)  # 0.9
  g_e, g_s, g_q = jax.grad(lambda e, s, q: irl.prm_loss(e, s, q)[0], argnums=(0, 1, 2))(
      jnp.array([[1.0]]), r, log_q)
  np.testing.assert_allclose(g_e, [[-1.0]])
  np.testing.assert_allclose(g_s, [[1 / 3, 2 / 3]], rtol=1e-6)
  np.testing.assert_allclose(g_q, 0.0)  # The proposal is held fixed.


def test_mixture_proposal_and_demo_counts_by_hand():
  # G = 2 policy samples, E = 1 demo. Sample 0 equals the demo (its padding differs, ignored),
  # sample 1 does not; the demo itself is pooled as sample 2.
  tokens = jnp.array([[[5, 6, 0], [5, 7, 0], [5, 6, 9]]])
  mask = jnp.array([[[1, 1, 0], [1, 1, 0], [1, 1, 0]]], bool)
  counts = irl.demo_counts(tokens, mask, jnp.array([[[5, 6, 3]]]), jnp.array([[[1, 1, 0]]], bool))
  np.testing.assert_array_equal(counts, [[1, 0, 1]])
  # π = (.25, .5, .25): q = (2 π + count) / 3 = (.5, 1/3, .5).
  log_q = irl.mixture_log_proposal(jnp.log(jnp.array([[0.25, 0.5, 0.25]])), counts, num_policy=2,
                                   num_expert=1)
  np.testing.assert_allclose(jnp.exp(log_q), [[0.5, 1 / 3, 0.5]], rtol=1e-6)
  # A different length is a different sequence.
  short = irl.demo_counts(tokens[:, :1], jnp.array([[[1, 0, 0]]], bool),
                          jnp.array([[[5, 6, 3]]]), jnp.array([[[1, 1, 0]]], bool))
  np.testing.assert_array_equal(short, [[0]])


def test_importance_sampled_partition_is_unbiased_on_an_enumerable_mdp():
  # 3 actions, 3 steps, a fixed non-uniform policy: E_q[Ẑ] = Z = Σ_τ exp R(τ), 27 sequences.
  rng = np.random.default_rng(0)
  r_HxA = rng.normal(size=(3, 3)).astype(np.float32)
  logits_HxA = rng.normal(size=(3, 3)).astype(np.float32)
  seqs = np.array(list(itertools.product(range(3), repeat=3)))
  true_z = np.exp(r_HxA[np.arange(3), seqs].sum(-1)).sum()
  lp_HxA = jax.nn.log_softmax(jnp.asarray(logits_HxA))
  a_RxMxH = jax.random.categorical(jax.random.key(1), lp_HxA, shape=(4000, 8, 3))
  rewards = jnp.asarray(r_HxA)[jnp.arange(3), a_RxMxH].sum(-1)
  log_pi = lp_HxA[jnp.arange(3), a_RxMxH].sum(-1)
  z_hat = jnp.exp(irl.log_partition(rewards, log_pi))  # 4000 independent estimates, M = 8.
  np.testing.assert_allclose(float(z_hat.mean()), true_z, rtol=0.05)
  assert float(jnp.exp(jnp.mean(jnp.log(z_hat)))) < true_z  # log Ẑ is biased low (Jensen).


def test_maxent_advantages_by_hand():
  # Group of 2, L = 2, α = 1. Row 0: r = (1, 2), log π = (-1, -1) -> soft (2, 3), Q = (5, 3).
  # Row 1: r = (0, _), log π = (-2, _), mask (1, 0) -> soft (2, 0), Q = (2, 0).
  # Leave-one-out: row 0's baselines (2, none -> 0), row 1's (5, -): A = (3, 3), (-3, 0).
  adv = irl.maxent_advantages(jnp.array([[1.0, 2.0], [0.0, 9.0]]),
                              jnp.array([[-1.0, -1.0], [-2.0, -5.0]]),
                              jnp.array([[1, 1], [1, 0]]), group_size=2, alpha=1.0)
  np.testing.assert_allclose(adv, [[3.0, 3.0], [-3.0, 0.0]])
  # α = 0 is plain REINFORCE on rewards-to-go: Q = (3, 2), (0, 0): A = (3, 2), (-3, 0).
  adv0 = irl.maxent_advantages(jnp.array([[1.0, 2.0], [0.0, 9.0]]), jnp.zeros((2, 2)),
                               jnp.array([[1, 1], [1, 0]]), group_size=2, alpha=0.0)
  np.testing.assert_allclose(adv0, [[3.0, 2.0], [-3.0, 0.0]])
  # The policy loss: -Σ A log π / Σ mask = -(3·-1 + 3·-1 + -3·-2) / 3 = 0.
  loss, _ = irl.maxent_policy_loss(jnp.array([[-1.0, -1.0], [-2.0, -5.0]]), adv,
                                   jnp.array([[1, 1], [1, 0]]))
  np.testing.assert_allclose(loss, 0.0, atol=1e-6)


def test_expert_is_optimal_by_enumeration():
  mdp = tabular_irl.random_mdp(3, states=3, actions=3, horizon=3)
  best, best_r = None, -np.inf
  for seq in itertools.product(range(3), repeat=3):
    s, total = 0, 0.0
    for a in seq:
      total += mdp.reward_SxA[s, a]
      s = mdp.next_SxA[s, a]
    if total > best_r + 1e-9:
      best, best_r = seq, total
  np.testing.assert_array_equal(tabular_irl.expert_actions(mdp), best)


@pytest.mark.parametrize('seed', [0, 1])
def test_tabular_repirl_ranks_the_experts_actions_first(seed):
  """Known reward, expert = optimal policy; rePIRL sees only the expert's trajectories."""
  mdp = tabular_irl.random_mdp(seed, states=4, actions=3, horizon=4)
  expert = tabular_irl.expert_actions(mdp)
  params, m = tabular_irl.run(mdp, expert, seed, iterations=120)
  # At every state the expert visits, r_φ puts the expert's action strictly first.
  states = np.asarray(tabular_irl.states_of(mdp.next_SxA, jnp.asarray(expert)[None]))[0]
  for t, (s, a) in enumerate(zip(states, expert)):
    row = params['prm'][t, s]
    assert np.argmax(row) == a and np.sum(row == row.max()) == 1, (t, s, row)
  assert m['prm_ranks_expert_first'][-1] == 1.0
  # The max-ent policy trained on r_φ alone imitates the expert, and its true return is optimal.
  assert m['expert_prob'][0] < 0.05 and m['expert_prob'][-1] > 0.8
  optimal = sum(mdp.reward_SxA[s, a] for s, a in zip(states, expert))
  assert m['true_return'][-10:].mean() > optimal - 0.5 * abs(optimal) - 0.2


def test_lm_prm_reads_every_position_and_the_last_equals_the_reward_model():
  from rlreason.model import transformer
  from rlreason.methods import repirl
  from rlreason.methods import reward_model
  cfg = transformer.ModelConfig(vocab_size=16, hidden_size=32, intermediate_size=64,
                                num_layers=1, num_heads=2, num_kv_heads=1, head_dim=16)
  params = transformer.init_params(cfg, jax.random.key(0))
  head = {'kernel': jax.random.normal(jax.random.key(1), (32, 1)), 'bias': jnp.zeros((1,))}
  tokens, mask, response = repirl.rows([[3, 4], [5]], [[6, 7, 8], [9]], length=6, pad_id=0)
  np.testing.assert_array_equal(response, [[0, 0, 1, 1, 1, 0], [0, 1, 0, 0, 0, 0]])
  rewards = jax.jit(lambda *a: repirl.token_rewards(*a, cfg=cfg))  # jit: fewer dispatches.
  r = rewards(params, head, jnp.asarray(tokens), jnp.asarray(mask))
  last = jax.jit(lambda *a: reward_model.sequence_scores(*a, cfg=cfg))(
      params, head, jnp.asarray(tokens), jnp.asarray(mask))
  np.testing.assert_allclose(r[[0, 1], [4, 1]], last, rtol=1e-5, atol=1e-6)
  # Causal: a position's reward does not see later tokens.
  changed = tokens.copy()
  changed[0, 4] = 2
  r2 = rewards(params, head, jnp.asarray(changed), jnp.asarray(mask))
  np.testing.assert_allclose(r2[0, :4], r[0, :4], rtol=1e-5, atol=1e-6)
  assert abs(float(r2[0, 4] - r[0, 4])) > 1e-6
  # log π(tokens[t] | tokens[<t]) from the full logits, by hand.
  lp = jax.jit(lambda *a: repirl.token_logprobs(*a, cfg=cfg))(params, jnp.asarray(tokens),
                                                               jnp.asarray(mask))
  logits = jax.jit(lambda p, t, m: transformer.apply(p, t, cfg=cfg, mask_NxT=m)[0])(
      params, jnp.asarray(tokens), jnp.asarray(mask))
  want = jax.nn.log_softmax(logits[0, 2].astype(jnp.float32))[tokens[0, 3]]
  np.testing.assert_allclose(lp[0, 3], want, rtol=1e-5)
  assert float(lp[0, 0]) == 0.0


def test_repirl_config_checks_name_the_field():
  from rlreason import config as config_lib
  c = config_lib.default()
  c.repirl.enabled = True
  c.rl.temperature = 0.7
  c.repirl.expert_per_prompt = 0
  with pytest.raises(ValueError, match=r'repirl.expert_per_prompt=0[\s\S]*rl.temperature=0.7'):
    config_lib.validate(c, num_devices=1)
