"""The RL loop end to end on a tiny model: steps run, resume is bit-exact (with the prompt
pool, HAPO and prefix snapshots), SIGTERM saves."""

import importlib
import json
import os
import pathlib
import signal

import chex
import jax
import numpy as np
import pytest

from rlreason import config as config_lib
from rlreason.rl import checkpoint
from rlreason.rl import metrics
from rlreason.rl import train


def tiny_config(steps=2):
  c = config_lib.default()
  c.data.task = 'arithmetic'
  c.data.difficulty = 2
  c.data.task_options = {'layout': 'columns', 'final_answer': False}
  c.data.prompt_buckets = (8,)
  c.model.arch = dict(vocab_size=0, hidden_size=32, intermediate_size=64, num_layers=1,
                      num_heads=2, num_kv_heads=1, head_dim=16, qkv_bias=False, qk_norm=False,
                      tie_embeddings=True, family='qwen2', rope_theta=10_000.0)
  c.sft.steps, c.sft.batch_size, c.sft.lr, c.sft.grad_clip = 2, 8, 3e-3, 0.0
  c.sft.teacher = 'rlreason.tasks.arithmetic:flawed_solution'
  c.rl.steps, c.rl.prompts_per_step, c.rl.group_size = steps, 4, 2
  c.rl.max_new_tokens, c.rl.minibatches = 8, 2
  c.optimizer.lr = 1e-3
  c.verifier.name = 'rlreason.tasks.arithmetic:verify_carry_chain'
  c.verifier.workers = 1
  c.eval.every, c.eval.num_prompts = 2, 6
  c.checkpoint.every = 1
  c.mesh = dict(data=1, fsdp=-1, tensor=1)  # All 8 fake devices: training is sharded.
  return c


def train_preempted_at(step, config, workdir):
  """train.train(config, workdir) as if SIGTERM arrived during `step`: it saves there, exits."""
  flag_init = checkpoint.PreemptionFlag.__init__

  def preempted(self, *a, **kw):
    flag_init(self, *a, **kw)
    self.should_stop = lambda s, manager=None: s == step

  with pytest.MonkeyPatch.context() as patch:
    patch.setattr(checkpoint.PreemptionFlag, '__init__', preempted)
    return train.train(config, workdir)


def test_two_rl_steps_end_to_end(tmp_path, monkeypatch):
  runs = []
  build = train.build
  monkeypatch.setattr(train, 'build', lambda *a, **k: runs.append(build(*a, **k)) or runs[-1])
  state, eval_metrics = train.train(tiny_config(steps=2), str(tmp_path))
  # One compilation of the update for the whole run: the warm start hands back its params
  # in the training layout (it once handed XLA's choice, which compiled step 2 again).
  assert runs[0].train_step.func._cache_size() == 1  # (a partial binding the LoRA base)
  assert int(state.step) + int(state.skipped) == 2 * 2  # 2 steps x 2 minibatches.
  log = metrics.read_jsonl(tmp_path / 'metrics.jsonl')
  rl_steps = [row for row in log if row['step'] > 0]
  assert [row['step'] for row in rl_steps] == [1, 2]
  for key in ('train/reward', 'train/accuracy', 'loss', 'grad_norm', 'time/sample_s',
              'sampler/length_mean', 'entropy'):
    assert any(key in row for row in rl_steps), key
  assert 'eval/pass@1' in rl_steps[-1] and 'eval/pass@1' in eval_metrics
  assert (tmp_path / 'tensorboard').is_dir()
  assert sorted(os.listdir(tmp_path / 'checkpoints')) == ['0', '1', '2']
  assert os.listdir(tmp_path / 'warm_start' / 'checkpoints') == ['0']


def mixed_config(steps):
  """tiny_config with HeaPA's pool, HAPO injection and prefixes from a refreshed snapshot:
  every piece of state that a resume must restore besides params and the data stream."""
  c = tiny_config(steps=steps)
  c.data.schedule = 'heapa'
  c.data.heapa.update(pool_size=6, fresh_per_step=1)  # Step 2 puts back, evicts, samples.
  c.hapo.update(enabled=True, threshold=1.0)
  c.prefix_rollouts.update(enabled=True, max_tokens=3, rows_per_group=1, refresh_every=2)
  c.objective.policy_loss = 'prefix_mixed_ppo'
  return c


