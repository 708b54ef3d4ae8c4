"""Tests for rlreason.methods.mixed_policy: HAPO's teacher injection and older-policy prefixes."""

import types

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rlreason import config as config_lib
from rlreason.methods import mixed_policy
from rlreason.model import tokenizer as tokenizer_lib
from rlreason.model import transformer
from rlreason.rollout import sampler
from rlreason.structs import Rollout
from rlreason.tasks import Example
from rlreason.verifiers import verdict as verdict_lib

TOK = tokenizer_lib.from_characters('0123456789+=')


class ExactMatchPool:
  """Verifier pool stand-in: reward 1 iff the completion is the gold answer."""

  def __init__(self):
    self.items = []

  def score(self, items, *, verifier, deadline_s):
    del verifier, deadline_s
    self.items += items
    return [verdict_lib.judged(it['completion'] == it['answer']) for it in items]


def fake_run(**hapo):
  config = config_lib.default()
  config.hapo.update({'enabled': True, **hapo})
  return types.SimpleNamespace(config=config, tok=TOK, pad_id=TOK.pad_id, pool=ExactMatchPool(),
                               judge=None)


def random_rollout(b, g, length, seed=0):
  rng = np.random.default_rng(seed)
  n = b * g
  lengths_N = rng.integers(1, length + 1, n)
  mask_NxL = np.arange(length)[None] < lengths_N[:, None]
  prompts = sampler.prepare_prompts([TOK.encode('1+1=')] * b, buckets=(8,), pad_id=TOK.pad_id)
  return Rollout(
      prompts=prompts, tokens_NxL=jnp.asarray(rng.integers(3, TOK.vocab_size, (n, length))),
      mask_NxL=jnp.asarray(mask_NxL), prefix_mask_NxL=jnp.zeros((n, length), bool),
      logprobs_NxL=jnp.asarray(-rng.random((n, length)), jnp.float32),
      behaviour_logprobs_NxL=jnp.asarray(-rng.random((n, length)), jnp.float32),
      truncated_N=jnp.zeros(n, bool), lengths_N=jnp.asarray(lengths_N, jnp.int32),
      group_size=g)


# Seven groups of G = 4 (success: reward >= 1), with reference solutions; group 4 has none and
# group 5's is wrong (its gold answer is '12').
HAPO_REWARDS_BxG = np.array([[0.0, 0.0, 0.0, 0.0],   # S = 0, all tied: any one slot
                             [1.0, 0.0, 0.2, 0.3],   # S = 1, lowest is slot 1
                             [1.0, 1.0, 0.0, 0.1],   # S = 2, lowest is slot 2
                             [1.0, 1.0, 1.0, 1.0],   # S = 4, no failure
                             [0.0, 0.0, 0.0, 0.0],   # no reference solution
                             [0.0, 0.5, 0.0, 0.0],   # the solution is wrong
                             [1.0, 1.0, 1.0, 0.0]],  # S = 3, lowest is slot 3
                            np.float32)
HAPO_SOLUTIONS = ['12', '34', '56', '78', None, '99', '11']


def _hapo_examples():
  return [Example(id=str(b), prompt='1+1=', answer='12' if b == 5 else (s or '0'), solution=s,
                  task='arithmetic', difficulty=1) for b, s in enumerate(HAPO_SOLUTIONS)]


