"""Off-policy corrections: hand cases (ratios at the cap, masked tokens and sequences, decoupled
PPO = PPO-clip when proximal = behaviour), stop-gradients, the mismatch and staleness metrics,
the wiring into update.loss_fn, config errors, and one RL step end to end."""

import functools
import math

import chex
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from rlreason import config as config_lib
from rlreason.model import transformer
from rlreason.objectives import aggregation
from rlreason.objectives import losses
from rlreason.objectives import offpolicy
from rlreason.rl import run_setup
from rlreason.rl import train
from rlreason.rl import update
from rlreason.structs import TrainBatch
from rlreason.verifiers import pool as pool_lib

PAD = -1.0  # A ratio of PAD marks a padding token in `_from_ratios`.


def _from_ratios(ratios):
  """(proximal, behaviour, mask) whose ρ = π_prox/μ are `ratios` exactly in log space.

  log ρ = lp_prox − lp_behaviour with one side 0, so log ρ is float32(log r), the same
  rounding as the bound it is compared to. Padding holds −inf / NaN, which must not leak.
  """
  r = np.asarray(ratios, np.float64)
  valid = r != PAD
  log_r = np.where(valid, np.log(np.where(valid, r, 1.0)), 0.0).astype(np.float32)
  prox = np.where(valid, np.where(log_r < 0, log_r, 0.0), -np.inf).astype(np.float32)
  behaviour = np.where(valid, np.where(log_r > 0, -log_r, 0.0), np.nan).astype(np.float32)
  return jnp.asarray(prox), jnp.asarray(behaviour), jnp.asarray(valid, jnp.float32)


def _inputs(ratios):
  """(learner, proximal, behaviour, mask) for `ratios`; the learner's enter metrics only."""
  prox, behaviour, mask = _from_ratios(ratios)
  return jnp.zeros(mask.shape), prox, behaviour, mask


