"""moe.py / moe_config.py: routing by hand, replay, ragged dispatch vs a dense loop, parity with
transformers' Qwen3-MoE and Qwen2-MoE sparse blocks, expert parallelism on 8 fake devices, the
auxiliary losses, bad configs, HF names."""

import functools
import math
import tempfile

import jax
import jax.numpy as jnp
from jax.sharding import AxisType, NamedSharding, PartitionSpec as P
import numpy as np
import pytest
import torch
from transformers import Qwen2MoeConfig, Qwen3MoeConfig
from transformers.models.qwen2_moe import modeling_qwen2_moe
from transformers.models.qwen3_moe import modeling_qwen3_moe

from rlreason.model import moe
from rlreason.model import moe_config


def _max_rel(a, b):
  a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
  return float(np.abs(a - b).max() / max(np.abs(b).max(), 1e-30))


def _tree_max_abs(a, b):
  return max(float(np.abs(np.asarray(x) - np.asarray(y)).max())
             for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)))


# ----------------------------------------------------------------------------- routing


def test_route_by_hand_four_experts_top2():
  # Row 0: logits = log p, so softmax = p = [0.1, 0.4, 0.3, 0.2] (softmax of logs of a
  #   distribution is the distribution); top-2 = experts 1, 2 with 0.4, 0.3; renormalised
  #   0.4/0.7 = 4/7, 0.3/0.7 = 3/7.
  # Row 1: all logits equal: p = 1/4 each, a 4-way tie -> the lower indices 0, 1; 0.25 each,
  #   renormalised 0.5 each.
  # Row 2: p = [0.3, 0.1, 0.3, 0.3]: a 3-way tie for two places -> experts 0, 2.
  logits_NxE = jnp.log(jnp.array([[0.1, 0.4, 0.3, 0.2], [0.25] * 4, [0.3, 0.1, 0.3, 0.3]]))
  ids, w = moe.route(logits_NxE, top_k=2, norm_topk_prob=False)
  np.testing.assert_array_equal(ids, [[1, 2], [0, 1], [0, 2]])
  np.testing.assert_allclose(w, [[0.4, 0.3], [0.25, 0.25], [0.3, 0.3]], rtol=1e-6)
  ids, w = moe.route(logits_NxE, top_k=2, norm_topk_prob=True)
  np.testing.assert_array_equal(ids, [[1, 2], [0, 1], [0, 2]])
  np.testing.assert_allclose(w, [[4 / 7, 3 / 7], [0.5, 0.5], [0.5, 0.5]], rtol=1e-6)
  assert ids.dtype == jnp.int32
  # Under jit, the same.
  jit_ids, jit_w = jax.jit(lambda l: moe.route(l, top_k=2, norm_topk_prob=True))(logits_NxE)
  np.testing.assert_array_equal(jit_ids, ids)
  np.testing.assert_allclose(jit_w, w, rtol=1e-6)


def test_route_replay_uses_live_softmax_at_the_replayed_ids():
  # p = [0.1, 0.4, 0.3, 0.2]; replaying experts (0, 3): weights p[0], p[3] = 0.1, 0.2,
  # renormalised 1/3, 2/3. A row of -1 (no recorded route) routes live: (1, 2).
  logits_NxE = jnp.log(jnp.array([[0.1, 0.4, 0.3, 0.2]] * 2))
  forced = jnp.array([[0, 3], [-1, -1]])
  ids, w = moe.route(logits_NxE, top_k=2, norm_topk_prob=False, forced_ids_NxK=forced)
  np.testing.assert_array_equal(ids, [[0, 3], [1, 2]])
  np.testing.assert_allclose(w, [[0.1, 0.2], [0.4, 0.3]], rtol=1e-6)
  ids, w = moe.route(logits_NxE, top_k=2, norm_topk_prob=True, forced_ids_NxK=forced)
  np.testing.assert_allclose(w, [[1 / 3, 2 / 3], [4 / 7, 3 / 7]], rtol=1e-6)
  # Replaying the live choice is no replay.
  live = moe.route(logits_NxE, top_k=2, norm_topk_prob=True)
  again = moe.route(logits_NxE, top_k=2, norm_topk_prob=True, forced_ids_NxK=live[0])
  np.testing.assert_array_equal(again[0], live[0])
  np.testing.assert_array_equal(again[1], live[1])