def test_resume_after_preemption_is_bit_exact(tmp_path):
  straight, _ = train.train(mixed_config(steps=3), str(tmp_path / 'straight'))
  # First attempt "receives SIGTERM" during step 2: it saves step 2 and exits.
  first, _ = train_preempted_at(2, mixed_config(steps=3), str(tmp_path / 'resumed'))
  assert sorted(os.listdir(tmp_path / 'resumed' / 'checkpoints'))[-1] == '2'
  assert sorted(os.listdir(tmp_path / 'resumed' / 'prefix_policy' / 'checkpoints')) == ['2']
  resumed, _ = train.train(mixed_config(steps=3), str(tmp_path / 'resumed'))
  chex.assert_trees_all_equal(jax.device_get(resumed.params), jax.device_get(straight.params))
  log = {name: [r for r in metrics.read_jsonl(tmp_path / name / 'metrics.jsonl')
                if r['step'] == 3][-1] for name in ('straight', 'resumed')}
  for key in ('train/reward', 'hapo/gate_open_frac', 'prefix/token_frac', 'loss'):
    assert log['resumed'][key] == log['straight'][key], key
  chex.assert_trees_all_equal(jax.device_get(resumed.opt_state),
                              jax.device_get(straight.opt_state))


def critic_config(steps):
  """tiny_config with PPO's critic; the `overlong` verifier (cache = L_max, so every token
  costs 1/8) gives varied nonzero rewards even to an untrained policy, so the head moves."""
  c = tiny_config(steps=steps)
  c.objective.advantage = 'gae'
  c.critic.update(enabled=True, lr=1e-2)
  c.verifier.name = 'overlong'
  c.overlong.cache_len = c.rl.max_new_tokens
  c.eval.every = 0
  return c


def test_resume_with_a_critic_is_bit_exact(tmp_path):
  straight, _ = train.train(critic_config(steps=2), str(tmp_path / 'straight'))
  assert np.abs(np.asarray(straight.value_params['kernel'])).max() > 0
  train_preempted_at(1, critic_config(steps=2), str(tmp_path / 'resumed'))
  resumed, _ = train.train(critic_config(steps=2), str(tmp_path / 'resumed'))
  for field in ('params', 'opt_state', 'value_params', 'value_opt_state'):
    chex.assert_trees_all_equal(jax.device_get(getattr(resumed, field)),
                                jax.device_get(getattr(straight, field)))
  log = [r for r in metrics.read_jsonl(tmp_path / 'resumed' / 'metrics.jsonl') if r['step'] == 2]
  for key in ('value/loss', 'value/explained_var', 'value/clip_frac', 'value/grad_norm'):
    assert np.isfinite(log[-1][key]), key


def test_resume_right_after_the_warm_start_does_not_repeat_it(tmp_path):
  # Stopped after saving step 0 (rl.steps=0 ends there): the resumed run must start RL from
  # the saved warm start, not run SFT a second time on top of it.
  straight, _ = train.train(tiny_config(steps=1), str(tmp_path / 'straight'))
  train.train(tiny_config(steps=0), str(tmp_path / 'resumed'))
  resumed, _ = train.train(tiny_config(steps=1), str(tmp_path / 'resumed'))
  chex.assert_trees_all_equal(jax.device_get(resumed.params), jax.device_get(straight.params))


def test_sigterm_sets_the_preemption_flag():
  flag = checkpoint.PreemptionFlag()
  try:
    assert not flag.should_stop(1)
    os.kill(os.getpid(), signal.SIGTERM)
    assert flag.should_stop(1)
  finally:
    flag.restore_handlers()


