"""Asynchronous sampling (rl/async_rl.py): the schedule, staleness 0 in a sampler process
equals the synchronous loop bit for bit, N steps = N/2 + resume + N/2 with rollouts in
flight, a resume with another staleness is refused, a dead sampler process is a named error."""

import os
import queue
import signal

import chex
import jax
import ml_collections
import numpy as np
import pytest

from rlreason import config as config_lib
from rlreason.model import transformer
from rlreason.rl import async_rl
from rlreason.rl import checkpoint
from rlreason.rl import metrics
from rlreason.rl import train

from train_test import tiny_config, train_preempted_at


def async_config(mode='', k=0, steps=2):
  """tiny_config whose rewards vary without training: the `overlong` verifier with cache =
  L_max charges 1/8 per token, so groups differ and every update moves the params."""
  c = tiny_config(steps=steps)
  c.verifier.name = 'overlong'
  c.overlong.cache_len = c.rl.max_new_tokens
  c.eval.every = c.checkpoint.every = 0  # The last step (or a preempted one) still saves.
  c.sft.steps = 0  # RL from the random init: the rewards vary anyway.
  c.rl.async_mode, c.rl.max_staleness = mode, k
  return c


def tiny_spec():
  cfg = transformer.ModelConfig(vocab_size=16, hidden_size=16, intermediate_size=32,
                                num_layers=1, num_heads=2, num_kv_heads=1, head_dim=8)
  return async_rl.Spec(rl=ml_collections.ConfigDict(config_lib.default().rl.to_dict()),
                       cfg=cfg, mesh=dict(data=1, fsdp=-1, tensor=1), stop_tokens=(1,), pad_id=0)


def params_of(state):
  return jax.device_get(state.params)


def test_schedule_hand_values():
  # v(t) = max(0, t - 1 - k): k = 0 is the synchronous loop (step t samples with version t-1).
  assert [async_rl.version_for(t, 0) for t in (1, 2, 3)] == [0, 1, 2]
  assert [async_rl.version_for(t, 1) for t in (1, 2, 3, 4)] == [0, 0, 1, 2]
  assert [async_rl.version_for(t, 2) for t in (1, 2, 3, 4)] == [0, 0, 0, 1]
  assert async_rl.staleness_of(async_config('', 3)) == 0  # async_mode '' ignores it.
  assert async_rl.staleness_of(async_config('inline', 3)) == 3


def test_staleness_zero_in_a_sampler_process_equals_sync(tmp_path):
  sync, _ = train.train(async_config(), str(tmp_path / 'sync'))
  spawned, _ = train.train(async_config('process', 0), str(tmp_path / 'process'))
  chex.assert_trees_all_equal(params_of(spawned), params_of(sync))
  logs = [metrics.read_jsonl(tmp_path / name / 'metrics.jsonl') for name in ('sync', 'process')]
  assert any(r.get('grad_norm', 0) > 0 for r in logs[0])  # The updates move the params.
  for a, b in zip(*logs):
    for key in ('train/reward', 'loss', 'grad_norm', 'offpolicy/staleness/0'):
      assert a.get(key) == b.get(key), key


