"""A checkpoint of another model: a short diff of the configs, not orbax's tree; Ctrl-C saves."""

import os
import signal

import jax
import numpy as np
import pytest

from rlreason.rl import checkpoint


def test_config_diff_lists_model_fields_first_with_both_values():
  saved = {'model': {'arch': {'hidden_size': 64, 'num_layers': 2}}, 'rl': {'steps': 8},
           'seed': 0, 'data': {'prompt_buckets': [16]}}
  requested = {'model': {'arch': {'hidden_size': 128, 'num_layers': 2}}, 'rl': {'steps': 9},
               'seed': 0, 'data': {'prompt_buckets': (16,)}, 'lora': {'rank': 4}}
  assert checkpoint.config_diff(saved, requested) == [
      "lora.rank: '(absent)' -> 4", 'model.arch.hidden_size: 64 -> 128', 'rl.steps: 8 -> 9']
  many = checkpoint.config_diff({f'k{i}': i for i in range(20)}, {}, limit=3)
  assert len(many) == 4 and many[-1] == '... and 17 more'


def test_restoring_another_models_checkpoint_names_the_differing_fields(tmp_path):
  ckpt = checkpoint.Checkpointer(tmp_path)
  saved_config = {'model': {'arch': {'hidden_size': 4}}, 'rl': {'steps': 2}}
  ckpt.save(1, {'w': np.zeros(4, np.float32)}, config=saved_config)
  ckpt.wait()
  abstract = {'w': jax.ShapeDtypeStruct((8,), np.float32)}
  requested = {'model': {'arch': {'hidden_size': 8}}, 'rl': {'steps': 2}}
  with pytest.raises(checkpoint.CheckpointMismatchError) as e:
    ckpt.restore(abstract, config=requested)
  message = str(e.value)
  assert 'model.arch.hidden_size: 4 -> 8' in message and 'new --workdir' in message
  assert 'partial_restore' not in message and len(message.splitlines()) < 8, message
  # Same config but an unreadable state: the old error, one line per step.
  # (orbax alone restores the saved shape silently.)
  with pytest.raises(RuntimeError, match=r"could be restored:\n  step 1: .*\['w'\] has shape "
                     r"\(4,\) in the checkpoint, this run expects \(8,\)") as e:
    ckpt.restore(abstract, config=saved_config)
  assert len(str(e.value).splitlines()) == 2, str(e.value)
  assert ckpt.restore({'w': jax.ShapeDtypeStruct((4,), np.float32)}, config=requested)[0] == 1


def test_sigint_sets_the_flag_and_a_second_one_exits_at_once(capsys):
  before = signal.getsignal(signal.SIGINT)  # pytest-xdist's workers install their own.
  flag = checkpoint.PreemptionFlag()
  try:
    os.kill(os.getpid(), signal.SIGINT)
    assert flag.should_stop(1)
    assert 'received SIGINT: saving a checkpoint' in capsys.readouterr().out
    with pytest.raises(KeyboardInterrupt):
      os.kill(os.getpid(), signal.SIGINT)
  finally:
    flag.restore_handlers()
  assert signal.getsignal(signal.SIGINT) is before