def test_corrupt_latest_checkpoint_falls_back_to_the_previous(tmp_path):
  ckpt = checkpoint.Checkpointer(tmp_path, keep=3)
  state = {'w': np.arange(4, dtype=np.float32)}
  for step in (1, 2):
    ckpt.save(step, {'w': state['w'] + step}, data_state={'next_index': step}, config={'a': 1})
  ckpt.wait()
  for path in (tmp_path / 'checkpoints' / '2' / 'state').rglob('*'):
    if path.is_file():
      path.write_bytes(b'corrupt')
  abstract = {'w': jax.ShapeDtypeStruct((4,), np.float32)}
  step, restored, data_state, config = ckpt.restore(abstract)
  assert step == 1 and data_state == {'next_index': 1} and config == {'a': 1}
  np.testing.assert_array_equal(restored['w'], state['w'] + 1)
  ckpt.close()


@pytest.mark.parametrize('field, value, match', [
    ('rl.group_size', 0, 'rl.group_size=0'),
    ('rl.minibatches', 3, 'not divisible by rl.minibatches=3'),
    ('rl.micro_batches', 3, 'rl.micro_batches=3'),
    ('rl.top_p', 1.5, 'rl.top_p=1.5'),
    ('rl.decode_chunks', 0, 'rl.decode_chunks=0'),
    ('objective.policy_loss', 'ppo', "objective.policy_loss='ppo'; known"),
    ('objective.advantage', 'grpoo', "objective.advantage='grpoo'; known"),
    ('verifier.name', 'maths', 'verifier.name'),
    ('data.task', 'sudoku', "data.task='sudoku'; known"),
    ('mesh.tensor', 3, 'mesh'),
])
def test_config_errors_name_the_field(field, value, match):
  c = tiny_config()
  section, key = field.split('.')
  c[section][key] = value
  with pytest.raises(ValueError, match=match):
    config_lib.validate(c, num_devices=8)


def test_rows_must_split_over_data_parallel_devices():
  c = tiny_config()  # 8 devices, 4 x 2 = 8 rows: fine.
  config_lib.validate(c, num_devices=8)
  c.rl.group_size = 3  # 12 rows over 8 devices.
  with pytest.raises(ValueError, match='12 rows is not divisible'):
    config_lib.validate(c, num_devices=8)


def test_config_json_is_written_after_init_and_kept_when_a_resume_fails(tmp_path, capsys):
  c = tiny_config(steps=1)
  train.train(c, str(tmp_path))
  written = json.loads((tmp_path / 'config.json').read_text())
  assert written['config']['rl']['steps'] == 1 and written['git_commit']
  other = tiny_config(steps=2)
  other.model.arch.hidden_size = 64
  # Imported here: checkpoint_crash_test loads this file by path, without tests/ on sys.path.
  from verifiers_sandbox_escapes_test import children_of  # pylint: disable=g-import-not-at-top
  before = children_of(os.getpid())
  with pytest.raises(checkpoint.CheckpointMismatchError,
                     match=r'model.arch.hidden_size: 32 -> 64(.|\n)*new --workdir'):
    train.train(other, str(tmp_path))
  # The failed run stopped its verifier pool (it leaked its workers once, which other tests
  # in the same xdist worker then counted as strays).
  assert not children_of(os.getpid()) - before
  assert json.loads((tmp_path / 'config.json').read_text()) == written  # The record stays.
  capsys.readouterr()
  train.train(tiny_config(steps=2), str(tmp_path))  # The same model resumes, and says so.
  out = capsys.readouterr().out
  assert f'resumed from step 1 (workdir {tmp_path})' in out
  assert 'step 2/2' in out  # The last step always prints.


EXPERIMENTS = sorted(p.stem for p in (pathlib.Path(__file__).resolve().parents[1] /
                                      'experiments').glob('*.py')
                     if p.stem not in ('__init__', 'reward_model',  # An RM: reward_model_test.
                                       'demo_real',  # Its runlocal: demo_real_test.
                                       'eval_real')  # Its configs: demo_real_test.
                     and not p.stem.endswith('_report'))  # Scripts, not configs.


@pytest.mark.parametrize('name', EXPERIMENTS)
def test_every_experiment_config_runs_a_step_with_runlocal(name, tmp_path):
  module = importlib.import_module(f'experiments.{name}')
  c = module.get_config('runlocal')
  c.rl.steps = 1
  _, eval_metrics = train.train(c, str(tmp_path))
  assert 0.0 <= eval_metrics['eval/pass@1'] <= 1.0


