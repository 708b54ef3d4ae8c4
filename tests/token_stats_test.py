"""Token statistics: hand-computed values, chunked == plain (values and gradients), OTB's
logit-gradient proxy, and that the chunked gradient never holds NxTxV."""

import functools

import chex
import jax
import jax.numpy as jnp
import numpy as np

from rlreason.objectives import token_stats

TOL = dict(atol=1e-5, rtol=1e-5)


def _problem(n=3, t=7, d=16, v=97, seed=0):
  k = jax.random.split(jax.random.key(seed), 4)
  h_NxTxD = jax.random.normal(k[0], (n, t, d))
  w_DxV = 0.5 * jax.random.normal(k[1], (d, v))
  tokens_NxT = jax.random.randint(k[2], (n, t), 0, v)
  cot_3xNxT = jax.random.normal(k[3], (3, n, t))
  return h_NxTxD, w_DxV, tokens_NxT, cot_3xNxT


class TokenStatsTest(chex.TestCase):

  @chex.variants(with_jit=True, without_jit=True)
  def test_hand_computed(self):
    # logits log[1, 2, 3] -> π = [1/6, 2/6, 3/6]; token 2: log π = log 0.5 = −0.693147;
    # H = (1/6)ln6 + (1/3)ln3 + (1/2)ln2 = 1.011404; Σπ² = (1 + 4 + 9)/36 = 0.388889.
    # At τ = 2: π ∝ [1, √2, √3] = [0.241181, 0.341081, 0.417738]: log π_2 = −0.872902,
    # H = 1.074532, Σπ² = 0.349010.
    logits = jnp.log(jnp.array([[[1.0, 2.0, 3.0]]]))
    tokens = jnp.array([[2]])
    f = self.variant(functools.partial(token_stats.token_stats, temperature=1.0))
    s = f(logits, tokens)
    np.testing.assert_allclose(s.logprobs_NxT, [[-0.693147]], atol=1e-6)
    np.testing.assert_allclose(s.entropy_NxT, [[1.011404]], atol=1e-6)
    np.testing.assert_allclose(s.sum_sq_probs_NxT, [[0.388889]], atol=1e-6)
    s2 = self.variant(functools.partial(token_stats.token_stats, temperature=2.0))(logits, tokens)
    np.testing.assert_allclose(s2.logprobs_NxT, [[-0.872902]], atol=1e-6)
    np.testing.assert_allclose(s2.entropy_NxT, [[1.074532]], atol=1e-6)
    np.testing.assert_allclose(s2.sum_sq_probs_NxT, [[0.349010]], atol=1e-6)

  @chex.variants(with_jit=True, without_jit=True)
  def test_chunked_equals_plain_values_and_grads(self):
    # V = 97 is not a multiple of vocab_chunk = 32 (last block overlaps), N·T = 21 is not a
    # multiple of token_chunk = 4 (padding), τ = 0.7.
    h, w, tokens, cot = _problem()

    def plain(h, w):
      return token_stats.token_stats(jnp.einsum('ntd,dv->ntv', h, w), tokens, temperature=0.7)

    def chunked(h, w):
      return token_stats.token_stats_from_hidden(h, w, tokens, temperature=0.7, token_chunk=4,
                                                 vocab_chunk=32)

    def scalar(stats_fn, h, w):
      s = stats_fn(h, w)
      return (jnp.sum(cot[0] * s.logprobs_NxT) + jnp.sum(cot[1] * s.entropy_NxT)
              + jnp.sum(cot[2] * s.sum_sq_probs_NxT))

    want, got = plain(h, w), self.variant(chunked)(h, w)
    for a, b in zip(jax.tree.leaves(want), jax.tree.leaves(got)):
      np.testing.assert_allclose(b, a, **TOL)
    g_want = jax.grad(functools.partial(scalar, plain), argnums=(0, 1))(h, w)
    g_got = self.variant(jax.grad(functools.partial(scalar, chunked), argnums=(0, 1)))(h, w)
    for a, b in zip(g_want, g_got):
      np.testing.assert_allclose(b, a, **TOL)

  @chex.variants(with_jit=True, without_jit=True)
  def test_chunk_sizes_do_not_matter(self):
    h, w, tokens, _ = _problem(n=2, t=5, v=50, seed=3)
    f = lambda tc, vc: token_stats.token_stats_from_hidden(h, w, tokens, token_chunk=tc,
                                                           vocab_chunk=vc)
    ref = self.variant(lambda: f(10, 50))()
    for tc, vc in ((1, 7), (3, 49), (64, 1000)):
      got = self.variant(lambda: f(tc, vc))()
      for a, b in zip(jax.tree.leaves(ref), jax.tree.leaves(got)):
        np.testing.assert_allclose(b, a, **TOL)

  @chex.variants(with_jit=True, without_jit=True)
  def test_logit_grad_energy_is_squared_score_norm(self):
    # ‖∂ log softmax(z)_a / ∂z‖² = ‖e_a − π‖² = 1 − 2π_a + Σπ² (algorithms.md §8).
    z_V = jnp.array([0.3, -1.2, 2.0, 0.5, -0.1])
    for a in range(5):
      grad = jax.grad(lambda z: jax.nn.log_softmax(z)[a])(z_V)
      s = token_stats.token_stats(z_V[None, None], jnp.array([[a]]))
      energy = self.variant(token_stats.logit_grad_energy)(s.logprobs_NxT, s.sum_sq_probs_NxT)
      np.testing.assert_allclose(energy[0, 0], jnp.sum(grad**2), atol=1e-6)


def test_peaked_distribution_entropy_is_accurate():
  # One logit 40 above the rest: H ≈ 96·41·e^−40 ≈ 1.7e-14; a naive lse − Σπz would be off by
  # ~1e-6 from cancellation. Both paths must be ≤ 1e-6 from the true value.
  v = 97
  w = jnp.zeros((1, v)).at[0, 5].set(40.0)
  h = jnp.ones((1, 1, 1))
  s = token_stats.token_stats_from_hidden(h, w, jnp.array([[5]]), vocab_chunk=16)
  assert abs(float(s.entropy_NxT[0, 0])) < 1e-6
  np.testing.assert_allclose(s.sum_sq_probs_NxT, [[1.0]], atol=1e-6)
  np.testing.assert_allclose(s.logprobs_NxT, [[0.0]], atol=1e-6)


def test_chunked_gradient_does_not_hold_full_logits():
  # The compiled gradient's scratch memory must be far below one NxTxV fp32 array.
  n, t, d, v = 2, 64, 32, 4096
  h = jax.ShapeDtypeStruct((n, t, d), jnp.float32)
  w = jax.ShapeDtypeStruct((d, v), jnp.float32)
  tokens = jax.ShapeDtypeStruct((n, t), jnp.int32)

  def loss(h, w, tokens):
    s = token_stats.token_stats_from_hidden(h, w, tokens, token_chunk=16, vocab_chunk=256)
    return jnp.sum(s.logprobs_NxT) + jnp.sum(s.entropy_NxT)

  compiled = jax.jit(jax.grad(loss, argnums=(0, 1))).lower(h, w, tokens).compile()
  temp = compiled.memory_analysis().temp_size_in_bytes
  full_logits = n * t * v * 4
  assert temp < full_logits / 4, (temp, full_logits)
