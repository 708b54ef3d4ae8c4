"""DART (model/dart.py, methods/cea.py): the route recurrence by hand, routed forward == merged LoRA
per adapter, sampler == learner log-probs with routing, where gradients can and cannot go,
CEA on hand cases, and config errors."""

import functools
import string

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from episodes_test import FakeEnv, RENDERER, _examples  # tests/ is on sys.path
from rlreason import config as config_lib
from rlreason.envs import formats
from rlreason.methods import cea
from rlreason.model import dart
from rlreason.model import dart_init
from rlreason.model import lora
from rlreason.model import tokenizer
from rlreason.model import transformer
from rlreason.rl import update
from rlreason.rollout import episodes as episodes_lib
from rlreason.rollout import sampler
from rlreason.structs import TrainBatch

TOK = tokenizer.from_characters(string.printable)
CFG = transformer.ModelConfig(vocab_size=TOK.vocab_size, hidden_size=32, intermediate_size=64,
                              num_layers=2, num_heads=4, num_kv_heads=2, head_dim=8,
                              qkv_bias=True)
LORA = lora.LoraConfig(rank=4, alpha=8.0)
HAND = {'open': np.array([1, 2], np.int32), 'close': np.array([3, 4], np.int32)}

# The reference forwards, jitted: eager, each primitive compiles on its own.
_apply = jax.jit(transformer.apply, static_argnames=('cfg',))


def _noisy(tree, seed, std=0.1):
  leaves, treedef = jax.tree.flatten(tree)
  keys = jax.random.split(jax.random.key(seed), len(leaves))
  return jax.tree.unflatten(treedef, [x + std * jax.random.normal(k, x.shape)
                                      for x, k in zip(leaves, keys)])


@pytest.fixture(scope='module')
def model():
  """(base params, random non-zero DART adapters)."""
  base = transformer.init_params(CFG, jax.random.key(0))
  return base, _noisy(dart_init.init(CFG, LORA, jax.random.key(1)), 2)


# ----------------------------------------------------------------------------- routing


@pytest.mark.parametrize('tokens, mask, expected', [
    # open (1 2) ... close (3 4): the open's last token through the close's last are tool.
    ([5, 1, 2, 6, 3, 4, 7], None, [0, 0, 1, 1, 1, 1, 0]),
    # A close without an open does nothing; an open without a close lasts to the end.
    ([3, 4, 5, 1, 2, 6, 6], None, [0, 0, 0, 0, 1, 1, 1]),
    # A second open inside a call (nested text) changes nothing; the first close ends it.
    ([1, 2, 1, 2, 3, 4, 5, 3, 4], None, [0, 1, 1, 1, 1, 1, 0, 0, 0]),
    # Padding inside a tag is skipped (the tag still matches) and routes False.
    ([1, 0, 2, 6, 3, 0, 4, 7], [1, 0, 1, 1, 1, 0, 1, 1], [0, 0, 1, 1, 1, 0, 1, 0]),
    # Left padding, then a tag broken by another token: no open.
    ([0, 0, 1, 5, 2, 6], [0, 0, 1, 1, 1, 1], [0, 0, 0, 0, 0, 0]),
])
def test_route_recurrence_by_hand(tokens, mask, expected):
  t = jnp.asarray([tokens])
  m = None if mask is None else jnp.asarray([mask], bool)
  route, _ = dart.route(t, m, HAND)
  np.testing.assert_array_equal(np.asarray(route[0], int), expected)
  # Online, token by token with the carried state, gives the same routes (the sampler's way).
  state, online = None, []
  for i in range(len(tokens)):
    r, state = dart.route(t[:, i:i + 1], None if m is None else m[:, i:i + 1], HAND, state)
    online.append(int(r[0, 0]))
  assert online == expected


def test_route_spec_follows_the_formats_and_refuses_llama3():
  for family in dart.OPEN_TAGS:
    assert dart.CLOSE_TAGS[family] == formats.FORMATS[family].call_end
  spec = dart.route_spec(TOK, 'tags')
  assert TOK.decode(spec['open'].tolist()) == '<call>'
  assert TOK.decode(spec['close'].tolist()) == '</call>'
  with pytest.raises(ValueError, match='llama3'):
    dart.route_spec(TOK, 'llama3')


# ----------------------------------------------------------------------------- forward


def test_one_route_everywhere_equals_merged_lora_with_that_adapter(model):
  base, adapters = model
  params = dart.attach(base, adapters, HAND, LORA.scale)
  tokens = jax.random.randint(jax.random.key(3), (2, 9), 0, CFG.vocab_size)
  mask = jnp.ones(tokens.shape, bool).at[0, :2].set(False)
  base_logits = _apply(base, tokens, cfg=CFG, mask_NxT=mask)[0]
  for name, route in (('reason', False), ('tool', True)):
    routed = _apply(params, tokens, cfg=CFG, mask_NxT=mask,
                    route_NxT=jnp.full(tokens.shape, route))[0]
    merged = _apply(lora.merge(base, adapters[name], CFG, LORA), tokens, cfg=CFG,
                    mask_NxT=mask)[0]
    np.testing.assert_allclose(routed[mask], merged[mask], atol=2e-5)
    assert float(jnp.abs(routed - base_logits)[mask].max()) > 1e-2  # The adapters matter.