# `python -m experiments.<module>` reading and writing the suite's compilation cache (whole
# entries, as the test process does): the report compiles what the run just compiled (SFT,
# sampling, evaluation); from an empty cache it compiled them all again.
_WITH_THE_SUITES_CACHE = ('from rlreason import compile_cache; compile_cache.enable(); '
                          'from absl import app; from experiments import {module}; '
                          'app.run({module}.main)')


def _suites_cache_env():
  return dict(os.environ, JAX_COMPILATION_CACHE_DIR=str(jax.config.jax_compilation_cache_dir),
              JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS=str(
                  jax.config.jax_persistent_cache_min_compile_time_secs),
              JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES=str(
                  jax.config.jax_persistent_cache_min_entry_size_bytes))


def test_demo_report_runs_the_baselines_and_plots(tmp_path):
  import subprocess
  import sys
  c = importlib.import_module('experiments.demo').get_config('runlocal')
  train.train(c, str(tmp_path))
  root = pathlib.Path(__file__).resolve().parents[1]
  out = subprocess.run(
      [sys.executable, '-c', _WITH_THE_SUITES_CACHE.format(module='demo_report'), '--config',
       str(root / 'experiments' / 'demo.py') + ':runlocal', '--workdir', str(tmp_path)],
      cwd=root, env=_suites_cache_env(), capture_output=True, text=True, timeout=600,
      check=True).stdout
  values = dict(line.split('=', 1) for line in out.splitlines() if '=' in line and ' ' not in line)
  for key in ('initial_accuracy', 'final_accuracy', 'sft_only_accuracy', 'rft_accuracy'):
    assert 0.0 <= float(values[key]) <= 1.0, key
  assert values['demo_targets_met'] in ('0', '1')
  assert (tmp_path / 'learning_curves.png').stat().st_size > 0


def test_demo_tools_report_runs_the_baseline_and_plots(tmp_path):
  import subprocess
  import sys
  c = importlib.import_module('experiments.demo_tools').get_config('runlocal')
  train.train(c, str(tmp_path))
  root = pathlib.Path(__file__).resolve().parents[1]
  out = subprocess.run(
      [sys.executable, '-c', _WITH_THE_SUITES_CACHE.format(module='demo_tools_report'), '--config',
       str(root / 'experiments' / 'demo_tools.py') + ':runlocal', '--workdir', str(tmp_path)],
      cwd=root, env=_suites_cache_env(), capture_output=True, text=True, timeout=600,
      check=True).stdout
  values = dict(line.split('=', 1) for line in out.splitlines() if '=' in line and ' ' not in line)
  for key in ('initial_accuracy', 'final_accuracy', 'sft_only_accuracy', 'initial_tool_call_rate',
              'final_tool_call_rate', 'sft_only_tool_call_rate'):
    assert 0.0 <= float(values[key]) <= 1.0, key
  assert values['demo_targets_met'] in ('0', '1')
  assert (tmp_path / 'learning_curves.png').stat().st_size > 0
  assert list((tmp_path / 'baselines' / 'sft_only' / 'tensorboard').iterdir())


def test_an_unimportable_or_crashing_reward_stops_the_run_with_its_error(tmp_path):
  c = tiny_config(steps=2)
  c.verifier.name = 'myreward_absent:last_int'
  with pytest.raises(ValueError, match=r"verifier.name: verifier 'myreward_absent:last_int' "
                     r'cannot be loaded: ModuleNotFoundError'):
    train.train(c, str(tmp_path / 'absent'))
  # Passes the start-up probe (its first call in a process), then raises.
  reward = tmp_path / 'picky.py'
  reward.write_text('CALLS = []\n'
                    'def score(item):\n'
                    '  CALLS.append(1)\n'
                    '  if len(CALLS) > 1:\n'
                    "    raise ValueError('cannot read ' + repr(item['completion']))\n"
                    '  return 0.0\n')
  c.verifier.name = f'{reward}:score'
  from rlreason.rl import rl_batch
  with pytest.raises(rl_batch.RewardCrashError, match=r"crashed on \d+ of \d+ items(.|\n)*"
                     r'ValueError: cannot read .*picky.py:5 in score\]'):
    train.train(c, str(tmp_path / 'crash'))
