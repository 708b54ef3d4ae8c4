"""The RL loop on tool-using episodes: a step end to end, transcripts, resume, masks."""

import os

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rlreason import config as config_lib
from rlreason import episodes as episodes_cli
from rlreason.rl import metrics
from rlreason.rl import run_setup
from rlreason.rl import train
from rlreason.rl import update
from rlreason.rl.rl_batch import make_train_batch
from train_test import train_preempted_at  # tests/ is on sys.path


def env_config(steps=2):
  c = config_lib.default()
  c.data.task, c.data.difficulty = 'calc_multiply', 2
  c.data.prompt_template = '{prompt}\n'
  c.data.prompt_buckets = (48,)
  c.model.arch = dict(vocab_size=0, hidden_size=32, intermediate_size=64, num_layers=1,
                      num_heads=2, num_kv_heads=1, head_dim=16, qkv_bias=False, qk_norm=False,
                      tie_embeddings=True, family='qwen2', rope_theta=10_000.0)
  c.env.update(enabled=True, tools=('calculator',), family='tags', verifier='exact',
               max_turns=2, max_turn_tokens=12, max_observation_tokens=24, transcripts=3)
  c.sft.steps, c.sft.batch_size, c.sft.lr, c.sft.grad_clip = 2, 8, 3e-3, 0.0
  c.sft.teacher = 'rlreason.envs.tasks:calculator_trace'
  c.sft.teacher_options = {'call_prob': 0.5}
  c.rl.steps, c.rl.prompts_per_step, c.rl.group_size = steps, 4, 2
  c.rl.max_new_tokens, c.rl.minibatches = 40, 2
  c.optimizer.lr = 1e-3
  c.verifier.workers = 2
  c.eval.every, c.eval.num_prompts = 2, 4
  c.checkpoint.every = 1
  c.mesh = dict(data=1, fsdp=-1, tensor=1)
  return c


def test_rl_steps_on_episodes_end_to_end(tmp_path, capsys):
  state, eval_metrics = train.train(env_config(steps=2), str(tmp_path))
  assert int(state.step) + int(state.skipped) == 2 * 2
  log = [r for r in metrics.read_jsonl(tmp_path / 'metrics.jsonl') if r['step'] > 0]
  for key in ('episodes/turns_mean', 'episodes/tool_calls_mean', 'episodes/truncated_frac',
              'episodes/observation_tokens_mean', 'train/reward', 'loss'):
    assert any(key in row for row in log), key
  assert 'eval/pass@1' in eval_metrics
  files = sorted(os.listdir(tmp_path / 'episodes'))
  assert files == ['eval_step000000.jsonl', 'eval_step000002.jsonl', 'train_step000002.jsonl']
  assert episodes_cli.main(['show', str(tmp_path)]) == 0
  out = capsys.readouterr().out
  assert out.count('=== step 2 train episode') == 3 and '--- prompt' in out
  assert episodes_cli.main(['show', str(tmp_path), '--step', '1']) == 1


def test_config_errors_name_the_tool_and_budget():
  c = env_config()
  c.env.tools = ('calculator', 'abacus')
  c.env.max_turn_tokens = 99
  with pytest.raises(ValueError, match=r"(?s)unknown tool\(s\) \['abacus'\].*max_turn_tokens=99"):
    config_lib.validate(c, num_devices=jax.device_count())


def test_a_missing_corpus_fails_at_start_up(tmp_path):
  c = env_config()
  c.env.tools = ('search',)
  missing = tmp_path / 'nope.jsonl'
  with pytest.raises((ValueError, FileNotFoundError), match='nope.jsonl'):
    run_setup.make_environment(c, None, [type('E', (), {'meta': {'corpus_path': str(missing)}})()])


def test_observation_tokens_get_no_loss_and_no_gradient(tmp_path):
  c = env_config()
  run = run_setup.build(c, str(tmp_path))
  real_env = run.env

  class CallsFirst:  # The untrained model's first turn is replaced by a tool call.
    format = real_env.format
    reset = real_env.reset

    def step(self, state, text):
      call = '<call>calculator: {"expression": "2*3"}</call>'
      return real_env.step(state, call if state.turns == 0 else text)

  run.env = CallsFirst()
  try:
    state = run._fresh_state()
    with jax.set_mesh(run.mesh):
      rollout, scores = train.sample_episodes(run, state.params, next(run.data_iter),
                                              jax.random.key(0), step=1, times={})
      batch, _ = make_train_batch(run, state.params, rollout)
    loss_mask = np.asarray(batch.loss_mask_NxL)
    obs = np.asarray(rollout.mask_NxL) & ~loss_mask
    assert obs.sum() > 0, 'no observation in the batch (no tool call sampled)'
    adv = jnp.where(batch.loss_mask_NxL, 1.0, 0.0)
    denominator = jnp.float32(loss_mask.sum())
    # Jitted: one compilation for both gradients (op by op, each primitive compiled apart).
    grad_fn = jax.jit(lambda params, b: jax.grad(lambda p: update.loss_fn(
        p, b, denominator, cfg=run.cfg, objective=run.objective)[0])(params))
    grad = lambda a: grad_fn(state.params, batch.replace(advantages_NxL=a))
    # Advantages on observation tokens (masked out) change nothing.
    chex.assert_trees_all_close(grad(adv), grad(jnp.where(obs, 1e6, adv)))
  finally:
    run.close()


def test_resume_with_an_environment_is_bit_exact(tmp_path):
  straight, _ = train.train(env_config(steps=2), str(tmp_path / 'straight'))
  train_preempted_at(1, env_config(steps=2), str(tmp_path / 'resumed'))
  resumed, _ = train.train(env_config(steps=2), str(tmp_path / 'resumed'))
  chex.assert_trees_all_equal(jax.device_get(resumed.params), jax.device_get(straight.params))
  log = {name: [r for r in metrics.read_jsonl(tmp_path / name / 'metrics.jsonl')
                if r['step'] == 2][-1] for name in ('straight', 'resumed')}
  for key in ('train/reward', 'episodes/tool_calls_mean', 'loss'):
    assert log['resumed'][key] == log['straight'][key], key
