"""Vocabulary-parallel token statistics on the 8 fake devices: values and gradients equal the
unsharded full-logits path, the compiled program gathers nothing vocabulary-sized, the
automatic choice (and update.completion_stats through it) takes the sharded path only where the
rules shard the vocabulary, and a vocabulary the devices do not divide is rejected by name."""

import functools
import re

import chex
import jax
import jax.numpy as jnp
from jax.sharding import NamedSharding, PartitionSpec as P
import numpy as np
import pytest

from rlreason.model import sharding
from rlreason.model import transformer
from rlreason.objectives import token_stats
from rlreason.objectives import vocab_parallel
from rlreason.rl import update

TOL = dict(atol=1e-5, rtol=1e-5)


def _problem(n=4, t=5, d=16, v=96, seed=0):
  k = jax.random.split(jax.random.key(seed), 5)
  h_NxTxD = jax.random.normal(k[0], (n, t, d))
  w_DxV = 0.5 * jax.random.normal(k[1], (d, v))
  tokens_NxT = jax.random.randint(k[2], (n, t), 0, v)
  cot_3xNxT = jax.random.normal(k[3], (3, n, t))
  mask_NxT = jax.random.bernoulli(k[4], 0.6, (n, t))  # Masked positions get no cotangent.
  return h_NxTxD, w_DxV, tokens_NxT, cot_3xNxT * mask_NxT


def _scalar(stats_fn, cot_3xNxT, h, w):
  s = stats_fn(h, w)
  return (jnp.sum(cot_3xNxT[0] * s.logprobs_NxT) + jnp.sum(cot_3xNxT[1] * s.entropy_NxT)
          + jnp.sum(cot_3xNxT[2] * s.sum_sq_probs_NxT))


def _uses_shard_map(f, *args):
  return 'shard_map' in str(jax.make_jaxpr(f)(*args))


def _check_against_unsharded(shape, temperature, variant):
  # 96 columns: 24 per device at tensor=4 (vocab_chunk 5: five blocks of 5, the last one
  # overlapping), 12 at 8 (three of 4). 20 positions: 10 per device at data=2 (token_chunk 3:
  # padded to 12).
  h, w, tokens, cot = _problem()
  chunks = dict(temperature=temperature, token_chunk=3, vocab_chunk=5)
  plain = lambda h, w: token_stats.token_stats(jnp.einsum('ntd,dv->ntv', h, w), tokens,
                                               temperature=temperature)
  parallel = lambda h, w: vocab_parallel.token_stats_from_hidden(h, w, tokens, **chunks)
  with jax.set_mesh(sharding.make_mesh(shape)):
    assert _uses_shard_map(parallel, h, w)
    got = variant(parallel)(h, w)
    g_got = variant(jax.grad(functools.partial(_scalar, parallel, cot), argnums=(0, 1)))(h, w)
  for a, b in zip(jax.tree.leaves(jax.jit(plain)(h, w)), jax.tree.leaves(got)):
    np.testing.assert_allclose(b, a, **TOL)
  g_want = jax.jit(jax.grad(functools.partial(_scalar, plain, cot), argnums=(0, 1)))(h, w)
  for a, b in zip(g_want, g_got):
    np.testing.assert_allclose(b, a, **TOL)


class VocabParallelTest(chex.TestCase):

  @chex.variants(with_jit=True, without_jit=True)
  def test_equals_unsharded_values_and_grads(self):
    _check_against_unsharded((2, 1, 4), 0.7, self.variant)

  def test_equals_unsharded_on_eight_vocabulary_shards(self):
    _check_against_unsharded((1, 1, 8), 1.0, jax.jit)