def test_cached_decode_with_carried_routes_equals_the_full_forward(model):
  base, adapters = model
  params = dart.attach(base, adapters, HAND, LORA.scale)
  tokens = jnp.asarray([[5, 1, 2, 6, 6, 3, 4, 7, 8], [0, 5, 6, 1, 2, 9, 9, 9, 3]])
  mask = jnp.asarray(tokens != 0)
  full = _apply(params, tokens, cfg=CFG, mask_NxT=mask)[0]

  @jax.jit
  def feed(cache, state, tokens_NxT, mask_NxT):
    route, state = dart.feed(params, tokens_NxT, mask_NxT, state)
    out, cache = transformer.apply(params, tokens_NxT, cfg=CFG, mask_NxT=mask_NxT, cache=cache,
                                   route_NxT=route)
    return out, cache, state

  out, cache, state = feed(transformer.init_cache(CFG, 2, 9), dart.initial_state(2, HAND),
                           tokens[:, :4], mask[:, :4])
  steps = [out]
  for i in range(4, 9):
    out, cache, state = feed(cache, state, tokens[:, i:i + 1], mask[:, i:i + 1])
    steps.append(out)
  np.testing.assert_allclose(jnp.concatenate(steps, 1)[mask], full[mask], atol=1e-5)
  with pytest.raises(ValueError, match='route_NxT'):
    transformer.apply(params, tokens[:, :1], cfg=CFG, cache=transformer.init_cache(CFG, 2, 4))


def test_episode_behaviour_logprobs_equal_the_routed_teacher_forced_recompute(model):
  """Routes change inside the prompt, the sampled turns and the observations; the recorded
  log-probs equal a fresh forward over the whole conversation, whose routes `apply`
  computes from the tokens (<= 1e-5, fp32)."""
  base, adapters = model
  # Tags frequent in this conversation: ' *' opens (the prompt's '12 * 34', observations),
  # '?' closes (the prompt's end, the second observation), and sampled tokens hit both.
  spec = {'open': np.asarray(TOK.encode(' *'), np.int32), 'close': np.asarray(TOK.encode('?'))}
  params = dart.attach(base, adapters, spec, LORA.scale)
  env = FakeEnv(['r *ok', 'done? 1'])
  ep = episodes_lib.run_episodes(
      params, env, RENDERER, TOK, _examples(3), cfg=CFG, group_size=2, max_turns=3,
      max_turn_tokens=6, max_observation_tokens=24, max_total_tokens=64, rng=jax.random.key(3),
      prompt_buckets=(48,), temperature=1.0, stop_seqs=((TOK.token_to_id('!'),),))
  tokens, mask = sampler.sequences(ep.rollout)
  p = ep.rollout.prompts.tokens_BxP.shape[1]
  recompute = jax.jit(lambda prm: jnp.take_along_axis(jax.nn.log_softmax(transformer.apply(
      prm, tokens, cfg=CFG, mask_NxT=mask)[0], -1)[:, p - 1:-1], ep.rollout.tokens_NxL[..., None],
      -1)[..., 0])
  loss = np.asarray(ep.rollout.loss_mask_NxL)
  route_NxL = np.asarray(dart.route(tokens, mask, spec)[0][:, p - 1:-1])
  assert route_NxL[loss].any() and (~route_NxL[loss]).any()  # Both adapters sampled tokens.
  np.testing.assert_allclose(np.asarray(ep.rollout.logprobs_NxL)[loss],
                             np.asarray(recompute(params))[loss], atol=1e-5)
  # Not the base's, nor one adapter's everywhere: the routing is what matched.
  for other in (base, lora.merge(base, adapters['reason'], CFG, LORA)):
    assert np.abs(np.asarray(ep.rollout.logprobs_NxL) - np.asarray(recompute(other)))[loss].max() > 1e-3


# ----------------------------------------------------------------------------- gradients


def _token_loss(adapters, base, tokens, weights_NxT):
  params = dart.attach(jax.lax.stop_gradient(base), adapters, HAND, LORA.scale)
  logp = jax.nn.log_softmax(transformer.apply(params, tokens[:, :-1], cfg=CFG)[0], -1)
  logp_NxT = jnp.take_along_axis(logp, tokens[:, 1:, None], -1)[..., 0]
  return -(logp_NxT * weights_NxT[:, 1:]).sum()


