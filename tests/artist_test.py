"""ARTIST: the rare-event task and its gold segment, the two roles' prompts and rewards, the
role-episode engine's rows, per-role advantages, and the config checks."""

import json
import string
import types

import jax.numpy as jnp
import numpy as np
import pytest

from rlreason import config as config_lib
from rlreason.envs import artist
from rlreason.envs import base
from rlreason.model import tokenizer
from rlreason.objectives import advantages
from rlreason.rl import rl_batch
from rlreason.rollout import roles
from rlreason.rollout import sampler
from rlreason.structs import Rollout

TOK = tokenizer.from_characters(string.printable)


@pytest.mark.parametrize('difficulty, width', [(1, 4), (2, 8), (4, 8)])
def test_the_task_has_one_rare_event_in_its_gold_segment(difficulty, width):
  for index in range(30):
    ex = artist.ts_rare_event(3, index, difficulty=difficulty, width=width)
    assert ex == artist.ts_rare_event(3, index, difficulty=difficulty, width=width)
    s, m = ex.meta['series'], ex.meta
    assert len(s) == artist.num_segments(difficulty) * width == len(m['timestamps'])
    outliers = [i for i, v in enumerate(s) if not 2 <= v <= 7]
    assert outliers == [m['event']]  # exactly one value off the baseline
    assert (s[m['event']] >= 12) == (m['kind'] == 'spike') and (s[m['event']] == 0) == (
        m['kind'] == 'dip')
    assert m['gold_segment'] == m['event'] // width
    assert ex.answer == (str(m['event']) if m['question'] == 'when' else m['kind'])
    assert ex.prompt == f'{m["question"]}?'
  assert artist.ts_rare_event(3, 0) != artist.ts_rare_event(4, 0)


def _hand_example(question='when'):
  # 2 segments of 4 (difficulty 1 has 4 segments; the environment reads meta only).
  series = [3, 4, 5, 6, 2, 14, 7, 3, 4, 4, 4, 4, 5, 5, 5, 5]
  meta = {'tools': ['timeseries'], 'series': series, 'timestamps': list(range(16)), 'width': 4,
          'event': 5, 'kind': 'spike', 'question': question, 'gold_segment': 1,
          'gold_calls': []}
  return artist.example_lib.Example(id='hand', prompt=f'{question}?',
                                    answer='5' if question == 'when' else 'spike',
                                    solution=None, task=artist.TASK, difficulty=1, meta=meta)


def test_the_reasoner_prompt_holds_only_the_selected_segment():
  ex = _hand_example()
  # Ranges: [3..6] 3, [2..14] 12 -> 9, [4..4] 0, [5..5] 0.
  assert artist.controller_prompt(ex) == 'ctl when? ranges 0:3 1:9 2:0 3:0\n'
  env = artist.ArtistEnvironment()
  state = env.reset(ex)
  step = env.select(state, 'seg 2\n')
  assert json.loads(step.observation) == [[8, 4], [9, 4], [10, 4], [11, 4]]  # the tool's window
  assert env.reasoner_prompt(state) == 'rsn when? 8:4 9:4 10:4 11:4\n'
  state = env.reset(ex)
  env.select(state, 'seg 1')
  assert env.reasoner_prompt(state) == 'rsn when? 4:2 5:14 6:7 7:3\n'


@pytest.mark.parametrize('controller_reward', ['segment', 'success'])
def test_role_rewards_on_hand_cases(controller_reward):
  env = artist.ArtistEnvironment(controller_reward=controller_reward)
  cases = [  # (question, segment, answer, controller 'segment', reasoner, success)
      ('when', 1, '5', 1.0, 1.0, 1.0),
      ('when', 1, '6', 1.0, 0.0, 0.0),  # right segment, wrong index
      ('when', 0, 'none', 0.0, 1.0, 0.0),  # wrong segment, rightly 'none'
      ('when', 0, '5', 0.0, 0.0, 1.0),  # a lucky guess: the episode succeeds
      ('what', 1, 'spike', 1.0, 1.0, 1.0),
      ('what', 3, 'spike', 0.0, 0.0, 1.0),
      ('what', 1, 'none', 1.0, 0.0, 0.0),
  ]
  for question, segment, answer, ctl, rsn, success in cases:
    state = env.reset(_hand_example(question))
    assert not env.select(state, f'seg {segment}\n').done
    step = env.answer(state, answer + '\n')
    assert step.done and step.reward == success == state.reward
    assert step.info['status'] == ('correct' if success else 'wrong')
    expected_ctl = ctl if controller_reward == 'segment' else success
    assert state.role_rewards == [expected_ctl, rsn], (question, segment, answer)


