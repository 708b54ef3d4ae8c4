"""The training forward (no cache) against independent paths: its head-major attention
against the cache path's token-major attention, and its RoPE against a table and by hand."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rlreason.model import layers
from rlreason.model import rope
from rlreason.model import transformer

CFG = transformer.ModelConfig(vocab_size=61, hidden_size=32, intermediate_size=48, num_layers=2,
                              num_heads=4, num_kv_heads=2, head_dim=8, qkv_bias=True,
                              rope_theta=100.0)
T = 10


@pytest.fixture(scope='module')
def inputs():
  params = transformer.init_params(CFG, jax.random.key(0))
  # Biases and norms away from 0 and 1, so a wrong layout cannot hide behind them.
  params = jax.tree.map(lambda x: x + 0.05 * jax.random.normal(jax.random.key(3), x.shape),
                        params)
  tokens_NxT = jax.random.randint(jax.random.key(1), (3, T), 0, CFG.vocab_size)
  mask_NxT = jnp.arange(T)[None, :] >= jnp.array([0, 3, 6])[:, None]  # Left padding.
  return params, tokens_NxT, mask_NxT


def _loss(logits_NxTxV, tokens_NxT, mask_NxT):
  """Mean next-token log-likelihood where both positions are real (pad queries' outputs are
  unused garbage, different in each path)."""
  logp = jax.nn.log_softmax(logits_NxTxV[:, :-1], axis=-1)
  picked = jnp.take_along_axis(logp, tokens_NxT[:, 1:, None], axis=-1)[..., 0]
  weight = mask_NxT[:, :-1] & mask_NxT[:, 1:]
  return jnp.sum(picked * weight) / jnp.sum(weight)


def _value_and_grad(forward, params, tokens_NxT, mask_NxT):
  fn = lambda p: _loss(forward(p), tokens_NxT, mask_NxT)
  (loss, grads), logits = jax.jit(jax.value_and_grad(fn))(params), jax.jit(forward)(params)
  return loss, grads, logits


def _assert_close(a, b, mask_NxT):
  (la, ga, xa), (lb, gb, xb) = a, b
  real = np.asarray(mask_NxT)
  np.testing.assert_allclose(np.asarray(xa)[real], np.asarray(xb)[real], atol=1e-5, rtol=1e-5)
  np.testing.assert_allclose(la, lb, atol=1e-5, rtol=1e-5)
  jax.tree.map(lambda x, y: np.testing.assert_allclose(x, y, atol=1e-5, rtol=1e-4), ga, gb)


def test_head_major_training_forward_equals_token_major_cache_path(inputs):
  # The cache path (an empty cache, one prefill) runs cache_attention on token-major
  # NxTxKxRxDh queries, the layout the training forward used before it went head-major.
  params, tokens_NxT, mask_NxT = inputs
  train = lambda p: transformer.apply(p, tokens_NxT, cfg=CFG, mask_NxT=mask_NxT)[0]
  cached = lambda p: transformer.apply(p, tokens_NxT, cfg=CFG, mask_NxT=mask_NxT,
                                       cache=transformer.init_cache(CFG, 3, T))[0]
  _assert_close(_value_and_grad(train, params, tokens_NxT, mask_NxT),
                _value_and_grad(cached, params, tokens_NxT, mask_NxT), mask_NxT)


def test_training_forward_rope_equals_a_gathered_table(inputs):
  # The training forward computes cos/sin once per call (held behind an optimization
  # barrier so XLA does not re-evaluate them in every layer); a table gathered by position
  # must give the same logits and gradients, left padding included.
  params, tokens_NxT, mask_NxT = inputs
  table = transformer.rope_table(CFG, T)
  computed = lambda p: transformer.apply(p, tokens_NxT, cfg=CFG, mask_NxT=mask_NxT)[0]
  gathered = lambda p: transformer.apply(p, tokens_NxT, cfg=CFG, mask_NxT=mask_NxT,
                                         rope_table=table)[0]
  _assert_close(_value_and_grad(computed, params, tokens_NxT, mask_NxT),
                _value_and_grad(gathered, params, tokens_NxT, mask_NxT), mask_NxT)


def test_rope_table_hand_computed():
  # Dh = 4, theta = 100: inverse frequencies 100^(-0/4) = 1 and 100^(-2/4) = 0.1.
  cfg = CFG.replace(head_dim=4, num_heads=2, num_kv_heads=1, rope_theta=100.0)
  cos, sin = rope.rope_table(cfg, 4)
  angles = np.array([[0, 0], [1, 0.1], [2, 0.2], [3, 0.3]], np.float32)
  np.testing.assert_allclose(cos, np.cos(angles), atol=1e-6)
  np.testing.assert_allclose(sin, np.sin(angles), atol=1e-6)
  # Rotate-half: x = (1, 0, 0, 1) at position 2 pairs (x0, x2) and (x1, x3).
  x = jnp.array([1.0, 0.0, 0.0, 1.0]).reshape(1, 1, 1, 4)
  got = rope.rotate(x, (cos[None, 2:3], sin[None, 2:3]))[0, 0, 0]
  c0, c1, s0, s1 = np.cos(2.0), np.cos(0.2), np.sin(2.0), np.sin(0.2)
  np.testing.assert_allclose(got, [c0, -s1, s0, c1], atol=1e-6)


@pytest.mark.parametrize('contract,dtype', [(1, jnp.float32), (2, jnp.float32),
                                            (1, jnp.bfloat16)])
def test_project_equals_tensordot_and_its_gradients(contract, dtype):
  kx, kw, kg = jax.random.split(jax.random.key(5), 3)
  x_shape, w_shape = ((3, 5, 6), (6, 2, 7)) if contract == 1 else ((3, 5, 4, 6), (4, 6, 7))
  x, w = jax.random.normal(kx, x_shape, dtype), jax.random.normal(kw, w_shape, dtype)
  g = jax.random.normal(kg, x.shape[:2] + w.shape[contract:], dtype)
  ours, ours_vjp = jax.vjp(lambda a, b: layers.project(a, b, contract), x, w)
  ref, ref_vjp = jax.vjp(lambda a, b: jnp.tensordot(a, b, contract), x, w)
  tol = 1e-5 if dtype == jnp.float32 else 2e-2
  np.testing.assert_allclose(np.float32(ours), np.float32(ref), rtol=tol, atol=tol)
  for a, b in zip(ours_vjp(g), ref_vjp(g)):
    assert a.dtype == b.dtype and a.shape == b.shape
    np.testing.assert_allclose(np.float32(a), np.float32(b), rtol=tol, atol=tol * 10)
