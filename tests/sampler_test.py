"""Sampler: exact behaviour log-probs, stop handling, group sharing, prefixes, sharding."""

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rlreason.model import sharding
from rlreason.model import transformer
from rlreason.rollout import sampler
from rlreason.rollout import sampling
from rlreason.structs import Prefixes

CFG = transformer.ModelConfig(vocab_size=32, hidden_size=32, intermediate_size=64, num_layers=2,
                        num_heads=4, num_kv_heads=2, head_dim=8, qkv_bias=True)

# The teacher-forced references, jitted: eager, each primitive compiles on its own.
_apply = jax.jit(transformer.apply, static_argnames=('cfg',))


@pytest.fixture(scope='module')
def params():
  # Larger-than-default weights so the tiny model has peaked, prompt-dependent distributions.
  p = transformer.init_params(CFG, jax.random.key(0))
  return jax.tree.map(lambda x: x * 5 if x.ndim > 1 else x, p)


@pytest.fixture(scope='module')
def prompts():
  return sampler.prepare_prompts([[5, 6, 7], [1, 2, 3, 4, 9], [8]], buckets=(4, 8), pad_id=0)


def _teacher_forced(params, rollout, temperature):
  tokens, mask = sampler.sequences(rollout)
  logits = _apply(params, tokens, cfg=CFG, mask_NxT=mask)[0] / temperature
  logp = jax.nn.log_softmax(logits, -1)
  p = rollout.prompts.tokens_BxP.shape[1]
  # Completion token l is predicted by position p + l - 1.
  lp = jnp.take_along_axis(logp[:, p - 1:-1], rollout.tokens_NxL[..., None], -1)[..., 0]
  return jnp.where(rollout.mask_NxL, lp, 0.0)


def test_greedy_is_deterministic_and_matches_argmax(params, prompts):
  kw = dict(cfg=CFG, group_size=2, max_new_tokens=6, temperature=0.0, rng=jax.random.key(1))
  a = sampler.generate(params, prompts, **kw)
  b = sampler.generate(params, prompts, **dict(kw, rng=jax.random.key(2)))
  np.testing.assert_array_equal(a.tokens_NxL, b.tokens_NxL)
  # Each greedy token is the argmax of a full forward over the sequence before it.
  tokens, mask = sampler.sequences(a)
  logits = _apply(params, tokens, cfg=CFG, mask_NxT=mask)[0]
  p = prompts.tokens_BxP.shape[1]
  np.testing.assert_array_equal(jnp.argmax(logits[:, p - 1:-1], -1), a.tokens_NxL)


@pytest.mark.parametrize('temperature, top_k, top_p', [(1.0, 0, 1.0), (0.7, 5, 1.0),
                                                       (1.3, 0, 0.8)])
def test_logprobs_equal_teacher_forced_recompute(params, prompts, temperature, top_k, top_p):
  r = sampler.generate(params, prompts, cfg=CFG, group_size=3, max_new_tokens=8,
                       temperature=temperature, top_k=top_k, top_p=top_p, rng=jax.random.key(3))
  np.testing.assert_allclose(r.logprobs_NxL, _teacher_forced(params, r, temperature), atol=1e-5)
  sampled = np.asarray(r.mask_NxL)
  gap = np.asarray(r.behaviour_logprobs_NxL - r.logprobs_NxL)[sampled]
  if top_k or top_p < 1:
    assert (gap >= -1e-6).all() and gap.max() > 0  # Truncation renormalises upwards.
  else:
    np.testing.assert_allclose(gap, 0.0, atol=1e-6)
  assert float(sampler.metrics(r)['sampler/behaviour_minus_plain_logprob']) >= -1e-6


