"""Tests of rlreason.dynamics.toy_lm: the on-device group task, decoding, rewards and summaries."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rlreason.dynamics import group_problems as gp
from rlreason.dynamics import toy_lm as dl
from rlreason.model import transformer
from rlreason.tasks import group_composition

# Jitted once per shape (and kept in the suite's persistent cache): eager dispatch of these
# small scans and reductions costs seconds on a shared 2-core machine.
_make_problems = jax.jit(gp.make_problems, static_argnums=0)
_advantages = jax.jit(dl.token_advantages, static_argnums=(0,))


def test_table_is_the_task_modules_product():
  task = dl.GroupTask.make('S3', max_k=3)
  names = group_composition.elements('S3')
  assert task.order == 6 and names[task.identity] == '[1 2 3]'
  for g in range(6):
    for s in range(6):
      assert names[task.table[g][s]] == group_composition.multiply('S3', names[g], names[s])
  z5 = dl.GroupTask.make('Z5', max_k=2)
  assert z5.identity == 0
  assert z5.table[3][4] == 2  # (3 + 4) mod 5


def test_problems_match_generated_examples():
  # The on-device left fold must give the answer of rlreason.tasks.group_composition.
  task = dl.GroupTask.make('S3', max_k=4)
  names = group_composition.elements('S3')
  index = {n: i for i, n in enumerate(names)}
  ks, elements, answers = [], [], []
  for i in range(12):
    k = 1 + i % 4
    ex = group_composition.generate(7, i, difficulty=k, group='S3')
    ks.append(k)
    elements.append([index[e] for e in ex.meta['elements']] + [0] * (4 - k))
    answers.append(index[ex.answer])
  problems = _make_problems(task, jnp.asarray(ks), jnp.asarray(elements))
  np.testing.assert_array_equal(gp.answers_B(problems), answers)
  # Register g_1..g_k, blanks, then the identity as s_0.
  np.testing.assert_array_equal(
      problems.tokens_BxP[1], [elements[1][0] + 2, elements[1][1] + 2, gp.BLANK, gp.BLANK,
                               task.identity + 2])


def test_rewards_score_only_the_kth_token():
  task = dl.GroupTask.make('Z5', max_k=3)
  problems = _make_problems(task, jnp.asarray([2]), jnp.asarray([[1, 3, 4]]))  # s = 1, 4 (mod 5); answer 4.
  prompt = list(np.asarray(problems.tokens_BxP[0]))
  right = prompt + [1 + 2, 4 + 2, 0]
  wrong_middle = prompt + [0 + 2, 4 + 2, 3]  # Intermediate state and filler are not scored.
  wrong_answer = prompt + [1 + 2, 3 + 2, 4 + 2]
  tokens_NxT = jnp.asarray([right, wrong_middle, wrong_answer], jnp.int32)
  rewards_N = dl.completion_rewards_N(tokens_NxT, problems, task=task, group_size=3)
  np.testing.assert_array_equal(rewards_N, [1.0, 1.0, 0.0])


def test_per_difficulty_mean():
  values_N = jnp.asarray([1.0, 0.0, 1.0, 1.0, 0.0])
  k_N = jnp.asarray([1, 1, 2, 2, 2])
  out_K = dl.per_difficulty_mean(values_N, k_N, 3)
  np.testing.assert_allclose(out_K[:2], [0.5, 2 / 3], rtol=1e-6)
  assert np.isnan(out_K[2])


def test_std_heterogeneity_hand_values():
  rewards_BxG = jnp.asarray([[1.0, 0, 0, 0], [1, 1, 0, 0], [1, 1, 1, 1]])
  out = dl.std_heterogeneity(rewards_BxG)
  # Population stds: sqrt(3/16) = 0.4330, 0.5, 0. Over the two live prompts: mean 0.4665,
  # std |0.5 - 0.4330| / 2 = 0.03349, cv = 0.0718.
  np.testing.assert_allclose(out['std_mean'], (0.4330127 + 0.5) / 3, rtol=1e-5)
  np.testing.assert_allclose(out['std_cv'], 0.0334936 / 0.4665064, rtol=1e-4)
  np.testing.assert_allclose(out['zero_std_frac'], 1 / 3, rtol=1e-6)


def test_token_advantages_hand_values():
  rewards_BxG = jnp.asarray([[1.0, 0.0], [1.0, 1.0]])
  mask_NxL = jnp.asarray([[1.0, 1.0], [1.0, 0.0], [1.0, 1.0], [1.0, 1.0]])
  adv = lambda name: np.asarray(_advantages(name, rewards_BxG, None, mask_NxL))
  # GRPO: ±0.5 / unbiased std 0.7071 = ±0.7071. Dr. GRPO: ±0.5. Global: centred values
  # [.5, -.5, 0, 0] over the batch have variance 0.5 / 3, so ±0.5 / 0.4082 = ±1.2247.
  np.testing.assert_allclose(adv('grpo')[:2], [[0.70710, 0.70710], [-0.70710, 0.0]], rtol=1e-4)
  np.testing.assert_allclose(adv('dr_grpo')[:2], [[0.5, 0.5], [-0.5, 0.0]], rtol=1e-6)
  np.testing.assert_allclose(adv('global')[:2], [[1.22474, 1.22474], [-1.22474, 0.0]],
                             rtol=1e-4)
  for name in ('grpo', 'dr_grpo', 'global'):
    np.testing.assert_array_equal(adv(name)[2:], 0.0)  # All-equal group.
  with pytest.raises(ValueError, match='estimator'):
    dl.token_advantages('nope', rewards_BxG, None, mask_NxL)


def test_greedy_decode_matches_full_forward():
  # Jitted only: eager nnx decoding dispatches op by op and takes minutes on 2 cores.
  task = dl.GroupTask.make('S3', max_k=3)
  cfg = dl.tiny_model(task, hidden=16, layers=1, heads=2)
  params = jax.jit(lambda key: transformer.init_params(cfg, key))(jax.random.key(3))
  problems = dl.sample_problems(jax.random.key(4), task, weights_K=jnp.ones(3) / 3, batch=5)
  fn = lambda p, t: dl.decode(p, t, jax.random.key(0), cfg=cfg, steps=3, temperature=0.0)
  tokens_NxT = jax.jit(fn)(params, problems.tokens_BxP)
  logits_NxTxV = jax.jit(lambda p, t: transformer.apply(p, t, cfg=cfg)[0])(params, tokens_NxT)
  p = task.prompt_len
  np.testing.assert_array_equal(tokens_NxT[:, :p], problems.tokens_BxP)
  np.testing.assert_array_equal(tokens_NxT[:, p:], jnp.argmax(logits_NxTxV[:, p - 1:-1], -1))


def test_sampled_decode_is_reproducible_and_uses_the_key():
  task = dl.GroupTask.make('Z5', max_k=4)
  cfg = dl.tiny_model(task, hidden=16, layers=1, heads=2)
  params = jax.jit(lambda key: transformer.init_params(cfg, key))(jax.random.key(0))
  weights_K = dl.difficulty_weights_K(task, (4,))
  prompts = jnp.repeat(dl.sample_problems(jax.random.key(1), task, weights_K=weights_K,
                                          batch=1).tokens_BxP, 64, 0)
  fn = jax.jit(lambda key: dl.decode(params, prompts, key, cfg=cfg, steps=4, temperature=1.0))
  a, b, c = fn(jax.random.key(5)), fn(jax.random.key(5)), fn(jax.random.key(6))
  np.testing.assert_array_equal(a, b)
  assert not np.array_equal(a, c)
  assert len(np.unique(np.asarray(a[:, -1]))) > 1  # Rows of one prompt differ at T = 1.


def test_difficulty_mixture():
  task = dl.GroupTask.make('S3', max_k=4)
  np.testing.assert_allclose(dl.difficulty_weights_K(task, (1, 4)), [0.5, 0, 0, 0.5])
  problems = dl.sample_problems(jax.random.key(0), task,
                                weights_K=dl.difficulty_weights_K(task, (1, 4)), batch=400)
  k_B = np.asarray(problems.k_B)
  assert set(k_B.tolist()) == {1, 4} and 150 < (k_B == 1).sum() < 250
  with pytest.raises(ValueError, match='difficulties'):
    dl.difficulty_weights_K(task, (5,))


def test_soft_targets_hand_values():
  # Z5: tokens PAD, BLANK, then elements 0..4. Answer 2 with p = 0.6: 0.6 on token 4, the
  # other 0.4 spread over the 4 other elements (0.1 each), nothing on PAD / BLANK.
  task = dl.GroupTask.make('Z5', max_k=2)
  np.testing.assert_allclose(dl.soft_targets_BxV(task, jnp.asarray([2, 0]), target_accuracy=0.6),
                             [[0, 0, .1, .1, .6, .1, .1], [0, 0, .6, .1, .1, .1, .1]], atol=1e-7)


def test_soft_warm_start_with_accuracy_one_is_the_hard_one():
  # target_accuracy = 1 puts all target mass on g_1 · s_0, so its cross-entropy is the
  # sft_step loss on the same batch: one Adam step must give the same parameters.
  task = dl.GroupTask.make('Z5', max_k=2)
  cfg = dl.tiny_model(task, hidden=16, layers=1, heads=2)
  params = jax.jit(lambda key: transformer.init_params(cfg, key))(jax.random.key(0))
  sft = jax.jit(lambda p, acc: dl.one_step_sft(p, jax.random.key(1), task=task, cfg=cfg,
                                                steps=1, batch=8, target_accuracy=acc),
                static_argnums=1)
  hard, soft = sft(params, None), sft(params, 1.0)
  for a, b in zip(jax.tree.leaves(hard), jax.tree.leaves(soft)):
    np.testing.assert_allclose(a, b, atol=1e-6)
  with pytest.raises(ValueError, match='target_accuracy'):
    dl.one_step_sft(params, jax.random.key(1), task=task, cfg=cfg, steps=1,
                    target_accuracy=0.2)  # Not above chance 1/5.
