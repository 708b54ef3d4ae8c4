"""Prolog-as-a-Tool as episodes: the task, the per-episode reward composition (hand-computed),
the protocols' stopping and observations, the teacher, and the config checks. Needs swipl."""

import dataclasses
import shutil
import string

import jax
import numpy as np
import pytest

from experiments import prolog_tool
from rlreason import config as config_lib
from rlreason.envs import prolog_protocols as pp
from rlreason.envs import prolog_tasks
from rlreason.envs import prolog_traces
from rlreason.envs import render
from rlreason.model import tokenizer
from rlreason.model import transformer
from rlreason.rollout import episodes as episodes_lib
from rlreason.verifiers import prolog
from rlreason.verifiers import verdict as V

pytestmark = pytest.mark.skipif(shutil.which('swipl') is None, reason='needs swipl')

def _add_example():  # Ann has 12 apples and buys 3 more: 15.
  ex = prolog_tasks.prolog_arith(0, 0)
  meta = {'kind': 'add', 'facts': [['has', 12], ['buys', 3]], 'expression': 'A+B'}
  return dataclasses.replace(ex, prompt='Ann has 12 apples and buys 3 more. How many apples?',
                             answer='15', meta=meta, solution=prolog_tasks.program(meta))


EX = _add_example()
DERIVED = pp.answer_text('has(12).\nbuys(3).\nsolve(X) :- has(A), buys(B), {X = A+B}.')
UNBOUND = pp.answer_text('has(12).\nbuys(3).\nsolve(X) :- {X = A+B}.')
WRONG = pp.answer_text('solve(X) :- {X = 16}.')


def test_the_task_is_deterministic_and_its_program_derives_the_answer():
  for kind in prolog_tasks.KINDS:
    ex = prolog_tasks.prolog_arith(3, 7, kinds=(kind,))
    assert ex == prolog_tasks.prolog_arith(3, 7, kinds=(kind,)) and ex.meta['kind'] == kind
    assert int(ex.answer) >= 0 and len(ex.prompt) + 1 <= 64  # experiments' prompt bucket
    verdict = pp.run_program(pp.answer_text(ex.solution), ex.answer)
    assert verdict.status == 'correct' and pp.derived(verdict), (kind, verdict)
  assert EX.solution == 'has(12).\nbuys(3).\nsolve(X) :- has(A), buys(B), {X = A+B}.'
  with pytest.raises(ValueError, match='kinds'):
    prolog_tasks.prolog_arith(0, 0, kinds=('div',))


def test_episode_reward_composition_by_hand():
  # DERIVED: correctness 2 (15 = gold); structure: 2 predicates besides solve/1 -> 0.6, one
  # constraint -> 0.5, = 1.1; syntax: ':-', 'solve(', 3 lines ending in '.' = 5 hits -> 1.0.
  #   correctness reward 2.0; structure reward 2 + 0.5 * 1.1 + 0.25 * 1.0 = 2.8.
  # WRONG: a number, not 15: correctness 1; structure: 0 predicates, 1 constraint = 0.5, hard-
  # coded x 0.2 = 0.1; syntax 3 hits -> 0.6.  1.0 and 1 + 0.05 + 0.15 = 1.2.
  # UNBOUND: correctness 0.5; structure 1.1 (not hard-coded); syntax 1.0: 0.5 and 1.3.
  # No program: every component 0: 0 and 0.
  cases = [(DERIVED, 2.0, 2.8, True), (WRONG, 1.0, 1.2, True), (UNBOUND, 0.5, 1.3, False),
           ('15', 0.0, 0.0, False)]
  for text, correctness, structured, number in cases:
    for reward, expected in (('correctness', correctness), ('structure', structured)):
      env = pp.PrologEnvironment(protocol='single', tries=1, reward=reward)
      state = env.reset(EX)
      step = env.step(state, text)
      assert step.done and step.reward == pytest.approx(expected), (text, reward)
      assert state.reward == pytest.approx(expected)
    assert step.info['c_correctness'] == correctness
    assert pp.gave_number(pp.run_program(text, EX.answer)) == number


def test_derived_is_one_predicate_one_constraint_and_not_hardcoded():
  for p in range(6):
    for c in range(3):
      for code in ('solve(X) :- {X = 7}.', 'solve(X) :- a(A), {X = A}.'):
        score = prolog.structure_score(code, p, c)
        verdict = V.judged(False, components={'structure': score})
        hard = code.startswith('solve(X) :- {X = 7')
        assert pp.derived(verdict) == (p >= 1 and c >= 1 and not hard), (p, c, code, score)


def test_multi_try_stops_at_the_first_number_right_or_wrong():
  env = pp.PrologEnvironment(protocol='multi_try', tries=3, reward='correctness')
  state = env.reset(EX)
  first = env.step(state, UNBOUND)
  assert not first.done and first.observation == pp.RETRY and first.reward == 0.0
  assert first.info['messages'] == [{'content': pp.RETRY}]
  second = env.step(state, WRONG)  # A number: the paper's success test; gold never consulted.
  assert second.done and second.reward == 1.0 and second.info['status'] == 'wrong'
  assert state.turns == 2 and state.tool_calls == 2 and state.errors['tool_failed'] == 1
  with pytest.raises(ValueError, match='finished'):
    env.step(state, DERIVED)


