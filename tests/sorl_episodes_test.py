"""SORL on episodes: turn ratios by hand, the one-turn invariance, the normaliser, a real step."""

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from experiments import sorl as sorl_config
from rlreason import config as config_lib
from rlreason.objectives import aggregation
from rlreason.objectives import losses
from rlreason.objectives import token_advantages
from rlreason.rl import run_setup
from rlreason.rl import train
from rlreason.rl import update
from rlreason.rl.rl_batch import advantages_for, make_train_batch

# Row 0, two turns and an observation between them; A = -1, ε = 0.2, lp = 0 everywhere, so
# lp − lp_old = -old:
#   turn 0 (tokens 0, 1): log ratios [0.1, -0.4]; observation (token 2, mask 0): 3.0, in no
#   ratio; turn 1 (tokens 3, 4): [-0.5, -0.3]; token 5 padding.
# Row 1, one turn (tokens 0, 1), A = +1: [0.3, 0.1]; the rest padding.
_OLD = -np.array([[0.1, -0.4, 3.0, -0.5, -0.3, 0.0], [0.3, 0.1, 0.0, 0.0, 0.0, 0.0]])
_MASK = np.array([[1, 1, 0, 1, 1, 0], [1, 1, 0, 0, 0, 0]], np.float32)
_TURNS = np.array([[0, 0, 0, 1, 1, 0], [0, 0, 0, 0, 0, 0]], np.int32)
_ADV = np.array([-1.0, 1.0])


def _sorl(lp, **kw):
  return losses.sorl(lp, jnp.asarray(_OLD), jnp.asarray(_ADV), jnp.asarray(_MASK),
                     turn_ids_NxL=jnp.asarray(_TURNS), num_turns=2, **kw)


def test_turn_ratio_two_turn_hand_case():
  # geometric: ρ00 = e^{(0.1 − 0.4)/2} = e^{−0.15} = 0.860708 ≥ 0.8: unclipped, ℓ = −A ρ =
  #   0.860708 on both tokens, ∂ℓ/∂lp = −A ρ = 0.860708 each; ρ01 = e^{−0.4} = 0.670320 < 0.8
  #   with A < 0: clipped, ℓ = −(0.8·−1) = 0.8, no gradient. Row 1: ρ = e^{0.2} = 1.221403 >
  #   1.2 with A > 0: clipped, ℓ = −1.2. ω0 = 1 − 2/4 = 0.5, ω1 = 1 − 2/2 = 0.
  # exact: ρ00 = e^{−0.3} = 0.740818 and ρ01 = e^{−0.8} = 0.449329, both clipped (ℓ = 0.8).
  # token (S-PPO): r = e^{0.1} = 1.105171 (A < 0, r > 1 stays unclipped: ℓ = 1.105171),
  #   e^{−0.4}, e^{−0.5} = 0.606531, e^{−0.3} = 0.740818 all < 0.8: ℓ = 0.8; ω0 = 1 − 3/4.
  # Jitted here; losses_test runs sorl's hand case eagerly too.
  lp = jnp.zeros((2, 6))
  run = lambda **kw: jax.jit(functools.partial(_sorl, **kw))(lp)
  loss, w, m = run()
  np.testing.assert_allclose(loss, [[0.860708, 0.860708, 0, 0.8, 0.8, 0],
                                    [-1.2, -1.2, 0, 0, 0, 0]], rtol=1e-5, atol=1e-7)
  np.testing.assert_allclose(w, [[0.5, 0.5, 0, 0.5, 0.5, 0], [0] * 6], atol=1e-7)
  np.testing.assert_allclose(m['sorl/turns_mean'], 1.5)
  np.testing.assert_allclose(m['clip_frac'], 4 / 6, rtol=1e-6)
  grad = jax.jit(jax.grad(lambda x: jnp.sum(_sorl(x)[0])))(lp)
  np.testing.assert_allclose(grad, [[0.860708, 0.860708, 0, 0, 0, 0], [0] * 6], rtol=1e-5,
                             atol=1e-7)
  np.testing.assert_allclose(run(turn_ratio='exact')[0][0], [0.8, 0.8, 0, 0.8, 0.8, 0],
                             rtol=1e-6)
  loss, w, _ = run(turn_ratio='token')
  np.testing.assert_allclose(loss[0], [1.105171, 0.8, 0, 0.8, 0.8, 0], rtol=1e-6)
  np.testing.assert_allclose(w[0], [0.25, 0.25, 0, 0.25, 0.25, 0], rtol=1e-6)
  # Clipping-triggered normalisation: Σ ω M ℓ / Σ ω M = 0.5·(2·0.860708 + 2·0.8) / (0.5·4) =
  # 0.830354; the mask's denominator would give 0.5·3.321416 / 6 = 0.276785.
  loss, w, _ = run()
  np.testing.assert_allclose(aggregation.aggregate(
      loss, w, mode='token_mean', denominator=aggregation.denominators(w, mode='token_mean')),
                             0.830354, rtol=1e-5)
  # Turn ids past num_turns on a valid token fail loudly (where the values are known).
  with pytest.raises(ValueError, match=r'turn_ids_NxL holds 2 .*num_turns=2'):
    losses.sorl(lp, _OLD, _ADV, _MASK, turn_ids_NxL=_TURNS * 2, num_turns=2)