def test_tokens_after_stop_are_masked(params, prompts):
  r = sampler.generate(params, prompts, cfg=CFG, group_size=4, max_new_tokens=24,
                       temperature=2.0, stop_tokens=(3, 11), pad_id=0, rng=jax.random.key(4))
  tokens, mask = np.asarray(r.tokens_NxL), np.asarray(r.mask_NxL)
  assert (~np.asarray(r.truncated_N)).any()
  for n in range(tokens.shape[0]):
    stops = np.flatnonzero(np.isin(tokens[n], (3, 11)))
    if r.truncated_N[n]:
      assert mask[n].all() and stops.size == 0
    else:
      end = stops[0] + 1
      assert mask[n, :end].all() and not mask[n, end:].any()
      assert (tokens[n, end:] == 0).all()
      assert r.lengths_N[n] == end
  np.testing.assert_array_equal(np.asarray(r.logprobs_NxL)[~mask], 0.0)


def test_repeat_then_decode_equals_independent_rows(params, prompts):
  g = 3
  kw = dict(cfg=CFG, max_new_tokens=7, temperature=1.0, rng=jax.random.key(5))
  shared = sampler.generate(params, prompts, group_size=g, **kw)
  repeated = prompts.replace(tokens_BxP=jnp.repeat(prompts.tokens_BxP, g, 0),
                             mask_BxP=jnp.repeat(prompts.mask_BxP, g, 0))
  independent = sampler.generate(params, repeated, group_size=1, **kw)
  np.testing.assert_array_equal(shared.tokens_NxL, independent.tokens_NxL)
  np.testing.assert_allclose(shared.logprobs_NxL, independent.logprobs_NxL, atol=1e-6)


def _first_token_counts(params, *, samples, **kw):
  prompts = sampler.prepare_prompts([[1, 2, 3]], buckets=(4,))
  r = sampler.generate(params, prompts, cfg=CFG, group_size=samples, max_new_tokens=1,
                       rng=jax.random.key(6), **kw)
  logits = _apply(params, prompts.tokens_BxP, cfg=CFG, mask_NxT=prompts.mask_BxP)[0][0, -1]
  return np.bincount(np.asarray(r.tokens_NxL[:, 0]), minlength=CFG.vocab_size), logits


def test_sampling_frequencies_match_softmax(params):
  # Pearson chi-square over tokens with expected count >= 5 (others pooled), fixed seed.
  # Critical value for p = 0.001 at df degrees of freedom from scipy.
  from scipy import stats
  n, temperature = 20000, 1.5
  counts, logits = _first_token_counts(params, samples=n, temperature=temperature)
  probs = np.asarray(jax.nn.softmax(logits / temperature))
  expected = n * probs
  big = expected >= 5
  obs = np.append(counts[big], counts[~big].sum())
  exp = np.append(expected[big], expected[~big].sum())
  chi2 = ((obs - exp) ** 2 / np.maximum(exp, 1e-9)).sum()
  assert chi2 < stats.chi2.ppf(0.999, df=len(obs) - 1), (chi2, obs, exp)


def test_top_k_and_top_p_keep_exactly_the_intended_support(params):
  # Hand case: probs of softmax([0, ln 3, ln 6, ln 10]) = [.05, .15, .3, .5].
  logits = jnp.log(jnp.array([[1.0, 3.0, 6.0, 10.0]]))
  finite = lambda lg: np.isfinite(np.asarray(lg))[0].tolist()
  assert finite(sampling.truncate_logits(logits, top_k=2, top_p=1.0)) == [0, 0, 1, 1]
  # top-p 0.8: mass before each sorted token is 0, .5, .8, .95 -> keep the first two.
  assert finite(sampling.truncate_logits(logits, top_k=0, top_p=0.8)) == [0, 0, 1, 1]
  assert finite(sampling.truncate_logits(logits, top_k=0, top_p=0.81)) == [0, 1, 1, 1]
  assert finite(sampling.truncate_logits(logits, top_k=3, top_p=0.5)) == [0, 0, 0, 1]
  # Sampled support: exactly the top-k tokens of the real model's distribution.
  counts, model_logits = _first_token_counts(params, samples=4000, temperature=1.0, top_k=3)
  top3 = set(np.argsort(-np.asarray(model_logits))[:3].tolist())
  assert set(np.flatnonzero(counts).tolist()) == top3


