"""MIND: the simulated patient, the typed evidence state, its information-gain reward, and the
typed-state episode engine (a row per turn) with its advantages."""

import dataclasses
import math
import string
import types

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rlreason import config as config_lib
from rlreason.envs import base
from rlreason.envs import patient
from rlreason.model import tokenizer
from rlreason.model import transformer
from rlreason.objectives import advantages
from rlreason.rl import rl_batch
from rlreason.rollout import sampler
from rlreason.rollout import typed_episodes
from rlreason.tasks import example as example_lib

# A hand bank: A = {a, b}, B = {a, c}, C = {b, c, d}, D = {a}.
BANK = patient.Bank(('A', 'B', 'C', 'D'), ('a', 'b', 'c', 'd'),
                    (frozenset('ab'), frozenset('ac'), frozenset('bcd'), frozenset('a')))
# The hidden condition is B; the patient is unsure about d.
ANSWERS = {'a': 'yes', 'b': 'no', 'c': 'yes', 'd': 'unsure'}
HAND = example_lib.Example(id='hand', prompt='complaint a', answer='B', solution='dx B',
                           task=patient.TASK, difficulty=1,
                           meta={'condition': 'B', 'complaint': 'a', 'answers': ANSWERS,
                                 'bank_seed': 0})


def _hand_state(env):
  return patient.PatientState(example=HAND, bank=BANK, evidence=patient.initial_evidence(HAND))


@pytest.mark.parametrize('difficulty', [1, 2, 3])
def test_the_patient_answers_from_its_hidden_condition(difficulty):
  bank = patient.make_bank(difficulty)
  assert bank == patient.make_bank(difficulty)  # Deterministic, and not a function of the seed.
  assert len(set(bank.criteria)) == len(bank.conditions) == patient.bank_size(difficulty)[0]
  env = patient.PatientEnvironment(max_turns=len(bank.findings) + 1)
  for index in range(20):
    ex = patient.patient_dx(5, index, difficulty=difficulty)
    assert ex == patient.patient_dx(5, index, difficulty=difficulty)
    condition = ex.meta['condition']
    assert ex.answer == condition and ex.prompt == f'complaint {ex.meta["complaint"]}'
    assert bank.present(condition, ex.meta['complaint'])
    state = env.reset(ex)
    for finding in bank.findings:
      step = env.step(state, f'ask {finding}\n')
      truth = 'yes' if bank.present(condition, finding) else 'no'
      assert step.observation in (truth, 'unsure'), (index, finding)
      assert step.observation == 'unsure' or step.observation == truth
      if finding == ex.meta['complaint']:
        assert step.observation == 'yes'
    # Every certain answer asked: only the hidden condition (and conditions differing from it
    # only on unsure findings) stay consistent.
    assert condition in patient.consistent(bank, state.evidence)


def test_typed_state_after_a_hand_scripted_consultation():
  # [a+]: A, B, D have a (C does not). Checks: b (A only), c (B only); d splits nobody.
  # Supports: A {a,b}: 1/2, B {a,c}: 1/2, D {a}: 1/1.
  evidence = [('a', 'yes')]
  assert patient.consistent(BANK, evidence) == ('A', 'B', 'D')
  assert patient.checks(BANK, evidence) == ('b', 'c')
  assert patient.supports(BANK, evidence) == (('A', 1, 2), ('B', 1, 2), ('D', 1, 1))
  assert patient.render_state(BANK, evidence) == ('ev a+\nchk b c\ndif A B D\n'
                                                  'sup A1/2 B1/2 D1/1\nlow -\n')
  # b- removes A; d? changes nothing but is low reliability; c+ removes D.
  evidence += [('b', 'no')]
  assert patient.consistent(BANK, evidence) == ('B', 'D')
  assert patient.checks(BANK, evidence) == ('c',)
  evidence += [('d', 'unsure')]
  assert patient.render_state(BANK, evidence) == ('ev a+ b- d?\nchk c\ndif B D\nsup B1/2 D1/1\n'
                                                  'low d\n')
  # 'unsure' leaves a check unresolved: b, answered unsure, still splits A from B and D.
  assert patient.checks(BANK, [('a', 'yes'), ('b', 'unsure')]) == ('b', 'c')
  evidence += [('c', 'yes')]
  assert patient.render_state(BANK, evidence) == 'ev a+ b- d? c+\nchk -\ndif B\nsup B2/2\nlow d\n'


