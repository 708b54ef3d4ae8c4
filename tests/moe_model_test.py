"""MoE in the model's forward: Qwen3-MoE / Qwen2-MoE checkpoints against transformers, export,
the expert-parallel mesh, replay of recorded routes, the config check, one RL step.

Block-level maths (routing, dispatch, losses) is tests/moe_test.py's.
"""

import functools
import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
import transformers

from rlreason.model import moe_config
from rlreason.model import moe_layer
from rlreason.model import sharding
from rlreason.model import transformer
from rlreason.model import weights

_BASE = dict(vocab_size=64, hidden_size=32, intermediate_size=48, moe_intermediate_size=16,
             num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=8,
             max_position_embeddings=64, rms_norm_eps=1e-6, tie_word_embeddings=False)

# (HF class, extra config): each mixes a dense and a sparse layer, or is all sparse.
HF_CASES = {
    'qwen3_top2_norm_mlp_only': ('Qwen3Moe', dict(num_experts=8, num_experts_per_tok=2,
                                                  norm_topk_prob=True, mlp_only_layers=[1])),
    'qwen3_top2_sparse_all': ('Qwen3Moe', dict(num_experts=4, num_experts_per_tok=2,
                                               norm_topk_prob=False)),
    'qwen2_top2_step2': ('Qwen2Moe', dict(num_experts=4, num_experts_per_tok=2,
                                          norm_topk_prob=False, decoder_sparse_step=2,
                                          shared_expert_intermediate_size=24)),
    'qwen2_top4_norm': ('Qwen2Moe', dict(num_experts=8, num_experts_per_tok=4,
                                         norm_topk_prob=True, shared_expert_intermediate_size=24)),
}


def _save_hf(case, path):
  """A random tiny HF MoE checkpoint (routers scaled up so the top-k is far from ties)."""
  kind, extra = HF_CASES[case]
  hf_cfg = getattr(transformers, f'{kind}Config')(**_BASE, **extra)
  torch.manual_seed(0)
  model = getattr(transformers, f'{kind}ForCausalLM')(hf_cfg).eval()
  with torch.no_grad():
    for name, p in model.named_parameters():
      if name.endswith('mlp.gate.weight'):
        p.normal_(0.0, 1.0)
  model.save_pretrained(path)
  return path


def _batch(t=12):
  tokens_NxT = np.random.default_rng(1).integers(0, _BASE['vocab_size'], size=(3, t))
  mask_NxT = np.ones((3, t), bool)
  mask_NxT[0, :4] = False  # Left padding.
  mask_NxT[2, :1] = False
  return tokens_NxT, mask_NxT


def _hf_logits(path, tokens_NxT, mask_NxT):
  model = transformers.AutoModelForCausalLM.from_pretrained(
      path, dtype=torch.float32, attn_implementation='eager').eval()
  positions_NxT = np.maximum(np.cumsum(mask_NxT, axis=1) - 1, 0)  # default_positions.
  with torch.no_grad():
    return model(input_ids=torch.tensor(tokens_NxT), attention_mask=torch.tensor(mask_NxT),
                 position_ids=torch.tensor(positions_NxT)).logits.numpy()


def _forward(cfg, params, tokens_NxT, mask_NxT, **kw):
  return jax.jit(functools.partial(transformer.apply, cfg=cfg, return_routing=True, **kw))(
      params, tokens_NxT, mask_NxT=mask_NxT)


@pytest.fixture(scope='module', name='ckpts')
def _ckpts(tmp_path_factory):
  root = tmp_path_factory.mktemp('moe_ckpts')
  return {case: _save_hf(case, root / case) for case in HF_CASES}


