"""SOAR (rlreason/dynamics/soar.py): parsing, the exact success probability, the teacher's
grounded reward against the student's measured improvement, skips of unparsable problems,
determinism per seed, and the setting's start-up errors."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rlreason.dynamics import soar, toy_lm
from rlreason.dynamics.group_problems import FIRST_ELEMENT, make_problems
from rlreason.model import transformer
from rlreason.rl import update

TASK = toy_lm.GroupTask.make('S3', max_k=2)  # vocab 8; k-digits are tokens 8 and 9.


def _setting(**kw):
  kw = {'task': TASK, 'student_cfg': toy_lm.tiny_model(TASK, hidden=16, layers=1, heads=2),
        'teacher_cfg': soar.teacher_model(TASK, hidden=16), 'hard_ks': (2,), 'candidates': 2,
        'problems_per_set': 4, 'group_size': 2, 'inner_steps': 1, 'reward_set_size': 8, **kw}
  return soar.Setting(**kw)


def test_parse_proposals_hand_rows():
  rows = [[9, 2, 7],   # k=2, elements 0 and 5: valid
          [8, 3, 0],   # k=1, element 1; the PAD past k is ignored: valid
          [2, 2, 2],   # first token an element, not a k-digit: unparsable
          [9, 4, 1],   # k=2 but the second slot is BLANK: unparsable
          [8, 9, 9]]   # k=1 with a k-digit where an element must be: unparsable
  k_B, elements_BxK, valid_B = soar.parse_proposals(jnp.array(rows), TASK)
  np.testing.assert_array_equal(valid_B, [True, True, False, False, False])
  np.testing.assert_array_equal(k_B[:2], [2, 1])
  np.testing.assert_array_equal(elements_BxK[:2], [[0, 5], [1, 0]])
  formatted = soar.format_proposals(TASK, k_B[:2], elements_BxK[:2])
  np.testing.assert_array_equal(formatted, [[9, 2, 7], [8, 3, 1]])  # BLANK past k
  with pytest.raises(ValueError, match='k-digit'):
    soar.parse_proposals(jnp.zeros((2, 5), jnp.int32), TASK)


def test_success_prob_and_chain_reward_hand_case():
  s = _setting()
  zero = jax.tree.map(jnp.zeros_like, transformer.init_params(s.student_cfg, jax.random.key(0)))
  problems = make_problems(TASK, [1, 2], [[1, 0], [1, 1]])
  # Zero params: uniform logits over the 8 tokens, so P(right chain of length k) = 8^-k.
  np.testing.assert_allclose(soar.success_prob_B(zero, problems, task=TASK, cfg=s.student_cfg),
                             [1 / 8, 1 / 64], rtol=1e-6)
  states = np.asarray(problems.states_BxK) + FIRST_ELEMENT
  prompt = np.asarray(problems.tokens_BxP)
  tokens = np.concatenate([prompt, states], 1)
  wrong_first = tokens.copy()
  wrong_first[:, TASK.prompt_len] = FIRST_ELEMENT + (states[:, 0] - FIRST_ELEMENT + 1) % 6
  wrong_last = tokens.copy()
  wrong_last[:, -1] = 0
  both = np.concatenate([tokens, wrong_first, wrong_last])  # rows: G = 1, problems repeated
  rewards = soar.chain_rewards_N(jnp.asarray(both), jax.tree.map(
      lambda x: jnp.concatenate([x] * 3), problems), task=TASK, group_size=1)
  # k=1 ignores the second written token; any wrong used state fails the chain.
  np.testing.assert_array_equal(rewards, [1, 1, 0, 0, 1, 0])
  np.testing.assert_allclose(soar.teacher_rewards_D(jnp.array([0.1, 0.3]),
                                                    jnp.array([[0.2, 0.4], [0.0, 0.2]])),
                             [0.1, -0.1], atol=1e-7)


@pytest.fixture(scope='module')
def one_step():
  """One compiled outer step from a random student and an SFT-free (mostly unparsable) teacher."""
  s = _setting()
  student = update.init_state(transformer.init_params(s.student_cfg, jax.random.key(1)),
                              s.student_opt)
  teacher = update.init_state(transformer.init_params(s.teacher_cfg, jax.random.key(2)),
                              s.teacher_opt)
  carry = soar.Carry(student=student, teacher=teacher)
  chunk, _ = soar._compiled(s, 4, 8)
  weights = jnp.full((1, TASK.max_k), 0.5)
  new, metrics = chunk(carry, jax.random.split(jax.random.key(3), 1), weights, jnp.float32(1),
                       jnp.float32(1))
  return s, carry, new, jax.device_get(metrics)


def test_teacher_reward_equals_measured_student_improvement(one_step):
  s, before, after, metrics = one_step
  measure = lambda params: float(soar.success_prob_B(params, s.reward_set, task=TASK,
                                                     cfg=s.student_cfg).mean())
  improvement = measure(after.student.params) - measure(before.student.params)
  rewards_D = metrics['rewards_D'][0]
  # The promoted student is the best candidate, and its reward is its measured improvement.
  np.testing.assert_allclose(rewards_D.max(), improvement, rtol=1e-4, atol=1e-9)
  np.testing.assert_allclose(metrics['best_reward'][0], improvement, rtol=1e-4, atol=1e-9)
  np.testing.assert_allclose(metrics['hard_p_before'][0], measure(before.student.params),
                             rtol=1e-5)


def test_unparsable_proposals_are_counted_and_skipped(one_step):
  s, _, after, metrics = one_step
  # A random teacher writes mostly unparsable proposals: counted, and the run goes on.
  assert 0 <= metrics['valid_frac'][0] < 1
  assert np.all(np.isfinite(metrics['rewards_D']))
  assert all(np.all(np.isfinite(x)) for x in jax.tree.leaves(after.teacher.params))
  # A set with no parsable problem leaves the student exactly unchanged (reward exactly 0).
  state = update.init_state(transformer.init_params(s.student_cfg, jax.random.key(4)),
                            s.student_opt)
  problems = make_problems(TASK, [1, 2, 2, 1], jnp.zeros((4, 2), jnp.int32))
  new, reward = jax.jit(lambda st: soar.student_step(st, problems, jnp.zeros(4, bool),
                                                     jax.random.key(5), s=s))(state)
  for a, b in zip(jax.tree.leaves(new), jax.tree.leaves(state)):
    np.testing.assert_array_equal(a, b)
  assert float(reward) == 0.0


def test_train_is_deterministic_per_seed(one_step):
  s = one_step[0]
  student_S = toy_lm.initial_params(task=TASK, model_cfg=s.student_cfg, seeds=(0,))
  teacher_S = soar.initial_teacher(s=s, seeds=(0,), prior_K=jnp.full(2, 0.5), sft_steps=0)
  run_seed = lambda seed: soar.train(s=s, student_S=student_S, teacher_S=teacher_S,
                                     seeds=(seed,), steps=2, eval_every=1, eval_per_k=4,
                                     test_size=8)
  a, b = run_seed(0), run_seed(0)
  np.testing.assert_array_equal(a.success_SxExK, b.success_SxExK)
  for name in ('rewards_D', 'proposed_k_K', 'valid_frac'):
    np.testing.assert_array_equal(a.train[name], b.train[name])
  other = run_seed(1)  # another seed draws other proposals
  assert not (np.array_equal(a.train['proposed_k_K'], other.train['proposed_k_K'])
              and np.array_equal(a.train['valid_frac'], other.train['valid_frac']))


def test_bad_settings_name_the_field():
  with pytest.raises(ValueError, match='hard_ks'):
    _setting(hard_ks=(3,))
  with pytest.raises(ValueError, match='candidates'):
    _setting(candidates=1)
  with pytest.raises(ValueError, match='teacher_cfg.vocab_size'):
    _setting(teacher_cfg=_setting().student_cfg)
  with pytest.raises(ValueError, match='proposer'):
    soar.train(s=_setting(), student_S=None, teacher_S=None, seeds=(0,), steps=1, eval_every=1,
               proposer='oracle')