def test_information_gain_reward_on_a_hand_case():
  # K = 4, coef 0.5, ask_cost 0.01. Entropy log2 |consistent|: 3 -> 2 (b-) -> 2 (d?) -> 1 (c+).
  # ask b: 0.5 * (log2 3 - 1) / 2 - 0.01 = 0.5 * 0.5849625 / 2 - 0.01 = 0.1362406
  # ask d: 0 - 0.01; ask b again: 0 - 0.01; ask c: 0.5 * 1 / 2 - 0.01 = 0.24; dx B: 1.
  env = patient.PatientEnvironment(max_turns=8, info_gain_coef=0.5, ask_cost=0.01)
  state = _hand_state(env)
  expected = [('ask b', 'no', 0.1362406, math.log2(3) - 1), ('ask d', 'unsure', -0.01, 0.0),
              ('ask b', 'no', -0.01, 0.0), ('ask c', 'yes', 0.24, 1.0)]
  for action, answer, reward, gain in expected:
    step = env.step(state, action + '\n')
    assert (step.observation, step.done) == (answer, False)
    assert step.reward == pytest.approx(reward, abs=1e-6)
    assert step.info['info_gain'] == pytest.approx(gain)
  final = env.step(state, 'dx B\n')
  assert final.done and final.reward == 1.0 and final.info['status'] == 'correct'
  assert state.reward == pytest.approx(1.0 + 0.1362406 - 0.02 + 0.24, abs=1e-6)
  assert state.info_gain == pytest.approx(math.log2(3))  # telescopes to H_0 - H_end
  assert state.tool_calls == 4 and not state.errors


def test_resolved_gain_is_the_reference_count_of_resolved_checks():
  # mind_v2/mind/reward/info_gain.py: coef x |M_{t-1} minus M_t|, here 1 per check answered
  # yes/no. From [a+]: M = (b, c). ask b (no): 1 -> 0.3; ask d (unsure, not a check): 0;
  # ask c (yes, a check of {B, D}): 1 -> 0.3; ask a again (not a check): 0.
  env = patient.PatientEnvironment(max_turns=8, info_gain_coef=0.3, gain='resolved')
  state = _hand_state(env)
  rewards = [env.step(state, f'ask {x}\n').reward for x in 'bdca']
  assert rewards == pytest.approx([0.3, 0.0, 0.3, 0.0])
  state = _hand_state(env)
  env.step(state, 'ask b\n')
  assert env.step(state, 'ask d\n').info['resolved'] == 0


def test_wrong_diagnosis_malformed_actions_and_the_turn_limit():
  env = patient.PatientEnvironment(max_turns=3, info_gain_coef=0.5)
  state = _hand_state(env)
  for text in ('hello\n', 'ask z\n'):  # not an action; a finding the bank does not have
    step = env.step(state, text)
    assert step.observation == 'error' and step.reward == 0.0 and not step.done
  assert dict(state.errors) == {base.MALFORMED: 2} and state.tool_calls == 0
  step = env.step(state, 'ask b\n')
  assert step.done and state.truncated  # the third turn was the last
  state = _hand_state(env)
  final = env.step(state, 'dx A\n')
  assert final.done and final.reward == 0.0 and final.info['status'] == 'wrong'


