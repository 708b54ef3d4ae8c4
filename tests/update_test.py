"""The learner's pure steps: micro-batch invariance, non-finite skips, log-prob alignment."""

import chex
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from rlreason.model import transformer
from rlreason.objectives import advantages
from rlreason.rl import update
from rlreason.structs import TrainBatch

CFG = transformer.ModelConfig(vocab_size=40, hidden_size=32, intermediate_size=64, num_layers=2,
                        num_heads=4, num_kv_heads=2, head_dim=8)
B, G, P, L = 4, 2, 5, 6
OPT = optax.chain(optax.clip_by_global_norm(1.0), optax.adam(1e-2))


def _batch(params, seed=0, objective_temperature=1.0):
  k1, k2, k3 = jax.random.split(jax.random.key(seed), 3)
  n = B * G
  tokens = jax.random.randint(k1, (n, P + L), 1, CFG.vocab_size)
  lengths = jax.random.randint(k2, (n,), 1, L + 1)
  loss_mask = jnp.arange(L)[None] < lengths[:, None]
  mask = jnp.concatenate([jnp.ones((n, P), bool), loss_mask], 1)
  old = update.logprobs_step(params, tokens, mask, cfg=CFG, completion_len=L,
                             temperature=objective_temperature).logprobs_NxT
  # Pretend the sampler's policy differed a little, so ratios are not all 1.
  old = old + 0.1 * jax.random.normal(k3, old.shape)
  adv = jnp.repeat(jax.random.normal(k3, (n,)), 1)[:, None] * jnp.ones((n, L))
  return TrainBatch(tokens_NxT=tokens, mask_NxT=mask, loss_mask_NxL=loss_mask,
                    advantages_NxL=adv, old_logprobs_NxL=old, ref_logprobs_NxL=old,
                    behaviour_logprobs_NxL=old, prefix_mask_NxL=jnp.zeros((n, L), bool))


@pytest.fixture(scope='module')
def state():
  return update.init_state(transformer.init_params(CFG, jax.random.key(0)), OPT)


@pytest.mark.parametrize('aggregation', ['token_mean', 'seq_mean_token_mean',
                                         'constant_normalizer'])
def test_micro_batch_split_does_not_change_the_update(state, aggregation):
  # Plain SGD: Adam's first step is ~sign(g), which turns fp32 rounding of near-zero
  # gradient entries into lr-sized differences and would hide what is being compared.
  objective = update.Objective(policy_loss='ppo_clip', aggregation=aggregation, max_len=L,
                               kl_coef=0.05, group_size=G)
  sgd = optax.sgd(0.1)
  state = update.init_state(state.params, sgd)
  batch = _batch(state.params)
  results = []
  for micro in (1, 2, 4):
    step = jax.jit(lambda s, b, m=micro: update.train_step(
        s, b, cfg=CFG, objective=objective, optimizer=sgd, micro_batches=m))
    results.append(step(state, batch))
  for new_state, metrics in results[1:]:
    np.testing.assert_allclose(metrics['loss'], results[0][1]['loss'], rtol=1e-5, atol=1e-7)
    np.testing.assert_allclose(metrics['grad_norm'], results[0][1]['grad_norm'], rtol=1e-5)
    chex.assert_trees_all_close(new_state.params, results[0][0].params, atol=1e-7, rtol=1e-6)
  assert int(results[0][0].step) == 1


def test_train_step_with_and_without_jit_agree(state):
  objective = update.Objective(group_size=G)
  batch = _batch(state.params, seed=1)
  eager, m1 = update.train_step(state, batch, cfg=CFG, objective=objective, optimizer=OPT)
  jitted, m2 = jax.jit(lambda s, b: update.train_step(
      s, b, cfg=CFG, objective=objective, optimizer=OPT))(state, batch)
  np.testing.assert_allclose(m1['loss'], m2['loss'], rtol=1e-5)
  chex.assert_trees_all_close(eager.params, jitted.params, atol=1e-6)


def test_non_finite_loss_skips_the_update_and_counts_it(state):
  batch = _batch(state.params, seed=2)
  batch = batch.replace(advantages_NxL=batch.advantages_NxL.at[0, 0].set(jnp.nan))
  new, metrics = update.train_step(state, batch, cfg=CFG, objective=update.Objective(),
                                   optimizer=OPT)
  assert int(new.skipped) == 1 and int(new.step) == 0 and metrics['skipped_nonfinite'] == 1
  chex.assert_trees_all_equal(new.params, state.params)
  chex.assert_trees_all_equal(new.opt_state, state.opt_state)