class CorrectionTest(chex.TestCase):

  @chex.variants(with_jit=True, without_jit=True)
  def test_tis_token_truncates_at_the_cap(self):
    # C = 2, ρ = [0.5, 1, 2, 4 | pad]: w = [0.5, 1, 2, 2, 0]; only ρ = 4 is capped (ρ = C is
    # not): capped_frac = 1/4. ESS = (Σw)² / (n Σw²) = 5.5² / (4 · 9.25) = 30.25 / 37.
    w, m = self.variant(functools.partial(offpolicy.tis_token, cap=2.0))(
        *_inputs([[0.5, 1.0, 2.0, 4.0, PAD]]))
    np.testing.assert_allclose(w, [[0.5, 1.0, 2.0, 2.0, 0.0]], rtol=1e-6)
    np.testing.assert_allclose(m['offpolicy/capped_frac'], 0.25)
    np.testing.assert_allclose(m['offpolicy/ess'], 30.25 / 37, rtol=1e-6)
    np.testing.assert_allclose(m['offpolicy/weight_mean'], 5.5 / 4, rtol=1e-6)

  @chex.variants(with_jit=True, without_jit=True)
  def test_tis_sequence_caps_the_product_in_log_space(self):
    # C = 3. Row 0: ρ = [2, 2 | pad], Π = 4 > 3 -> 3 on both tokens (capped).
    # Row 1: [0.5, 2, 1.5], Π = 1.5. Row 2: [3 | pad, pad], Π = 3 = C, kept (not capped).
    # Row 3: all padding: weight 0 and not a sequence. capped_frac = 1/3 sequences.
    w, m = self.variant(functools.partial(offpolicy.tis_sequence, cap=3.0))(
        *_inputs([[2.0, 2.0, PAD], [0.5, 2.0, 1.5], [3.0, PAD, PAD], [PAD, PAD, PAD]]))
    np.testing.assert_allclose(w, [[3, 3, 0], [1.5, 1.5, 1.5], [3, 0, 0], [0, 0, 0]], rtol=1e-6)
    np.testing.assert_allclose(m['offpolicy/capped_frac'], 1 / 3, rtol=1e-6)

  @chex.variants(with_jit=True, without_jit=True)
  def test_mask_token_drops_tokens_outside_the_interval(self):
    # [a, b] = [0.5, 2], inclusive. ρ = [0.25, 0.5, 1, 2, 4 | pad].
    # IcePop M(k) = k·1[a ≤ k ≤ b]: [0, 0.5, 1, 2, 0, 0]; mask only: [0, 1, 1, 1, 0, 0].
    # dropped_frac = 2/5 valid tokens.
    ratios = [[0.25, 0.5, 1.0, 2.0, 4.0, PAD]]
    w, m = self.variant(functools.partial(offpolicy.mask_token, low=0.5, high=2.0))(
        *_inputs(ratios))
    np.testing.assert_allclose(w, [[0.0, 0.5, 1.0, 2.0, 0.0, 0.0]], rtol=1e-6)
    np.testing.assert_allclose(m['offpolicy/dropped_frac'], 0.4, rtol=1e-6)
    w, _ = self.variant(functools.partial(offpolicy.mask_token, low=0.5, high=2.0,
                                          importance_weight=False))(*_inputs(ratios))
    np.testing.assert_array_equal(w, [[0.0, 1.0, 1.0, 1.0, 0.0, 0.0]])

  @chex.variants(with_jit=True, without_jit=True)
  def test_mask_sequence_tests_the_geometric_mean(self):
    # [a, b] = [0.5, 2] on g = (Π ρ)^(1/|y|):
    # row 0 [4, 1 | pad]  g = 2 (at b): kept.       row 1 [4, 4 | pad]  g = 4: dropped.
    # row 2 [1.5]*3       g = 1.5: kept, though Π = 3.375 > b (the length normalisation).
    # row 3 [0.25, 1, 0.25] g = 0.0625^(1/3) ≈ 0.40: dropped.
    # dropped_frac = (2 + 3) / 10 valid tokens; seq_dropped_frac = 2/4.
    w, m = self.variant(functools.partial(offpolicy.mask_sequence, low=0.5, high=2.0))(
        *_inputs([[4.0, 1.0, PAD], [4.0, 4.0, PAD], [1.5, 1.5, 1.5], [0.25, 1.0, 0.25]]))
    np.testing.assert_array_equal(w, [[1, 1, 0], [0, 0, 0], [1, 1, 1], [0, 0, 0]])
    np.testing.assert_allclose(m['offpolicy/dropped_frac'], 0.5)
    np.testing.assert_allclose(m['offpolicy/seq_dropped_frac'], 0.5)

  @chex.variants(with_jit=True, without_jit=True)
  def test_decoupled_ppo_weight_drops_tokens_above_the_cap(self):
    # ρ = [0.5, 2, 4 | pad]: uncapped w = ρ; cap 3 drops ρ = 4 (AReaL: dropped, not truncated);
    # cap 4 keeps it (ρ ≤ cap).
    ratios = [[0.5, 2.0, 4.0, PAD]]
    for cap, want in ((None, [0.5, 2, 4, 0]), (3.0, [0.5, 2, 0, 0]), (4.0, [0.5, 2, 4, 0])):
      w, m = self.variant(functools.partial(offpolicy.decoupled_ppo, cap=cap))(*_inputs(ratios))
      np.testing.assert_allclose(w, [want], rtol=1e-6)
      np.testing.assert_allclose(m['offpolicy/dropped_frac'], 1 / 3 if cap == 3.0 else 0.0)

  @chex.variants(with_jit=True, without_jit=True)
  def test_decoupled_ppo_hand_case(self):
    # ε = 0.2, ℓ = −w·min(r A, clip(r) A), r = π_θ/π_prox, w = π_prox/μ, gradient on lp only.
    # tok 0: r = 1.3, A = 1, w = 2:   ℓ = −2·1.2 = −2.4, ∂ℓ/∂lp = 0 (clipped).
    # tok 1: r = 0.7, A = 1, w = 0.5: ℓ = −0.5·0.7 = −0.35, ∂ℓ/∂lp = −w A r = −0.35.
    # tok 2: r = 1.1, A = −1, w = 4:  ℓ = 4·1.1 = 4.4, ∂ℓ/∂lp = 4.4.
    lp = jnp.full((1, 3), -1.0)
    prox = lp - jnp.log(jnp.array([[1.3, 0.7, 1.1]]))
    behaviour = prox - jnp.log(jnp.array([[2.0, 0.5, 4.0]]))
    adv, mask = jnp.array([[1.0, 1.0, -1.0]]), jnp.ones((1, 3))

    def total(lp, prox, behaviour):
      loss, weights, _ = losses.ppo_clip(lp, prox, adv, mask)
      w, _ = offpolicy.decoupled_ppo(lp, prox, behaviour, mask)
      return jnp.sum(loss * w * weights), loss * w

    (_, per_token), (g_lp, _, g_behaviour) = self.variant(
        jax.value_and_grad(total, argnums=(0, 1, 2), has_aux=True))(lp, prox, behaviour)
    np.testing.assert_allclose(per_token, [[-2.4, -0.35, 4.4]], rtol=1e-5)
    np.testing.assert_allclose(g_lp, [[0.0, -0.35, 4.4]], rtol=1e-5, atol=1e-7)
    np.testing.assert_array_equal(g_behaviour, 0.0)  # The weight is a stop-gradient.