def _norm(tree):
  return float(sum(jnp.sum(x * x) for x in jax.tree.leaves(tree))) ** 0.5


def test_gradients_reach_each_adapter_only_through_tokens_that_used_it(model):
  base, adapters = model
  grad = jax.jit(jax.grad(_token_loss))
  # No tool tokens anywhere: the tool adapter's gradient is exactly zero.
  plain = jnp.asarray([[5, 6, 7, 8, 9, 10, 11, 12, 13, 14]])
  g = grad(adapters, base, plain, jnp.ones(plain.shape))
  assert _norm(g['tool']) == 0.0 and _norm(g['reason']) > 0
  # A call at columns 3-6; a loss on tokens predicted from positions before it (causal: their
  # hidden states never saw a tool token) gives the tool adapter exactly zero.
  call = jnp.asarray([[5, 6, 1, 2, 9, 3, 4, 7, 8, 10]])
  route = np.asarray(dart.route(call, None, HAND)[0][0])
  assert route.tolist() == [0, 0, 0, 1, 1, 1, 1, 0, 0, 0]
  early = jnp.zeros(call.shape).at[0, 1:4].set(1.0)  # predicted at positions 0-2
  g = grad(adapters, base, call, early)
  assert _norm(g['tool']) == 0.0 and _norm(g['reason']) > 0
  # What is not zero (hidden states mix across tokens): a loss on tokens predicted inside the
  # call reaches the reasoning adapter through the earlier positions' keys and values, and a
  # loss after the call reaches the tool adapter.
  inside = jnp.zeros(call.shape).at[0, 4:8].set(1.0)  # predicted at positions 3-6 (tool)
  late = jnp.zeros(call.shape).at[0, 8:].set(1.0)  # predicted at positions 7-8 (reason)
  assert _norm(grad(adapters, base, call, inside)['reason']) > 0
  assert _norm(grad(adapters, base, call, late)['tool']) > 0


# ----------------------------------------------------------------------------- CEA


def test_cosine_on_hand_trees():
  a = {'x': jnp.asarray([1.0, 0.0]), 'y': jnp.asarray([2.0])}
  b = {'x': jnp.asarray([0.0, 3.0]), 'y': jnp.asarray([0.0])}
  neg = jax.tree.map(lambda v: -2 * v, a)
  assert float(cea._cos(a, b)) == 0.0
  np.testing.assert_allclose(float(cea._cos(a, neg)), -1.0, rtol=1e-6)
  np.testing.assert_allclose(float(cea._cos(a, a)), 1.0, rtol=1e-6)
  assert float(cea._cos(a, jax.tree.map(jnp.zeros_like, a))) == 0.0


def _batch(tokens, advantages):
  n, t = tokens.shape
  mask = jnp.ones((n, t), bool)
  l = t - 3  # a 3-token prompt
  loss = jnp.ones((n, l), jnp.float32)
  zeros = jnp.zeros((n, l), jnp.float32)
  return TrainBatch(tokens_NxT=tokens, mask_NxT=mask, loss_mask_NxL=loss,
                    advantages_NxL=jnp.asarray(advantages, jnp.float32), old_logprobs_NxL=zeros,
                    ref_logprobs_NxL=zeros, behaviour_logprobs_NxL=zeros, prefix_mask_NxL=zeros)


def _merged(base, adapter):
  return lora.merge(base, adapter, CFG, LORA)


def _routed(base, adapters):
  return dart.attach(base, adapters, HAND, LORA.scale)


