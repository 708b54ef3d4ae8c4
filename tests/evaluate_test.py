"""Stand-alone evaluation of a checkpoint, majority vote, and the Hugging Face export.

One 1-step run (HeaPA schedule, HAPO injection, export at the end) writes the checkpoint
that the tests evaluate and the directory they load back.
"""

import json

import jax
import numpy as np
import pytest

from rlreason.model import transformer
from rlreason.model import weights
from rlreason.rl import evaluate
from rlreason.rl import metrics
from rlreason.rl import train
from train_test import tiny_config


@pytest.fixture(scope='module')
def finished_run(tmp_path_factory):
  workdir = tmp_path_factory.mktemp('run')
  c = tiny_config(steps=1)
  c.sft.steps = 0  # The warm start is not under test here.
  c.data.schedule, c.data.heapa.pool_size = 'heapa', 6
  c.hapo.enabled, c.hapo.threshold = True, 1.0
  c.export.path = str(workdir / 'hf')
  state, eval_metrics = train.train(c, str(workdir))
  return c, workdir, state, eval_metrics


def test_the_run_logs_the_new_metrics(finished_run):
  _, workdir, _, _ = finished_run
  (row,) = [r for r in metrics.read_jsonl(workdir / 'metrics.jsonl') if r['step'] == 1]
  for key in ('train/zero_variance_frac', 'hapo/gate_open_frac', 'hapo/threshold',
              'throughput/generate_tokens_per_s', 'throughput/update_tokens_per_s',
              'throughput/eval_tokens_per_s', 'tokens/generate'):
    assert key in row, key
  assert 0.0 <= row['train/zero_variance_frac'] <= 1.0 and np.isfinite(row['loss'])


def test_the_workdirs_config_json_stands_in_for_config(finished_run, tmp_path):
  c, workdir, _, eval_metrics = finished_run
  assert evaluate.workdir_config(workdir).to_dict() == c.to_dict()
  result = evaluate.evaluate_checkpoint(evaluate.workdir_config(workdir), workdir,
                                        output=str(tmp_path / 'from_json.json'))
  assert result['metrics']['pass@1'] == eval_metrics['eval/pass@1']
  with pytest.raises(FileNotFoundError, match=r'config.json does not exist: pass --config'):
    evaluate.workdir_config(tmp_path)


def test_eval_of_the_checkpoint_matches_the_run_and_writes_json(finished_run, tmp_path):
  c, workdir, _, eval_metrics = finished_run
  # Same checkpoint, same held-out prompts, greedy, same key: the run's own final numbers.
  result = evaluate.evaluate_checkpoint(c, workdir, output=str(tmp_path / 'greedy.json'))
  assert result['step'] == 1
  assert result['metrics']['pass@1'] == eval_metrics['eval/pass@1']
  assert result['metrics']['generated_tokens'] == eval_metrics['tokens/eval']  # Same samples.
  sampled = evaluate.evaluate_checkpoint(c, workdir, step=1, k=3, temperature=1.0,
                                         export=str(tmp_path / 'hf_from_eval'))
  written = json.loads((workdir / 'eval' / 'step_1.json').read_text())
  assert written == json.loads(json.dumps(sampled))
  assert written['k'] == 3 and written['num_prompts'] == c.eval.num_prompts
  m = written['metrics']
  assert set(m) == {'pass@1', 'pass@3', 'mean@3', 'maj@3', 'generated_tokens'}
  assert 0.0 <= m['pass@1'] <= m['pass@3'] <= 1.0 and m['mean@3'] == pytest.approx(m['pass@1'])
  a, b = (tmp_path / 'hf_from_eval' / 'model.safetensors'), (workdir / 'hf' / 'model.safetensors')
  assert a.read_bytes() == b.read_bytes()  # The same step-1 policy, exported twice.


def test_exported_policy_loads_back_with_the_same_logits(finished_run):
  c, workdir, state, _ = finished_run
  cfg, params = weights.load(workdir / 'hf')
  assert cfg.hidden_size == c.model.arch.hidden_size and cfg.family == 'qwen2'
  # HF Qwen2 always has q/k/v biases: the export writes zeros, so our config has none.
  ours_cfg = cfg.replace(qkv_bias=False)
  tokens = np.array([[3, 5, 7, 9, 4, 1]], np.int32)
  logits = lambda p, c: np.asarray(jax.jit(lambda p: transformer.apply(p, tokens, cfg=c)[0])(p))
  expected = logits(jax.device_get(state.params), ours_cfg)
  assert expected.std() > 0
  np.testing.assert_array_equal(logits(params, cfg), expected)
  # That transformers reads such a directory alike is weights_test's
  # test_export_matches_transformers; here the point is the run's own export.


def test_majority_vote_uses_final_answers():
  assert evaluate.answer_key('work #### 42') == '42'
  assert evaluate.answer_key(' 1,0 3,1 ') == '1,0 3,1'  # No marker: the whole completion.
  assert evaluate.answer_key('  ') is None
  # Prompt 0: answers 7, 7, 8 -> vote 7, judged correct on sample 0. Prompt 1: 5, 6, 6 ->
  # vote 6, wrong (sample 1 judged wrong). maj@3 = 1/2.
  correct = np.array([[True, True, False], [True, False, False]])
  out = evaluate.summarize(correct, answers_BxK=[['7', '7', '8'], ['5', '6', '6']], ks=(1, 3))
  assert out['maj@3'] == 0.5 and out['pass@3'] == 1.0 and out['pass@1'] == pytest.approx(0.5)