def _random_logprobs(seed, shape=(4, 6), scale=0.3):
  k = jax.random.split(jax.random.key(seed), 4)
  lp = -jax.random.uniform(k[0], shape, minval=0.2, maxval=2.0)
  prox = lp + scale * jax.random.normal(k[1], shape)
  behaviour = prox + scale * jax.random.normal(k[2], shape)
  adv = jax.random.normal(k[3], shape[:1])
  mask = (jnp.arange(shape[1])[None] < jnp.array([6, 3, 5, 1])[:, None]).astype(jnp.float32)
  return lp, prox, behaviour, adv, mask


@pytest.mark.parametrize('jit', [False, True])
def test_decoupled_ppo_is_exactly_ppo_clip_when_proximal_is_behaviour(jit):
  lp, prox, _, adv, mask = _random_logprobs(0)

  def both(lp):
    plain, _, _ = losses.ppo_clip(lp, prox, adv, mask, eps_low=0.2, eps_high=0.28)
    w, _ = offpolicy.decoupled_ppo(lp, prox, prox, mask, cap=5.0)
    return plain, plain * w

  f = jax.jit(both) if jit else both
  plain, decoupled = f(lp)
  np.testing.assert_array_equal(decoupled, plain)
  g_plain, g_decoupled = (jax.grad(lambda x, i=i: jnp.sum(f(x)[i]))(lp) for i in (0, 1))
  np.testing.assert_array_equal(g_decoupled, g_plain)


@pytest.mark.parametrize('name', sorted(offpolicy.CORRECTIONS))
def test_weights_carry_no_gradient_and_are_one_on_policy(name):
  lp, prox, behaviour, _, mask = _random_logprobs(1)
  fn = offpolicy.get_correction(name)
  grads = jax.grad(lambda *a: jnp.sum(fn(*a)[0]), argnums=(0, 1, 2))(lp, prox, behaviour, mask)
  for g in grads:
    np.testing.assert_array_equal(g, 0.0)
  w, m = fn(lp, prox, prox, mask)  # Behaviour = proximal: ρ = 1 on every token.
  np.testing.assert_array_equal(w, mask)
  np.testing.assert_allclose(m['offpolicy/ess'], 1.0, rtol=1e-6)


def test_effective_sample_size_hand_cases():
  # w = [1, 1, 0, 2 | masked NaN]: (Σw)² / (n Σw²) = 16 / (4 · 6) = 2/3; equal weights: 1;
  # all zero: 0.
  mask = jnp.array([[1.0, 1, 1, 1, 0]])
  ess = offpolicy.effective_sample_size
  np.testing.assert_allclose(ess(jnp.array([[1.0, 1, 0, 2, jnp.nan]]), mask), 2 / 3, rtol=1e-6)
  np.testing.assert_allclose(ess(jnp.full((1, 5), 3.0), mask), 1.0, rtol=1e-6)
  assert float(ess(jnp.zeros((1, 5)), mask)) == 0.0