def test_agentic_shows_the_run_and_the_last_try_is_scored():
  env = pp.PrologEnvironment(protocol='agentic', tries=3, reward='structure')
  state = env.reset(EX)
  unclosed = '<answer>\nsolve(X) :- {X = 15}.'
  steps = [env.step(state, t) for t in (UNBOUND, 'no program', unclosed)]
  assert [s.observation for s in steps[:2]] == ['X unbound', 'no <answer> program']
  # The third try is the last: scored although it gave no number (no closing tag: no program).
  assert steps[2].done and steps[2].reward == 0.0 and state.turns == 3
  single = pp.PrologEnvironment(protocol='single', tries=1)
  assert single.step(single.reset(EX), UNBOUND).done


def test_the_teacher_traces_replay_in_the_environment():
  rng = np.random.default_rng(0)
  seen = set()
  for i in range(6):
    ex = prolog_tasks.prolog_arith(1, i)
    for protocol, tries in (('single', 1), ('multi_try', 2), ('agentic', 3)):
      trace = prolog_traces.prolog_trace(ex, rng, protocol=protocol, tries=tries,
                                         slip_prob=0.7)
      env = pp.PrologEnvironment(protocol=protocol, tries=tries)
      state = env.reset(ex)
      for k in range(0, len(trace), 2):
        text, trained = trace[k]
        assert trained and text.startswith('<answer>\n') and text.endswith('\n</answer>')
        step = env.step(state, text)
        if k + 1 < len(trace):
          assert not step.done and trace[k + 1] == [
              render.RESULT_OPEN + step.observation + render.RESULT_CLOSE, False]
      assert step.done or protocol == 'single'
      seen.add((protocol, len(trace)))
  assert {('multi_try', 3), ('agentic', 3), ('single', 1)} <= seen


def test_observations_are_masked_in_episodes():
  """A random tiny model writes no program: every try fails and the observation between turns
  is the protocol's text, fed in with loss mask 0."""
  tok = tokenizer.from_characters(string.printable)
  cfg = transformer.ModelConfig(vocab_size=tok.vocab_size, hidden_size=16, intermediate_size=32,
                                num_layers=1, num_heads=2, num_kv_heads=1, head_dim=8)
  params = transformer.init_params(cfg, jax.random.key(0))
  examples = [prolog_tasks.prolog_arith(0, i) for i in range(2)]
  for protocol, expected in (('agentic', 'no <answer> program'), ('multi_try', pp.RETRY)):
    env = pp.PrologEnvironment(protocol=protocol, tries=2)
    ep = episodes_lib.run_episodes(
        params, env, pp.renderer('{prompt}\n'), tok, examples, cfg=cfg, group_size=4,
        max_turns=2, max_turn_tokens=4, max_observation_tokens=40, max_total_tokens=48,
        rng=jax.random.key(1), prompt_buckets=(64,))
    tokens, loss = np.asarray(ep.tokens_NxL), np.asarray(ep.loss_mask_NxL)
    for n in range(8):
      assert ep.turns_N[n] == 2 and ep.rewards_N[n] == 0.0
      count = int(ep.lengths_N[n])
      masked = [int(t) for t, m in zip(tokens[n, :count], loss[n, :count]) if not m]
      assert tok.decode(masked) == render.RESULT_OPEN + expected + render.RESULT_CLOSE
      assert ep.transcripts[n][0]['observation'] == tok.decode(masked)


@pytest.mark.parametrize('field,value,match', [
    ('protocol', 'best_of', 'env.options.protocol'),
    ('tries', 0, 'env.options.tries'),
    ('reward', 'semantic', 'env.options.reward'),
    ('temperature', 0.2, 'unknown for env.kind'),
    ('tries', 3, 'env.max_turns=2 must be >= env.options.tries'),
])
def test_config_errors_name_the_field(field, value, match):
  c = prolog_tool.get_config('agentic,structure')
  config_lib.validate(c, num_devices=8)
  c.env.options[field] = value
  with pytest.raises(ValueError, match=match):
    config_lib.validate(c, num_devices=8)
  single = prolog_tool.get_config('single,correctness')
  single.env.options.tries = 2
  with pytest.raises(ValueError, match="1 with protocol='single'"):
    config_lib.validate(single, num_devices=8)
  with pytest.raises(ValueError, match='env.options.protocol'):
    pp.PrologEnvironment(protocol='agent')


def test_the_study_runs_the_experiment_settings():
  from experiments.dynamics import prolog_protocols as study
  for protocol, reward in (('single', 'correctness'), ('agentic', 'structure')):
    ours = study.make_config(protocol, reward, smoke=False).to_dict()
    theirs = prolog_tool.get_config(f'{protocol},{reward}').to_dict()
    for section in ('data', 'model', 'tokenizer', 'env', 'sft', 'objective', 'optimizer'):
      assert ours[section] == theirs[section], section
    assert ours['rl']['max_new_tokens'] == theirs['rl']['max_new_tokens']