@pytest.mark.parametrize('case', sorted(HF_CASES))
def test_logits_match_transformers(case, ckpts):
  cfg, params = weights.load(ckpts[case])
  _, extra = HF_CASES[case]
  assert cfg.moe.num_experts == extra['num_experts']
  assert cfg.moe.norm_topk_prob == extra['norm_topk_prob']
  tokens_NxT, mask_NxT = _batch()
  logits_NxTxV, _, routing = _forward(cfg, params, tokens_NxT, mask_NxT)
  want_NxTxV = _hf_logits(ckpts[case], tokens_NxT, mask_NxT)
  np.testing.assert_allclose(np.asarray(logits_NxTxV)[mask_NxT], want_NxTxV[mask_NxT],
                             atol=1e-4, rtol=1e-4)
  sparse = [i for i in range(cfg.num_layers) if moe_config.is_moe_layer(i, cfg.moe)]
  assert routing.expert_ids_LxNxTxK.shape == (len(sparse), 3, 12, extra['num_experts_per_tok'])


def test_aux_loss_matches_transformers(ckpts):
  case = 'qwen3_top2_sparse_all'
  cfg, params = weights.load(ckpts[case])
  tokens_NxT = _batch()[0]
  _, _, routing = _forward(cfg, params, tokens_NxT, None)
  ours = moe_layer.aux_losses(routing, cfg=cfg.moe)
  model = transformers.AutoModelForCausalLM.from_pretrained(ckpts[case], dtype=torch.float32)
  with torch.no_grad():
    out = model(input_ids=torch.tensor(tokens_NxT), output_router_logits=True)
  np.testing.assert_allclose(float(ours['load_balancing']), float(out.aux_loss), rtol=1e-5)
  assert float(ours['z']) > 0


@pytest.mark.parametrize('case', ['qwen3_top2_norm_mlp_only', 'qwen2_top2_step2'])
def test_export_round_trip(case, ckpts, tmp_path):
  cfg, params = weights.load(ckpts[case])
  weights.save(tmp_path / 'out', cfg, params)
  again_cfg, again = weights.load(tmp_path / 'out')
  assert again_cfg == cfg
  jax.tree.map(lambda a, b: np.testing.assert_array_equal(np.asarray(a), np.asarray(b)),
               params, again)
  hf_config = json.loads((tmp_path / 'out' / 'config.json').read_text())
  assert hf_config['architectures'] == [HF_CASES[case][0] + 'ForCausalLM']
  tokens_NxT, mask_NxT = _batch()
  np.testing.assert_allclose(_hf_logits(tmp_path / 'out', tokens_NxT, mask_NxT)[mask_NxT],
                             _hf_logits(ckpts[case], tokens_NxT, mask_NxT)[mask_NxT], atol=1e-6)


def test_expert_parallel_mesh_equals_one_device(ckpts):
  cfg, params = weights.load(ckpts['qwen2_top4_norm'])
  tokens_NxT, mask_NxT = _batch()
  tokens_NxT, mask_NxT = np.concatenate([tokens_NxT] * 2)[:4], np.concatenate([mask_NxT] * 2)[:4]
  want_NxTxV, _, want = _forward(cfg, params, tokens_NxT, mask_NxT)
  mesh = sharding.make_mesh({'data': 1, 'fsdp': 2, 'tensor': 2, 'expert': 2})
  assert mesh.shape['expert'] == 2
  shardings = sharding.param_shardings(cfg, mesh, sharding.TRAIN_RULES)
  assert shardings['layers']['1']['mlp']['gate'].spec[0] == 'expert'
  with jax.set_mesh(mesh):
    placed = jax.device_put(params, shardings)
    rows = sharding.data_sharding(mesh, tokens_NxT.shape)
    got_NxTxV, _, got = _forward(cfg, placed, jax.device_put(tokens_NxT, rows),
                                 jax.device_put(mask_NxT, rows))
  np.testing.assert_allclose(np.asarray(got_NxTxV), np.asarray(want_NxTxV), atol=1e-5)
  np.testing.assert_array_equal(np.asarray(got.expert_ids_LxNxTxK),
                                np.asarray(want.expert_ids_LxNxTxK))