def test_mismatch_metrics_hand_case():
  # learner [-1, -2], behaviour [-1.5, -1], proximal = learner, third token masked (NaN).
  # |behaviour − learner| = [0.5, 1] -> 0.75. k3 with u = lp_learner − lp_behaviour = [0.5, −1]:
  # e^u − u − 1 = [e^0.5 − 1.5, e^−1] -> mean (e^0.5 − 1.5 + e^−1)/2 ≈ 0.2583.
  # ρ = e^u = [e^0.5, e^−1]: ESS = (e^0.5 + e^−1)² / (2 (e + e^−2)) ≈ 0.7126.
  learner = jnp.array([[-1.0, -2.0, jnp.nan]])
  behaviour = jnp.array([[-1.5, -1.0, jnp.nan]])
  mask = jnp.array([[1.0, 1.0, 0.0]])
  m = jax.jit(offpolicy.mismatch_metrics)(learner, learner, behaviour, mask)
  np.testing.assert_allclose(m['offpolicy/abs_logprob_diff'], 0.75, rtol=1e-6)
  np.testing.assert_allclose(m['offpolicy/kl_k3'], (math.exp(0.5) - 1.5 + math.exp(-1)) / 2,
                             rtol=1e-5)
  a, b = math.exp(0.5), math.exp(-1)
  np.testing.assert_allclose(m['offpolicy/ratio_ess'], (a + b)**2 / (2 * (a * a + b * b)),
                             rtol=1e-5)


@pytest.mark.parametrize('jit', [False, True])
def test_staleness_histogram_hand_cases(jit):
  # Learner step 5, K = 2. Token versions [[5, 5, 4 | pad], [3, 1, 6, 2]]: staleness
  # [[0, 0, 1], [2, 4, −1, 3]] -> counts [2, 1, 1]; 4, −1 and 3 are out of range (3).
  versions = jnp.array([[5, 5, 4, 0], [3, 1, 6, 2]])
  mask = jnp.array([[1, 1, 1, 0], [1, 1, 1, 1]], bool)
  f = functools.partial(offpolicy.staleness_metrics, max_staleness=2)
  f = jax.jit(f) if jit else f
  m = f(versions, learner_step=5, mask=mask)
  assert [int(m[f'offpolicy/staleness/{s}']) for s in range(3)] == [2, 1, 1]
  assert int(m['offpolicy/staleness/out_of_range']) == 3
  # Per-sequence versions, no mask: staleness [0, 1, 1, 5], K = 3 -> [1, 2, 0, 0].
  counts = offpolicy.staleness_histogram(jnp.array([5, 4, 4, 0]), learner_step=5,
                                         max_staleness=3)
  np.testing.assert_array_equal(counts, [1, 2, 0, 0])


# --- The wiring into update.loss_fn and train_step -------------------------------------------

CFG = transformer.ModelConfig(vocab_size=40, hidden_size=32, intermediate_size=64, num_layers=2,
                              num_heads=4, num_kv_heads=2, head_dim=8)
B, G, P, L = 2, 2, 4, 6
# What each registered correction runs with in the tests; must cover the registry.
CORRECTION_CASES = {
    'tis_token': (('cap', 1.2),), 'tis_sequence': (('cap', 1.5),),
    'mask_token': (('high', 1.2), ('low', 0.8)), 'mask_sequence': (('high', 1.1), ('low', 0.9)),
    'decoupled_ppo': (('cap', 1.3),),
}


def test_the_case_table_covers_the_registry():
  assert set(CORRECTION_CASES) == set(offpolicy.CORRECTIONS)


@pytest.fixture(scope='module')
def params():
  return transformer.init_params(CFG, jax.random.key(0))


def _batch(params, seed=0):
  """Rows whose behaviour log-probs differ from the proximal (the learner's) ones."""
  k1, k2, k3, k4 = jax.random.split(jax.random.key(seed), 4)
  n = B * G
  tokens = jax.random.randint(k1, (n, P + L), 1, CFG.vocab_size)
  loss_mask = jnp.arange(L)[None] < jax.random.randint(k2, (n,), 1, L + 1)[:, None]
  mask = jnp.concatenate([jnp.ones((n, P), bool), loss_mask], 1)
  old = update.logprobs_step(params, tokens, mask, cfg=CFG, completion_len=L).logprobs_NxT
  return TrainBatch(
      tokens_NxT=tokens, mask_NxT=mask, loss_mask_NxL=loss_mask,
      advantages_NxL=jnp.broadcast_to(jax.random.normal(k3, (n, 1)), (n, L)),
      old_logprobs_NxL=old, ref_logprobs_NxL=old,
      behaviour_logprobs_NxL=old + 0.2 * jax.random.normal(k4, old.shape),
      prefix_mask_NxL=jnp.zeros((n, L), bool))


