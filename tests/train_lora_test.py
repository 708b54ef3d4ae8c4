"""LoRA through the RL loop: only the adapter trains and is checkpointed, the sampler samples
with it, resume is bit-exact and refuses another base, export writes merged + PEFT."""

import os

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rlreason import config as config_lib
from rlreason.model import weights
from rlreason.rl import run_setup
from rlreason.rl import train
from rlreason.rl.rl_batch import make_train_batch
from rlreason.rollout import sampler
from train_test import tiny_config, train_preempted_at  # tests/ is on sys.path


def lora_config(steps=2, **lora_fields):
  c = tiny_config(steps)  # arithmetic, 8 fake devices; here 2 layers with qkv biases.
  c.model.arch.update(num_layers=2, qkv_bias=True)
  c.lora.update(enabled=True, rank=4, alpha=8.0, **lora_fields)
  c.sft.lr = c.optimizer.lr = 1e-2  # An adapter from zero moves slowly at full-FT rates.
  c.eval.every, c.eval.num_prompts = 0, 4
  return c


def _leaves(tree):
  return {jax.tree_util.keystr(p): np.asarray(x)
          for p, x in jax.tree_util.tree_flatten_with_path(jax.device_get(tree))[0]}


def test_only_the_adapter_trains_and_the_base_stays_bit_identical(tmp_path, monkeypatch):
  # The training run's own base, copied to the host when it is built and read again after
  # training (two probe builds, each with its verifier pool, compared fresh bases before).
  runs, base_before, build = [], {}, train.build

  def build_and_copy_the_base(*a, **k):
    runs.append(build(*a, **k))
    base_before.update(_leaves(runs[-1].adapter.base))
    return runs[-1]

  monkeypatch.setattr(train, 'build', build_and_copy_the_base)
  c = lora_config(steps=2)
  state, _ = train.train(c, str(tmp_path / 'run'))
  assert len(runs) == 1 and base_before
  assert int(state.step) == 4
  names = _leaves(state.params)
  # The TrainState holds A and B of every targeted weight and nothing else.
  assert names and all(k.endswith(("['a']", "['b']")) for k in names), sorted(names)[:4]
  assert len(names) == 2 * 2 * 7  # 2 layers x 7 targets x (A, B)
  assert any(np.abs(v).max() > 0 for k, v in names.items() if k.endswith("['b']"))
  opt_bytes = sum(x.nbytes for x in _leaves(state.opt_state).values())
  base_bytes = sum(x.nbytes for x in base_before.values())
  assert opt_bytes < base_bytes  # Adam's two moments of the adapter only.
  base_after = _leaves(runs[0].adapter.base)
  assert base_after.keys() == base_before.keys()
  for k, v in base_after.items():
    np.testing.assert_array_equal(v, base_before[k], err_msg=k)


def test_the_sampler_samples_the_adapter(tmp_path):
  c = lora_config()
  run = run_setup.build(c, str(tmp_path))
  state, _ = run.restore_or_init()
  # A non-zero adapter, as after training: B random.
  leaves, treedef = jax.tree.flatten(state.params)
  keys = jax.random.split(jax.random.key(3), len(leaves))
  adapter = jax.tree.unflatten(treedef, [x + 0.5 * jax.random.normal(k, x.shape, x.dtype)
                                         for x, k in zip(leaves, keys)])
  policy = run.policy(adapter)
  with jax.set_mesh(run.mesh):
    prompts = run_setup.encode_prompts(run, run.eval_examples[:4])
    rollout = sampler.generate(policy, prompts, cfg=run.cfg, group_size=2, max_new_tokens=8,
                               rng=jax.random.key(0), temperature=1.0, pad_id=run.pad_id,
                               stop_tokens=(run.tok.eos_id,), mesh=run.mesh)
    batch, _ = make_train_batch(run, policy, rollout)
    mask = np.asarray(batch.loss_mask_NxL)
    gap = np.abs(np.asarray(batch.behaviour_logprobs_NxL) - np.asarray(batch.old_logprobs_NxL))
    assert mask.any() and gap[mask].max() <= 1e-5, gap[mask].max()
    # And the adapter matters: the base alone scores the same tokens differently.
    base_run_params = run.policy(jax.tree.map(jnp.zeros_like, adapter))
    base_lp = run.logprobs(base_run_params, batch.tokens_NxT, batch.mask_NxT,
                           batch.loss_mask_NxL.shape[1]).logprobs_NxT
    assert np.abs(np.asarray(base_lp) - np.asarray(batch.old_logprobs_NxL))[mask].max() > 1e-3
  run.close()