def test_forced_routes_reproduce_the_forward_and_survive_a_changed_router(ckpts):
  cfg, params = weights.load(ckpts['qwen3_top2_norm_mlp_only'])
  tokens_NxT, mask_NxT = _batch()
  logits_NxTxV, _, routing = _forward(cfg, params, tokens_NxT, mask_NxT)
  ids_LxNxTxK = routing.expert_ids_LxNxTxK
  replayed_NxTxV, _, again = _forward(cfg, params, tokens_NxT, mask_NxT, forced_routes=ids_LxNxTxK)
  np.testing.assert_array_equal(np.asarray(replayed_NxTxV), np.asarray(logits_NxTxV))
  np.testing.assert_array_equal(np.asarray(again.expert_ids_LxNxTxK), np.asarray(ids_LxNxTxK))
  # A perturbed router chooses other experts; replay keeps the recorded ones, except where a
  # token's ids are -1 (no record: routed live).
  moved = jax.tree.map(lambda x: x, params)
  router = moved['layers']['0']['mlp']['router']
  moved['layers']['0']['mlp']['router'] = router + jax.random.normal(jax.random.key(3),
                                                                     router.shape)
  live = _forward(cfg, moved, tokens_NxT, mask_NxT)[2].expert_ids_LxNxTxK
  assert np.any(np.asarray(live) != np.asarray(ids_LxNxTxK))
  forced_LxNxTxK = ids_LxNxTxK.at[:, 1, 0].set(-1)
  kept = _forward(cfg, moved, tokens_NxT, mask_NxT, forced_routes=forced_LxNxTxK)[2]
  kept_LxNxTxK = np.asarray(kept.expert_ids_LxNxTxK)
  np.testing.assert_array_equal(np.delete(kept_LxNxTxK.reshape(1, -1, 2), 12, axis=1),
                                np.delete(np.asarray(ids_LxNxTxK).reshape(1, -1, 2), 12, axis=1))
  np.testing.assert_array_equal(kept_LxNxTxK[:, 1, 0], np.asarray(live)[:, 1, 0])


def test_dense_forward_is_unchanged_and_rejects_routes():
  cfg = transformer.ModelConfig(vocab_size=16, hidden_size=16, intermediate_size=32, num_layers=1,
                                num_heads=2, num_kv_heads=1, head_dim=8)
  params = transformer.abstract_params(cfg)
  tokens_NxT = jnp.zeros((1, 3), jnp.int32)
  shapes = lambda **kw: jax.eval_shape(
      lambda p: transformer.apply(p, tokens_NxT, cfg=cfg, **kw), params)
  assert len(shapes()) == 2
  assert shapes(return_routing=True)[2] is None
  with pytest.raises(ValueError, match='forced_routes'):
    shapes(forced_routes=jnp.zeros((1, 1, 3, 2)))


def test_config_check_names_the_field():
  from rlreason import config as config_lib
  c = config_lib.default()
  c.model.moe.num_experts, c.model.moe.num_experts_per_tok = 4, 5
  c.mesh.expert, c.mesh.fsdp = 3, 1
  with pytest.raises(ValueError) as raised:
    config_lib.validate(c, num_devices=3)
  assert 'model.moe.num_experts_per_tok=5 > num_experts=4' in str(raised.value)
  assert 'mesh.expert=3 does not divide model.moe.num_experts=4' in str(raised.value)
  assert 'lora.enabled' not in str(raised.value)
  c.lora.enabled = True
  with pytest.raises(ValueError, match='lora.enabled with an MoE model'):
    config_lib.validate(c, num_devices=3)
  c.lora.enabled, c.sample_mesh.kind = False, 'host'
  with pytest.raises(ValueError, match="mesh.expert=3 with sample_mesh.kind='host'"):
    config_lib.validate(c, num_devices=3)
  c = config_lib.default()
  c.mesh.expert, c.mesh.fsdp = 2, -1
  with pytest.raises(ValueError, match='mesh.expert=2 but the model has no experts'):
    config_lib.validate(c, num_devices=8)