def test_cea_on_hand_cases(model):
  base, adapters = model
  # Completion (after 3 prompt tokens): 6 1 2 9 3 4 7: tool tokens at 2 9 3 4 (4 of 7).
  tokens = jnp.asarray([[5, 5, 5, 6, 1, 2, 9, 3, 4, 7]])

  @functools.partial(jax.jit, static_argnums=(1, 3))
  def run(trainable, to_model, adv, routed):
    # π_old = the current policy: ratio 1, no clipping, gradient -A grad log-prob.
    batch = _batch(tokens, adv)
    old = update.logprobs_step(to_model(trainable), tokens, batch.mask_NxT, cfg=CFG,
                               completion_len=7).logprobs_NxT
    return cea.cea(trainable, batch.replace(old_logprobs_NxL=old), to_model=to_model, spec=HAND,
                   cfg=CFG, objective=update.Objective(max_len=7), routed=routed)

  joint = _noisy(lora.init(CFG, LORA, jax.random.key(4)), 5)
  merged = functools.partial(_merged, base)
  adv = np.array([[1.0, -0.5, 2.0, 1.0, -1.0, 0.5, 0.3]])
  out = run(joint, merged, adv, False)
  np.testing.assert_allclose(float(out['cea/tool_token_frac']), 4 / 7, rtol=1e-6)
  # The tool tokens' advantages negated: the tool gradient flips, so does the cosine.
  flipped = adv * np.where(np.asarray(cea.tool_mask(_batch(tokens, adv), HAND))[0], -1, 1)
  out_flipped = run(joint, merged, flipped, False)
  assert abs(float(out['cea/cosine'])) > 1e-3
  np.testing.assert_allclose(float(out_flipped['cea/cosine']), -float(out['cea/cosine']),
                             rtol=1e-4, atol=1e-6)
  # Advantage only on reasoning tokens: no tool-loss gradient, cosine 0.
  only_reason = adv * ~np.asarray(cea.tool_mask(_batch(tokens, adv), HAND))
  out = run(joint, merged, only_reason, False)
  assert float(out['cea/tool_grad_norm']) == 0.0 and float(out['cea/cosine']) == 0.0
  # DART: the reasoning loss on the tokens before the call never reaches the tool adapter.
  routed = functools.partial(_routed, base)
  before = np.array([[1.0, -0.5, 0, 0, 0, 0, 0]])  # tokens 6 and 1, predicted before the call
  before = before + flipped * np.asarray(cea.tool_mask(_batch(tokens, adv), HAND))[0]
  out = run(adapters, routed, before, True)
  assert float(out['cea/reason_loss_in_tool']) == 0.0
  assert 0 < float(out['cea/tool_loss_in_reason']) < 1
  assert np.isfinite(float(out['cea/cosine_tool_adapter']))


# ----------------------------------------------------------------------------- config


def _config(**lora):
  c = config_lib.default()
  c.data.task = 'calc_multiply'
  c.tokenizer.kind = 'chars'
  c.env.update(enabled=True, tools=('calculator',), family='tags', verifier='exact')
  c.lora.update(enabled=True, routing='dart', **lora)
  return c


@pytest.mark.parametrize('change, match', [
    (lambda c: c.env.update(enabled=False), 'env.enabled'),
    (lambda c: c.env.update(family='llama3'), 'llama3'),
    (lambda c: c.lora.update(routing='moe'), 'lora.routing'),
    (lambda c: c.lora.update(cea_every=-1), 'lora.cea_every'),
    (lambda c: c.lora.update(enabled=False), 'need lora.enabled'),
    (lambda c: c.export.update(path='/tmp/x'), 'merged HF checkpoint'),
    (lambda c: c.env.rollback.update(enabled=True), 'env.rollback.enabled'),
    (lambda c: c.lora.update(routing='', cea_every=2) or c.env.update(enabled=False),
     'lora.cea_every=2'),
])
def test_config_errors_name_the_field(change, match):
  c = _config()
  config_lib.validate(c, num_devices=1)  # The base config is valid.
  change(c)
  with pytest.raises(ValueError, match=match):
    config_lib.validate(c, num_devices=1)


def test_embedding_targets_are_refused():
  with pytest.raises(ValueError, match="routing='dart'.*embed"):
    dart_init.check(CFG, lora.LoraConfig(rank=4, alpha=8.0, targets=('q', 'embed')))


def test_peft_export_writes_each_adapter(model, tmp_path):
  """No merged model; each adapter in PEFT format (save_peft, round-tripped through peft in
  adapter_export_test), the reasoning one under reason/, the tool one under tool/."""
  import safetensors.numpy
  from rlreason.model import adapter_export
  from rlreason.rl import adapters as adapters_lib
  _, pair = model
  c = _config()
  c.export.peft_path = str(tmp_path / 'peft')
  adapter = adapters_lib.Adapter(lora_cfg=LORA, base=None, fingerprint='', merge=None,
                                 routing='dart', spec=HAND)
  adapters_lib.export_dart(c, CFG, adapter, pair)
  for name in dart.ADAPTERS:
    written = safetensors.numpy.load_file(tmp_path / 'peft' / name / 'adapter_model.safetensors')
    expected = adapter_export.peft_tensors(CFG, jax.device_get(pair[name]), LORA)
    assert written.keys() == expected.keys()
    for key in expected:
      np.testing.assert_array_equal(written[key], expected[key])


def test_resume_refuses_a_checkpoint_of_the_other_routing():
  from rlreason.rl import adapters as adapters_lib
  c = _config()
  for routing, saved in (('dart', ''), ('', 'dart')):
    adapter = adapters_lib.Adapter(lora_cfg=LORA, base=None, fingerprint='f', merge=None,
                                   routing=routing)
    saved_config = {adapters_lib.FINGERPRINT_KEY: 'f', 'lora': {'routing': saved}}
    with pytest.raises(ValueError, match='lora.routing'):
      adapters_lib.check_resume(saved_config, adapter, c)
    saved_config['lora']['routing'] = routing
    adapters_lib.check_resume(saved_config, adapter, c)  # Same routing, same base: fine.
