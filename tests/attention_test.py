"""Blocked causal attention equals the dense masked softmax, values and gradients."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rlreason.model import attention


def dense_attention(q_NxTxKxRxDh, k_NxTxKxDh, v_NxTxKxDh, mask_NxT):
  """The textbook form: the full TxT scores, causal and key-padding masked, softmax."""
  t, dh = q_NxTxKxRxDh.shape[1], q_NxTxKxRxDh.shape[-1]
  s = jnp.einsum('ntkrd,nskd->nkrts', q_NxTxKxRxDh, k_NxTxKxDh) / np.sqrt(dh)
  allowed = jnp.tril(jnp.ones((t, t), bool))[None] & mask_NxT[:, None, :]
  s = jnp.where(allowed[:, None, None], s, -1e30)  # Finite: pad rows stay finite.
  return jnp.einsum('nkrts,nskd->ntkrd', jax.nn.softmax(s, axis=-1), v_NxTxKxDh)


def _inputs(n, t, k, r, dh, pads, seed=0):
  rng = np.random.default_rng(seed)
  q = jnp.asarray(rng.standard_normal((n, t, k, r, dh)), jnp.float32)
  keys = jnp.asarray(rng.standard_normal((n, t, k, dh)), jnp.float32)
  values = jnp.asarray(rng.standard_normal((n, t, k, dh)), jnp.float32)
  mask = jnp.asarray(np.arange(t)[None, :] >= np.asarray(pads)[:, None])  # Left padding.
  # Loss weights: zero on pad queries, whose outputs the model never uses.
  w = jnp.asarray(rng.standard_normal((n, t, k, r, dh)), jnp.float32)
  return q, keys, values, mask, w * mask[:, :, None, None, None]


@pytest.mark.parametrize('jit', [False, True])
@pytest.mark.parametrize('shape,pads,block', [
    ((2, 7, 2, 2, 8), (0, 3), 3),        # Blocks that do not divide T.
    ((2, 40, 1, 4, 8), (0, 17), 16),     # GQA with 4 queries per kv head.
    ((1, 16, 2, 1, 4), (5,), 16),        # One block.
])
def test_matches_dense(shape, pads, block, jit):
  q, k, v, mask, w = _inputs(*shape, pads)
  blocked = lambda q, k, v: attention.causal_attention(q, k, v, mask, block=block)
  # The reference jitted in both variants: eager, each primitive compiles on its own.
  dense = jax.jit(lambda q, k, v: dense_attention(q, k, v, mask))
  if jit:
    blocked = jax.jit(blocked)
  valid = np.asarray(mask)[:, :, None, None, None]
  out_blocked, out_dense = blocked(q, k, v), dense(q, k, v)
  assert np.all(np.isfinite(out_blocked))  # Pad rows too: every key masked, still finite.
  np.testing.assert_allclose(np.where(valid, out_blocked, 0), np.where(valid, out_dense, 0),
                             atol=2e-6)
  grads_blocked = jax.grad(lambda *a: jnp.sum(w * blocked(*a)), argnums=(0, 1, 2))(q, k, v)
  grads_dense = jax.jit(jax.grad(lambda *a: jnp.sum(w * dense(*a)), argnums=(0, 1, 2)))(q, k, v)
  for name, gb, gd in zip('qkv', grads_blocked, grads_dense):
    np.testing.assert_allclose(gb, gd, atol=1e-5, err_msg=f'd loss / d {name}')


def test_padded_keys_get_no_gradient():
  # A key that is padding is attended by nobody, so its k and v gradients are exactly 0.
  q, k, v, mask, w = _inputs(2, 12, 1, 2, 4, pads=(4, 0))
  _, dk, dv = jax.grad(lambda *a: jnp.sum(w * attention.causal_attention(*a, mask, block=5)),
                       argnums=(0, 1, 2))(q, k, v)
  assert np.all(np.asarray(dk)[0, :4] == 0) and np.all(np.asarray(dv)[0, :4] == 0)
  assert np.all(np.abs(np.asarray(dv)[1]) > 0)


def test_block_size_bounds_the_number_of_blocks():
  assert attention.block_size(100) == 100
  assert attention.block_size(512) == 64
  assert attention.block_size(4096) == 256  # 16 blocks.


def _segment(rng, rows, k, dh, slots, valid):
  keys = jnp.asarray(rng.standard_normal((rows, k, dh, slots)), jnp.float32)
  values = jnp.asarray(rng.standard_normal((rows, k, slots, dh)), jnp.float32)
  return keys, values, jnp.asarray(valid)


@pytest.mark.parametrize('t', [1, 3])
def test_cache_attention_equals_dense_softmax_over_the_segments(t):
  # A shared segment (2 rows, each read by G = 3 rows, one invalid slot), a per-row segment
  # with a left-padded row, and the call's own segment, causal over its t new slots.
  n, g, k, r, dh = 6, 3, 2, 2, 8
  rng = np.random.default_rng(1)
  q = jnp.asarray(rng.standard_normal((n, t, k, r, dh)), jnp.float32)
  shared_valid = np.ones((n // g, 5), bool)
  shared_valid[1, 0] = False
  history_valid = np.ones((n, 4), bool)
  history_valid[2, :3] = False
  own_valid = np.tril(np.ones((t, t), bool))[None].repeat(n, 0)  # NxTxS
  shared = _segment(rng, n // g, k, dh, 5, shared_valid)
  history = _segment(rng, n, k, dh, 4, history_valid)
  own = _segment(rng, n, k, dh, t, own_valid)
  segments = [
      (shared[0], shared[1], np.broadcast_to(shared_valid[:, None], (n // g, t, 5))),
      (history[0], history[1], np.broadcast_to(history_valid[:, None], (n, t, 4))),
      own]
  out = attention.cache_attention(q, segments, dtype=jnp.float32)

  # Dense reference: every row's slots laid end to end, the shared ones repeated G times.
  rep = lambda x: np.repeat(np.asarray(x), g, axis=0)
  keys = np.concatenate([rep(shared[0]), history[0], own[0]], axis=-1)      # NxKxDhxS
  values = np.concatenate([rep(shared[1]), history[1], own[1]], axis=-2)    # NxKxSxDh
  allowed = np.concatenate([rep(segments[0][2]), segments[1][2], own_valid], axis=-1)
  s = np.einsum('ntkrd,nkds->nkrts', np.asarray(q), keys) / np.sqrt(dh)
  s = np.where(allowed[:, None, None], s, -np.inf)
  p = np.exp(s - s.max(-1, keepdims=True))
  p /= p.sum(-1, keepdims=True)
  want = np.einsum('nkrts,nksd->ntkrd', p, values)
  np.testing.assert_allclose(out, want, atol=1e-5, rtol=1e-5)
