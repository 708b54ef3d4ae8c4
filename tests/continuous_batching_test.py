"""Continuous batching: the static sampler's tokens for the same per-row streams, whole groups,
exact log-probs, one compilation, and clear errors for bad slot counts and budgets."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rlreason import config as config_lib
from rlreason.model import transformer
from rlreason.rollout import continuous
from rlreason.rollout import sampler
from rlreason.structs import Prefixes

CFG = transformer.ModelConfig(vocab_size=32, hidden_size=32, intermediate_size=64, num_layers=2,
                              num_heads=4, num_kv_heads=2, head_dim=8, qkv_bias=True)
G, M = 2, 10
# Four groups through two slots' worth of groups (slots = 4 = 2 groups): every slot is refilled.
KW = dict(cfg=CFG, group_size=G, max_new_tokens=M, temperature=1.3, top_k=6,
          stop_tokens=(3,), rng=jax.random.key(5))
LIMITS = np.array([10, 3, 6, 1, 10, 9, 2, 10], np.int32)


@pytest.fixture(scope='module')
def params():
  p = transformer.init_params(CFG, jax.random.key(0))
  return jax.tree.map(lambda x: x * 5 if x.ndim > 1 else x, p)  # Peaked distributions.


@pytest.fixture(scope='module')
def prompts():
  return sampler.prepare_prompts([[5, 6, 7], [1, 2, 3, 4, 9], [8], [4, 4]], buckets=(8,))


@pytest.fixture(scope='module')
def both(params, prompts):
  static = sampler.generate(params, prompts, row_rng=True, max_new_tokens_N=LIMITS, **KW)
  cont, stats = continuous.generate(params, prompts, slots=4, max_new_tokens_N=LIMITS,
                                    return_stats=True, **KW)
  return jax.device_get((static, cont, stats))


def _teacher_forced(params, rollout, temperature):
  tokens, mask = sampler.sequences(rollout)
  return _teacher_forced_lp(params, tokens, mask, rollout.tokens_NxL, rollout.mask_NxL,
                            temperature, p=rollout.prompts.tokens_BxP.shape[1])


@functools.partial(jax.jit, static_argnames='p')  # One compilation (op by op: one per primitive).
def _teacher_forced_lp(params, tokens, mask, sampled_NxL, mask_NxL, temperature, *, p):
  logits = transformer.apply(params, tokens, cfg=CFG, mask_NxT=mask)[0] / temperature
  lp = jnp.take_along_axis(jax.nn.log_softmax(logits[:, p - 1:-1], -1),
                           sampled_NxL[..., None], -1)[..., 0]
  return jnp.where(mask_NxL, lp, 0.0)


def _assert_same(a, b):
  for name in ('tokens_NxL', 'mask_NxL', 'prefix_mask_NxL', 'truncated_N', 'lengths_N'):
    np.testing.assert_array_equal(getattr(a, name), getattr(b, name), err_msg=name)
  for name in ('logprobs_NxL', 'behaviour_logprobs_NxL'):
    np.testing.assert_allclose(getattr(a, name), getattr(b, name), atol=1e-5, err_msg=name)


def test_same_tokens_and_logprobs_as_static_batching_for_the_same_row_streams(both):
  static, cont, stats = both
  _assert_same(static, cont)
  assert int(stats.steps) > M  # Slots were refilled: more steps than one static call needs.
  # The per-row limits, stop tokens and truncation all occurred.
  lengths, truncated = np.asarray(cont.lengths_N), np.asarray(cont.truncated_N)
  assert (lengths <= LIMITS).all() and (lengths < LIMITS).any() and truncated.any()
  assert not truncated.all()


def test_behaviour_logprobs_equal_a_teacher_forced_recompute(params, both):
  _, cont, _ = both
  np.testing.assert_allclose(cont.logprobs_NxL, _teacher_forced(params, cont, 1.3), atol=1e-5)
  gap = (cont.behaviour_logprobs_NxL - cont.logprobs_NxL)[cont.mask_NxL]
  assert (gap >= -1e-6).all() and gap.max() > 0  # top-k renormalises upwards.


def test_groups_are_admitted_and_released_whole_and_slots_never_overlap(both):
  _, _, stats = both
  admitted_B, released_B = np.asarray(stats.admitted_B), np.asarray(stats.released_B)
  finished_N, slot_N = np.asarray(stats.finished_N), np.asarray(stats.slot_N)
  np.testing.assert_array_equal(released_B, finished_N.reshape(-1, G).max(axis=1))
  assert (np.diff(admitted_B) >= 0).all()  # The queue is served in order.
  for b in range(len(admitted_B)):
    assert len(set(slot_N[b * G:(b + 1) * G])) == G  # A group holds G slots at once.
  # A slot holds one row at a time: a row occupies it from its group's admission to its finish.
  start_N = np.repeat(admitted_B, G)
  for i in range(len(slot_N)):
    for j in range(i + 1, len(slot_N)):
      if slot_N[i] == slot_N[j]:
        assert finished_N[i] < start_N[j] or finished_N[j] < start_N[i], (i, j)
  # Group 2 enters the step after the first two rows (of groups 0 and 1) finish, not later.
  assert admitted_B[2] == np.sort(finished_N[:2 * G])[G - 1] + 1


def test_prefixes_match_static_batching(params, prompts):
  n = prompts.tokens_BxP.shape[0] * G
  rng = np.random.default_rng(0)
  q_N = rng.integers(0, 4, n)
  tokens = rng.integers(4, CFG.vocab_size, (n, 3)).astype(np.int32)
  mask = np.arange(3)[None] < q_N[:, None]
  logprobs = np.where(np.arange(n)[:, None] % 3 == 0, -0.5, np.nan).astype(np.float32)
  prefixes = Prefixes(tokens_NxQ=jnp.asarray(np.where(mask, tokens, 0)),
                      mask_NxQ=jnp.asarray(mask), logprobs_NxQ=jnp.asarray(logprobs))
  kw = dict(KW, prefixes=prefixes, max_new_tokens_N=LIMITS)
  static = sampler.generate(params, prompts, row_rng=True, **kw)
  cont = continuous.generate(params, prompts, slots=4, **kw)
  _assert_same(static, cont)
  assert np.asarray(cont.prefix_mask_NxL).any()


def test_no_compilation_after_the_first_call(params, prompts, both):
  compiles = []
  # Tracing, lowering and backend compilation all report under /jax/core/compile/.
  listener = lambda event, *a, **k: compiles.append(event) if '/compile/' in event else None
  jax.monitoring.register_event_duration_secs_listener(listener)
  try:
    other = sampler.prepare_prompts([[9, 9], [1], [2, 3, 4], [7, 6, 5, 4, 3]], buckets=(8,))
    out = continuous.generate(params, other, slots=4, max_new_tokens_N=LIMITS[::-1].copy(),
                              **dict(KW, temperature=0.8, rng=jax.random.key(9)))
    jax.block_until_ready(out)
  finally:
    jax.monitoring.unregister_event_duration_listener(listener)
  assert compiles == []  # Same shapes as the fixture's call: not even traced again.
  assert not np.array_equal(out.tokens_NxL, both[1].tokens_NxL)


@pytest.mark.parametrize('slots, match', [(3, 'multiple of group_size=2'), (0, 'positive'),
                                          (10, 'exceeds the B\\*G=8 rows'), (4.0, 'an int')])
def test_bad_slot_counts_name_slots(params, prompts, slots, match):
  with pytest.raises(ValueError, match=f'slots={slots}.*{match}'):
    continuous.generate(params, prompts, slots=slots, **KW)


def test_more_slots_than_the_memory_estimate_allows_is_refused(params, prompts):
  kw = dict(rows=8, group_size=G, prompt_len=8, max_new_tokens=M)
  budget = continuous.memory_estimate(CFG, slots=4, **kw)['total']
  assert continuous.max_slots(budget, CFG, **kw) == 4
  assert continuous.max_slots(budget - 1, CFG, **kw) == 2
  continuous.check_slots(4, group_size=G, rows=8)
  with pytest.raises(ValueError, match=r'slots=6: .*memory_budget_bytes.*at most 4 slots fit'
                     r'.*rl\.slots'):
    continuous.generate(params, prompts, slots=6, memory_budget_bytes=budget, **KW)
  # The per-slot cache part is slots x (P + Q + L) columns of K and V in every layer.
  one, two = (continuous.memory_estimate(CFG, slots=k, **kw)['kv_cache'] for k in (1, 2))
  assert two - one == 2 * CFG.num_layers * CFG.num_kv_heads * CFG.head_dim * 4 * (8 + M)


@pytest.mark.parametrize('limits, match', [(np.zeros(8, np.int32), 'outside'),
                                           (np.full(8, M + 1, np.int32), 'outside'),
                                           (np.ones(7, np.int32), '8 integer per-row')])
def test_bad_row_limits_name_the_tensor(params, prompts, limits, match):
  for generate in (sampler.generate, lambda *a, **k: continuous.generate(*a, slots=4, **k)):
    with pytest.raises(ValueError, match=f'max_new_tokens_N.*{match}'):
      generate(params, prompts, max_new_tokens_N=limits, **KW)


@pytest.mark.parametrize('overrides, match', [
    ({'sampler': 'paged'}, "rl.sampler='paged'"),
    ({'sampler': 'continuous', 'slots': 0}, 'rl.slots=0'),
    ({'sampler': 'continuous', 'slots': 5}, 'rl.slots=5 .*multiple of rl.group_size=2'),
    ({'sampler': 'continuous', 'slots': 10}, 'rl.slots=10 .*exceeds'),
])
def test_config_checks_name_the_field(overrides, match):
  c = config_lib.default()
  c.rl.prompts_per_step, c.rl.group_size = 4, 2
  c.model.arch.vocab_size = 64
  c.rl.update(overrides)
  with pytest.raises(ValueError, match=match):
    config_lib.validate(c, num_devices=1)


def test_config_refuses_continuous_batching_for_episodes_it_does_not_carry():
  c = config_lib.default()  # Plain tool episodes are accepted: continuous_episodes_test.py.
  c.rl.prompts_per_step, c.rl.group_size = 4, 2
  c.rl.sampler, c.rl.slots, c.env.enabled, c.env.state = 'continuous', 4, True, 'typed'
  with pytest.raises(ValueError, match="rl.sampler='continuous'.*env.state"):
    config_lib.validate(c, num_devices=1)
