"""CLEANER's rollback (rollout/rollback.py): the purified row is the row that sampled the
corrected call directly, the retry limit and its notice, which errors roll back, masks, turn
ids, provenance, SAAR's switch, the tools' error classes and the config checks."""

import collections
import dataclasses
import string

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import pytest

from rlreason import config as config_lib
from rlreason.envs import base
from rlreason.envs import calculator
from rlreason.envs import environment
from rlreason.envs import python_tool
from rlreason.envs import render
from rlreason.envs import tasks as env_tasks
from rlreason.model import tokenizer
from rlreason.model import transformer
from rlreason.rl import rl_batch
from rlreason.rollout import episodes as episodes_lib
from rlreason.rollout import rollback
from rlreason.rollout import sampler

TOK = tokenizer.from_characters(string.printable)
CFG = transformer.ModelConfig(vocab_size=TOK.vocab_size, hidden_size=32, intermediate_size=64,
                              num_layers=1, num_heads=4, num_kv_heads=2, head_dim=8)
RENDERER = render.TextRenderer(prompt_template='Q:{prompt}\nA:')
SETTINGS = rollback.Settings(error_classes=(('calc', ('SyntaxError',)),), max_retries=3,
                             feedback='E:{errors}')
OBS = 48  # observation width: the notice fits cut ('<result>Too...[truncated ...]</result>')
STOP = ((TOK.token_to_id('!'),),)
LENGTH = 96  # completion columns: room for the cut notice and a later turn


@pytest.fixture(scope='module')
def params():
  return transformer.init_params(CFG, jax.random.key(0))


@dataclasses.dataclass
class _State:
  example: object
  turns: int = 0
  reward: float = 0.0
  tool_calls: int = 0
  errors: collections.Counter = dataclasses.field(default_factory=collections.Counter)


class ErrEnv:
  """Every turn but the last is a 'calc' call; at turn t the first fails[t] attempts of each
  example fail with `error_class`, the others return 'ok'. Attempts are counted on the env,
  not in the (restorable) episode state. Done after `turns` turns, reward 1."""

  def __init__(self, fails, *, turns=3, error_class='SyntaxError'):
    self.fails, self.turns, self.error_class = fails, turns, error_class
    self.attempts = collections.Counter()

  def reset(self, example):
    return _State(example)

  def step(self, state, turn_text):
    del turn_text  # The tiny random model writes noise; the schedule decides.
    t = state.turns
    state.turns += 1
    if t == self.turns - 1:
      state.reward += 1.0
      return base.Step('', 1.0, True, {'truncated': False, 'failed': 0})
    key = (state.example.id, t)
    failed = self.attempts[key] < self.fails.get(t, 0)
    self.attempts[key] += 1
    state.tool_calls += 1
    if failed:
      state.errors['bad_arguments'] += 1
    content = 'bad' if failed else 'ok'
    classes = [('calc', self.error_class, 'x')] if failed else []
    return base.Step(content, 0.0, False, {'messages': [{'role': 'tool', 'content': content}],
                                           'failed': int(failed), 'truncated': False,
                                           'error_classes': classes})


def _examples(count):
  return [env_tasks.calc_multiply(0, i, difficulty=2) for i in range(count)]


def _run(params, env, settings=SETTINGS, **kw):
  args = dict(cfg=CFG, group_size=1, max_turns=3, max_turn_tokens=6, max_observation_tokens=OBS,
              max_total_tokens=LENGTH, rng=jax.random.key(3), prompt_buckets=(48,), temperature=1.0,
              stop_seqs=STOP, rollback=settings)
  args.update(kw)
  return episodes_lib.run_episodes(params, env, RENDERER, TOK, _examples(3), **args)


def _teacher_forced(params, rollout, temperature=1.0):
  tokens, mask = sampler.sequences(rollout)
  logits = transformer.apply(params, tokens, cfg=CFG, mask_NxT=mask)[0] / temperature
  p = rollout.prompts.tokens_BxP.shape[1]
  return np.asarray(jnp.take_along_axis(jax.nn.log_softmax(logits, -1)[:, p - 1:-1],
                                        rollout.tokens_NxL[..., None], -1)[..., 0])


