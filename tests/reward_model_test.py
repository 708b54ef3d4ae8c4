"""Reward models: losses by hand, last-token scores, train / save / load, and the RL reward."""

import importlib

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rlreason import config as config_lib
from rlreason import main as main_lib
from rlreason.methods import reward_model
from rlreason.model import transformer
from rlreason.objectives import reward_losses
from rlreason.rl import train

CFG = transformer.ModelConfig(vocab_size=13, hidden_size=32, intermediate_size=64, num_layers=1,
                              num_heads=2, num_kv_heads=1, head_dim=16)


def test_pointwise_and_bradley_terry_by_hand():
  loss, m = reward_losses.pointwise(jnp.array([0.0, 2.0]), jnp.array([1.0, 0.0]))
  # (softplus(0) + softplus(2)) / 2 = (0.693147 + 2.126928) / 2
  np.testing.assert_allclose(loss, 1.4100378, rtol=1e-6)
  assert m['rm/accuracy'] == 0.0  # Score 0 is not > 0 for label 1; 2 > 0 for label 0.
  loss, m = reward_losses.bradley_terry(jnp.array([1.0, 0.0]), jnp.array([0.0, 1.0]))
  # (softplus(-1) + softplus(1)) / 2 = (0.313262 + 1.313262) / 2
  np.testing.assert_allclose(loss, 0.8132617, rtol=1e-6)
  assert m['rm/accuracy'] == 0.5
  loss, _ = reward_losses.bradley_terry(jnp.array([1.0]), jnp.array([0.0]),
                                        margin_N=jnp.array([1.0]))
  np.testing.assert_allclose(loss, np.log(2.0), rtol=1e-6)  # -log σ(1 - 0 - 1)


def test_the_score_reads_the_last_real_token_whatever_the_padding():
  params = transformer.init_params(CFG, jax.random.key(0))
  head = {'kernel': jax.random.normal(jax.random.key(1), (32, 1)), 'bias': jnp.array([0.3])}
  seq = [3, 5, 7, 2, 9]
  right = jnp.array([seq + [0, 0]]), jnp.array([[1] * 5 + [0, 0]], bool)
  left = jnp.array([[0, 0] + seq]), jnp.array([[0, 0] + [1] * 5], bool)
  h = transformer.apply(params, jnp.array([seq]), cfg=CFG, return_hidden=True)[0][0, -1]
  expect = float(h @ head['kernel'][:, 0] + head['bias'][0])
  for tokens, mask in (right, left):
    got = reward_model.sequence_scores(params, head, tokens, mask, cfg=CFG)
    np.testing.assert_allclose(got, [expect], rtol=1e-5)
  np.testing.assert_array_equal(reward_model.last_token_index(
      jnp.array([[1, 1, 0], [0, 1, 1], [0, 0, 0]], bool)), [1, 2, 0])


def test_preference_pairs_take_each_problem_best_against_worse():
  class Ex:
    def __init__(self, i):
      self.id = i
  a, b = Ex('a'), Ex('b')
  traces = [(a, 'a1', 0.0), (a, 'a2', 1.0), (a, 'a3', 0.0), (b, 'b1', 1.0), (b, 'b2', 1.0)]
  pairs = reward_model.preference_pairs(traces)
  assert [(p[1], p[2]) for p in pairs] == [('a2', 'a1'), ('a2', 'a3')]  # b: all tie, none.


def _rm_config(mode='pointwise'):
  c = importlib.import_module('experiments.reward_model').get_config('runlocal')
  c.reward_model.train.update(mode=mode, steps=3, batch_size=4, problems=8,
                              traces_per_problem=3, eval_problems=4)
  c.sft.teacher_options = {'drop_carry_prob': 0.5}  # Both labels in a few traces.
  return c


@pytest.fixture(scope='module')
def trained(tmp_path_factory):
  workdir = tmp_path_factory.mktemp('rm')
  metrics = main_lib.run(_rm_config(), workdir)
  return workdir / 'reward_model', metrics


def test_main_trains_and_saves_a_reward_model_that_loads_with_the_same_scores(trained):
  path, metrics = trained
  assert 0.0 <= metrics['eval/rm_accuracy'] <= 1.0 and metrics['eval/rm_traces'] == 12
  rm = reward_model.load(path, vocab_size=None)
  assert rm.meta['mode'] == 'pointwise'
  tokens = jnp.array([[1, 2, 3, 4]])
  again = reward_model.load(path)
  np.testing.assert_array_equal(rm.score(tokens, tokens > 0), again.score(tokens, tokens > 0))
  with pytest.raises(ValueError, match='tokenizer'):
    reward_model.load(path, vocab_size=rm.meta['vocab_size'] + 1)


def test_an_rl_step_is_rewarded_by_the_reward_model(trained, tmp_path, monkeypatch):
  path, _ = trained
  c = importlib.import_module('experiments.demo').get_config('runlocal')
  c.rl.steps = 1
  c.reward_model.update(path=str(path), weight=1.0, verifier_weight=0.0)
  seen = []
  learned = reward_model.learned_rewards

  def spy(run, model, rollout, rewards_BxG):
    out = learned(run, model, rollout, rewards_BxG)
    seen.append(out)
    return out

  monkeypatch.setattr(reward_model, 'learned_rewards', spy)
  train.train(c, str(tmp_path))
  (rewards_BxG, metrics), = seen
  assert np.all((rewards_BxG > 0) & (rewards_BxG < 1))  # sigmoid(score), verifier weight 0.
  assert 0.0 <= metrics['reward_model/agreement'] <= 1.0


def test_bad_config_names_the_field(tmp_path):
  c = _rm_config()
  c.reward_model.train.mode = 'listwise'
  with pytest.raises(ValueError, match='reward_model.train.mode'):
    config_lib.validate(c, num_devices=8)
  c = importlib.import_module('experiments.demo').get_config('runlocal')
  c.reward_model.path = str(tmp_path)
  with pytest.raises(ValueError, match='reward_model.path'):
    config_lib.validate(c, num_devices=8)