def test_a_malformed_or_out_of_range_selection_ends_the_episode():
  env = artist.ArtistEnvironment()
  for text, kind in (('look at 2\n', base.MALFORMED), ('seg 9\n', base.BAD_ARGUMENTS)):
    state = env.reset(_hand_example())
    step = env.select(state, text)
    assert step.done and state.done and step.reward == 0.0 and dict(state.errors) == {kind: 1}
    assert state.role_rewards == [0.0, 0.0] and state.segment is None
    with pytest.raises(ValueError, match='selected segment'):
      env.answer(state, '5\n')


def test_the_teacher_writes_one_role_row_with_the_configured_accuracy():
  ex = artist.ts_rare_event(0, 7)
  rng = np.random.default_rng(0)
  gold = ex.meta['gold_segment']
  ctl, rsn = [], []
  for _ in range(400):
    (prompt, p_trained), (action, a_trained) = artist.teacher_trace(
        ex, rng, select_prob=0.5, answer_prob=1.0)
    assert not p_trained and a_trained and action.endswith('\n')
    if prompt.startswith('ctl '):
      assert prompt == artist.controller_prompt(ex)
      ctl.append(action == f'seg {gold}\n')
    else:  # answer_prob 1: always right for the segment shown.
      seg = int(prompt.split()[2].split(':')[0]) // ex.meta['width']
      assert action == artist.right_answer(ex, seg) + '\n'
      rsn.append(seg == gold)
  assert 0.4 < np.mean(ctl) < 0.6 and 0.4 < np.mean(rsn) < 0.6  # 0.5 each, 200 draws
  assert artist.longest_prompt(2, 8) >= max(
      len(artist.teacher_trace(ex, rng)[0][0]) for _ in range(50))


# --- per-role advantages --------------------------------------------------------------------


def test_role_advantages_hand_computed():
  # One prompt, G = 3, roles (controller, reasoner). Controller rewards 1, 0, 1: mean 2/3,
  # unbiased std sqrt(((1/3)^2 * 2 + (2/3)^2) / 2) = sqrt(1/3) = 0.57735 -> A = +0.57735,
  # -1.1547, +0.57735. Reasoner rewards 1, 0 and a missing row (NaN): over the two present,
  # mean 0.5, std sqrt(0.5) = 0.70711 -> A = +0.70711, -0.70711, and 0 for the missing row.
  r = jnp.array([[[1.0, 1.0], [0.0, 0.0], [1.0, jnp.nan]]])
  adv = np.asarray(roles.role_advantages(r))
  np.testing.assert_allclose(adv[0, :, 0], [0.57735, -1.1547, 0.57735], atol=1e-4)
  np.testing.assert_allclose(adv[0, :, 1], [0.70711, -0.70711, 0.0], atol=1e-4)
  # Present rows: exactly grpo within each role.
  full = jnp.array([[[1.0, 0.2], [0.0, 0.9], [1.0, 0.4]], [[0.3, 1.0], [0.3, 1.0], [0.0, 0.0]]])
  for role in range(2):
    np.testing.assert_allclose(np.asarray(roles.role_advantages(full))[..., role],
                               np.asarray(advantages.grpo(full[..., role])), atol=1e-6)
  # A role with one present row, or equal rewards, learns nothing.
  one = jnp.array([[[1.0, 1.0], [1.0, jnp.nan]]])
  np.testing.assert_allclose(np.asarray(roles.role_advantages(one)), 0.0)


def _scores(role_rewards_BxGxR, success_BxG):
  return rl_batch.Scores(success_BxG, success_BxG, np.full(success_BxG.shape, -1), {},
                         role_rewards_BxGxR=role_rewards_BxGxR)