@pytest.mark.parametrize('norm', [False, True])
def test_router_gradient_under_replay_is_nonzero_and_the_masked_gather_zeroes_it(norm):
  # The live router now prefers experts 1, 2; the recorded route is 1, 3: expert 3 drifted out.
  logits_NxE = jnp.log(jnp.array([[0.1, 0.4, 0.3, 0.2]]))
  forced = jnp.array([[1, 3]])
  c_K = jnp.array([0.0, 1.0])  # The loss is the drifted expert's weight.

  def loss(logits):
    return jnp.sum(moe.route(logits, top_k=2, norm_topk_prob=norm, forced_ids_NxK=forced)[1] * c_K)

  def masked_gather_loss(logits):  # The bug class: gather from the top-k-masked probabilities.
    probs = jax.nn.softmax(logits, axis=-1)
    top_ids = jax.lax.top_k(probs, 2)[1]
    masked = probs * jnp.sum(jax.nn.one_hot(top_ids, 4), axis=1)
    w = jnp.take_along_axis(masked, forced, axis=-1)
    if norm:
      w = w / jnp.sum(w, -1, keepdims=True)
    return jnp.sum(w * c_K)

  g = jax.grad(loss)(logits_NxE)
  assert float(jnp.abs(g[0, 3])) > 1e-3, g
  # The masked gather: expert 3's weight is a constant 0, so the router gets no gradient from it.
  np.testing.assert_array_equal(jax.grad(masked_gather_loss)(logits_NxE), 0.0)


# ----------------------------------------------------------------------------- dispatch


def _dense_loop(params, x_NxD, *, top_k, norm, forced=None):
  """Every expert on every token, weighted by its (zero where unrouted) routing weight."""
  x_NxD = x_NxD.reshape(-1, x_NxD.shape[-1])
  ids, w = moe.route(x_NxD @ params['router'], top_k=top_k, norm_topk_prob=norm,
                     forced_ids_NxK=forced)
  y_NxD = 0.0
  for e in range(params['gate'].shape[0]):
    h_NxD = (jax.nn.silu(x_NxD @ params['gate'][e]) * (x_NxD @ params['up'][e])) @ params['down'][e]
    y_NxD = y_NxD + jnp.sum(jnp.where(ids == e, w, 0.0), axis=-1)[:, None] * h_NxD
  if 'shared' in params:
    sh = params['shared']
    gate_N = jax.nn.sigmoid(x_NxD @ params['shared_expert_gate'])
    y_NxD += gate_N[:, None] * ((jax.nn.silu(x_NxD @ sh['gate']) * (x_NxD @ sh['up'])) @ sh['down'])
  return y_NxD


def _params(seed, *, d=16, e=8, i=12, shared=0, router_scale=25.0):
  p = moe.init_moe_params(jax.random.key(seed), hidden_size=d, num_experts=e,
                          moe_intermediate_size=i, shared_expert_intermediate_size=shared)
  p['router'] = p['router'] * router_scale  # Decisive routing, uneven groups.
  return p


@pytest.mark.parametrize('top_k,norm,shared,use_jit,grouped', [
    (1, False, 0, True, 'ragged_dot'), (2, True, 0, False, 'ragged_dot'),
    (4, False, 10, True, 'ragged_dot'), (2, True, 10, True, 'tiled')])
def test_ragged_dispatch_equals_dense_loop_values_and_gradients(top_k, norm, shared, use_jit,
                                                                grouped):
  params = _params(0, shared=shared)
  x_BxTxD = jax.random.normal(jax.random.key(1), (2, 7, 16))
  block = lambda p, x: moe.moe_mlp(p, x, top_k=top_k, norm_topk_prob=norm,
                                   grouped=grouped)[0].reshape(-1, 16)
  if use_jit:
    block = jax.jit(block)
  y, ref = block(params, x_BxTxD), _dense_loop(params, x_BxTxD, top_k=top_k, norm=norm)
  assert float(jnp.abs(y - ref).max()) <= 1e-5
  r_NxD = jax.random.normal(jax.random.key(2), (14, 16))
  grads = jax.grad(lambda p, x: jnp.sum(block(p, x) * r_NxD), argnums=(0, 1))(params, x_BxTxD)
  ref_grads = jax.jit(jax.grad(
      lambda p, x: jnp.sum(_dense_loop(p, x, top_k=top_k, norm=norm) * r_NxD),
      argnums=(0, 1)))(params, x_BxTxD)
  assert _tree_max_abs(grads, ref_grads) <= 1e-5


