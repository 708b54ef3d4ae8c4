"""KBQA-R1's Referenced Rejection Sampling: action sequences, the filters, the teacher, the
config (its :runlocal step runs in tests/train_test.py's every-experiment test)."""

import dataclasses

import numpy as np
import pytest

from experiments import kbqa_r1
from experiments.dynamics import kbqa_rrs
from rlreason import config as config_lib
from rlreason import config_checks
from rlreason.envs import base
from rlreason.envs import environment as environment_lib
from rlreason.envs import kb_traces
from rlreason.envs import render
from rlreason.envs import tasks as env_tasks
from rlreason.methods import rejection_sampling as rs


def _env():
  return environment_lib.ToolEnvironment(tools=('kb',), family='tags', verifier='exact',
                                         max_turns=4)


def _call(**arguments) -> str:
  return kb_traces.call_text(base.ToolCall('kb', arguments))


# kb_qa(0, 7, difficulty=1): 'Who works for Kele Corp and lives in Fifitu?' -> 'Doke'. Its graph
# (run_gold's outputs): Kele Corp's employees ["Doke", "Peku"], Fifitu's residents
# ["Butu", "Doke", "Lape", "Tuzu"], their intersection ["Doke"].
BOTH = env_tasks.kb_qa(0, 7, difficulty=1)
EMPLOYEES = _call(action='neighbours', entity='Kele Corp', relation='employer^-1')
RESIDENTS = _call(action='neighbours', entity='Fifitu', relation='lives_in^-1')
INTERSECT = _call(action='intersection', sets=[['Doke', 'Peku'], ['Butu', 'Doke', 'Lape', 'Tuzu']])
GOLD = (('kb', (('action', 'neighbours'), ('entity', 'Kele Corp'), ('relation', 'employer^-1'))),
        ('kb', (('action', 'neighbours'), ('entity', 'Fifitu'), ('relation', 'lives_in^-1'))),
        ('kb', (('action', 'intersection'),
                ('sets', (('Butu', 'Doke', 'Lape', 'Tuzu'), ('Doke', 'Peku'))))))

# (turns, kept by 'rrs', kept by 'answer'): every case but the first two is rejected by RRS.
CASES = {
    'gold': ([EMPLOYEES, RESIDENTS, INTERSECT, '#### Doke'], True, True),
    'intersection lists swapped (one set operation)': (
        [EMPLOYEES, RESIDENTS, _call(action='intersection',
                                     sets=[['Tuzu', 'Lape', 'Doke', 'Butu'], ['Peku', 'Doke']]),
         '#### Doke'], True, True),
    'wrong action order': ([RESIDENTS, EMPLOYEES, INTERSECT, '#### Doke'], False, True),
    'wrong argument (another city)': (
        [EMPLOYEES, _call(action='neighbours', entity='Dufima', relation='lives_in^-1'),
         INTERSECT, '#### Doke'], False, True),
    'wrong argument (a relation the entity lacks: a failed call)': (
        [EMPLOYEES, _call(action='neighbours', entity='Fifitu', relation='lives_in'), RESIDENTS,
         INTERSECT, '#### Doke'], False, False),  # 5 turns > max_turns: truncated.
    'right answer by a wrong path (the first employee)': ([EMPLOYEES, '#### Doke'], False, True),
    'right answer, no call at all': (['#### Doke'], False, True),
    'gold path, wrong final answer': ([EMPLOYEES, RESIDENTS, INTERSECT, '#### Peku'], False, False),
    'an extra call first': ([_call(action='relations', entity='Kele Corp'), EMPLOYEES, RESIDENTS,
                             '#### Doke'], False, True),
    'stops before answering': ([EMPLOYEES, RESIDENTS, INTERSECT], False, False),
    'malformed call, then gold': (['<call>kb: {"action": </call>', EMPLOYEES, RESIDENTS,
                                   INTERSECT], False, False),
}


def test_gold_actions_resolve_the_references_and_read_lists_as_sets():
  assert rs.gold_actions(BOTH) == GOLD
  hop = env_tasks.kb_qa(0, 2, difficulty=1)  # 'In which city is the employer of Refi located?'
  assert rs.gold_actions(hop) == (
      ('kb', (('action', 'neighbours'), ('entity', 'Refi'), ('relation', 'employer'))),
      ('kb', (('action', 'neighbours'), ('entity', 'Nodi Corp'), ('relation', 'located_in'))))


def test_canonical_action_hand_cases():
  call = lambda **a: base.ToolCall('kb', a)
  assert rs.canonical_action(call(action='count', entities=['b', 'a', 'b'])) == (
      'kb', (('action', 'count'), ('entities', ('a', 'b'))))
  assert (rs.canonical_action(call(action='count', entities=['a'])) !=
          rs.canonical_action(call(action='count', entities=['a', 'b'])))
  # Argument order in the JSON object does not matter; the tool's name does.
  assert (rs.canonical_action(base.ToolCall('kb', {'relation': 'r', 'entity': 'e'})) ==
          rs.canonical_action(base.ToolCall('kb', {'entity': 'e', 'relation': 'r'})))
  assert (rs.canonical_action(base.ToolCall('kb2', {})) !=
          rs.canonical_action(base.ToolCall('kb', {})))


def test_replay_extracts_the_executed_action_sequence():
  env = _env()
  result = rs.replay(env, BOTH, CASES['wrong action order'][0])
  assert result.actions == (GOLD[1], GOLD[0], GOLD[2])
  assert result.correct and result.failed_calls == 0 and result.reward == 1.0
  result = rs.replay(env, BOTH, CASES['right answer by a wrong path (the first employee)'][0])
  assert result.actions == (GOLD[0],) and result.correct
  failed = rs.replay(env, BOTH, CASES['malformed call, then gold'][0])
  assert failed.failed_calls == 1 and failed.actions == GOLD and not failed.correct