@pytest.mark.parametrize('name', sorted(CORRECTION_CASES))
def test_loss_fn_multiplies_the_policy_loss_by_the_correction(params, name):
  # seq_mean_token_mean divides each row by its aggregation weights, so a sequence weight
  # survives only on the loss: the expected value is Σ_i mean_t(ℓ w) / #rows.
  batch = _batch(params)
  kwargs = CORRECTION_CASES[name]
  objective = update.Objective(aggregation='seq_mean_token_mean', group_size=G, correction=name,
                               correction_kwargs=kwargs)
  den = aggregation.denominators(batch.loss_mask_NxL, mode='seq_mean_token_mean')
  got, metrics = jax.jit(lambda p, b: update.loss_fn(p, b, den, cfg=CFG, objective=objective))(
      params, batch)
  lp = update.completion_stats(params, batch.tokens_NxT, batch.mask_NxT, cfg=CFG,
                               completion_len=L).logprobs_NxT
  mask = batch.loss_mask_NxL
  loss, _, _ = losses.ppo_clip(lp, batch.old_logprobs_NxL, batch.advantages_NxL, mask)
  w, _ = offpolicy.get_correction(name)(lp, batch.old_logprobs_NxL,
                                        batch.behaviour_logprobs_NxL, mask, **dict(kwargs))
  want = jnp.sum(aggregation.masked_mean(loss * w, mask, axis=-1)) / den
  np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-7)
  assert 0.0 < float(metrics['offpolicy/ess']) < 1.0  # The ratios differ from 1 here.
  assert float(metrics['offpolicy/abs_logprob_diff']) > 0.0


def test_decoupled_ppo_in_the_train_step_is_plain_ppo_when_behaviour_is_proximal(params):
  batch = _batch(params)
  batch = batch.replace(behaviour_logprobs_NxL=batch.old_logprobs_NxL)
  opt = optax.sgd(0.1)
  state = update.init_state(params, opt)
  out = []
  for correction in ('', 'decoupled_ppo'):
    objective = update.Objective(group_size=G, correction=correction)
    out.append(jax.jit(lambda s, b, o=objective: update.train_step(
        s, b, cfg=CFG, objective=o, optimizer=opt, micro_batches=2))(state, batch))
  (plain, m_plain), (decoupled, m_decoupled) = out
  np.testing.assert_array_equal(m_decoupled['loss'], m_plain['loss'])
  # Two programs that XLA may fuse differently (the decoupled one multiplies by weights of
  # exactly 1): the updated params agree to the last bit or two (the loop emitter left 14
  # of 1280 embedding entries one ulp apart), far below any real difference.
  chex.assert_trees_all_close(decoupled.params, plain.params, rtol=1e-6, atol=0)
  assert float(m_decoupled['offpolicy/weight_mean']) == 1.0


def test_unknown_correction_in_the_objective_lists_the_known_ones():
  with pytest.raises(KeyError, match='tis_token'):
    update.Objective(correction='tis')


def test_a_correction_rejects_an_inverted_cap_when_called():
  prox, behaviour, mask = _from_ratios([[1.0]])
  with pytest.raises(ValueError, match='cap=0.0 must be a number > 0'):
    offpolicy.tis_token(prox, prox, behaviour, mask, cap=0.0)
  with pytest.raises(ValueError, match='0 <= low < high'):
    offpolicy.mask_token(prox, prox, behaviour, mask, low=2.0, high=0.5)


# --- Config -----------------------------------------------------------------------------------

def tiny(**overrides):
  """every_option_test's tiny config: d = 32, vocabulary 128, one prompt bucket."""
  c = config_lib.default()
  c.data.task, c.data.difficulty, c.data.prompt_buckets = 'arithmetic', 1, (128,)
  c.model.arch = dict(vocab_size=128, hidden_size=32, intermediate_size=64, num_layers=2,
                      num_heads=2, num_kv_heads=1, head_dim=16, qkv_bias=False, qk_norm=False,
                      tie_embeddings=True, family='qwen2', rope_theta=10_000.0)
  c.rl.steps, c.rl.prompts_per_step, c.rl.group_size, c.rl.max_new_tokens = 1, 4, 2, 8
  c.optimizer.lr = 1e-3
  c.verifier.name, c.verifier.workers = 'arithmetic', 1
  c.eval.num_prompts = 4
  c.mesh = dict(data=1, fsdp=-1, tensor=1)
  for path, value in overrides.items():
    section, key = path.split('.')
    c[section][key] = value
  return c