def test_one_rl_step_of_an_hf_moe_checkpoint_on_an_expert_mesh(ckpts, tmp_path):
  from rlreason.rl import train
  import train_test
  c = train_test.tiny_config(steps=1)
  c.model.init, c.model.path = 'hf', str(ckpts['qwen3_top2_sparse_all'])
  c.sft.steps = c.eval.every = c.checkpoint.every = 0
  c.rl.prompts_per_step, c.rl.max_new_tokens, c.rl.minibatches = 2, 4, 1
  reward = tmp_path / 'varied.py'  # Rewards that vary within a group, so the update moves.
  reward.write_text("def score(item):\n  return float(sum(map(ord, item['completion'])) % 5)\n")
  c.verifier.name = f'{reward}:score'
  c.mesh = dict(data=1, fsdp=-1, tensor=1, expert=2)
  state, _ = train.train(c, str(tmp_path / 'run'))
  lines = (tmp_path / 'run' / 'metrics.jsonl').read_text().splitlines()
  rows = [json.loads(line) for line in lines]
  assert any(r.get('step') == 1 and np.isfinite(r['loss']) for r in rows)
  router = np.asarray(state.params['layers']['0']['mlp']['router'])
  loaded = weights.load(c.model.path)[1]['layers']['0']['mlp']['router']
  assert not np.array_equal(router, np.asarray(loaded))


@pytest.mark.parametrize('remat', ['full'])
def test_gradients_match_torch(remat, ckpts):
  case = 'qwen2_top2_step2'
  cfg, params = weights.load(ckpts[case])
  cfg = cfg.replace(remat=remat)
  tokens_NxT, mask_NxT = _batch()

  def loss(p):
    logits_NxTxV = transformer.apply(p, tokens_NxT, cfg=cfg, mask_NxT=mask_NxT)[0]
    logp_NxT = jnp.take_along_axis(jax.nn.log_softmax(logits_NxTxV[:, :-1]),
                                   tokens_NxT[:, 1:, None], axis=-1)[..., 0]
    return jnp.sum(logp_NxT * mask_NxT[:, 1:])

  grads = jax.jit(jax.grad(loss))(params)['layers']['1']['mlp']
  model = transformers.AutoModelForCausalLM.from_pretrained(
      ckpts[case], dtype=torch.float32, attn_implementation='eager')
  positions_NxT = np.maximum(np.cumsum(mask_NxT, axis=1) - 1, 0)
  logits = model(input_ids=torch.tensor(tokens_NxT), attention_mask=torch.tensor(mask_NxT),
                 position_ids=torch.tensor(positions_NxT)).logits
  logp = torch.log_softmax(logits[:, :-1], -1).gather(-1, torch.tensor(tokens_NxT[:, 1:, None]))
  (logp[..., 0] * torch.tensor(mask_NxT[:, 1:])).sum().backward()
  mlp = model.model.layers[1].mlp
  inter = cfg.moe.moe_intermediate_size
  gate_up = mlp.experts.gate_up_proj.grad.numpy()
  want = {'router': mlp.gate.weight.grad.numpy().T,
          'gate': gate_up[:, :inter].transpose(0, 2, 1),
          'up': gate_up[:, inter:].transpose(0, 2, 1),
          'down': mlp.experts.down_proj.grad.numpy().transpose(0, 2, 1),
          'shared_expert_gate': mlp.shared_expert_gate.weight.grad.numpy()[0]}
  for name, want_grad in want.items():
    got = np.asarray(grads[name])
    assert np.abs(want_grad).max() > 0, name
    np.testing.assert_allclose(got, want_grad, atol=1e-4 * np.abs(want_grad).max(), err_msg=name)


def test_memory_estimate_counts_experts():
  from rlreason import config as config_lib
  from rlreason.rl import memory
  dense = transformer.ModelConfig(vocab_size=32, hidden_size=8, intermediate_size=16,
                                  num_layers=1, num_heads=2, num_kv_heads=1, head_dim=4)
  sparse = dense.replace(moe=moe_config.MoEConfig(num_experts=4, num_experts_per_tok=2,
                                                  moe_intermediate_size=4))
  # The MLP: dense gate/up/down 3*8*16 = 384; MoE router 8*4 + experts 4*3*8*4 = 416.
  assert sparse.num_params() - dense.num_params() == 416 - 384
  # Per token, fp32: dense 3F*4 = 192; MoE k(2D + 3I)*4 + 2E*4 = 2*(16 + 12)*4 + 32 = 256.
  assert memory.mlp_residuals(dense) == 192 and memory.mlp_residuals(sparse) == 256
  mixed = sparse.replace(num_layers=2, moe=sparse.moe.__class__(
      **{**sparse.moe.__dict__, 'mlp_only_layers': (0,)}))
  assert memory.mlp_residuals(mixed.replace(intermediate_size=64)) == 3 * 64 * 4
  c = config_lib.default()
  c.rl.prompts_per_step, c.rl.group_size, c.rl.max_new_tokens = 1, 2, 4
  c.data.prompt_buckets = (4,)
  gap = {k: memory.step_estimate(c, sparse)[k] - memory.step_estimate(c, dense)[k]
         for k in ('state/params', 'update/layer_working_set')}
  # 32 more params (fp32); the working set of 2 rows x 8 positions, twice, 64 bytes more each.
  assert gap == {'state/params': 32 * 4, 'update/layer_working_set': 2 * 16 * 64}