def test_resume_is_bit_exact_and_refuses_another_base(tmp_path):
  straight, _ = train.train(lora_config(steps=2), str(tmp_path / 'straight'))
  train_preempted_at(1, lora_config(steps=2), str(tmp_path / 'resumed'))
  resumed, _ = train.train(lora_config(steps=2), str(tmp_path / 'resumed'))
  chex.assert_trees_all_equal(jax.device_get(resumed.params), jax.device_get(straight.params))
  chex.assert_trees_all_equal(jax.device_get(resumed.opt_state),
                              jax.device_get(straight.opt_state))
  other = lora_config(steps=4)
  other.seed = 1  # Another random base: same shapes, other weights.
  with pytest.raises(ValueError, match='another base model'):
    train.train(other, str(tmp_path / 'resumed'))
  full = lora_config(steps=4)
  full.lora.enabled = False
  with pytest.raises(ValueError, match='lora.enabled'):
    run_setup.build(full, str(tmp_path / 'resumed')).restore_or_init()


def test_quantised_base_trains(tmp_path):
  state, _ = train.train(lora_config(steps=1, quantize='int8'), str(tmp_path))
  assert int(state.step) + int(state.skipped) == 2 and int(state.skipped) == 0


def test_export_writes_the_merged_model_and_a_peft_adapter(tmp_path):
  c = lora_config(steps=1)
  c.export.update(path=str(tmp_path / 'merged'), peft_path=str(tmp_path / 'peft'))
  state, _ = train.train(c, str(tmp_path / 'run'))
  run = run_setup.build(c, str(tmp_path / 'probe'))
  cfg, merged = weights.load(tmp_path / 'merged')
  want = jax.device_get(run.policy(state.params))
  got = jax.device_get(merged)
  for k, v in _leaves(want).items():
    np.testing.assert_allclose(_leaves(got)[k], v, atol=1e-6, err_msg=k)
  assert sorted(os.listdir(tmp_path / 'peft')) == ['adapter_config.json',
                                                    'adapter_model.safetensors']
  run.close()


@pytest.mark.parametrize('field, value, match', [
    ('rank', 0, 'lora.rank=0'),
    ('dropout', 0.1, 'lora.dropout=0.1'),
    ('quantize', 'int3', "lora.quantize='int3'"),
])
def test_config_errors_name_the_field(field, value, match):
  c = lora_config()
  c.lora[field] = value
  with pytest.raises(ValueError, match=match):
    config_lib.validate(c, num_devices=jax.device_count())


def test_a_peft_export_that_peft_cannot_load_fails_at_build(tmp_path):
  c = lora_config()
  c.lora.targets = ('q', 'embed')  # Tied embeddings: PEFT's embedding adapter is input-only.
  c.export.update(path=str(tmp_path / 'm'), peft_path=str(tmp_path / 'p'))
  with pytest.raises(ValueError, match='tied embeddings'):
    run_setup.build(c, str(tmp_path / 'run'))


def test_targets_that_match_nothing_fail_at_build_naming_the_modules(tmp_path):
  c = lora_config()
  c.lora.targets = ('q_proj',)
  with pytest.raises(ValueError, match=r"'q_proj' matches no weight.*'gate', 'k', 'o', 'q'"):
    run_setup.build(c, str(tmp_path))
