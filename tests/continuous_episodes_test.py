"""Continuous batching of episodes: the static episode loop's tokens, log-probs and masks for the
same per-row streams, whole groups, slots refilled, one compilation, clear errors."""

import dataclasses
import string

import jax
import numpy as np
import pytest

from rlreason import config as config_lib
from rlreason.envs import base
from rlreason.envs import environment
from rlreason.envs import render
from rlreason.envs import tasks as env_tasks
from rlreason.model import tokenizer
from rlreason.model import transformer
from rlreason.rollout import continuous_episodes
from rlreason.rollout import episodes as episodes_lib

TOK = tokenizer.from_characters(string.printable)
CFG = transformer.ModelConfig(vocab_size=TOK.vocab_size, hidden_size=32, intermediate_size=64,
                              num_layers=2, num_heads=4, num_kv_heads=2, head_dim=8,
                              qkv_bias=True)
RENDERER = render.TextRenderer(prompt_template='Q:{prompt}\nA:')
G = 2
# Example i's episodes end after TURNS[i % 4] turns (the tool is done then): groups of 1 to 3
# turns, so short episodes free their slots while long ones still run.
TURNS = (3, 1, 2, 1)


class CountingEnv:
  """A deterministic fake tool: after turn t it answers with the length of what the model wrote
  and t; the episode is done after TURNS[i % 4] turns (i: the example's meta['index']). Reward:
  0.1 per character written."""

  def reset(self, example):
    return environment.EpisodeState(example)

  def step(self, state, text):
    t = state.turns
    state.turns += 1
    state.tool_calls += 1
    state.reward += 0.1 * len(text)
    done = state.turns >= TURNS[state.example.meta['index'] % 4]
    messages = [] if done else [{'role': 'tool', 'content': f'{len(text)}/{t}'}]
    return base.Step(observation='', reward=0.1 * len(text), done=done,
                     info={'messages': messages, 'truncated': False})


def _examples(count, offset=0):
  return [dataclasses.replace(ex, meta=dict(ex.meta, index=i + offset)) for i, ex in
          enumerate(env_tasks.calc_multiply(0, i, difficulty=2) for i in range(count))]


# The cache holds P + min(L, 3*6 + 2*24 = 66) columns: fewer than L = 72.
ARGS = dict(cfg=CFG, group_size=G, max_turns=3, max_turn_tokens=6, max_observation_tokens=24,
            max_total_tokens=72, prompt_buckets=(48,), temperature=1.0, top_k=20,
            stop_seqs=((TOK.token_to_id('!'),), (TOK.token_to_id('a'), TOK.token_to_id('b'))))


@pytest.fixture(scope='module')
def params():
  p = transformer.init_params(CFG, jax.random.key(0))
  return jax.tree.map(lambda x: x * 3 if x.ndim > 1 else x, p)  # Peaked: stops happen.


@pytest.fixture(scope='module')
def both(params):
  examples = _examples(6)
  static = episodes_lib.run_episodes(params, CountingEnv(), RENDERER, TOK, examples,
                                     rng=jax.random.key(3), row_rng=True, **ARGS)
  cont, stats = continuous_episodes.run_episodes(
      params, CountingEnv(), RENDERER, TOK, examples, rng=jax.random.key(3), slots=4,
      chunk_steps=2, return_stats=True, **ARGS)
  return static, cont, stats


def test_same_episodes_as_the_static_loop_for_the_same_row_streams(both):
  static, cont, _ = both
  for name in ('tokens_NxL', 'mask_NxL', 'loss_mask_NxL', 'turn_NxL', 'lengths_N',
               'truncated_N'):
    np.testing.assert_array_equal(getattr(static.rollout, name), getattr(cont.rollout, name),
                                  err_msg=name)
  for name in ('logprobs_NxL', 'behaviour_logprobs_NxL'):
    np.testing.assert_allclose(getattr(static.rollout, name), getattr(cont.rollout, name),
                               atol=1e-5, err_msg=name)
  for name in ('rewards_N', 'turns_N', 'tool_calls_N', 'observation_tokens_N', 'truncated_N'):
    np.testing.assert_array_equal(getattr(static, name), getattr(cont, name), err_msg=name)
  assert static.transcripts == cont.transcripts
  # Hand check: episode n took TURNS[example] turns (none hit the budget here), observations
  # carry no loss and answer their turn, and turn counts really differ.
  np.testing.assert_array_equal(cont.turns_N, np.repeat([TURNS[i % 4] for i in range(6)], G))
  loss, turn = np.asarray(cont.loss_mask_NxL), np.asarray(cont.turn_NxL)
  mask = np.asarray(cont.mask_NxL)
  for n in range(6 * G):
    obs = mask[n] & ~loss[n]
    assert obs.sum() == cont.observation_tokens_N[n]
    assert (obs.sum() > 0) == (cont.turns_N[n] > 1)
    assert turn[n][loss[n]].max() == cont.turns_N[n] - 1
    text = TOK.decode(np.asarray(cont.tokens_NxL)[n, :int(cont.lengths_N[n])].tolist(),
                      skip_special_tokens=True)
    assert text == ''.join(e['text'] + (e.get('observation') or '') for e in cont.transcripts[n])
  assert 0 < loss.sum() < mask.sum()