def test_completion_logprobs_align_with_a_full_forward(state):
  batch = _batch(state.params, seed=3)
  stats = update.logprobs_step(state.params, batch.tokens_NxT, batch.mask_NxT, cfg=CFG,
                               completion_len=L, temperature=0.7)
  logits = transformer.apply(state.params, batch.tokens_NxT, cfg=CFG, mask_NxT=batch.mask_NxT)[0]
  logp = jax.nn.log_softmax(logits / 0.7, -1)
  # Completion token l (column P + l) is predicted at position P + l - 1.
  want = jnp.take_along_axis(logp[:, P - 1:-1], batch.tokens_NxT[:, P:, None], -1)[..., 0]
  np.testing.assert_allclose(stats.logprobs_NxT, want, atol=1e-5)


def test_ratio_one_gradient_is_reinforce(state):
  # At old = current log-probs, PPO-clip's gradient equals that of -A * logprob (token mean).
  batch = _batch(state.params, seed=4)
  fresh = update.logprobs_step(state.params, batch.tokens_NxT, batch.mask_NxT, cfg=CFG,
                               completion_len=L).logprobs_NxT
  batch = batch.replace(old_logprobs_NxL=fresh)
  objective = update.Objective()
  den = batch.loss_mask_NxL.sum()
  # Jitted: eager, every primitive of the forward and backward compiles on its own.
  g_ppo = jax.jit(jax.grad(
      lambda p: update.loss_fn(p, batch, den, cfg=CFG, objective=objective)[0]))(state.params)

  def reinforce(p):
    lp = update.completion_stats(p, batch.tokens_NxT, batch.mask_NxT, cfg=CFG,
                                 completion_len=L).logprobs_NxT
    return -jnp.sum(jnp.where(batch.loss_mask_NxL, batch.advantages_NxL * lp, 0)) / den

  chex.assert_trees_all_close(g_ppo, jax.jit(jax.grad(reinforce))(state.params), atol=1e-6)


def test_unknown_objective_names_list_the_known_ones():
  with pytest.raises(KeyError, match='ppo_clip'):
    update.Objective(policy_loss='ppo')
  with pytest.raises((KeyError, ValueError), match='token_mean'):
    update.Objective(aggregation='mean')


def test_sft_step_lowers_the_loss_on_its_batch(state):
  tokens = jax.random.randint(jax.random.key(5), (8, 10), 1, CFG.vocab_size)
  loss_mask = jnp.arange(10)[None] >= 4
  s, first = state, None
  step = jax.jit(lambda s: update.sft_step(s, tokens, jnp.broadcast_to(loss_mask, (8, 10)),
                                           cfg=CFG, optimizer=OPT, micro_batches=2))
  for _ in range(20):
    s, m = step(s)
    first = m['loss'] if first is None else first
  assert m['loss'] < 0.7 * first


def _critic_batch(params, head):
  # Two groups of G = 2, outcome rewards [1, 0 | 0, 1], completion lengths 3, 2, 1, 4.
  batch = _batch(params)
  n = B * G
  lengths = jnp.array([3, 2, 1, 4, 2, 2, 1, 1])
  loss_mask = jnp.arange(L)[None] < lengths[:, None]
  batch = batch.replace(loss_mask_NxL=loss_mask,
                        mask_NxT=jnp.concatenate([jnp.ones((n, P), bool), loss_mask], 1))
  rewards_N = jnp.array([1.0, 0.0, 0.0, 1.0, 1.0, 1.0, 0.0, 0.0])
  values = update.values_step(params, head, batch.tokens_NxT, batch.mask_NxT, cfg=CFG,
                              completion_len=L)
  token_rewards = advantages.outcome_token_rewards(rewards_N, loss_mask)
  adv, returns = advantages.gae(token_rewards, values, loss_mask, whiten=False)
  return batch.replace(advantages_NxL=adv, old_values_NxL=values, returns_NxL=returns), values