@pytest.mark.parametrize('name', list(CASES))
def test_rrs_keeps_only_traces_that_execute_the_gold_sequence(name):
  turns, rrs_keeps, answer_keeps = CASES[name]
  segments = [[t, True] for t in turns]
  assert rs.judge(_env(), BOTH, segments, rule='rrs')[0] == rrs_keeps
  assert rs.judge(_env(), BOTH, segments, rule='answer')[0] == answer_keeps
  assert rs.judge(_env(), BOTH, segments, rule='unfiltered')[0]


def test_action_match_n_reads_episode_turns_per_group():
  turns_N = [CASES['gold'][0], CASES['wrong action order'][0],
             CASES['gold path, wrong final answer'][0], ['#### Doke']]
  # Validity is the action sequence alone: the wrong final answer still matches.
  assert rs.action_match_N(_env(), [BOTH], turns_N, group_size=4).tolist() == [
      True, False, True, False]


def test_teacher_traces_replay_through_the_environment():
  env, renderer = _env(), render.TextRenderer(prompt_template='{prompt}\n')
  rng = np.random.default_rng(0)
  kinds, lucky = set(), 0
  for index in range(60):
    example = env_tasks.kb_qa(0, index, difficulty=1)
    gold_trace = kb_traces.kb_trace(example, rng, gold_prob=1.0)
    wrong_trace = kb_traces.kb_trace(example, rng, gold_prob=0.0)
    kinds.add(kb_traces.question_kind(env_tasks.resolved_gold_calls(example)))
    for trace in (gold_trace, wrong_trace):
      state, observations = env.reset(example), []
      for text in rs.turn_texts(trace):
        step = env.step(state, text)
        if not step.done:
          observations.append(renderer.observation_text(step.info['messages'], False))
      assert [t for t, trained in trace if not trained] == observations
    assert rs.judge(env, example, gold_trace, rule='rrs')[0]
    assert not rs.judge(env, example, wrong_trace, rule='rrs')[0]
    lucky += rs.judge(env, example, wrong_trace, rule='answer')[0]
  assert kinds == set(kb_traces.KINDS)
  assert 0 < lucky < 60  # Some wrong procedures are right by luck: only RRS rejects them all.


def test_filtered_teacher_tries_until_a_trace_is_kept():
  good = [[t, True] for t in CASES['gold'][0]]
  bad = [[t, True] for t in CASES['wrong action order'][0]]
  script = iter([bad, bad, good, bad, bad, bad])
  teacher = lambda example, rng: next(script)
  solutions = rs.FilteredTeacher(_env(), teacher, rule='rrs', tries=3)
  assert solutions([BOTH], None) == [good]  # the third try
  assert solutions([BOTH], None) == [None]  # three rejected tries
  assert solutions.counts == {'traces': 6, 'kept': 1, 'problems': 2, 'problems_kept': 1,
                              'gold_match': 1, 'correct': 6}
  metrics = solutions.metrics()
  assert metrics['sft/filter_problems_kept_frac'] == 0.5


def test_filtered_teacher_and_config_errors():
  with pytest.raises(ValueError, match='sft.filter=.bogus.'):
    rs.FilteredTeacher(_env(), None, rule='bogus', tries=1)
  with pytest.raises(ValueError, match='env.enabled'):
    rs.FilteredTeacher(None, None, rule='rrs', tries=1)
  with pytest.raises(ValueError, match='filter_tries=0'):
    rs.FilteredTeacher(_env(), None, rule='rrs', tries=0)
  with pytest.raises(ValueError, match="no meta\\['gold_calls'\\]"):
    rs.gold_actions(dataclasses.replace(BOTH, meta={'tools': ['kb']}))
  assert set(config_checks.SFT_FILTERS) == set(rs.FILTERS)
  c = kbqa_r1.get_config('rrs')
  config_lib.validate(c, num_devices=1)
  c.sft.filter = 'bogus'
  with pytest.raises(ValueError, match='sft.filter=.bogus.'):
    config_lib.validate(c, num_devices=1)
  c.sft.filter, c.env.enabled = 'rrs', False
  with pytest.raises(ValueError, match='sft.filter=.rrs. executes'):
    config_lib.validate(c, num_devices=1)


def test_config_sources_and_the_study_settings_agree():
  for arg, source, seed in (('', 'rrs', 0), ('answer', 'answer', 0), ('unfiltered,3',
                                                                     'unfiltered', 3)):
    c = kbqa_r1.get_config(arg)
    config_lib.validate(c, num_devices=1)
    assert (c.sft.filter, c.seed) == (source, seed)
  with pytest.raises(ValueError, match='kbqa_r1.py: arg'):
    kbqa_r1.get_config('rss')
  config, study = kbqa_r1.get_config('rrs'), kbqa_rrs.make_config(smoke=False)
  for section in ('data', 'model', 'tokenizer', 'env', 'sft', 'objective', 'optimizer'):
    mine, theirs = config[section].to_dict(), study[section].to_dict()
    if section == 'env':  # Transcripts are the loop's; the study writes none.
      mine.pop('transcripts'), theirs.pop('transcripts')
    assert mine == theirs, section
  for key in ('max_new_tokens', 'steps', 'prompts_per_step', 'group_size', 'temperature'):
    assert config.rl[key] == study.rl[key], key