def test_the_teacher_asks_the_most_informative_check_then_concludes():
  # From [a+]: b and c both split {A, B, D} 1:2, expected gain log2 3 - 2/3 = 0.918 bits; the
  # tie goes to b. After b-: c splits {B, D}; after c+: one condition left.
  evidence = [('a', 'yes')]
  assert patient.expected_gain(BANK, evidence, 'b') == pytest.approx(math.log2(3) - 2 / 3)
  assert patient.expected_gain(BANK, evidence, 'd') == 0.0
  assert patient.teacher_action(BANK, evidence) == 'ask b'
  assert patient.teacher_action(BANK, evidence + [('b', 'no')]) == 'ask c'
  assert patient.teacher_action(BANK, evidence + [('b', 'no'), ('c', 'yes')]) == 'dx B'
  ex = patient.patient_dx(0, 1)
  rng = np.random.default_rng(0)
  raw = patient.teacher_trace(ex, rng, state='raw')
  assert raw[-1] == [f'dx {ex.answer}\n', True]
  assert all(trained == text.startswith(('ask', 'dx')) for text, trained in raw)
  state_text, action = patient.teacher_trace(ex, rng, state='typed')
  assert state_text[0].startswith('ev ') and not state_text[1] and action[1]


def test_raw_renderer_and_format():
  renderer = patient.RawRenderer()
  assert renderer.prompt_text(HAND) == 'complaint a\n'
  assert renderer.observation_text([{'role': 'tool', 'content': 'yes'}], True) == '= yes\n'
  assert patient.LONGEST_OBSERVATION == len('= unsure\n') == 9
  assert patient.TypedRenderer().prompt_text(HAND) == ''
  assert patient.FORMAT.call_end == '\n'


# --- the typed-state engine -------------------------------------------------------------

TOK = tokenizer.from_characters(string.printable)
CFG = transformer.ModelConfig(vocab_size=TOK.vocab_size, hidden_size=32, intermediate_size=64,
                              num_layers=1, num_heads=2, num_kv_heads=1, head_dim=16)


@dataclasses.dataclass
class _FakeState:
  example: object
  turns: int = 0
  tool_calls: int = 0
  reward: float = 0.0
  errors: dict = dataclasses.field(default_factory=dict)


class FakeTypedEnv:
  """Episode i (of its example's index) ends after `1 + index % 3` turns, whatever the model
  wrote; the state is 'state <turns taken>'; reward 0.5 per turn."""
  format = patient.FORMAT

  def reset(self, example):
    return _FakeState(example)

  def state_text(self, state):
    return f'state {state.turns}\n'

  def step(self, state, turn_text):
    state.turns += 1
    state.reward += 0.5
    done = state.turns >= 1 + int(state.example.id) % 3
    return base.Step('', 0.5, done, {'messages': [{'role': 'tool', 'content': 'ok'}],
                                     'truncated': False})


def test_typed_episodes_are_a_row_per_turn_prompted_by_the_state_alone():
  params = transformer.init_params(CFG, jax.random.key(0))
  examples = [types.SimpleNamespace(id=str(i)) for i in range(3)]  # 1, 2 and 3 turns
  g, turns, width = 2, 4, 5
  ep = typed_episodes.run_typed_episodes(
      params, FakeTypedEnv(), patient.TypedRenderer(), TOK, examples, cfg=CFG, group_size=g,
      max_turns=turns, max_turn_tokens=width, state_tokens=16, rng=jax.random.key(1))
  r = ep.rollout
  assert r.tokens_NxL.shape == (3 * g * turns, width) and r.group_size == 1
  taken = np.repeat([1, 2, 3], g)
  np.testing.assert_array_equal(ep.turns_N, taken)
  np.testing.assert_allclose(ep.rewards_BxG, np.repeat([[0.5], [1.0], [1.5]], g, axis=1))
  mask = np.asarray(r.mask_NxL).reshape(3 * g, turns, width)
  np.testing.assert_array_equal(mask.any(-1), np.arange(turns)[None] < taken[:, None])
  np.testing.assert_array_equal(np.asarray(r.loss_mask_NxL), np.asarray(r.mask_NxL))
  np.testing.assert_array_equal(np.asarray(r.turn_NxL)[:, 0], np.tile(np.arange(turns), 3 * g))
  prompts = np.asarray(r.prompts.tokens_BxP)
  prompt_mask = np.asarray(r.prompts.mask_BxP)
  for n in range(3 * g):
    for t in range(taken[n]):
      row = n * turns + t
      assert TOK.decode(prompts[row][prompt_mask[row]].tolist()) == f'state {t}\n'
      assert ep.transcripts[n][t]['state'] == f'state {t}\n'
  # The learner's teacher-forced log-probs of each row (its state, then its action) are the
  # sampler's: the row holds no history.
  tokens, seq_mask = sampler.sequences(r)
  logp = jax.nn.log_softmax(transformer.apply(params, tokens, cfg=CFG, mask_NxT=seq_mask)[0], -1)
  p = prompts.shape[1]
  lp = jnp.take_along_axis(logp[:, p - 1:-1], r.tokens_NxL[..., None], -1)[..., 0]
  np.testing.assert_allclose(np.where(mask.reshape(-1, width), lp, 0),
                             np.where(mask.reshape(-1, width), r.logprobs_NxL, 0), atol=2e-5)
  conv = ep.conversation
  for n in range(3 * g):  # actions (trained) then '= ok\n' (not) between turns
    trained = conv.loss_mask_NxL[n, :conv.lengths_N[n]]
    assert trained.sum() == mask.reshape(3 * g, turns, width)[n].sum()
    assert (~trained).sum() == len('= ok\n') * (taken[n] - 1)