@pytest.mark.parametrize('jit', [False, True])
def test_gae_with_a_value_head_hand_case(state, jit):
  # A head with kernel 0 and bias 0.25 predicts V = 0.25 on every token. GAE with γ = λ = 1:
  # A_t = R - V_t = 0.75 on rows with reward 1, -0.25 on rows with 0; returns R_t = A_t + V_t
  # = the outcome. Value loss (token_mean over the 16 valid tokens; V = V_old, so no clip):
  # rows with R = 1 have 3 + 4 + 2 + 2 = 11 tokens of ½ 0.75² = 0.28125, rows with R = 0 have
  # 2 + 1 + 1 + 1 = 5 tokens of ½ 0.25² = 0.03125: (11·0.28125 + 5·0.03125) / 16 = 0.203125.
  # dℓ/db = mean(V - R) = (11·(-0.75) + 5·0.25) / 16 = -0.4375, so SGD(lr 1) on the head
  # moves the bias to 0.25 + 0.4375 = 0.6875. Explained variance: R - V is R shifted, so 0.
  head = {'kernel': jnp.zeros((CFG.hidden_size, 1)), 'bias': jnp.full((1,), 0.25)}
  batch, values = _critic_batch(state.params, head)
  mask = batch.loss_mask_NxL
  np.testing.assert_allclose(values[mask], 0.25)
  jitted = jax.jit(lambda p, h, t, m: update.values_step(p, h, t, m, cfg=CFG, completion_len=L))
  np.testing.assert_allclose(jitted(state.params, head, batch.tokens_NxT, batch.mask_NxT),
                             values, rtol=1e-6)
  reward_N = jnp.array([1.0, 0.0, 0.0, 1.0, 1.0, 1.0, 0.0, 0.0])
  np.testing.assert_allclose(batch.advantages_NxL, jnp.where(mask, reward_N[:, None] - 0.25, 0.0),
                             rtol=1e-6)
  np.testing.assert_allclose(batch.returns_NxL, jnp.where(mask, reward_N[:, None], 0.0),
                             rtol=1e-6)
  objective = update.Objective(policy_loss='ppo_clip', group_size=G, value_coef=1.0,
                               value_clip=0.5)
  sgd, value_sgd = optax.sgd(0.0), optax.sgd(1.0)
  start = update.init_state(state.params, sgd, value_params=head, value_optimizer=value_sgd)
  step = lambda s, b: update.train_step(s, b, cfg=CFG, objective=objective, optimizer=sgd,
                                        value_optimizer=value_sgd)
  new, metrics = (jax.jit(step) if jit else step)(start, batch)
  np.testing.assert_allclose(metrics['value/loss'], 0.203125, rtol=1e-6)
  np.testing.assert_allclose(metrics['loss'], metrics['policy_loss'] + 0.203125, rtol=1e-6)
  np.testing.assert_allclose(metrics['value/clip_frac'], 0.0)
  np.testing.assert_allclose(metrics['value/explained_var'], 0.0, atol=1e-6)
  np.testing.assert_allclose(new.value_params['bias'], [0.6875], rtol=1e-6)
  assert np.abs(np.asarray(new.value_params['kernel'])).max() > 0
  # The policy's lr is 0 here: only the head moved.
  chex.assert_trees_all_equal(new.params, state.params)


def test_critic_update_does_not_depend_on_the_micro_batch_split(state):
  head = {'kernel': 0.1 * jax.random.normal(jax.random.key(5), (CFG.hidden_size, 1)),
          'bias': jnp.zeros((1,))}
  batch, _ = _critic_batch(state.params, head)
  objective = update.Objective(policy_loss='ppo_clip', group_size=G, value_coef=0.5)
  sgd = optax.sgd(0.1)
  start = update.init_state(state.params, sgd, value_params=head, value_optimizer=sgd)
  out = [jax.jit(lambda s, b, m=m: update.train_step(
      s, b, cfg=CFG, objective=objective, optimizer=sgd, micro_batches=m,
      value_optimizer=sgd))(start, batch) for m in (1, 2)]
  np.testing.assert_allclose(out[1][1]['value/loss'], out[0][1]['value/loss'], rtol=1e-5)
  chex.assert_trees_all_close(out[1][0].value_params, out[0][0].value_params, atol=1e-7,
                              rtol=1e-6)
  chex.assert_trees_all_close(out[1][0].params, out[0][0].params, atol=1e-7, rtol=1e-6)