def test_advantages_for_per_role_or_per_episode_on_episode_major_rows():
  c = config_lib.default()
  c.rl.group_size = 2
  run = types.SimpleNamespace(config=c)
  # One prompt, 2 episodes: (controller, reasoner) rewards (1, 0) and (0, 1); success 0, 0.
  role_BxGxR = np.array([[[1.0, 0.0], [0.0, 1.0]]], np.float32)
  success_BxG = np.zeros((1, 2), np.float32)
  mask = jnp.ones((4, 3), bool)
  batch = types.SimpleNamespace(loss_mask_NxL=mask)
  adv, _ = rl_batch.advantages_for(run, _scores(role_BxGxR, success_BxG), None, batch,
                                   progress=0.0)
  # Rows: ep0 ctl, ep0 rsn, ep1 ctl, ep1 rsn. Each role's pair {1, 0}: +-1/sqrt(0.5) / ... =
  # (1 - 0.5) / (0.70711 + 1e-6) = 0.70711.
  np.testing.assert_allclose(np.asarray(adv)[:, 0], [0.70711, -0.70711, -0.70711, 0.70711],
                             atol=1e-4)
  # Credit 'episode': no role rewards; the episodes' equal success -> 0 everywhere.
  adv, _ = rl_batch.advantages_for(run, _scores(None, success_BxG), None, batch, progress=0.0)
  np.testing.assert_allclose(np.asarray(adv), 0.0)
  adv, _ = rl_batch.advantages_for(run, _scores(None, np.array([[1.0, 0.0]], np.float32)),
                                   None, batch, progress=0.0)
  np.testing.assert_allclose(np.asarray(adv)[:, 0], [0.70711, 0.70711, -0.70711, -0.70711],
                             atol=1e-4)


# --- the role-episode engine, with a scripted sampler -----------------------------------------


def _scripted_generate(script):
  """A stand-in for sampler.generate (group_size 1): each row's completion is script(prompt
  text), so the engine's prompts, masks and row order can be checked without a model."""

  def generate(params, prompts, *, max_new_tokens, stop_tokens, pad_id, **kw):
    del params, stop_tokens, kw
    tokens_BxP, mask_BxP = np.asarray(prompts.tokens_BxP), np.asarray(prompts.mask_BxP)
    n = tokens_BxP.shape[0]
    tokens = np.full((n, max_new_tokens), pad_id, np.int32)
    mask = np.zeros((n, max_new_tokens), bool)
    for i in range(n):
      ids = TOK.encode(script(TOK.decode(tokens_BxP[i][mask_BxP[i]].tolist())))[:max_new_tokens]
      tokens[i, :len(ids)], mask[i, :len(ids)] = ids, True
    zeros = jnp.zeros((n, max_new_tokens), jnp.float32)
    return Rollout(prompts=prompts, tokens_NxL=jnp.asarray(tokens), mask_NxL=jnp.asarray(mask),
                   prefix_mask_NxL=jnp.zeros((n, max_new_tokens), bool), logprobs_NxL=zeros,
                   behaviour_logprobs_NxL=zeros, truncated_N=jnp.zeros((n,), bool),
                   lengths_N=jnp.asarray(mask.sum(1), jnp.int32), group_size=1)

  return generate