@pytest.mark.parametrize('sizes,tile', [([3, 0, 17, 9, 4], 8), ([0, 0, 50], 16),
                                        ([5, 5, 5, 5], 32), ([1] * 6, 4)])
def test_tiled_grouped_matmul_equals_ragged_dot(sizes, tile):
  # Empty groups, a group spanning several tiles, one tile holding many groups, and rows past
  # the groups (37 > 33, 64 > 50, 40 > 6), which must come out 0.
  rows = {8: 37, 16: 64, 32: 20, 4: 40}[tile]
  rng = np.random.default_rng(tile)
  x_RxD = jnp.asarray(rng.normal(size=(rows, 6)), jnp.float32)
  w_GxDxI = jnp.asarray(rng.normal(size=(len(sizes), 6, 3)), jnp.float32)
  sizes_G = jnp.asarray(sizes, jnp.int32)
  tiled = jax.jit(lambda x, w: moe.tiled_grouped_matmul(x, w, sizes_G, tile=tile))
  ragged = lambda x, w: jax.lax.ragged_dot(x, w, sizes_G)
  y = tiled(x_RxD, w_GxDxI)
  assert float(jnp.abs(y - ragged(x_RxD, w_GxDxI)).max()) <= 1e-5
  np.testing.assert_array_equal(y[sum(sizes):], 0.0)
  grad = lambda f: jax.grad(lambda x, w: jnp.sum(jnp.sin(f(x, w))), argnums=(0, 1))(x_RxD, w_GxDxI)
  assert _tree_max_abs(grad(tiled), grad(ragged)) <= 1e-5


# ----------------------------------------------------------------------------- parity


def _hf_block(family, *, d, e, i, k, norm, shared, seed):
  torch.manual_seed(seed)
  kw = dict(hidden_size=d, num_experts=e, moe_intermediate_size=i, num_experts_per_tok=k,
            norm_topk_prob=norm, num_hidden_layers=1, num_attention_heads=2,
            num_key_value_heads=1, vocab_size=32, intermediate_size=24)
  if family == 'qwen2':
    block = modeling_qwen2_moe.Qwen2MoeSparseMoeBlock(
        Qwen2MoeConfig(shared_expert_intermediate_size=shared, **kw))
  else:
    block = modeling_qwen3_moe.Qwen3MoeSparseMoeBlock(Qwen3MoeConfig(**kw))
  with torch.no_grad():
    for name, p in block.named_parameters():  # The router inits to zeros: every token a tie.
      p.normal_(0.0, 0.5 if name == 'gate.weight' else 0.1)
  return block.double().float()


def _to_hf_fused(g, *, shared):
  out = {'gate.weight': g['router'].T,
         'experts.gate_up_proj': np.concatenate([np.swapaxes(g['gate'], 1, 2),
                                                 np.swapaxes(g['up'], 1, 2)], axis=1),
         'experts.down_proj': np.swapaxes(g['down'], 1, 2)}
  if shared:
    out.update({f'shared_expert.{n}_proj.weight': g['shared'][n].T
                for n in ('gate', 'up', 'down')})
    out['shared_expert_gate.weight'] = g['shared_expert_gate'][None]
  return out


@pytest.mark.parametrize('family', ['qwen3', 'qwen2'])
@pytest.mark.parametrize('top_k', [2, 4])
@pytest.mark.parametrize('norm', [False, True])
def test_block_matches_transformers_values_and_gradients(family, top_k, norm):
  d, e, i, shared = 16, 8, 12, (20 if family == 'qwen2' else 0)
  hf = _hf_block(family, d=d, e=e, i=i, k=top_k, norm=norm, shared=shared, seed=top_k + 2 * norm)
  tensors = {k: v.detach().numpy() for k, v in hf.state_dict().items()}
  params = jax.tree.map(jnp.asarray, moe_config.moe_params_from_hf(
      tensors, '', num_experts=e, shared_expert=bool(shared)))
  x_np = np.random.default_rng(top_k).normal(size=(2, 9, d)).astype(np.float32)
  r_np = np.random.default_rng(7).normal(size=(2, 9, d)).astype(np.float32)

  x_t = torch.tensor(x_np, requires_grad=True)
  y_t = hf(x_t)
  (y_t * torch.tensor(r_np)).sum().backward()
  block = jax.jit(lambda p, x: moe.moe_mlp(p, x, top_k=top_k, norm_topk_prob=norm)[0])
  y = block(params, jnp.asarray(x_np))
  assert float(np.abs(np.asarray(y) - y_t.detach().numpy()).max()) <= 1e-5

  gp, gx = jax.grad(lambda p, x: jnp.sum(block(p, x) * r_np), argnums=(0, 1))(params, x_np)
  assert _max_rel(gx, x_t.grad.numpy()) <= 1e-4
  ours = _to_hf_fused(jax.tree.map(np.asarray, gp), shared=shared)
  for name, p in hf.named_parameters():
    assert _max_rel(ours[name], p.grad.numpy()) <= 1e-4, name


