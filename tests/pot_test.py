"""PoT (methods/pot.py): the base is untouched, the adapter is per problem and transient, equal
rewards give no update, the jitted pieces compile once, bad options fail naming the flag."""

import types

import jax
import numpy as np
import pytest

from rlreason.methods import pot
from rlreason.rl import run_setup
from rlreason.tasks import example as example_lib
from train_test import tiny_config  # 1 layer, d = 32, arithmetic, 8 fake devices.

STEPS, CANDIDATES, RANK = 2, 4, 2


def _leaves(tree):
  return [np.array(x) for x in jax.tree.leaves(jax.device_get(tree))]


@pytest.fixture(scope='module')
def run(tmp_path_factory):
  c = tiny_config()
  c.model.arch.update(num_layers=2)
  r = run_setup.build(c, str(tmp_path_factory.mktemp('pot')))
  yield r
  r.close()


def _solve(run, examples, *, lr=1e-2, seed=0, **kw):
  return pot.solve(run, run.policy(run.init_params), examples, steps=STEPS,
                   candidates=CANDIDATES, rank=RANK, lr=lr, rng=jax.random.key(seed), **kw)


def test_one_problem_end_to_end_leaves_the_base_bit_identical(run):
  before = _leaves(run.init_params)
  result = _solve(run, run.eval_examples[:1])
  assert result.correct_P.shape == result.base_correct_P.shape == (1,)
  assert result.reward_means_PxS.shape == (1, STEPS)
  assert np.all((result.reward_means_PxS >= 0) & (result.reward_means_PxS <= 1))
  assert isinstance(result.answers[0], str) and isinstance(result.base_answers[0], str)
  # A right candidate implies a positive mean reward at its step (binary checker).
  assert not result.any_candidate_P[0] or result.reward_means_PxS.max() > 0
  for a, b in zip(before, _leaves(run.init_params)):
    np.testing.assert_array_equal(a, b)
  assert set(result.metrics()) >= {'pot/pass@1', 'pot/base_pass@1', 'pot/any_candidate',
                                   'pot/reward_mean_step0', 'pot/reward_mean_step1'}


def _alternating(run, rollout, examples):
  """Rewards 1, 0, 1, 0, ... whatever the text: a non-zero GRPO advantage every step."""
  g = rollout.group_size
  rewards = np.tile(np.arange(g) % 2 == 0, (len(examples), 1)).astype(np.float32)
  return rewards, rewards > 0


def test_jitted_pieces_compile_once_for_several_problems(run):
  before = _leaves(run.init_params)
  result = _solve(run, run.eval_examples[:3], score=_alternating)
  # Unequal rewards: every problem's adapter moved (and was dropped: the base did not).
  assert np.all(result.adapter_b_norm_P > 0)
  for a, b in zip(before, _leaves(run.init_params)):
    np.testing.assert_array_equal(a, b)
  (fns,) = {pot.jitted(run.cfg, _lora_cfg(), lr=1e-2, candidates=CANDIDATES, mesh=run.mesh)}
  for name in ('init', 'merge', 'train', 'b_norm'):
    assert getattr(fns, name)._cache_size() == 1, name


def _lora_cfg():
  from rlreason.model import lora
  return lora.LoraConfig(rank=RANK, alpha=2.0 * RANK)


def _all_equal(run, rollout, examples):
  g = rollout.group_size
  ones = np.ones((len(examples), g), np.float32)
  return ones, ones > 0


def test_equal_rewards_give_no_update_and_the_base_models_answer(run):
  examples = run.eval_examples[:2]
  result = _solve(run, examples, score=_all_equal, lr=1.0)
  # GRPO: A_i = (1 - 1) / (0 + eps) = 0 for every candidate, so the loss and its gradient
  # are 0, Adam's update 0 / (sqrt(0) + eps) = 0: B stays exactly zero.
  np.testing.assert_array_equal(result.adapter_b_norm_P, [0.0, 0.0])
  real = _solve(run, examples, lr=1.0)  # The real checker, with the same keys: greedy answers.
  assert result.answers == result.base_answers == real.base_answers
  np.testing.assert_array_equal(real.base_correct_P, _base_greedy(run, examples))


def _base_greedy(run, examples):
  """The base model's greedy verdicts through the evaluation's own sampler call."""
  from rlreason.rollout import sampler
  with jax.set_mesh(run.mesh):
    out = []
    for ex in examples:
      rollout = sampler.generate(
          run.init_params, run_setup.encode_prompts(run, [ex]), cfg=run.cfg, group_size=1,
          max_new_tokens=run.config.rl.max_new_tokens, temperature=0.0,
          stop_tokens=tuple(run.tok.eos_ids), pad_id=run.pad_id, rng=jax.random.key(0),
          mesh=run.mesh, max_chunks=run.config.rl.decode_chunks)
      out.append(bool(pot.checker_scores(run, rollout, [ex])[1][0, 0]))
  return out


@pytest.mark.parametrize('field, value, flag', [
    ('steps', -1, '--pot_steps'), ('candidates', 1, '--pot_candidates'),
    ('rank', 0, '--pot_rank'), ('rank', -2, '--pot_rank'), ('lr', 0.0, '--pot_lr')])
def test_bad_options_name_the_flag(field, value, flag):
  kw = dict(steps=2, candidates=4, rank=2, lr=1e-2)
  kw[field] = value
  with pytest.raises(ValueError, match=flag):
    pot.check_options(**kw)
  with pytest.raises(ValueError, match=flag):  # solve checks before touching the run.
    pot.solve(None, None, [], rng=jax.random.key(0), **kw)


def test_tasks_without_a_test_time_checker_are_refused():
  fake_run = types.SimpleNamespace(env=None, judge=None)
  gsm = example_lib.Example(id='g1', prompt='2+2?', answer='4', solution='4', task='gsm8k',
                            difficulty=1, meta={})
  with pytest.raises(ValueError, match="task 'gsm8k'.*test-time checker|test-time checker.*"
                     "gsm8k"):
    pot.check_run(fake_run, [gsm])
  with pytest.raises(ValueError, match='env and judge'):
    pot.check_run(types.SimpleNamespace(env=object(), judge=None), [])


def test_evaluate_with_pot_adds_both_pass_at_1_and_keeps_the_plain_metrics(tmp_path, capsys):
  from rlreason.rl import evaluate
  from rlreason.rl import train
  c = tiny_config(steps=0)
  c.sft.steps, c.eval.num_prompts = 0, 3
  train.train(c, str(tmp_path))  # The step-0 checkpoint.
  plain = evaluate.evaluate_checkpoint(c, tmp_path, output=str(tmp_path / 'plain.json'))
  options = dict(steps=1, candidates=2, rank=1, lr=1e-2)
  with_pot = evaluate.evaluate_checkpoint(c, tmp_path, output=str(tmp_path / 'pot.json'),
                                          pot_options=options)
  assert 'pot' not in plain and with_pot['metrics'] == plain['metrics']
  assert with_pot['pot']['steps'] == 1 and with_pot['num_prompts'] == 3
  printed = capsys.readouterr().out
  for key, name in (('pot/pass@1', 'pot_pass_at_1'), ('pot/base_pass@1', 'base_pass_at_1')):
    assert f'{name}={with_pot["pot"]["metrics"][key]:.4f}' in printed.splitlines()
  with pytest.raises(ValueError, match='--pot_candidates'):
    evaluate.evaluate_checkpoint(c, tmp_path, pot_options={**options, 'candidates': 1})