def test_replace_restores_exactly_the_pre_error_state(params):
  """Row 0: decode a turn, a feedback observation, a regenerated turn, then rewind and prefill
  X. A forced run that prefilled X right after the prompt has the same next-token logits,
  positions and columns, and both sample the same continuation; rows 1-2 are untouched. (The
  episode loop's own jitted functions and shapes, so nothing compiles twice in this file.)"""
  slots = episodes_lib.cache_slots(3, 6, OBS) + rollback.extra_slots(
      SETTINGS, max_turns=3, max_turn_tokens=6, max_observation_tokens=OBS)
  static = dict(cfg=CFG, group_size=1, length=LENGTH, slots=slots, pad_id=0, cache_dtype=None,
                mesh=None)
  examples = _examples(3)
  prompts = sampler.prepare_prompts([TOK.encode(RENDERER.prompt_text(e)) for e in examples],
                                    buckets=(48,), pad_id=0)
  start = episodes_lib._start_fn(**static)
  decode = episodes_lib._decode_fn(**static, steps=6, greedy=False, top_k=0, top_p=1.0,
                                   eos=tuple(sorted(TOK.eos_ids)), stop_seqs=STOP)
  observe = episodes_lib._observe_fn(**static, width=OBS)
  state0 = start(params, prompts)
  saved = rollback.save(state0)
  t = jnp.float32(1.0)
  first = jnp.asarray([True, False, False])
  failed = decode(params, state0, jnp.ones(3, bool), jnp.int32(0), t, jax.random.key(1))
  fb = np.zeros((3, OBS), np.int32)
  fb[0, :4] = TOK.encode('E:x!')
  state = observe(params, failed, jnp.asarray(fb), jnp.asarray(fb > 0), jnp.int32(0))
  state = decode(params, state, first, jnp.int32(0), t, jax.random.key(2))
  x = TOK.encode('<c>9')
  kept = np.zeros((3, 6), np.int32)
  kept[0, :4] = x
  replace = rollback.replace_fn(cfg=CFG, length=LENGTH, pad_id=0, width=6, greedy=False)
  purified = replace(params, state, saved, jnp.asarray(kept), jnp.full((3, 6), -0.5),
                     jnp.asarray([4, 0, 0]), first, jnp.int32(0), t)
  forced_obs = np.zeros((3, OBS), np.int32)
  forced_obs[0, :4] = x
  forced = observe(params, state0, jnp.asarray(forced_obs), jnp.asarray(forced_obs > 0),
                   jnp.int32(0))
  np.testing.assert_allclose(purified.logits_NxV[0], forced.logits_NxV[0], atol=1e-5)
  p = int(state0.cache.pos_N[0])
  assert int(purified.cache.pos_N[0]) == int(forced.cache.pos_N[0]) == p + 4
  assert int(purified.count_N[0]) == 4
  np.testing.assert_array_equal(purified.tokens_NxL[0], forced.tokens_NxL[0])
  assert np.asarray(purified.sampled_NxL[0]).tolist() == [True] * 4 + [False] * (LENGTH - 4)
  np.testing.assert_allclose(purified.blogp_NxL[0, :4], -0.5)
  # Purified log-probs: the teacher-forced forward of prompt + X (fp32, <= 1e-5).
  seq = jnp.asarray([TOK.encode(RENDERER.prompt_text(examples[0])) + x])
  logp = jax.nn.log_softmax(transformer.apply(params, seq, cfg=CFG)[0][0], -1)
  expect = [float(logp[p - 1 + i, x[i]]) for i in range(4)]
  np.testing.assert_allclose(purified.logp_NxL[0, :4], expect, atol=1e-5)
  # Rows 1-2 were not rolled back: as after their first decode.
  np.testing.assert_array_equal(purified.tokens_NxL[1:], failed.tokens_NxL[1:])
  np.testing.assert_allclose(purified.logits_NxV[1:], failed.logits_NxV[1:], atol=1e-6)
  np.testing.assert_array_equal(purified.count_N[1:], failed.count_N[1:])
  # The same continuation (same key) from the purified and the forced row.
  a = decode(params, purified, first, jnp.int32(1), t, jax.random.key(5))
  b = decode(params, forced, first, jnp.int32(1), t, jax.random.key(5))
  n = int(a.count_N[0])
  assert n > 4 and n == int(b.count_N[0])
  np.testing.assert_array_equal(a.tokens_NxL[0, :n], b.tokens_NxL[0, :n])
  np.testing.assert_allclose(a.logp_NxL[0, 4:n], b.logp_NxL[0, 4:n], atol=1e-5)