# ----------------------------------------------------------------------------- expert parallel


@pytest.mark.parametrize('shards,grouped', [(2, 'ragged_dot'), (4, 'tiled'), (8, 'ragged_dot')])
def test_expert_parallel_equals_single_device(shards, grouped):
  assert jax.device_count() == 8
  mesh = jax.make_mesh((8 // shards, shards), ('data', 'expert'),
                       axis_types=(AxisType.Auto,) * 2)
  params = _params(3, shared=10)
  # The experts' weights live sharded over 'expert' (PARAM_AXES' first axis), the rest whole.
  placed = {k: jax.device_put(v, NamedSharding(mesh, P('expert') if k in ('gate', 'up', 'down')
                                                else P())) for k, v in params.items()}
  x_BxTxD = jax.random.normal(jax.random.key(4), (3, 5, 16))  # 15 tokens: padded per shard.
  r_BxTxD = jax.random.normal(jax.random.key(5), (3, 5, 16))
  run = lambda mesh: jax.jit(
      lambda p, x: moe.moe_mlp(p, x, top_k=2, norm_topk_prob=True, mesh=mesh, grouped=grouped))
  (y1, routed1), (yS, routedS) = run(None)(params, x_BxTxD), run(mesh)(placed, x_BxTxD)
  assert float(jnp.abs(yS - y1).max()) <= 1e-5
  np.testing.assert_array_equal(routedS.expert_ids_NxK, routed1.expert_ids_NxK)
  grad = lambda mesh, p: jax.grad(lambda p, x: jnp.sum(run(mesh)(p, x)[0] * r_BxTxD),
                                  argnums=(0, 1))(p, x_BxTxD)
  assert _tree_max_abs(grad(mesh, placed), grad(None, params)) <= 1e-5


# ----------------------------------------------------------------------------- replay in the block


def test_replay_of_recorded_routes():
  params = _params(6, shared=10)
  x_NxD = jax.random.normal(jax.random.key(7), (24, 16))
  block = jax.jit(lambda p, x, f: moe.moe_mlp(p, x, top_k=2, norm_topk_prob=True,
                                              forced_ids_NxK=f))
  y, routed = block(params, x_NxD, None)
  recorded = routed.expert_ids_NxK
  # Nothing drifted: replaying the recorded routes is the unreplayed forward.
  y_replay, routed_replay = block(params, x_NxD, recorded)
  np.testing.assert_array_equal(y_replay, y)
  np.testing.assert_array_equal(routed_replay.expert_ids_NxK, recorded)
  # A perturbed router chooses other experts for some tokens; replay keeps the recorded ones
  # and equals the dense loop with the recorded ids, and the router still gets gradients.
  drifted = dict(params, router=params['router']
                 + 0.5 * jax.random.normal(jax.random.key(8), params['router'].shape))
  live = block(drifted, x_NxD, None)[1].expert_ids_NxK
  changed = np.any(np.sort(np.asarray(live), -1) != np.sort(np.asarray(recorded), -1), -1)
  assert 0 < changed.sum() < len(changed)
  y_replay, routed_replay = block(drifted, x_NxD, recorded)
  np.testing.assert_array_equal(routed_replay.expert_ids_NxK, recorded)
  ref = jax.jit(functools.partial(_dense_loop, top_k=2, norm=True))(drifted, x_NxD, forced=recorded)
  assert float(jnp.abs(y_replay - ref).max()) <= 1e-5
  g_router = jax.grad(lambda p: jnp.sum(block(p, x_NxD, recorded)[0] ** 2))(drifted)['router']
  assert float(jnp.abs(g_router).max()) > 1e-6


# ----------------------------------------------------------------------------- auxiliary losses


def test_load_balancing_loss_by_hand():
  # Two experts, top-1. Tokens 0, 1: p = [0.75, 0.25] -> both to expert 0: f = [1, 0],
  # P = [0.75, 0.25]; loss = E * sum f*P = 2 * 0.75 = 1.5. Token 2 (p = [0.1, 0.9]) masked out.
  logits_NxE = jnp.log(jnp.array([[0.75, 0.25], [0.75, 0.25], [0.1, 0.9]]))
  loss = moe.load_balancing_loss([logits_NxE], top_k=1, mask_N=jnp.array([1, 1, 0]))
  np.testing.assert_allclose(loss, 1.5, rtol=1e-6)
  # Unmasked: f = [2/3, 1/3], P = [1.6/3, 1.4/3]; loss = 2 * (3.2 + 1.4) / 9 = 9.2 / 9.
  np.testing.assert_allclose(moe.load_balancing_loss([logits_NxE], top_k=1), 9.2 / 9, rtol=1e-6)
  # z-loss: logsumexp of log-probabilities is log 1 = 0; of [0, 0] it is log 2.
  np.testing.assert_allclose(moe.router_z_loss([logits_NxE]), 0.0, atol=1e-6)
  np.testing.assert_allclose(moe.router_z_loss([jnp.zeros((4, 2))]), math.log(2) ** 2, rtol=1e-6)


def test_load_balancing_loss_equals_transformers_on_raw_logits():
  rng = np.random.default_rng(0)
  layers = [rng.normal(size=(2 * 6, 8)).astype(np.float32) * 2 for _ in range(3)]
  mask_BxT = np.ones((2, 6), np.int64)
  mask_BxT[0, :2] = 0  # Left padding.
  for mask in (None, mask_BxT):
    theirs = modeling_qwen3_moe.load_balancing_loss_func(
        tuple(torch.tensor(l) for l in layers), 8, 4,
        None if mask is None else torch.tensor(mask))
    ours = moe.load_balancing_loss([jnp.asarray(l) for l in layers], top_k=4,
                                   mask_N=None if mask is None else jnp.asarray(mask).reshape(-1))
    np.testing.assert_allclose(ours, theirs.numpy(), rtol=1e-5)
  # The bug of issue 45120 (probabilities handed over as logits) gives a different, flatter
  # loss: the function must be given raw logits.
  probs = tuple(torch.softmax(torch.tensor(l), -1) for l in layers)
  double = modeling_qwen3_moe.load_balancing_loss_func(probs, 8, 4).numpy()
  assert abs(float(ours) - float(double)) > 1e-3


def test_routing_stats_by_hand():
  # 2 layers x 3 tokens, top-2 of 4 experts; token 2 is masked out.
  # Layer 0: token 0 same set ({0,1} vs {1,0}), token 1 shares one of two ({2,3} vs {2,0}).
  # Layer 1: both tokens agree. So 1 of 4 decisions differs (0.25); mismatch = (0.5)/4 = 0.125;
  # 1 of 2 tokens differs in some layer (0.5). Load of `ids` in layer 0: experts 0,1,2,3 get
  # 1,1,1,1 slots (max/mean 1); layer 1: {0,1},{0,1} -> 2,2,0,0 (max 2 / mean 1 = 2); mean 1.5.
  ids = jnp.array([[[0, 1], [2, 3], [3, 2]], [[0, 1], [1, 0], [3, 2]]])
  other = jnp.array([[[1, 0], [2, 0], [0, 1]], [[0, 1], [0, 1], [0, 1]]])
  stats = moe.routing_stats(ids, other, num_experts=4, mask_N=jnp.array([1, 1, 0]))
  np.testing.assert_allclose([stats[k] for k in ('disagreement', 'mismatch_rate',
                                                 'tokens_any_layer_differ', 'load_max_over_mean')],
                             [0.25, 0.125, 0.5, 1.5], rtol=1e-6)
  same = moe.routing_stats(ids, ids, num_experts=4)
  assert float(same['disagreement']) == float(same['tokens_any_layer_differ']) == 0.0


# ----------------------------------------------------------------------------- config


def test_bad_configs_rejected_naming_the_field():
  cfg = moe_config.MoEConfig(num_experts=8, num_experts_per_tok=2, moe_intermediate_size=16)
  moe_config.check_moe(cfg, expert_axis_size=4, num_layers=4)
  with pytest.raises(ValueError, match='num_experts_per_tok=9'):
    moe_config.check_moe(cfg.__class__(**{**cfg.__dict__, 'num_experts_per_tok': 9}))
  with pytest.raises(ValueError, match='mesh.expert=3 does not divide moe num_experts=8'):
    moe_config.check_moe(cfg, expert_axis_size=3)
  with pytest.raises(ValueError, match='decoder_sparse_step=0'):
    moe_config.check_moe(cfg.__class__(**{**cfg.__dict__, 'decoder_sparse_step': 0}))
  with pytest.raises(ValueError, match='mlp_only_layers'):
    moe_config.check_moe(cfg.__class__(**{**cfg.__dict__, 'mlp_only_layers': (4,)}), num_layers=4)
  mesh = jax.make_mesh((2, 4), ('data', 'expert'), axis_types=(AxisType.Auto,) * 2)
  with pytest.raises(ValueError, match="'expert' of size 4 does not divide num_experts=6"):
    moe.moe_mlp(_params(0, e=6), jnp.ones((4, 16)), top_k=2, norm_topk_prob=False, mesh=mesh)
  with pytest.raises(ValueError, match="grouped='dense'"):
    moe.moe_mlp(_params(0), jnp.ones((4, 16)), top_k=2, norm_topk_prob=False, grouped='dense')
  with pytest.raises(ValueError, match="'num_experts' missing"):
    moe_config.moe_config_from_hf({'model_type': 'mixtral'})


def test_config_from_hf_and_which_layers_are_sparse():
  hf = Qwen3MoeConfig(num_hidden_layers=6, decoder_sparse_step=2, mlp_only_layers=[3],
                      num_experts=4, num_experts_per_tok=2, norm_topk_prob=True,
                      hidden_size=16, moe_intermediate_size=8, intermediate_size=24,
                      num_attention_heads=2, num_key_value_heads=1, vocab_size=32)
  cfg = moe_config.moe_config_from_hf(hf.to_dict())
  assert cfg == moe_config.MoEConfig(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=8,
                                     norm_topk_prob=True, decoder_sparse_step=2,
                                     mlp_only_layers=(3,), shared_expert_intermediate_size=0,
                                     router_aux_loss_coef=0.001)
  sparse = [isinstance(modeling_qwen3_moe.Qwen3MoeDecoderLayer(hf, i).mlp,
                       modeling_qwen3_moe.Qwen3MoeSparseMoeBlock) for i in range(6)]
  assert sparse == [moe_config.is_moe_layer(i, cfg) for i in range(6)]
  assert sparse == [False, True, False, False, False, True]
  qwen2 = moe_config.moe_config_from_hf({'model_type': 'qwen2_moe', 'num_experts': 4})
  assert (qwen2.num_experts, qwen2.num_experts_per_tok, qwen2.shared_expert_intermediate_size) == (
      4, 4, 5632)


def test_hf_names_round_trip_and_match_save_pretrained():
  hf_cfg = Qwen2MoeConfig(vocab_size=32, hidden_size=16, intermediate_size=24,
                          moe_intermediate_size=8, shared_expert_intermediate_size=12,
                          num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1,
                          num_experts=4, num_experts_per_tok=2)
  torch.manual_seed(0)
  model = modeling_qwen2_moe.Qwen2MoeForCausalLM(hf_cfg)
  with torch.no_grad():
    for p in model.parameters():
      p.normal_()
  prefix = 'model.layers.0.mlp.'
  fused = {k: v.detach().numpy() for k, v in model.state_dict().items()}
  params = moe_config.moe_params_from_hf(fused, prefix, num_experts=4, shared_expert=True)
  assert params['gate'].shape == (4, 16, 8) and params['down'].shape == (4, 8, 16)
  with tempfile.TemporaryDirectory() as d:
    model.save_pretrained(d)
    from safetensors.numpy import load_file
    on_disk = load_file(f'{d}/model.safetensors')
  exported = moe_config.moe_params_to_hf(params, prefix)
  assert set(exported) == {k for k in on_disk if k.startswith(prefix)}
  for k, v in exported.items():
    np.testing.assert_array_equal(v, on_disk[k])
  again = moe_config.moe_params_from_hf(on_disk, prefix, num_experts=4, shared_expert=True)
  jax.tree.map(np.testing.assert_array_equal, again, params)