def test_prefix_rows_reproduce_prefix_and_continue(params, prompts):
  g = 2
  prefix_lists = [[4, 4, 4], [], [7], [9, 8], [1, 2, 3], []]  # One per row n = b*G + g.
  q = 3
  toks = np.zeros((6, q), np.int32)
  pmask = np.zeros((6, q), bool)
  for n, pre in enumerate(prefix_lists):
    toks[n, :len(pre)], pmask[n, :len(pre)] = pre, True
  recorded = np.where(pmask, -0.25, 0.0).astype(np.float32)
  prefixes = Prefixes(tokens_NxQ=jnp.asarray(toks), mask_NxQ=jnp.asarray(pmask),
                      logprobs_NxQ=jnp.asarray(recorded))
  r = sampler.generate(params, prompts, cfg=CFG, group_size=g, max_new_tokens=4,
                       temperature=0.0, prefixes=prefixes, rng=jax.random.key(7))
  for n, pre in enumerate(prefix_lists):
    k = len(pre)
    assert np.asarray(r.tokens_NxL[n, :k]).tolist() == pre
    assert np.asarray(r.prefix_mask_NxL[n]).tolist() == [True] * k + [False] * (7 - k)
    assert int(r.lengths_N[n]) == k + 4
    np.testing.assert_allclose(np.asarray(r.behaviour_logprobs_NxL[n, :k]), -0.25)
    # Greedy continuation equals greedy decoding from prompt + prefix as one prompt.
    b = n // g
    prompt = np.asarray(prompts.tokens_BxP[b])[np.asarray(prompts.mask_BxP[b])].tolist()
    alone = sampler.generate(params, sampler.prepare_prompts([prompt + pre], buckets=(8,)),
                             cfg=CFG, group_size=1, max_new_tokens=4, temperature=0.0,
                             rng=jax.random.key(0))
    np.testing.assert_array_equal(r.tokens_NxL[n, k:k + 4], alone.tokens_NxL[0])
  # Plain log-probs of prefix tokens are the sampling policy's, teacher-forced.
  np.testing.assert_allclose(r.logprobs_NxL, _teacher_forced(params, r, 1.0), atol=1e-5)


def test_decode_chunks_cover_the_steps():
  for steps, most in [(0, 8), (1, 8), (15, 8), (39, 4), (127, 8), (1000, 3)]:
    chunks = sampler.decode_chunks(steps, most)
    assert len(chunks) <= most
    assert [b for _, b in chunks[:-1]] == [a for a, _ in chunks[1:]]  # Contiguous.
    if steps:
      assert chunks[0][0] == 0 and chunks[-1][1] == steps
      assert all(b - a >= min(16, steps) for a, b in chunks)
  assert sampler.decode_chunks(127, 8) == [(0, 18), (18, 36), (36, 54), (54, 72), (72, 90),
                                           (90, 108), (108, 127)]


def test_chunked_decode_equals_one_loop(params, prompts):
  # 40 new tokens: 39 forward passes, in 2 while_loops (own cache segments) or in 1. With
  # prefixes (their own segment) and a stop token that ends some rows in the first chunk.
  assert len(sampler.decode_chunks(39, 4)) == 2
  g, q = 2, 2
  toks = np.tile(np.array([[4, 5]], np.int32), (6, 1))
  pmask = np.array([[True, True], [True, False], [False, False]] * 2)
  prefixes = Prefixes(tokens_NxQ=jnp.asarray(toks), mask_NxQ=jnp.asarray(pmask))
  kw = dict(cfg=CFG, group_size=g, max_new_tokens=40, temperature=1.0, stop_tokens=(3,),
            prefixes=prefixes, rng=jax.random.key(11))
  one = sampler.generate(params, prompts, max_chunks=1, **kw)
  two = sampler.generate(params, prompts, max_chunks=4, **kw)
  lengths = np.asarray(two.lengths_N) - pmask.sum(1)
  assert (lengths < 18).any() and (lengths > 20).any()  # Stops in both chunks' ranges.
  np.testing.assert_array_equal(two.tokens_NxL, one.tokens_NxL)
  np.testing.assert_array_equal(two.mask_NxL, one.mask_NxL)
  np.testing.assert_allclose(two.logprobs_NxL, one.logprobs_NxL, atol=1e-5)
  np.testing.assert_allclose(two.logprobs_NxL, _teacher_forced(params, two, 1.0), atol=1e-5)