def test_role_episodes_interleave_a_controller_and_a_reasoner_row(monkeypatch):
  examples = [_hand_example('when'), _hand_example('what')]
  picks = iter(['seg 1\n', 'seg 0\n', 'oops\n', 'seg 1\n'])  # rows in order: b*G + g
  answers = {'rsn when? 4:2 5:14 6:7 7:3': '5\n', 'rsn when? 0:3 1:4 2:5 3:6': 'none\n',
             'rsn what? 4:2 5:14 6:7 7:3': 'dip\n'}
  script = lambda text: next(picks) if text.startswith('ctl') else answers.get(text.strip(), '')
  monkeypatch.setattr(sampler, 'generate', _scripted_generate(script))
  env = artist.ArtistEnvironment()
  ep = roles.run_role_episodes(None, env, TOK, examples, cfg=None, group_size=2,
                               max_turn_tokens=8, prompt_tokens=40, rng=jnp.zeros(2, jnp.uint32))
  r = ep.rollout
  assert r.tokens_NxL.shape == (8, 8) and ep.turn_rows == 2
  prompts, pmask = np.asarray(r.prompts.tokens_BxP), np.asarray(r.prompts.mask_BxP)
  texts = [TOK.decode(prompts[i][pmask[i]].tolist()) for i in range(8)]
  assert texts[0] == texts[2] == 'ctl when? ranges 0:3 1:9 2:0 3:0\n'
  assert texts[1] == 'rsn when? 4:2 5:14 6:7 7:3\n' and texts[3] == 'rsn when? 0:3 1:4 2:5 3:6\n'
  assert texts[4] == texts[6] == 'ctl what? ranges 0:3 1:9 2:0 3:0\n'
  assert texts[7] == 'rsn what? 4:2 5:14 6:7 7:3\n'
  np.testing.assert_array_equal(np.asarray(r.turn_NxL)[:, 0], [0, 1] * 4)
  # Episode 2's controller wrote 'oops': its reasoner row is all masked, its rewards 0 / NaN.
  real = np.asarray(r.mask_NxL).any(1)
  np.testing.assert_array_equal(real, [1, 1, 1, 1, 1, 0, 1, 1])
  np.testing.assert_array_equal(np.asarray(r.loss_mask_NxL), np.asarray(r.mask_NxL))
  np.testing.assert_array_equal(ep.rewards_N, [1, 0, 0, 0])
  np.testing.assert_array_equal(ep.role_rewards_N, [[1, 1], [0, 1], [0, np.nan], [1, 0]])
  np.testing.assert_array_equal(ep.credit_BxGxR, ep.role_rewards_N.reshape(2, 2, 2))
  assert list(ep.errors_N) == [base.MALFORMED]
  assert ep.errors_N[base.MALFORMED].tolist() == [0, 0, 1, 0]
  assert ep.role_metrics() == {'artist/segment_accuracy': 0.5,
                               'artist/reasoner_accuracy': pytest.approx(2 / 3),
                               'artist/reached_reasoner_frac': 0.75,
                               'artist/answer_accuracy': 0.25}
  assert ep.transcripts[0][-1]['status'] == 'correct'
  env_ep = artist.ArtistEnvironment(credit='episode')
  picks = iter(['seg 1\n', 'seg 0\n', 'oops\n', 'seg 1\n'])
  ep = roles.run_role_episodes(None, env_ep, TOK, examples, cfg=None, group_size=2,
                               max_turn_tokens=8, prompt_tokens=40, rng=jnp.zeros(2, jnp.uint32))
  assert ep.credit_BxGxR is None
  with pytest.raises(ValueError, match='data.prompt_buckets'):
    roles.run_role_episodes(None, env, TOK, examples, cfg=None, group_size=2, max_turn_tokens=8,
                            prompt_tokens=10, rng=jnp.zeros(2, jnp.uint32))


# --- config checks --------------------------------------------------------------------------


def test_the_configs_validate():
  from experiments import artist as artist_config
  for arg in ('runlocal', 'episode_runlocal', '', 'episode'):
    config_lib.validate(artist_config.get_config(arg), num_devices=1)
  with pytest.raises(ValueError, match='experiments/artist.py'):
    artist_config.get_config('bogus')


@pytest.mark.parametrize('edit, message', [
    (lambda c: c.env.update(options={'credit': 'team'}), 'env.options.credit'),
    (lambda c: c.env.update(options={'temperature': 1}), 'env.options'),
    (lambda c: c.env.update(options={'controller_reward': 'x'}), 'env.options.controller_reward'),
    (lambda c: c.data.update(task='arithmetic'), 'data.task'),
    (lambda c: c.data.update(prompt_buckets=(32,)), 'data.prompt_buckets'),
    (lambda c: c.data.update(difficulty=7), 'data.difficulty'),
    (lambda c: c.objective.update(advantage='rloo'), 'objective.advantage'),
    (lambda c: c.objective.update(advantage='gae'), 'token-level'),
    (lambda c: c.rl.update(dynamic_sampling=True), 'rl.dynamic_sampling'),
    (lambda c: c.env.update(max_turn_tokens=99), 'env.max_turn_tokens'),
    (lambda c: c.judge.update(enabled=True), 'judge.enabled'),
])
def test_config_errors_name_the_field(edit, message):
  from experiments import artist as artist_config
  c = artist_config.get_config('runlocal')
  edit(c)
  with pytest.raises(ValueError, match=message):
    config_lib.validate(c, num_devices=1)