def test_resume_with_rollouts_in_flight_is_exact(tmp_path):
  # Straight: 4 steps at staleness 1, sampled in this process. The same schedule in a
  # sampler process, stopped after step 2 (step 3's rollout is in flight and saved), then
  # resumed inline: both halves give the straight run's params and logs.
  straight, _ = train.train(async_config('inline', 1, steps=4), str(tmp_path / 'straight'))
  train_preempted_at(2, async_config('process', 1, steps=4), str(tmp_path / 'resumed'))
  saved = async_rl.inflight_path(tmp_path / 'resumed', 2)
  k, inflight = async_rl.read_inflight(saved)
  assert k == 1 and list(inflight) == [3]
  saved_config = checkpoint.Checkpointer(tmp_path / 'resumed').saved_config()
  for other, hint in ((async_config('inline', 2, steps=4), 'rl.max_staleness=1 and'),
                      (async_config('', 0, steps=4), "rl.async_mode 'process' or 'inline'")):
    with pytest.raises(ValueError, match='rl.max_staleness: the checkpoint at step 2') as e:
      async_rl.check_resume(other, saved_config, step=2, workdir=tmp_path / 'resumed')
    assert hint in str(e.value)
  resumed, _ = train.train(async_config('inline', 1, steps=4), str(tmp_path / 'resumed'))
  chex.assert_trees_all_equal(params_of(resumed), params_of(straight))
  chex.assert_trees_all_equal(jax.device_get(resumed.opt_state),
                              jax.device_get(straight.opt_state))
  logs = {name: {r['step']: r for r in metrics.read_jsonl(tmp_path / name / 'metrics.jsonl')}
          for name in ('straight', 'resumed')}
  for step in (3, 4):
    for key in ('train/reward', 'loss', 'offpolicy/staleness/1'):
      assert logs['resumed'][step][key] == logs['straight'][step][key], (step, key)
  # Step 1 samples with the warm start (staleness 0); from step 2 on, one step behind.
  assert logs['straight'][1]['offpolicy/staleness/0'] > 0
  assert logs['straight'][3]['offpolicy/staleness/0'] == 0
  assert logs['straight'][3]['offpolicy/staleness/1'] > 0


def test_a_finished_run_extends_with_more_steps(tmp_path):
  # A run of 2 steps at staleness 1 submitted nothing past step 2; extended to 4, step 3 is
  # sampled by the learner's params then (version 2: staleness 0, the schedule's version 1
  # is gone), step 4 follows the schedule (version 2, one step behind the learner's 3).
  train.train(async_config('inline', 1, steps=2), str(tmp_path))
  k, inflight = async_rl.read_inflight(async_rl.inflight_path(tmp_path, 2))
  assert k == 1 and inflight == {}
  state, _ = train.train(async_config('inline', 1, steps=4), str(tmp_path))
  assert int(state.step) + int(state.skipped) == 4 * 2  # 4 steps x 2 minibatches.
  logs = {r['step']: r for r in metrics.read_jsonl(tmp_path / 'metrics.jsonl')}
  assert logs[3]['offpolicy/staleness/0'] > 0 and logs[3]['offpolicy/staleness/1'] == 0
  assert logs[4]['offpolicy/staleness/0'] == 0 and logs[4]['offpolicy/staleness/1'] > 0
  assert logs[4]['offpolicy/staleness/out_of_range'] == 0


def test_a_dead_sampler_process_is_a_named_error():
  sampler = async_rl.ProcessSampler(tiny_spec(), timeout_s=120.0)
  try:
    os.kill(sampler.process.pid, signal.SIGKILL)  # Dies while it starts: cheap, and certain.
    # The learner's wait ends at once with the process named (a hang would end in the
    # 120 s timeout's message instead).
    with pytest.raises(async_rl.SamplerError, match=r'sampler process \(pid \d+\) exited '
                       r'with code -9 before sending step 1'):
      sampler.result(1)
  finally:
    sampler.close()


def test_the_sampler_reports_its_exception_with_the_step():
  # _serve in this process: step 1 arrives before any params, so sampling fails; the
  # learner's side (ProcessSampler.result) turns the report into a SamplerError.
  requests, results = queue.Queue(), queue.Queue()
  tokens = np.ones((1, 4), np.int32)
  requests.put((1, None, (tokens, tokens > 0), np.asarray(jax.random.key_data(jax.random.key(0)))))
  async_rl._serve(requests, results, tiny_spec())
  step, report = results.get_nowait()
  assert step == 1 and report.startswith('Traceback') and results.empty()


@pytest.mark.parametrize('field, value, match', [
    ('rl.max_staleness', -1, r'rl.max_staleness=-1 must be an integer >= 0'),
    ('rl.async_mode', 'threads', r"rl.async_mode='threads'; known"),
    ('rl.sampler_cpus', (0,), r'rl.sampler_cpus=\(0,\) pins the sampler process'),
    ('rl.dynamic_sampling', True, r'rl.dynamic_sampling is not supported'),
])
def test_config_errors_name_the_field(field, value, match):
  c = async_config('inline', 1)
  section, name = field.split('.')
  c[section][name] = value
  with pytest.raises(ValueError, match=match):
    config_lib.validate(c, num_devices=8)