def test_one_turn_episode_is_the_single_turn_form():
  # One turn per row (ids 0, num_turns 1): the geometric turn ratio is GSPO's sequence ratio,
  # so with nothing clipped (ω = 1: the normaliser is the token count) SORL's aggregated loss
  # and gradient are GSPO-token's with the same ε; the per-token form without normalisation
  # is PPO-clip's.
  k1, k2, k3 = jax.random.split(jax.random.key(0), 3)
  lp = -jax.random.uniform(k1, (4, 6), minval=0.1, maxval=2.0)
  old = lp + 0.05 * jax.random.normal(k2, (4, 6))
  adv = jax.random.normal(k3, (4,))
  mask = jnp.array([[1, 1, 1, 0, 0, 0], [1] * 6, [1, 0, 0, 0, 0, 0], [1, 1, 1, 1, 0, 0]],
                   jnp.float32)
  one = dict(turn_ids_NxL=jnp.zeros((4, 6), jnp.int32), num_turns=1)

  def total(fn, normalised, **kw):
    def f(x):
      loss, w, _ = fn(x, old, adv, mask, **kw)
      den = aggregation.denominators(w if normalised else mask, mode='token_mean')
      return aggregation.aggregate(loss, w, mode='token_mean', denominator=den)
    return jax.jit(jax.value_and_grad(f))(lp)

  value, grad = total(losses.sorl, True, **one)
  assert float(_sorl_weights(lp, old, adv, mask).min()) == 1.0  # nothing clipped
  ref_value, ref_grad = total(losses.gspo_token, False, eps_low=0.2, eps_high=0.2,
                              log_ratio_clip=20.0)
  np.testing.assert_allclose(value, ref_value, rtol=1e-6)
  np.testing.assert_allclose(grad, ref_grad, rtol=1e-5, atol=1e-8)
  value, grad = total(losses.sorl, False, turn_ratio='token', normalization='none', **one)
  ref_value, ref_grad = total(losses.ppo_clip, False)
  np.testing.assert_allclose(value, ref_value, rtol=1e-6)
  np.testing.assert_allclose(grad, ref_grad, rtol=1e-5, atol=1e-8)


def _sorl_weights(lp, old, adv, mask):
  return losses.sorl(lp, old, adv, mask, turn_ids_NxL=jnp.zeros(mask.shape, jnp.int32),
                     num_turns=1)[1][mask > 0]


