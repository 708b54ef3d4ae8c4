"""Tests for rlreason.methods.soup: the keep-k snapshot buffer, age sampling, per-row prefixes with
their own versions and behaviour log-probs, and prefix length 0 = GRPO."""

import types

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rlreason import config as config_lib
from rlreason.methods import soup
from rlreason.model import tokenizer as tokenizer_lib
from rlreason.model import transformer
from rlreason.objectives import losses
from rlreason.rl import rl_batch
from rlreason.rollout import sampler

TOK = tokenizer_lib.from_characters('0123456789+=')
CFG = transformer.ModelConfig(vocab_size=TOK.vocab_size, hidden_size=16, intermediate_size=32,
                              num_layers=1, num_heads=2, num_kv_heads=1, head_dim=8)


def make_run(buffer, *, rows_per_group=2, keep=3, age_decay=1.0, group_size=4):
  config = config_lib.default()
  config.rl.update(group_size=group_size, temperature=1.0)
  config.prefix_rollouts.update(enabled=True, max_tokens=5, rows_per_group=rows_per_group,
                                refresh_every=2, keep=keep, age_decay=age_decay)
  (step, params), history = buffer[0], buffer[1:]
  return types.SimpleNamespace(config=config, cfg=CFG, tok=TOK, pad_id=TOK.pad_id, mesh=None,
                               sample_shardings=None, prefix_params=params, prefix_step=step,
                               prefix_history=list(history))


def prompts():
  return sampler.prepare_prompts([TOK.encode('12+3='), TOK.encode('4+56=')], buckets=(8,),
                                 pad_id=TOK.pad_id)


def test_buffer_keeps_the_k_newest_snapshot_steps():
  assert soup.buffer_steps(7, 2, 3) == [6, 4, 2]
  assert soup.buffer_steps(3, 2, 5) == [2, 0]  # The warm start while fewer than k exist.
  assert soup.buffer_steps(9, 0, 4) == [0]  # No refresh: the warm start only.
  assert soup.buffer_steps(5, 3, 1) == [3]  # keep = 1: mixed_policy.snapshot_step.
  with pytest.raises(ValueError, match='prefix_rollouts.keep'):
    soup.buffer_steps(1, 1, 0)


def test_push_is_first_in_first_out():
  run = make_run([(0, {'w': jnp.zeros(())})], keep=3)
  for step in (2, 4, 6):
    soup.push_snapshot(run, {'w': jnp.float32(step)}, step)
  got = [(s, float(p['w'])) for s, p in soup.snapshots(run)]
  assert got == [(6, 6.0), (4, 4.0), (2, 2.0)]  # Warm start (0) evicted at the third push.


def test_age_probabilities_and_choice_are_deterministic_per_key():
  np.testing.assert_allclose(soup.age_probs(3, 0.5), [4 / 7, 2 / 7, 1 / 7], rtol=1e-6)
  np.testing.assert_allclose(soup.age_probs(4, 1.0), [0.25] * 4)
  a = soup.choose_snapshots(jax.random.key(0), 4000, 3, 0.5)
  b = soup.choose_snapshots(jax.random.key(0), 4000, 3, 0.5)
  c = soup.choose_snapshots(jax.random.key(1), 4000, 3, 0.5)
  np.testing.assert_array_equal(a, b)
  assert (np.asarray(a) != np.asarray(c)).any()
  freq = np.bincount(np.asarray(a), minlength=3) / 4000
  np.testing.assert_allclose(freq, [4 / 7, 2 / 7, 1 / 7], atol=0.03)
  with pytest.raises(ValueError, match='age_decay'):
    soup.age_probs(2, 0.0)


def test_rows_take_prefix_tokens_logprobs_and_version_from_their_own_snapshot():
  snaps = [(4, transformer.init_params(CFG, jax.random.key(1))),
           (2, transformer.init_params(CFG, jax.random.key(2))),
           (0, transformer.init_params(CFG, jax.random.key(3)))]
  run = make_run(snaps, keep=3, age_decay=1.0)
  key = jax.random.key(5)
  prefixes, version_N = soup.buffer_prefixes(run, prompts(), key=key)
  choice_N = np.asarray(soup.choose_snapshots(jax.random.fold_in(key, soup._CHOICE_KEY), 8, 3,
                                              1.0))
  np.testing.assert_array_equal(version_N, np.array([4, 2, 0])[choice_N])
  sample_key = jax.random.split(key)[0]
  k_N = np.asarray(prefixes.mask_NxQ).sum(1)
  assert (k_N[np.arange(8) % 4 >= 2] == 0).all() and k_N.max() >= 1
  for j, (_, params) in enumerate(snaps):  # Each snapshot's rows: its own sampled tokens.
    old = sampler.generate(params, prompts(), cfg=CFG, group_size=4, max_new_tokens=5,
                           stop_tokens=tuple(TOK.eos_ids), pad_id=TOK.pad_id,
                           rng=jax.random.fold_in(sample_key, j))
    for n in np.flatnonzero(choice_N == j):
      k = k_N[n]
      np.testing.assert_array_equal(np.asarray(prefixes.tokens_NxQ)[n, :k],
                                    np.asarray(old.tokens_NxL)[n, :k])
      np.testing.assert_array_equal(np.asarray(prefixes.logprobs_NxQ)[n, :k],
                                    np.asarray(old.behaviour_logprobs_NxL)[n, :k])
  # The continuation: prefix tokens carry their snapshot's version, the rest the learner's.
  params = transformer.init_params(CFG, jax.random.key(9))
  rollout = sampler.generate(params, prompts(), cfg=CFG, group_size=4, max_new_tokens=4,
                             stop_tokens=tuple(TOK.eos_ids), pad_id=TOK.pad_id,
                             rng=jax.random.key(4), prefixes=prefixes)
  tagged = rl_batch.tag_versions(rollout, version=6, prefix_version=version_N)
  v_NxL, p_NxL = np.asarray(tagged.version_NxL), np.asarray(rollout.prefix_mask_NxL)
  for n in range(8):
    assert (v_NxL[n][p_NxL[n]] == np.asarray(version_N)[n]).all()
    assert (v_NxL[n][~p_NxL[n]] == 6).all()
  # Behaviour log-probs of prefix tokens are the snapshot's, recorded, not recomputed.
  blp = np.asarray(rollout.behaviour_logprobs_NxL)
  np.testing.assert_array_equal(blp[p_NxL], np.asarray(prefixes.logprobs_NxQ)[
      np.asarray(prefixes.mask_NxQ)])