def test_groups_stay_whole_and_slots_are_refilled(both):
  _, _, stats = both
  admitted, released, finished, slot_N = (stats.admitted_B, stats.released_B, stats.finished_N,
                                          stats.slot_N)
  assert (np.diff(admitted) >= 0).all() and admitted[-1] > 0  # Later groups waited for slots.
  np.testing.assert_array_equal(released, finished.reshape(-1, G).max(axis=1))
  start_N = np.repeat(admitted, G)
  for b in range(len(admitted)):
    assert len(set(slot_N[b * G:(b + 1) * G])) == G
  for i in range(len(slot_N)):  # A slot holds one episode at a time.
    for j in range(i + 1, len(slot_N)):
      if slot_N[i] == slot_N[j]:
        assert finished[i] <= start_N[j] or finished[j] <= start_N[i], (i, j)
  assert stats.chunks > 1 and stats.steps >= stats.chunks


def test_no_compilation_after_the_first_call(params, both):
  compiles = []
  listener = lambda event, *a, **k: compiles.append(event) if '/compile/' in event else None
  jax.monitoring.register_event_duration_secs_listener(listener)
  try:
    out = continuous_episodes.run_episodes(params, CountingEnv(), RENDERER, TOK,
                                           _examples(6, offset=1), rng=jax.random.key(8),
                                           slots=4, chunk_steps=2, **ARGS)
    jax.block_until_ready(out.rollout)
  finally:
    jax.monitoring.unregister_event_duration_listener(listener)
  assert compiles == []
  assert not np.array_equal(out.turns_N, both[1].turns_N)  # Other turn counts, same programs.


@pytest.mark.parametrize('kw, match', [(dict(slots=3), 'slots=3.*multiple of group_size=2'),
                                       (dict(slots=14), 'slots=14 exceeds'),
                                       (dict(slots=4, chunk_steps=0), 'chunk_steps=0')])
def test_bad_arguments_name_them(params, kw, match):
  with pytest.raises(ValueError, match=match):
    continuous_episodes.run_episodes(params, CountingEnv(), RENDERER, TOK, _examples(6),
                                     rng=jax.random.key(0), **ARGS, **kw)


def _tool_config():
  c = config_lib.default()
  c.rl.prompts_per_step, c.rl.group_size = 4, 2
  c.rl.sampler, c.rl.slots = 'continuous', 4
  c.env.update(enabled=True, tools=('calculator',))
  return c


def test_config_accepts_continuous_episodes_and_names_what_it_does_not_carry():
  config_lib.validate(_tool_config(), num_devices=1)
  c = _tool_config()
  c.env.rollback.enabled = True
  with pytest.raises(ValueError, match="rl.sampler='continuous'.*env.rollback.enabled"):
    config_lib.validate(c, num_devices=1)
  c = _tool_config()
  c.rl.partial_rollouts = True
  with pytest.raises(ValueError, match='rl.partial_rollouts.*env.enabled'):
    config_lib.validate(c, num_devices=1)


def test_rl_step_on_continuous_episodes_end_to_end(tmp_path, monkeypatch):
  from train_episodes_test import env_config  # tests/ is on sys.path
  from rlreason.rl import metrics
  from rlreason.rl import train
  calls = []
  run = continuous_episodes.run_episodes
  monkeypatch.setattr(continuous_episodes, 'run_episodes',
                      lambda *a, **k: calls.append(k['slots']) or run(*a, **k))
  c = env_config(steps=1)
  c.rl.sampler, c.rl.slots = 'continuous', 4
  c.sft.steps, c.eval.every, c.checkpoint.every = 0, 0, 0
  state, _ = train.train(c, str(tmp_path))
  assert calls == [4] and int(state.step) + int(state.skipped) == 2
  row = [r for r in metrics.read_jsonl(tmp_path / 'metrics.jsonl') if r['step'] == 1][0]
  assert row['tokens/generate'] > 0 and 'episodes/turns_mean' in row and np.isfinite(row['loss'])