def test_hapo_v1_gate_injects_into_mixed_groups_too():
  # The default, v1's gate: open iff (1 + S)/(N + 2) < 0.8 with N = 4, i.e. S + 1 < 4.8, S <= 3:
  #   S = 0: 1/6, S = 1: 2/6, S = 2: 3/6, S = 3: 4/6 -> open;  S = 4: 5/6 = 0.83 -> shut.
  # Open with a solution: groups 0, 1, 2, 5, 6 (5/7); verified: all but 5 (4/5); injected:
  # 0, 1, 2, 6 (4/7) -- groups 2 and 6 are mixed groups, which a fail-only gate would skip.
  rollout = random_rollout(7, 4, length=5)
  run = fake_run()
  assert (run.config.hapo.gate, run.config.hapo.threshold) == ('posterior_mean', 0.8)
  new, new_rewards_BxG, metrics = mixed_policy.hapo_inject(
      run, rollout, HAPO_REWARDS_BxG, _hapo_examples(), step=0, key=jax.random.key(0),
      params=None, progress=0.0)
  injected_BxG = np.zeros((7, 4), bool)
  injected_BxG[1, 1] = injected_BxG[2, 2] = injected_BxG[6, 3] = True
  tied = np.flatnonzero(np.asarray(new.prefix_mask_NxL).reshape(7, 4, -1)[0].any(-1))
  assert len(tied) == 1
  injected_BxG[0, tied[0]] = True
  np.testing.assert_array_equal(new_rewards_BxG, np.where(injected_BxG, 1.0, HAPO_REWARDS_BxG))
  assert metrics['hapo/gate_open_frac'] == pytest.approx(5 / 7)
  assert metrics['hapo/injected_frac'] == pytest.approx(4 / 7)
  assert metrics['hapo/teacher_verified_frac'] == pytest.approx(4 / 5)

  inj_N = injected_BxG.reshape(-1)
  tokens, mask = np.asarray(new.tokens_NxL), np.asarray(new.mask_NxL)
  for n in np.flatnonzero(inj_N):
    row = TOK.encode(HAPO_SOLUTIONS[n // 4]) + [TOK.eos_id]  # '12' -> 2 chars + eos, in L = 5.
    np.testing.assert_array_equal(tokens[n, :3], row)
    np.testing.assert_array_equal(mask[n], [True] * 3 + [False] * 2)
    np.testing.assert_array_equal(np.asarray(new.prefix_mask_NxL)[n], mask[n])  # Marked.
    assert np.isnan(np.asarray(new.behaviour_logprobs_NxL)[n, :3]).all()  # Learner's own.
    assert int(new.lengths_N[n]) == 3 and not bool(new.truncated_N[n])
  for field in ('tokens_NxL', 'mask_NxL', 'prefix_mask_NxL', 'behaviour_logprobs_NxL',
                'lengths_N'):
    np.testing.assert_array_equal(np.asarray(getattr(new, field))[~inj_N],
                                  np.asarray(getattr(rollout, field))[~inj_N])
  # The teacher traces were verified (rewards recomputed), the wrong one rejected.
  assert {it['completion'] for it in run.pool.items} >= {'12', '34', '56', '99', '11'}


def test_hapo_confidence_gate_is_a_labelled_option():
  # gate='confidence' [I], α0 = β0 = 1, τ = 0.5, confidence 0.8: open iff
  # P(p < 0.5 | s, f) = I_0.5(1 + s, 1 + f) >= 0.8 (and f > 0):
  #   s=0, f=4: 1 - 0.5^5 = 0.96875 open      s=1, f=3: 26/32 = 0.8125 open
  #   s=2, f=2: 0.5 shut                       s=3, f=1: I_0.5(4, 2) = 6/32 = 0.1875 shut
  # Open with a solution: groups 0, 1, 5 (3/7); injected 0 and 1.
  run = fake_run(gate='confidence', threshold=0.5, confidence=0.8)
  _, new_rewards_BxG, metrics = mixed_policy.hapo_inject(
      run, random_rollout(7, 4, length=5), HAPO_REWARDS_BxG, _hapo_examples(), step=0,
      key=jax.random.key(0), params=None, progress=0.0)
  assert metrics['hapo/gate_open_frac'] == pytest.approx(3 / 7)
  assert metrics['hapo/injected_frac'] == pytest.approx(2 / 7)
  np.testing.assert_array_equal(new_rewards_BxG[2:], HAPO_REWARDS_BxG[2:])
  assert new_rewards_BxG[1, 1] == 1.0 and new_rewards_BxG[0].sum() == 1.0


def test_hapo_is_off_after_the_annealing_horizon_and_one_means_probability_one():
  rewards_BxG = np.zeros((2, 2), np.float32)
  examples = [Example(id=str(b), prompt='1+1=', answer='2', solution='2', task='arithmetic',
                      difficulty=1) for b in range(2)]
  rollout = random_rollout(2, 2, length=4)
  run = fake_run(anneal_steps=10)
  new, rewards, metrics = mixed_policy.hapo_inject(
      run, rollout, rewards_BxG, examples, step=10, key=jax.random.key(0), params=None,
      progress=1.0)
  assert new is rollout and metrics['hapo/injected_frac'] == 0.0 and run.pool.items == []
  np.testing.assert_array_equal(rewards, rewards_BxG)
  run = fake_run(teacher_behaviour='one')
  new, rewards, _ = mixed_policy.hapo_inject(
      run, rollout, rewards_BxG, examples, step=0, key=jax.random.key(0), params=None,
      progress=0.0)
  prefix_NxL = np.asarray(new.prefix_mask_NxL)
  assert prefix_NxL.any(-1).sum() == 2 and rewards.max(-1).tolist() == [1.0, 1.0]
  np.testing.assert_array_equal(np.asarray(new.behaviour_logprobs_NxL)[prefix_NxL], 0.0)


def test_prefix_rows_start_with_the_old_policy_prefix_and_are_marked():
  cfg = transformer.ModelConfig(vocab_size=TOK.vocab_size, hidden_size=16, intermediate_size=32,
                          num_layers=1, num_heads=2, num_kv_heads=1, head_dim=8)
  old_params = transformer.init_params(cfg, jax.random.key(1))
  params = transformer.init_params(cfg, jax.random.key(2))
  config = config_lib.default()
  config.rl.update(group_size=4, temperature=1.0)
  config.prefix_rollouts.update(enabled=True, max_tokens=5, rows_per_group=2)
  run = types.SimpleNamespace(config=config, cfg=cfg, tok=TOK, pad_id=TOK.pad_id, mesh=None,
                              prefix_params=old_params)
  prompts = sampler.prepare_prompts([TOK.encode('12+3='), TOK.encode('4+56=')], buckets=(8,),
                                    pad_id=TOK.pad_id)
  key = jax.random.key(3)
  prefixes = mixed_policy.old_policy_prefixes(run, prompts, key=key)
  # What the old policy sampled with the same keys (old_policy_prefixes splits `key`).
  old = sampler.generate(old_params, prompts, cfg=cfg, group_size=4, max_new_tokens=5,
                         stop_tokens=tuple(TOK.eos_ids), pad_id=TOK.pad_id,
                         rng=jax.random.split(key)[0])
  rollout = sampler.generate(params, prompts, cfg=cfg, group_size=4, max_new_tokens=6,
                             stop_tokens=tuple(TOK.eos_ids), pad_id=TOK.pad_id,
                             rng=jax.random.key(4), prefixes=prefixes)
  k_N = np.asarray(prefixes.mask_NxQ).sum(1)
  usable_N = np.asarray(old.lengths_N) - (~np.asarray(old.truncated_N))
  chosen_N = np.arange(8) % 4 < 2
  assert (k_N[~chosen_N] == 0).all()
  assert ((k_N[chosen_N] >= 1) | (usable_N[chosen_N] == 0)).all()
  assert (k_N <= usable_N).all() and k_N.max() >= 1
  tokens, pmask = np.asarray(rollout.tokens_NxL), np.asarray(rollout.prefix_mask_NxL)
  for n in range(8):
    k = k_N[n]
    np.testing.assert_array_equal(tokens[n, :k], np.asarray(old.tokens_NxL)[n, :k])
    np.testing.assert_array_equal(pmask[n], np.arange(11) < k)
    np.testing.assert_allclose(np.asarray(rollout.behaviour_logprobs_NxL)[n, :k],
                               np.asarray(old.behaviour_logprobs_NxL)[n, :k], rtol=1e-6)
    assert int(rollout.lengths_N[n]) > k  # The current policy continued after the prefix.
  assert TOK.eos_id not in [t for n in range(8) for t in tokens[n, :k_N[n]]]


def test_snapshot_step_and_config_checks():
  assert [mixed_policy.snapshot_step(s, 3) for s in (0, 2, 3, 5, 6)] == [0, 0, 3, 3, 6]
  assert mixed_policy.snapshot_step(7, 0) == 0  # refresh_every = 0: always the warm start.
  c = config_lib.default()
  c.prefix_rollouts.enabled = True
  with pytest.raises(ValueError, match="policy_loss='ppo_clip' ignores them"):
    config_lib.validate(c, num_devices=1)
  c.objective.policy_loss = 'prefix_mixed_ppo'
  c.hapo.enabled, c.hapo.teacher_behaviour = True, 'teacher'
  c.data.schedule = 'heap'
  with pytest.raises(ValueError, match='hapo.teacher_behaviour') as e:
    config_lib.validate(c, num_devices=1)
  assert 'data.schedule' in str(e.value) and 'prefix_rollouts' not in str(e.value)


@pytest.mark.parametrize('hapo, match', [
    ({'gate': 'sampled'}, r"hapo.gate='sampled'; known: \('posterior_mean'"),
    ({'gate': 'confidence'}, r"hapo.confidence=0.0 must be in \(0, 1\) with hapo.gate="),
    ({'confidence': 0.8}, "hapo.confidence=0.8 is read only by hapo.gate='confidence'"),
    ({'anneal_steps': -1}, 'hapo.anneal_steps=-1 must be >= 0'),
    ({'threshold': 1.5}, r'hapo.threshold=1.5 must be in \[0, 1\]'),
])
def test_hapo_config_errors_name_the_field(hapo, match):
  c = config_lib.default()
  c.hapo.update({'enabled': True, **hapo})
  with pytest.raises(ValueError, match=match):
    config_lib.validate(c, num_devices=1)
  c.hapo.update(config_lib.default().hapo.to_dict(), enabled=True)
  config_lib.validate(c, num_devices=1)  # The defaults (v1's gate) are valid.