def test_prefix_length_zero_is_grpo():
  """rows_per_group = 0: no row gets a prefix; sampling and the loss are GRPO's."""
  snaps = [(2, transformer.init_params(CFG, jax.random.key(1))),
           (0, transformer.init_params(CFG, jax.random.key(2)))]
  run = make_run(snaps, rows_per_group=0, keep=2)
  prefixes, _ = soup.buffer_prefixes(run, prompts(), key=jax.random.key(5))
  assert not np.asarray(prefixes.mask_NxQ).any()
  params = transformer.init_params(CFG, jax.random.key(9))
  kw = dict(cfg=CFG, group_size=4, max_new_tokens=6, stop_tokens=tuple(TOK.eos_ids),
            pad_id=TOK.pad_id, rng=jax.random.key(4), temperature=1.0)
  mixed = sampler.generate(params, prompts(), prefixes=prefixes, **kw)
  plain = sampler.generate(params, prompts(), **kw)
  np.testing.assert_array_equal(mixed.tokens_NxL[:, :6], plain.tokens_NxL)
  assert not np.asarray(mixed.mask_NxL[:, 6:]).any()
  np.testing.assert_allclose(mixed.behaviour_logprobs_NxL[:, :6], plain.behaviour_logprobs_NxL,
                             atol=1e-6)
  # The loss on the same numbers: prefix_mixed_ppo with no prefix token = ppo_clip, bit-exact.
  lp = plain.behaviour_logprobs_NxL + 0.1 * jax.random.normal(jax.random.key(7), (8, 6))
  adv = jnp.repeat(jnp.array([1.0, -0.5]), 4)[:, None] * jnp.ones((1, 6))
  mask = plain.mask_NxL.astype(jnp.float32)
  loss_a, w_a, _ = losses.prefix_mixed_ppo(
      lp, plain.behaviour_logprobs_NxL, adv, mask, prefix_mask_NxL=mixed.prefix_mask_NxL[:, :6],
      behavior_logprobs_NxL=mixed.behaviour_logprobs_NxL[:, :6], prefix_eps_low=0.05)
  loss_b, w_b, _ = losses.ppo_clip(lp, plain.behaviour_logprobs_NxL, adv, mask)
  np.testing.assert_array_equal(loss_a, loss_b)
  np.testing.assert_array_equal(w_a, w_b)


def test_keep_needs_refresh_and_positive_decay():
  c = config_lib.default()
  c.objective.policy_loss = 'prefix_mixed_ppo'
  c.prefix_rollouts.update(enabled=True, keep=3, refresh_every=0, age_decay=0.0)
  with pytest.raises(ValueError) as e:
    config_lib.validate(c, num_devices=1)
  assert 'prefix_rollouts.keep=3' in str(e.value) and 'prefix_rollouts.age_decay=0.0' in str(
      e.value)


def test_refresh_saves_and_restore_rebuilds_the_buffer(tmp_path):
  """keep = 2, a snapshot every 2 steps: after step 6 the buffer is {6, 4}; a resumed run
  restores the same steps and parameters from prefix_policy/ (step 0 is the warm start)."""
  params = lambda v: {'w': jnp.full((3,), v, jnp.float32)}
  run = make_run([(0, params(0.0))], keep=2)
  run.workdir = tmp_path
  for step in range(1, 7):
    soup.refresh(run, params(float(step)), step)
  assert [s for s, _ in soup.snapshots(run)] == [6, 4]
  resumed = make_run([(0, None)], keep=2)
  resumed.workdir = tmp_path
  abstract = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype), params(0.0))
  soup.restore_buffer(resumed, abstract, 7, params(0.0))
  got = [(s, np.asarray(p['w']).tolist()) for s, p in soup.snapshots(resumed)]
  assert got == [(6, [6.0] * 3), (4, [4.0] * 3)]
  soup.restore_buffer(resumed, abstract, 3, params(0.0))  # {2, 0}: 0 is the warm start.
  assert [(s, float(p['w'][0])) for s, p in soup.snapshots(resumed)] == [(2, 2.0), (0, 0.0)]