def test_sharded_gradient_gathers_nothing_vocabulary_sized():
  # V = 424 (106 columns per device) appears in no shape of the compiled per-device program,
  # whose only collectives are all-reduces: of per-position scalars, of dh (over tensor) and of
  # the dw shard (over data). The unsharded chunked kernel under the same shardings
  # all-gathers w (f32[16,424]): the check can fail.
  n, t, d, v = 4, 6, 16, 424
  mesh = sharding.make_mesh((2, 1, 4))
  args = (jax.ShapeDtypeStruct((n, t, d), jnp.float32),
          jax.ShapeDtypeStruct((d, v), jnp.float32),
          jax.ShapeDtypeStruct((n, t), jnp.int32))
  in_shardings = (NamedSharding(mesh, P('data')), NamedSharding(mesh, P(None, 'tensor')),
                  NamedSharding(mesh, P('data')))

  def compiled_text(stats_fn):
    def loss(h, w, tokens):
      s = stats_fn(h, w, tokens, token_chunk=8, vocab_chunk=32)
      return jnp.sum(s.logprobs_NxT) + jnp.sum(s.entropy_NxT) + jnp.sum(s.sum_sq_probs_NxT)
    with jax.set_mesh(mesh):
      grad = jax.jit(jax.grad(loss, argnums=(0, 1)), in_shardings=in_shardings)
      return grad.lower(*args).compile().as_text()

  def vocab_shapes(text):
    return [s for s in re.findall(r'[a-z0-9]+\[[0-9,]*\]', text) if re.search(rf'\b{v}\b', s)]

  text = compiled_text(vocab_parallel.token_stats_from_hidden)
  assert not vocab_shapes(text), vocab_shapes(text)[:5]
  assert not re.search(r'all-gather|all-to-all|collective-permute', text)
  assert 'all-reduce' in text
  unsharded = compiled_text(token_stats.token_stats_from_hidden)
  assert re.search(rf'f32\[{d},{v}\][^\n]* all-gather\(', unsharded)


def test_automatic_choice_follows_the_rules():
  h, w, tokens, _ = _problem()
  f = lambda h, w: vocab_parallel.token_stats_from_hidden(h, w, tokens)
  assert not _uses_shard_map(f, h, w)  # No mesh.
  with jax.set_mesh(sharding.make_mesh((8, 1, 1))):  # tensor = 1.
    assert not _uses_shard_map(f, h, w)
  with jax.set_mesh(sharding.make_mesh((1, 2, 4))):
    assert _uses_shard_map(f, h, w)
    # 97 columns do not split 4 ways: the rules leave the LM head replicated over tensor
    # (sharding.logical_to_spec), and so does this, with the unsharded kernel.
    h, w, tokens, _ = _problem(v=97)
    g = lambda h, w: vocab_parallel.token_stats_from_hidden(h, w, tokens, temperature=0.7)
    assert not _uses_shard_map(g, h, w)
    want = token_stats.token_stats(jnp.einsum('ntd,dv->ntv', h, w), tokens, temperature=0.7)
    chex.assert_trees_all_close(jax.jit(g)(h, w), want, **TOL)


def test_explicit_axes_reject_a_vocabulary_they_do_not_divide():
  h, w, tokens, _ = _problem(v=97)
  mesh = sharding.make_mesh((1, 2, 4))
  with pytest.raises(ValueError, match=r'vocabulary \(97\) is not divisible by the 4 devices'):
    vocab_parallel.sharded_token_stats(h, w, tokens, mesh=mesh, vocab_axes=('tensor',))
  with pytest.raises(ValueError, match='3 rows do not split over the 2 devices'):
    vocab_parallel.sharded_token_stats(h[:3], w[:, :96], tokens[:3], mesh=mesh,
                                       vocab_axes=('tensor',), batch_axes=('fsdp',))


def test_completion_stats_gradient_under_a_tensor_mesh_equals_no_mesh():
  # update.completion_stats picks the vocabulary-parallel path by itself under an FSDP x TP
  # training mesh (the tied embedding's D sharded over fsdp, V over tensor; rows over fsdp);
  # the parameter gradient of its statistics is the one computed without a mesh.
  cfg = transformer.ModelConfig(vocab_size=48, hidden_size=16, intermediate_size=32,
                                num_layers=1, num_heads=4, num_kv_heads=2, head_dim=4,
                                tie_embeddings=True)
  n, t, length = 4, 9, 5
  k = jax.random.split(jax.random.key(1), 3)
  params = transformer.init_params(cfg, k[0])
  tokens = jax.random.randint(k[1], (n, t), 0, cfg.vocab_size)
  mask = jnp.ones((n, t), bool)
  cot = jax.random.normal(k[2], (3, n, length))

  def scalar(p):
    s = update.completion_stats(p, tokens, mask, cfg=cfg, completion_len=length,
                                temperature=0.8, token_chunk=4, vocab_chunk=5)
    return (jnp.sum(cot[0] * s.logprobs_NxT) + jnp.sum(cot[1] * s.entropy_NxT)
            + jnp.sum(cot[2] * s.sum_sq_probs_NxT))

  want = jax.jit(jax.value_and_grad(scalar))(params)
  mesh = sharding.make_mesh((1, 2, 4))
  with jax.set_mesh(mesh):
    assert _uses_shard_map(scalar, params)
    placed = jax.device_put(params, sharding.param_shardings(cfg, mesh, sharding.TRAIN_RULES))
    got = jax.jit(jax.value_and_grad(scalar))(placed)
  chex.assert_trees_all_close(got, want, **TOL)