def test_advantages_repeat_each_episode_over_its_turn_rows():
  c = config_lib.default()
  c.rl.group_size = 2
  run = types.SimpleNamespace(config=c)
  rewards_BxG = np.array([[1.0, 0.0], [0.2, 0.6]], np.float32)
  scores = rl_batch.Scores(rewards_BxG, rewards_BxG, np.full((2, 2), -1), {})
  turns, width = 3, 4
  mask = np.ones((4 * turns, width), bool)
  mask[1 * turns + 2] = False  # episode 1's last turn never happened
  batch = types.SimpleNamespace(loss_mask_NxL=jnp.asarray(mask))
  adv, _ = rl_batch.advantages_for(run, scores, None, batch, progress=0.0)
  per_episode = np.asarray(advantages.grpo(jnp.asarray(rewards_BxG))).reshape(-1)
  expected = np.repeat(per_episode, turns)[:, None] * mask
  np.testing.assert_allclose(np.asarray(adv), expected, rtol=1e-6)


@pytest.mark.parametrize('field, value, message', [
    ('state', 'bogus', 'env.state'),
    ('kind', 'doctor', 'env.kind'),
    ('options', {'temperature': 1.0}, 'env.options'),
    ('options', {'gain': 'kl'}, 'env.options.gain'),
])
def test_config_checks_name_the_field(field, value, message):
  from experiments import mind
  c = mind.get_config('runlocal')
  c.env[field] = value
  with pytest.raises(ValueError, match=message):
    config_lib.validate(c, num_devices=1)


def test_config_checks_refuse_what_typed_rows_cannot_do():
  from experiments import mind
  config_lib.validate(mind.get_config('runlocal'), num_devices=1)
  config_lib.validate(mind.get_config('raw_runlocal'), num_devices=1)
  c = mind.get_config('runlocal')
  c.objective.advantage = 'gae'
  with pytest.raises(ValueError, match='token-level'):
    config_lib.validate(c, num_devices=1)
  c = mind.get_config('runlocal')
  c.data.task = 'arithmetic'
  with pytest.raises(ValueError, match='patient_dx'):
    config_lib.validate(c, num_devices=1)
  c = mind.get_config('runlocal')
  c.env.kind = 'tools'
  with pytest.raises(ValueError, match='typed'):
    config_lib.validate(c, num_devices=1)
  c = mind.get_config('raw_runlocal')
  c.env.max_observation_tokens = 8  # '= unsure\n' is 9: the raw episode would end there
  with pytest.raises(ValueError, match='longest answer'):
    config_lib.validate(c, num_devices=1)