@pytest.mark.parametrize('name', sorted(CORRECTION_CASES))
def test_every_correction_with_its_options_passes_validation(name):
  config_lib.validate(tiny(**{'objective.correction': name,
                              'objective.correction_kwargs': dict(CORRECTION_CASES[name])}),
                      num_devices=8)
  config_lib.validate(tiny(**{'objective.correction': name}), num_devices=8)  # Defaults.


@pytest.mark.parametrize('correction, kwargs, match', [
    ('tis', {}, r"objective.correction='tis'; known: \['', 'decoupled_ppo', 'mask_sequence'"),
    ('tis_token', {'cap': 0}, 'objective.correction_kwargs.cap=0 must be a number > 0'),
    ('tis_sequence', {'cap': -2.0}, r'objective.correction_kwargs.cap=-2.0 must be a number > 0'),
    ('mask_token', {'low': 2.0, 'high': 0.5},
     r'objective.correction_kwargs.low=2.0, high=0.5 must satisfy 0 <= low < high'),
    ('mask_sequence', {'low': 1.0, 'high': 1.0},
     r'objective.correction_kwargs.low=1.0, high=1.0 must satisfy 0 <= low < high'),
    ('mask_token', {'low': -0.5}, r'low=-0.5, high=5.0 must satisfy 0 <= low < high'),
    ('mask_token', {'low': 1.5, 'high': 3.0}, 'must contain 1'),
    ('decoupled_ppo', {'cap': 1.0}, 'cap=1.0 must be None or a number > 1'),
    ('tis_token', {'threshold': 2.0},
     "objective.correction_kwargs has 'threshold', which tis_token does not take"),
    ('', {'cap': 2.0}, "objective.correction_kwargs=.* is set but objective.correction is ''"),
])
def test_bad_corrections_are_rejected_at_start_up_naming_the_field(correction, kwargs, match):
  c = tiny(**{'objective.correction': correction, 'objective.correction_kwargs': kwargs})
  with pytest.raises(ValueError, match=match):
    config_lib.validate(c, num_devices=8)


def test_a_correction_on_prefix_tokens_already_corrected_by_the_loss_is_rejected():
  c = tiny(**{'objective.correction': 'tis_token', 'objective.policy_loss': 'prefix_mixed_ppo',
              'prefix_rollouts.enabled': True})
  with pytest.raises(ValueError, match='corrected twice'):
    config_lib.validate(c, num_devices=8)
  config_lib.validate(tiny(**{'objective.correction': 'tis_token',
                              'objective.policy_loss': 'prefix_mixed_ppo'}), num_devices=8)


# --- End to end -------------------------------------------------------------------------------

def test_one_rl_step_with_decoupled_ppo(tmp_path, monkeypatch):
  # Top-k sampling: the behaviour distribution is the renormalised top 4, so every sampled
  # token has π_prox/μ = (top-4 mass under the plain softmax) < 1 and the weights are not 1.
  c = tiny(**{'objective.correction': 'decoupled_ppo', 'objective.correction_kwargs': {'cap': 2.0},
              'rl.top_k': 4})
  config_lib.validate(c, num_devices=jax.device_count())
  pool = pool_lib.VerifierPool(num_workers=1)
  monkeypatch.setattr(run_setup.pool_lib, 'VerifierPool', lambda **kw: pool)
  try:
    run = run_setup.build(c, tmp_path)
    assert run.objective.correction == 'decoupled_ppo'
    try:
      state = run._fresh_state()
      with jax.set_mesh(run.mesh):
        state, metrics = train.rl_step(run, state, 1, {})
    finally:
      run.checkpointer.close()
  finally:
    pool.close()
  metrics = jax.device_get(metrics)
  assert int(state.step) == 1 and int(state.skipped) == 0 and np.isfinite(metrics['loss'])
  assert 0.0 < metrics['offpolicy/weight_mean'] < 1.0
  assert 0.0 < metrics['offpolicy/ess'] <= 1.0
  assert metrics['offpolicy/abs_logprob_diff'] > 0.0 and metrics['offpolicy/kl_k3'] > 0.0
  assert metrics['offpolicy/dropped_frac'] == 0.0  # ρ < 1 < cap everywhere.