def test_episode_with_rollbacks_is_the_purified_conversation(params):
  """One failure at turn 0 and two at turn 1: the kept rows hold only the corrected calls and
  the tools' answers (no failed call, no feedback), their log-probs equal a teacher-forced
  forward of the purified sequence, the corrected tokens carry VERSION_ROLLBACK and keep
  their behaviour log-probs (sampled with the error in context: they differ)."""
  env = ErrEnv({0: 1, 1: 2})
  ep = _run(params, env)
  r = ep.rollout
  assert ep.rollback.rollbacks_N.tolist() == [3, 3, 3]
  assert not ep.rollback.exhausted_N.any()
  tokens, count = np.asarray(r.tokens_NxL), np.asarray(r.lengths_N)
  loss, turn = np.asarray(r.loss_mask_NxL), np.asarray(r.turn_NxL)
  for n in range(3):
    entries = ep.transcripts[n]
    assert [len(e.get('rollbacks', [])) for e in entries] == [1, 2, 0]
    text = ''.join(e['text'] + (e.get('observation') or '') for e in entries)
    assert TOK.decode(tokens[n, :count[n]].tolist(), skip_special_tokens=True) == text
    assert [e['observation'] for e in entries[:2]] == ['<result>ok</result>'] * 2
    assert 'E:' not in text  # no feedback turn survives
    assert ep.observation_tokens_N[n] == 2 * len('<result>ok</result>')
    obs = np.flatnonzero(~loss[n, :count[n]])
    assert turn[n, obs[0]] == 0 and turn[n, obs[-1]] == 1
    assert not loss[n, count[n]:].any() and (tokens[n, count[n]:] == 0).all()
    # Turn ids of the kept sampled tokens: turn 0's corrected call, turn 1's, turn 2.
    sampled_turns = turn[n, :count[n]][loss[n, :count[n]]]
    lengths = [e['tokens'] for e in entries]
    assert sampled_turns.tolist() == sum(([t] * k for t, k in enumerate(lengths)), [])
  np.testing.assert_allclose(np.asarray(r.logprobs_NxL)[loss], _teacher_forced(params, r)[loss],
                             atol=1e-5)
  version = np.asarray(r.version_NxL)
  off = ep.rollback.offpolicy_NxL & loss
  assert (version[off] == rollback.VERSION_ROLLBACK).all() and (version[~off] == 0).all()
  lengths = np.array([[e['tokens'] for e in t[:2]] for t in ep.transcripts])
  assert off.sum() == lengths.sum()  # deep replacement: both corrected turns, whole.
  behaviour, purified = np.asarray(r.behaviour_logprobs_NxL), np.asarray(r.logprobs_NxL)
  assert np.abs(behaviour - purified)[off].mean() > 1e-3
  np.testing.assert_allclose(behaviour[loss & ~off], purified[loss & ~off], atol=1e-6)
  m = episodes_lib.metrics(ep)
  assert m['rollback/rollbacks_mean'] == 3.0 and m['rollback/exhausted_frac'] == 0.0
  assert m['episodes/error_turn_frac'] == 0.0 and m['rollback/turn_frac'] == pytest.approx(2 / 3)
  assert m['rollback/abs_logprob_diff'] == pytest.approx(np.abs(behaviour - purified)[off].mean())
  # The environment state was restored: the rolled-back failures are not counted.
  assert ep.errors_N.get('bad_arguments', np.zeros(3)).sum() == 0
  assert ep.tool_calls_N.tolist() == [2, 2, 2]
  # The loop's tagging keeps the mark and puts the step's version elsewhere.
  tagged = np.asarray(rl_batch.tag_versions(r, version=7).version_NxL)
  assert (tagged[off] == rollback.VERSION_ROLLBACK).all()
  assert (tagged[loss & ~off] == 7).all()


def test_retry_limit_then_notice_and_no_more_rollback(params):
  """Turn 0 always fails: 3 retries, then the notice replaces the tool's answer and rollback
  stays off, so turn 1's failure is an ordinary observation."""
  ep = _run(params, ErrEnv({0: 99, 1: 1}))
  assert ep.rollback.rollbacks_N.tolist() == [3, 3, 3]
  assert ep.rollback.exhausted_N.tolist() == [True, True, True]
  for entries in ep.transcripts:
    assert len(entries[0]['rollbacks']) == 3 and 'rollbacks' not in entries[1]
    assert entries[0]['rollback_notice'] and entries[0]['observation'].startswith('<result>To')
    assert entries[1]['observation'] == '<result>bad</result>'
  assert ep.errors_N['bad_arguments'].tolist() == [2, 2, 2]  # the 4th attempt and turn 1's
  assert episodes_lib.metrics(ep)['episodes/error_turn_frac'] == pytest.approx(2 / 3)
  assert episodes_lib.metrics(ep)['rollback/exhausted_frac'] == 1.0


def test_errors_outside_the_classes_are_not_rolled_back(params):
  ep = _run(params, ErrEnv({0: 1}, error_class='ValueError'))
  assert ep.rollback.rollbacks_N.tolist() == [0, 0, 0] and not ep.rollback.offpolicy_NxL.any()
  assert [t[0]['observation'] for t in ep.transcripts] == ['<result>bad</result>'] * 3
  assert 'rollbacks' not in ep.transcripts[0][0]
  assert (np.asarray(ep.rollout.version_NxL) == 0).all()
  assert ep.errors_N['bad_arguments'].tolist() == [1, 1, 1]