def test_sampler_records_the_routes_the_full_forward_takes(ckpts):
  from rlreason.rollout import sampler
  from rlreason.structs import Prefixes, Prompts
  cfg, params = weights.load(ckpts['qwen3_top2_norm_mlp_only'])
  tokens_NxT, mask_NxT = _batch(t=6)
  prompts = Prompts(jnp.asarray(tokens_NxT), jnp.asarray(mask_NxT))
  prefixes = Prefixes(jnp.asarray([[5, 6], [7, 0]] * 3), jnp.asarray([[1, 1], [1, 0]] * 3, bool))
  rollout, routes = sampler.generate(params, prompts, cfg=cfg, group_size=2, max_new_tokens=5,
                                     rng=jax.random.key(0), stop_tokens=(3,), prefixes=prefixes,
                                     return_routes=True)
  assert routes.prompt_MxBxPxK.dtype == jnp.uint8
  assert routes.completion_MxNxLxK.shape == (1, 6, 7, 2)
  # The full forward over prompt + completion routes every real token; the sampler recorded
  # the same experts for each, except the last token of each row (never fed: no route).
  full_tokens_NxT = jnp.concatenate([jnp.repeat(prompts.tokens_BxP, 2, 0), rollout.tokens_NxL], 1)
  full_mask_NxT = jnp.concatenate([jnp.repeat(prompts.mask_BxP, 2, 0), rollout.mask_NxL], 1)
  full = _forward(cfg, params, full_tokens_NxT, full_mask_NxT)[2].expert_ids_LxNxTxK
  prompt = moe_layer.unpack_routes(routes.prompt_MxBxPxK)
  completion = moe_layer.unpack_routes(routes.completion_MxNxLxK)
  np.testing.assert_array_equal(np.repeat(np.asarray(prompt), 2, 1)[:, mask_NxT.repeat(2, 0)],
                                np.asarray(full[:, :, :6])[:, mask_NxT.repeat(2, 0)])
  last_N = np.asarray(rollout.lengths_N) - 1
  fed_NxL = np.asarray(rollout.mask_NxL) & (np.arange(7)[None] != last_N[:, None])
  assert fed_NxL.sum() > 6
  np.testing.assert_array_equal(np.asarray(completion)[:, fed_NxL],
                                np.asarray(full[:, :, 6:])[:, fed_NxL])
  assert np.all(np.asarray(completion)[:, ~fed_NxL] == -1)
  # Replaying them reproduces the sampler's log-probs (up to cached-vs-full rounding).
  forced = jnp.concatenate([jnp.repeat(prompt, 2, 1), completion], 2)
  logits_NxTxV = _forward(cfg, params, full_tokens_NxT, full_mask_NxT, forced_routes=forced)[0]
  logp_NxL = jnp.take_along_axis(jax.nn.log_softmax(logits_NxTxV[:, 5:-1]),
                                 rollout.tokens_NxL[..., None], -1)[..., 0]
  sampled_NxL = np.asarray(rollout.mask_NxL & ~rollout.prefix_mask_NxL)
  np.testing.assert_allclose(np.asarray(logp_NxL)[sampled_NxL],
                             np.asarray(rollout.logprobs_NxL)[sampled_NxL], atol=1e-4)