def test_no_recompilation_within_a_bucket(params, monkeypatch):
  chex.clear_trace_counter()  # chex counts by function across tests (failed in reversed order).
  monkeypatch.setattr(sampler, '_generate', chex.assert_max_traces(sampler._generate, n=1))
  sampler._generate_fn.cache_clear()
  for i, rows in enumerate([[[1, 2]], [[3, 4, 5]], [[6]]]):  # All fit bucket 4.
    prompts = sampler.prepare_prompts(rows, buckets=(4, 8))
    sampler.generate(params, prompts, cfg=CFG, group_size=2, max_new_tokens=3,
                     temperature=0.5 + i, rng=jax.random.key(i))
  sampler._generate_fn.cache_clear()


@pytest.mark.parametrize('stop', [False, True])
def test_sharded_greedy_equals_single_device(params, prompts, stop):
  mesh = sharding.make_mesh({'data': 2, 'fsdp': 1, 'tensor': 4})
  # 34 new tokens: two decode chunks, each with its own sharded cache segment.
  kw = dict(cfg=CFG, group_size=4, max_new_tokens=34, temperature=0.0, rng=jax.random.key(8))
  single = sampler.generate(params, prompts, **kw)
  if stop:  # Rows stop at different steps; the sharded loop asks "all done?" every 8 only.
    kw['stop_tokens'] = tuple(int(single.tokens_NxL[n, j]) for n, j in ((0, 5), (4, 9), (8, 12)))
    single = sampler.generate(params, prompts, **kw)
    assert not single.truncated_N.any() and int(single.lengths_N.max()) <= 13
  with jax.set_mesh(mesh):
    sharded_params = jax.device_put(params, sharding.param_shardings(CFG, mesh,
                                                                     sharding.SAMPLE_RULES))
    sharded = sampler.generate(sharded_params, prompts, mesh=mesh, **kw)
  assert sharded.tokens_NxL.sharding.spec[0] in ('data', ('data', 'fsdp'))
  np.testing.assert_array_equal(sharded.tokens_NxL, single.tokens_NxL)
  np.testing.assert_allclose(sharded.logprobs_NxL, single.logprobs_NxL, atol=1e-5)


def test_sharded_rows_ask_whether_all_are_done_every_k_steps():
  keep = lambda i, done, **kw: bool(sampler._keep_decoding(
      (jnp.int32(i), None, jnp.asarray(done)), stop=20, **kw))
  some, every = [True, False], [True, True]
  for i in range(20):  # One device: exact, every step.
    assert keep(i, some, early_exit=True, check_every=1)
    assert not keep(i, every, early_exit=True, check_every=1)
    assert keep(i, every, early_exit=False, check_every=1)  # No stop tokens: run to the end.
    assert keep(i, some, early_exit=True, check_every=8)
    assert keep(i, every, early_exit=True, check_every=8) == (i % 8 != 0)
  assert not keep(20, some, early_exit=True, check_every=8)
  assert not keep(20, some, early_exit=False, check_every=1)


def test_bf16_cache_halves_the_estimate_and_runs(params, prompts):
  kw = dict(batch=8, group_size=8, prompt_len=64, max_new_tokens=128)
  f32 = sampler.memory_estimate(CFG, **kw)
  bf16 = sampler.memory_estimate(CFG, cache_dtype='bfloat16', **kw)
  assert bf16['kv_cache'] * 2 == f32['kv_cache']
  r = sampler.generate(params, prompts, cfg=CFG, group_size=2, max_new_tokens=4,
                       cache_dtype='bfloat16', rng=jax.random.key(9))
  assert np.isfinite(np.asarray(r.logprobs_NxL)).all()


