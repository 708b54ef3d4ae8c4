"""R²PO's rollout head (model/rollout_head.py) and its two stages (methods/r2po.py)."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from rlreason import config as config_lib
from rlreason.methods import r2po
from rlreason.model import rollout_head
from rlreason.model import transformer
from rlreason.rl import run_setup
from rlreason.rl import train
from rlreason.rl import update
from rlreason.rollout import sampler
from rlreason.structs import Prompts
from tests import train_test

CFG = transformer.ModelConfig(vocab_size=19, hidden_size=32, intermediate_size=64, num_layers=1,
                              num_heads=2, num_kv_heads=1, head_dim=16)


def _params(init_std):
  base = transformer.init_params(CFG, jax.random.key(0))
  return base, rollout_head.attach(base, rollout_head.init(CFG, jax.random.key(1),
                                                           init_std=init_std))


def _tokens(n=3, t=7):
  return jax.random.randint(jax.random.key(2), (n, t), 1, CFG.vocab_size)


def test_a_zero_head_is_the_base_policy_and_detach_removes_it():
  base, with_head = _params(1e-6)
  zero = rollout_head.attach(base, jax.tree.map(jnp.zeros_like, with_head['rollout_head']))
  tokens = _tokens()
  np.testing.assert_array_equal(transformer.apply(zero, tokens, cfg=CFG)[0],
                                transformer.apply(base, tokens, cfg=CFG)[0])
  assert rollout_head.detach(with_head).keys() == base.keys()
  assert rollout_head.detach(base) is base


def test_rollout_logits_add_the_residual_term_by_hand():
  base, with_head = _params(0.3)
  tokens = _tokens()
  h = transformer.apply(base, tokens, cfg=CFG, return_hidden=True)[0]
  head = with_head['rollout_head']
  expect = (np.asarray(h) @ np.asarray(base['lm_head'])
            + np.maximum(np.asarray(h) @ np.asarray(head['w1']), 0) @ np.asarray(head['w2']))
  got = transformer.apply(with_head, tokens, cfg=CFG)[0]
  np.testing.assert_allclose(got, expect, atol=2e-5)
  assert np.abs(got - transformer.apply(base, tokens, cfg=CFG)[0]).max() > 0.1


def test_learner_log_probs_with_the_head_equal_the_full_logits():
  _, with_head = _params(0.3)
  tokens = _tokens()
  stats = update.logprobs_step(with_head, tokens, jnp.ones(tokens.shape, bool), cfg=CFG,
                               completion_len=4)
  logp = jax.nn.log_softmax(transformer.apply(with_head, tokens, cfg=CFG)[0], -1)
  expect = jnp.take_along_axis(logp[:, -5:-1], tokens[:, -4:, None], -1)[..., 0]
  np.testing.assert_allclose(stats.logprobs_NxT, expect, atol=1e-5)


def test_the_sampler_samples_the_head_augmented_policy():
  base, with_head = _params(0.3)
  prompts = Prompts(tokens_BxP=jnp.array([[0, 3, 4, 5], [6, 7, 8, 9]]),
                    mask_BxP=jnp.array([[0, 1, 1, 1], [1, 1, 1, 1]], bool))
  rollout = sampler.generate(with_head, prompts, cfg=CFG, group_size=2, max_new_tokens=6,
                             temperature=1.0, rng=jax.random.key(3), stop_tokens=(), pad_id=0)
  tokens, mask = sampler.sequences(rollout)

  def recompute(params):
    return update.logprobs_step(params, tokens, mask, cfg=CFG, completion_len=6).logprobs_NxT

  m = np.asarray(rollout.mask_NxL)
  gap_head = np.abs(np.asarray(recompute(with_head)) - rollout.behaviour_logprobs_NxL)[m]
  gap_base = np.abs(np.asarray(recompute(base)) - rollout.behaviour_logprobs_NxL)[m]
  assert gap_head.max() <= 1e-5, gap_head.max()
  assert gap_base.max() > 1e-3  # The behaviour policy is not the inference policy.


@pytest.mark.parametrize('step,stage', [(1, 1), (40, 1), (41, 2), (80, 2), (81, 1), (100, 1),
                                        (101, 2), (500, 2)])
def test_stage_schedule(step, stage):
  assert r2po.stage_at(step, (40, 80, 100)) == stage


def test_each_stage_moves_only_its_part_and_the_other_stays_bit_identical():
  _, params = _params(0.1)
  make = lambda: optax.adam(1e-2)
  opt1, opt2 = r2po.stage_optimizer(make, 1), r2po.stage_optimizer(make, 2)
  state = opt2.init(params)
  assert jax.tree.structure(state) == jax.tree.structure(opt1.init(params))
  tokens = _tokens()

  def loss(p, to_model):
    return -jnp.mean(jax.nn.log_softmax(transformer.apply(to_model(p), tokens, cfg=CFG)[0]))

  def step(params, state, stage):
    opt = opt1 if stage == 1 else opt2
    grads = jax.grad(loss)(params, r2po.to_model(stage))
    updates, state = opt.update(grads, state, params)
    return optax.apply_updates(params, updates), state

  head0, base0 = params['rollout_head'], rollout_head.detach(params)
  params, state = step(params, state, 1)  # Head only.
  assert jax.tree.all(jax.tree.map(np.array_equal, rollout_head.detach(params), base0))
  assert not np.array_equal(params['rollout_head']['w2'], head0['w2'])
  head1 = params['rollout_head']
  for _ in range(2):  # Backbone only: the head's Adam moments do not carry it on.
    params, state = step(params, state, 2)
    assert jax.tree.all(jax.tree.map(np.array_equal, params['rollout_head'], head1))
  assert not np.array_equal(params['lm_head'], base0['lm_head'])


def _config():
  c = train_test.tiny_config(steps=2)
  c.sft.steps = 0
  c.rl.minibatches = 1
  c.eval.every = 0
  c.checkpoint.every = 0
  c.r2po.enabled, c.r2po.switch_steps, c.r2po.init_std = True, (1,), 0.05
  c.objective.entropy_coef = 0.01  # A gradient in both stages even when every reward is 0.
  return c


def test_two_steps_train_the_head_then_the_backbone(tmp_path, monkeypatch):
  runs, stages = [], []
  build, rl_step = train.build, train.rl_step
  monkeypatch.setattr(train, 'build', lambda *a, **k: runs.append(build(*a, **k)) or runs[-1])

  def spy(run, state, step, times, *rest):
    before = jax.tree.map(np.asarray, state.params)
    state, metrics = rl_step(run, state, step, times, *rest)
    stages.append((metrics['r2po/stage'], before, jax.tree.map(np.asarray, state.params)))
    return state, metrics

  monkeypatch.setattr(train, 'rl_step', spy)
  train.train(_config(), str(tmp_path))
  (s1, b1, a1), (s2, b2, a2) = stages
  assert (s1, s2) == (1, 2)
  same = lambda x, y: jax.tree.all(jax.tree.map(np.array_equal, x, y))
  assert same(rollout_head.detach(b1), rollout_head.detach(a1))  # Stage 1: backbone frozen,
  assert not same(b1['rollout_head'], a1['rollout_head'])  # the head trained.
  assert same(b2['rollout_head'], a2['rollout_head'])  # Stage 2: the head frozen,
  assert not same(rollout_head.detach(b2), rollout_head.detach(a2))  # the backbone trained.
  run = runs[0]
  assert 'rollout_head' not in run.policy(jax.device_put(a2))  # Evaluation and export.
  assert 'rollout_head' in run.rollout_policy(jax.device_put(a2))  # The sampler.


@pytest.mark.parametrize('field,value,message', [
    ('switch_steps', (5, 3), 'r2po.switch_steps'),
    ('init_std', 0.0, 'r2po.init_std'),
])
def test_bad_config_names_the_field(field, value, message):
  c = _config()
  c.r2po[field] = value
  with pytest.raises(ValueError, match=message):
    config_lib.validate(c, num_devices=8)


def test_lora_with_r2po_is_refused():
  c = _config()
  c.lora.enabled = True
  with pytest.raises(ValueError, match='r2po.enabled with lora.enabled'):
    config_lib.validate(c, num_devices=8)
