"""Aggregation modes: hand values, micro-batch invariance of loss and gradient, Dr. GRPO's
length-independent token weight, empty masks."""

import functools

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rlreason.objectives import aggregation

MODES = ('token_mean', 'seq_mean_token_mean', 'seq_mean_token_sum', 'constant_normalizer')
MAX_LEN = 6


def _batch(n=8, l=6, seed=0):
  k = jax.random.split(jax.random.key(seed), 4)
  lengths_N = jax.random.randint(k[0], (n,), 1, l + 1)
  mask_NxL = (jnp.arange(l)[None] < lengths_N[:, None]).astype(jnp.float32)
  lp_NxL = -jax.random.uniform(k[1], (n, l), minval=0.1, maxval=3.0)
  old_NxL = lp_NxL + 0.3 * jax.random.normal(k[2], (n, l))
  adv_N = jax.random.normal(k[3], (n,))
  return lp_NxL, old_NxL, adv_N, mask_NxL


def _loss(lp_NxL, old_NxL, adv_N, mask_NxL, *, mode, denominator):
  # The importance-weighted surrogate −A·exp(lp − lp_old): nonlinear per token, few ops.
  loss_NxL = -adv_N[:, None] * jnp.exp(jnp.where(mask_NxL > 0, lp_NxL - old_NxL, 0.0))
  return aggregation.aggregate(loss_NxL, mask_NxL, mode=mode, denominator=denominator)


class AggregationTest(chex.TestCase):

  @chex.variants(with_jit=True, without_jit=True)
  def test_dapo_hand_example(self):
    # Per-token losses [a] and [b, b, b] with a = 2, b = 1 (algorithms.md §3):
    # token_mean = (a + 3b)/4 = 1.25; seq_mean_token_mean = (a + b)/2 = 1.5;
    # seq_mean_token_sum = (a + 3b)/2 = 2.5; constant_normalizer, L_max = 4: (a + 3b)/8 = 0.625.
    loss_NxL = jnp.array([[2.0, 9.0, 9.0], [1.0, 1.0, 1.0]])
    mask_NxL = jnp.array([[1.0, 0.0, 0.0], [1.0, 1.0, 1.0]])
    want = {'token_mean': 1.25, 'seq_mean_token_mean': 1.5, 'seq_mean_token_sum': 2.5,
            'constant_normalizer': 0.625}
    for mode, value in want.items():
      den = aggregation.denominators(mask_NxL, mode=mode, max_len=4)
      got = self.variant(functools.partial(aggregation.aggregate, mode=mode))(
          loss_NxL, mask_NxL, denominator=den)
      np.testing.assert_allclose(got, value, atol=1e-6)

  @chex.variants(with_jit=True, without_jit=True)
  def test_micro_batch_invariance_of_loss_and_gradient(self):
    lp, old, adv, mask = _batch()
    dens = {m: aggregation.denominators(mask, mode=m, max_len=MAX_LEN) for m in MODES}

    def all_modes(lp, old, adv, mask, dens):
      return {m: jax.value_and_grad(functools.partial(_loss, mode=m))(
          lp, old, adv, mask, denominator=dens[m]) for m in MODES}

    f = self.variant(all_modes)
    full = f(lp, old, adv, mask, dens)
    # Uneven splits only under jit: each new shape costs many op compiles when eager.
    jitted = self.variant.type == chex.ChexVariantType.WITH_JIT
    for splits in ((0, 4, 8), (0, 3, 8)) if jitted else ((0, 4, 8),):
      parts = [f(lp[a:b], old[a:b], adv[a:b], mask[a:b], dens)
               for a, b in zip(splits[:-1], splits[1:])]
      for m in MODES:
        np.testing.assert_allclose(sum(p[m][0] for p in parts), full[m][0], atol=1e-6,
                                   rtol=1e-6)
        np.testing.assert_allclose(jnp.concatenate([p[m][1] for p in parts]), full[m][1],
                                   atol=1e-7, rtol=1e-6)

  def test_local_denominator_breaks_invariance_for_token_mean(self):
    # The failure mode the global denominator prevents: per-micro-batch token counts.
    lp, old, adv, mask = _batch()
    loss = jax.jit(functools.partial(_loss, mode='token_mean'))
    full = loss(lp, old, adv, mask, denominator=aggregation.denominators(mask, mode='token_mean'))
    halves = sum(loss(lp[s], old[s], adv[s], mask[s],
                      denominator=aggregation.denominators(mask[s], mode='token_mean')) / 2
                 for s in (slice(0, 4), slice(4, 8)))
    assert abs(float(full - halves)) > 1e-4

  def test_dr_grpo_token_weight_does_not_depend_on_length(self):
    # Duplicating a response's tokens doubles its gradient under the constant normaliser;
    # seq_mean_token_mean keeps it constant (algorithms.md §2).
    def grad_norm(lp_NxL, mask_NxL, mode):
      den = aggregation.denominators(mask_NxL, mode=mode, max_len=MAX_LEN)
      g = jax.jit(jax.grad(_loss), static_argnames='mode')(
          lp_NxL, lp_NxL, jnp.array([1.0]), mask_NxL, mode=mode, denominator=den)
      return float(jnp.sum(g))

    lp = jnp.full((1, 6), -1.0)
    short = jnp.array([[1.0, 1.0, 0.0, 0.0, 0.0, 0.0]])
    long = jnp.array([[1.0, 1.0, 1.0, 1.0, 0.0, 0.0]])
    np.testing.assert_allclose(grad_norm(lp, long, 'constant_normalizer'),
                               2 * grad_norm(lp, short, 'constant_normalizer'), rtol=1e-6)
    np.testing.assert_allclose(grad_norm(lp, long, 'seq_mean_token_mean'),
                               grad_norm(lp, short, 'seq_mean_token_mean'), rtol=1e-6)

  @chex.variants(with_jit=True, without_jit=True)
  def test_empty_mask_gives_zero_not_nan(self):
    loss_NxL = jnp.full((2, 3), jnp.nan)
    mask_NxL = jnp.zeros((2, 3))
    for mode in MODES:
      den = aggregation.denominators(mask_NxL, mode=mode, max_len=3)
      got = self.variant(functools.partial(aggregation.aggregate, mode=mode))(
          loss_NxL, mask_NxL, denominator=den)
      assert float(got) == 0.0


def test_denominators_hand_values():
  # Rows with 1, 3 and 0 valid tokens: 4 tokens, 2 sequences (the empty row does not count).
  mask = jnp.array([[1, 0, 0], [1, 1, 1], [0, 0, 0]], jnp.float32)
  assert float(aggregation.denominators(mask, mode='token_mean')) == 4.0
  assert float(aggregation.denominators(mask, mode='seq_mean_token_mean')) == 2.0
  assert float(aggregation.denominators(mask, mode='seq_mean_token_sum')) == 2.0
  assert float(aggregation.denominators(mask, mode='constant_normalizer', max_len=5)) == 10.0
  with pytest.raises(ValueError, match='max_len'):
    aggregation.denominators(mask, mode='constant_normalizer')


def test_unknown_mode_lists_known_names():
  with pytest.raises(KeyError, match='seq_mean_token_mean'):
    aggregation.get_aggregation('seq-mean-token-sum-norm')