def test_memory_estimate_bounds_the_compiled_sampler(params):
  kw = dict(batch=2, group_size=4, prompt_len=8, max_new_tokens=40)
  one = sampler.memory_estimate(CFG, max_chunks=1, **kw)
  two = sampler.memory_estimate(CFG, max_chunks=4, **kw)
  slot = 2 * CFG.num_layers * CFG.num_kv_heads * CFG.head_dim * 4  # K and V, fp32.
  assert one['kv_cache'] == two['kv_cache'] == (2 * 8 + 8 * 40) * slot
  # 39 decode steps in 2 chunks, [0, 19) and [19, 39): the merge before the second copies
  # 19 slots of history per row; one loop copies nothing.
  assert one['kv_merge'] == 0 and two['kv_merge'] == 8 * 19 * slot
  prompts = sampler.prepare_prompts([[1, 2, 3], [4, 5]], buckets=(8,))
  temp = {}
  for chunks in (1, 4):
    sampler._generate_fn.cache_clear()
    fn = sampler._generate_fn(CFG, 4, 40, False, 0, 1.0, (), 0, None, None, chunks)
    compiled = fn.lower(params, prompts, None, jnp.float32(1.0), jax.random.key(0)).compile()
    temp[chunks] = compiled.memory_analysis().temp_size_in_bytes
  sampler._generate_fn.cache_clear()
  assert temp[4] - temp[1] <= two['kv_merge']  # What chunking costs XLA, at most the bound.


@pytest.mark.parametrize('kwargs, match', [
    (dict(group_size=0), 'group_size'),
    (dict(max_new_tokens=0), 'max_new_tokens'),
    (dict(top_p=0.0), 'top_p'),
    (dict(top_p=1.5), 'top_p'),
    (dict(stop_tokens=(32,)), r'stop_tokens \[32\]'),
    (dict(temperature=-1.0), 'temperature'),
    (dict(memory_budget_bytes=1000), 'memory_budget_bytes'),
])
def test_bad_input_fails_before_compiling(params, prompts, kwargs, match):
  args = dict(cfg=CFG, group_size=2, max_new_tokens=4, rng=jax.random.key(0)) | kwargs
  sampler._generate_fn.cache_clear()
  with pytest.raises(ValueError, match=match):
    sampler.generate(params, prompts, **args)
  assert sampler._generate_fn.cache_info().currsize == 0


def test_bad_prompts_name_the_row(params, prompts):
  with pytest.raises(ValueError, match='empty'):
    sampler.prepare_prompts([[1], []], buckets=(4,))
  with pytest.raises(ValueError, match='Row 1 has length 9'):
    sampler.prepare_prompts([[1], [1] * 9], buckets=(4, 8))
  empty = prompts.replace(mask_BxP=prompts.mask_BxP.at[1].set(False))
  with pytest.raises(ValueError, match=r'rows \[1\] are empty'):
    sampler.generate(params, empty, cfg=CFG, group_size=1, max_new_tokens=2,
                     rng=jax.random.key(0))


def test_top_p_bisection_equals_sorted_cumulative_mass():
  # The threshold search must keep exactly {i : mass of strictly likelier tokens < top_p}.
  for seed in range(5):
    logits = jax.random.normal(jax.random.key(seed), (16, 300)) * 3
    probs = np.asarray(jax.nn.softmax(logits, -1))
    order = np.argsort(-probs, -1)
    sorted_p = np.take_along_axis(probs, order, -1)
    for top_p in (0.1, 0.5, 0.9, 0.99):
      want = np.zeros(probs.shape, bool)
      np.put_along_axis(want, order, np.cumsum(sorted_p, -1) - sorted_p < top_p, -1)
      got = np.isfinite(np.asarray(sampling.truncate_logits(logits, top_k=0, top_p=top_p)))
      np.testing.assert_array_equal(got, want)