@pytest.fixture(scope='module')
def episode_batch(tmp_path_factory):
  """SO-PPO's runlocal run (turn-level critic) and a batch of real 2-turn episodes: the
  untrained model's first turn is replaced by a calculator call (as in train_episodes_test),
  its answer turn is its own."""
  c = sorl_config.get_config('so_ppo,runlocal')
  c.rl.minibatches, c.rl.micro_batches = 1, 2  # The step's global-normaliser pre-pass.
  config_lib.validate(c, num_devices=jax.device_count())
  run = run_setup.build(c, str(tmp_path_factory.mktemp('sorl')))
  real_env = run.env

  class CallsFirst:
    format = real_env.format
    reset = real_env.reset

    def step(self, state, text):
      call = '<call>calculator: {"expression": "12*34"}</call>'
      return real_env.step(state, call if state.turns == 0 else text)

  run.env = CallsFirst()
  try:
    state = run._fresh_state()
    with jax.set_mesh(run.mesh):
      rollout, scores = train.sample_episodes(run, state.params, next(run.data_iter),
                                              jax.random.key(0), step=1, times={})
      batch, stats = make_train_batch(run, state.params, rollout,
                                      value_params=state.value_params)
      # The untrained model earns nothing and its fresh head says 0: give the critic values
      # and some episodes a reward, so the turn-level GAE has something to compute.
      n, length = batch.loss_mask_NxL.shape
      batch = batch.replace(old_values_NxL=jax.random.normal(jax.random.key(2), (n, length)))
      scores = dataclasses.replace(scores, rewards_BxG=np.tile([1.0, 0.0], (n // 2, 1)))
      adv_NxL, returns_NxL = advantages_for(run, scores, stats, batch, progress=0.0)
    yield run, state, batch.replace(advantages_NxL=adv_NxL, returns_NxL=returns_NxL)
  finally:
    run.close()


def test_turn_level_critic_on_real_episodes(episode_batch):
  # γ = λ = 1 (the config's): turn k's advantage before whitening is r − V(turn k's first
  # token) (δ_1 = r − V_1; A_0 = V_1 − V_0 + A_1 = r − V_0), and every return is r.
  _, _, batch = episode_batch
  mask, turns = np.asarray(batch.loss_mask_NxL) > 0, np.asarray(batch.turn_ids_NxL)
  adv, ret = np.asarray(batch.advantages_NxL), np.asarray(batch.returns_NxL)
  values, r_N = np.asarray(batch.old_values_NxL), np.tile([1.0, 0.0], mask.shape[0] // 2)
  starts = np.asarray(token_advantages.turn_starts(batch.loss_mask_NxL))
  expected = np.zeros(adv.shape)
  two_turns = 0
  for n in range(mask.shape[0]):
    ids = sorted(set(turns[n][mask[n]].tolist()))
    # The runs of model tokens are the episode's turns, in order.
    assert starts[n].sum() == len(ids) and ids == list(range(len(ids)))
    assert turns[n][starts[n]].tolist() == ids
    for k in ids:
      expected[n][mask[n] & (turns[n] == k)] = r_N[n] - values[n][starts[n]][k]
    two_turns += len(ids) == 2
  assert two_turns >= 1, 'no two-turn episode in the batch'
  np.testing.assert_allclose(ret[mask], np.broadcast_to(r_N[:, None], mask.shape)[mask],
                             rtol=1e-5, atol=1e-6)
  # Whitened over the batch's model tokens (unbiased variance, as gae's token form).
  white = (expected[mask] - expected[mask].mean()) / np.sqrt(expected[mask].var(ddof=1) + 1e-8)
  np.testing.assert_allclose(adv[mask], white, rtol=1e-4, atol=1e-5)


def test_train_step_normalises_by_the_global_sum_of_the_weights(episode_batch):
  # The run's own jitted step, with 2 micro-batches: the normaliser must be Σ ω M over the
  # whole minibatch at the current θ (a per-micro-batch sum would give another loss).
  run, state, batch = episode_batch
  objective = run.objective
  assert objective.policy_loss == 'sorl' and objective.num_turns == 2
  # Off-policy, as after earlier updates: π_old 0.4 lower on the first turn of rows 0-3, so
  # with A = 1 those turns clip (ratio e^0.4 > 1.2: ω < 1) and the rows 4-7 do not.
  first_NxL = (batch.turn_ids_NxL == 0) & (jnp.arange(8) < 4)[:, None]
  batch = batch.replace(old_logprobs_NxL=batch.old_logprobs_NxL - 0.4 * first_NxL,
                        advantages_NxL=jnp.where(batch.loss_mask_NxL, 1.0, 0.0))
  lp = run.logprobs(state.params, batch.tokens_NxT, batch.mask_NxT,
                    batch.loss_mask_NxL.shape[1]).logprobs_NxT
  sorl = jax.jit(functools.partial(losses.sorl, num_turns=2, **dict(objective.loss_kwargs)))
  loss, w, _ = sorl(lp, batch.old_logprobs_NxL, batch.advantages_NxL, batch.loss_mask_NxL,
                    turn_ids_NxL=batch.turn_ids_NxL)  # Jitted: one compilation, not one per op.
  tokens, den = float(batch.loss_mask_NxL.sum()), float(jnp.sum(w))
  # Rows 0-3 lose their first turns' weight, rows 4-7 keep all: the micro-batches' own sums
  # differ, so a per-micro-batch normaliser would give another loss than this.
  np.testing.assert_allclose(float(jnp.sum(w[4:])), float(batch.loss_mask_NxL[4:].sum()))
  assert 0 < float(jnp.sum(w[:4])) < float(batch.loss_mask_NxL[:4].sum())
  new, m = run.train_step(state, batch)
  np.testing.assert_allclose(m['policy_loss'], float(jnp.sum(loss * w)) / den, rtol=1e-4)
  np.testing.assert_allclose(m['policy_denominator_frac'], den / tokens, rtol=1e-5)
  assert int(new.step) == 1 and float(m['sorl/turns_mean']) > 1.0


def test_config_errors_name_the_sorl_fields():
  c = sorl_config.get_config('runlocal')
  c.objective.aggregation = 'seq_mean_token_mean'
  c.objective.loss_kwargs = dict(c.objective.loss_kwargs, turn_ratio='arithmetic')
  with pytest.raises(ValueError, match=r"(?s)loss_kwargs.turn_ratio='arithmetic'.*"
                                       r"needs objective.aggregation='token_mean'"):
    config_lib.validate(c, num_devices=jax.device_count())
  with pytest.raises(ValueError, match='unknown argument'):
    sorl_config.get_config('so-ppo')