def test_saar_switch_hand_cases():
  # ratio = 2 * matches / total: 'abcd' vs 'abed' share 'ab' and 'd': 2 * 3 / 8.
  assert rollback.similarity('abcd', 'abed') == pytest.approx(0.75)
  failed, new = TOK.encode('hm<call>c: 1+*2</call>'), TOK.encode('ok<call>c: 1+2</call>')
  assert rollback.split_at_call(TOK, failed, 'tags') == 2
  saar = dataclasses.replace(SETTINGS, replacement='saar', saar_threshold=0.9)
  ids, blogp, first, mode = rollback.kept_turn(TOK, 'tags', failed, [-1.0] * len(failed), new,
                                               [-2.0] * len(new), settings=saar, width=32)
  # ratio('<call>c: 1+*2</call>', '<call>c: 1+2</call>') = 2 * 19 / 39 = 0.974 >= 0.9: shallow.
  assert mode == 'shallow' and TOK.decode(ids) == 'hm<call>c: 1+2</call>' and first == 2
  assert blogp == [-1.0] * 2 + [-2.0] * (len(new) - 2)
  deep = dataclasses.replace(saar, saar_threshold=0.99)
  ids, _, first, mode = rollback.kept_turn(TOK, 'tags', failed, [0.0] * len(failed), new,
                                           [0.0] * len(new), settings=deep, width=32)
  assert mode == 'deep' and ids == new and first == 0
  # Too long for the turn's width: deep.
  assert rollback.kept_turn(TOK, 'tags', failed, [0.0] * len(failed), new, [0.0] * len(new),
                            settings=saar, width=len(new) - 1)[3] == 'deep'


def test_tools_declare_error_classes():
  tools = {'calculator': calculator.TOOL}
  result = base.run_tool(tools, {}, base.ToolCall('calculator', {'expression': '12 * * 3'}),
                         context={}, deadline_s=None)
  assert result.error == base.BAD_ARGUMENTS and result.error_class == 'SyntaxError'
  result = base.run_tool(tools, {}, base.ToolCall('calculator', {'expression': '1/0'}),
                         context={}, deadline_s=None)
  assert result.error == base.TOOL_FAILED and result.error_class is None
  assert python_tool.exception_name('Traceback...\n  File "<cell 1>"\nNameError: name x') == \
      'NameError'
  assert python_tool.exception_name('IndentationError: unexpected indent') == 'IndentationError'
  assert python_tool.exception_name('') is None
  assert 'SyntaxError' in python_tool.TOOL.rollback_errors
  assert rollback.default_classes(['calculator', 'kb']) == {'calculator': ('SyntaxError',),
                                                            'kb': ()}
  env = environment.ToolEnvironment(tools=['calculator'], family='tags', max_turns=3)
  step = env.step(env.reset(_examples(1)[0]),
                  '<call>calculator: {"expression": "12 * * 3"}</call>')
  assert step.info['error_classes'] == [('calculator', 'SyntaxError',
                                         'Error: calculator: cannot parse: invalid syntax')]


def _config(**rollback_fields):
  c = config_lib.default()
  c.env.update(enabled=True, tools=('calculator',), max_turns=3, max_turn_tokens=16)
  c.rl.max_new_tokens = 64
  c.data.task = 'calc_multiply'
  c.env.rollback.update(enabled=True, **rollback_fields)
  return c


def test_config_checks_name_the_field():
  config_lib.validate(_config(), num_devices=1)
  assert rollback.from_config(_config().env).classes('calculator') == ('SyntaxError',)
  bad = _config(max_retries=0, replacement='shallow', saar_threshold=2.0, feedback='no slot')
  bad.env.rollback.error_classes = ml_collections.ConfigDict({'python': ['SyntaxError']})
  with pytest.raises(ValueError) as e:
    config_lib.validate(bad, num_devices=1)
  for field in ('env.rollback.max_retries=0', "env.rollback.replacement='shallow'",
                'env.rollback.saar_threshold=2.0', 'env.rollback.feedback',
                "tool(s) ['python'] not in env.tools"):
    assert field in str(e.value)
  c = _config()
  c.env.tools = ('kb',)
  c.data.task = 'kb_qa'
  with pytest.raises(ValueError, match='no tool of env.tools'):
    config_lib.validate(c, num_devices=1)
  c = _config()
  c.env.enabled = False
  with pytest.raises(ValueError, match='env.rollback.enabled needs env.enabled'):
    config_lib.validate(c, num_devices=1)
