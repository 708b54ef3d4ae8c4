"""SCRIBE (rollout/scribe.py): routing by hand and its determinism, routed rubrics against the
plain judge, the unrouted policies (skip counted, generic, error before the model runs), bad
libraries and config fields named."""

import string

import jax
import numpy as np
import pytest

from rlreason import config as config_lib
from rlreason.model import tokenizer
from rlreason.model import transformer
from rlreason.rollout import judge
from rlreason.rollout import scribe

TOK = tokenizer.from_characters(string.printable)
CFG = transformer.ModelConfig(vocab_size=TOK.vocab_size, hidden_size=32, intermediate_size=64,
                              num_layers=1, num_heads=2, num_kv_heads=1, head_dim=16)
A = scribe.SkillPrototype('alpha', (r'\balpha\b', r'\bshared\b'), 'A|{problem}|{step}|')
B = scribe.SkillPrototype('beta', (r'\bbeta\b', r'\bshared\b', r'\bbonus\b'), 'B|{step}|{index}')
LIB = (A, B)


@pytest.fixture(scope='module')
def params():
  p = transformer.init_params(CFG, jax.random.key(0))
  return jax.tree.map(lambda x: x * 5 if x.ndim > 1 else x, p)  # Peaked, prompt-dependent.


def make(params, **kw):
  kw = {'template': 'G|{step}|', 'prompt_buckets': (64,), 'batch_size': 4, **kw}
  return judge.Judge(cfg=CFG, tok=TOK, params=params, use_chat_template=False, **kw)


@pytest.mark.parametrize('step, want', [
    ('alpha only', 0), ('beta only', 1),
    ('shared', 0),  # One match each: the tie goes to the earlier prototype.
    ('shared beta bonus', 1),  # 1 vs 3 distinct patterns.
    ('ALPHA shared', 0), ('nothing here', None)])
def test_route_by_hand(step, want):
  assert scribe.route(step, LIB) == want


@pytest.mark.parametrize('library, step, want', [
    ('tools', '<call>calculator: {"expression": "12*34"}</call>', 'tool_call'),
    ('tools', '<result>408</result>', 'result_use'),
    ('tools', '12 * 34 = 408', 'calculation'),
    ('tools', 'First we need to multiply', 'planning'),
    ('tools', '#### 408', 'answer'),
    ('tools', '408', 'answer'),
    ('clinmpo', 'ask sleep', 'symptom_inquiry'),
    ('clinmpo', 'dx depression', 'diagnosis'),
    ('clinmpo', 'The differential: depression vs anxiety', 'differential'),
    ('clinmpo', 'Findings present: low mood; absent: mania', 'evidence_synthesis')])
def test_library_routes_by_hand(library, step, want):
  lib = scribe.LIBRARIES[library]
  assert lib[scribe.route(step, lib)].name == want


def test_routing_is_deterministic_and_per_step():
  steps = ['alpha only', 'shared beta bonus', 'shared', 'nothing', 'beta'] * 3
  first = [scribe.route(s, LIB) for s in steps]
  perm = np.random.default_rng(0).permutation(len(steps))
  again = [scribe.route(steps[i], LIB) for i in perm]
  assert [first[i] for i in perm] == again  # Each step's route depends on its text alone.
  assert first == [0, 1, 0, None, 1] * 3


def test_routed_steps_are_judged_with_their_prototype_rubric(params):
  base = make(params, score_mode='expected')  # Continuous scores: a changed prompt shows.
  sj = scribe.ScribeJudge(judge=base, library=LIB, unrouted='generic')
  problems = ['p1', 'p2']
  completions = ['alpha one\nbeta two\nnothing three', 'shared beta bonus']
  result = sj.score(problems, completions)
  # By hand: each step through the plain judge whose template is its routed rubric.
  by_template = {0: make(params, template=A.rubric, score_mode='expected'),
                 1: make(params, template=B.rubric, score_mode='expected'), None: base}
  for n, (problem, text) in enumerate(zip(problems, completions)):
    steps = judge.split_lines(text)
    want = []
    for k, step in enumerate(steps):
      j = by_template[scribe.route(step, LIB)]
      ids, _ = j.encode_prompts([j.render(problem, steps[:k], step, k + 1)])
      want.append(judge.step_scores(j.label_logprobs(ids, params=params), mode='expected')[0])
    np.testing.assert_allclose(result.step_scores[n], want, atol=1e-6)
  generic = base.score(problems, completions)  # The same steps under the generic rubric.
  assert not np.allclose(generic.step_scores[0][:2], result.step_scores[0][:2])
  np.testing.assert_allclose(generic.step_scores[0][2], result.step_scores[0][2], atol=1e-6)
  np.testing.assert_array_equal(result.routes[0], [0, 1, -1])
  np.testing.assert_array_equal(result.routes[1], [1])
  m = result.metrics()
  assert m['scribe/unrouted'] == 1 and m['scribe/route_alpha_frac'] == pytest.approx(0.25)
  assert m['scribe/route_beta_frac'] == pytest.approx(0.5)
  assert sj.score(problems, completions).step_scores[0].tolist() == \
      result.step_scores[0].tolist()  # The same batch again: the same scores.


def test_unrouted_skip_is_counted_and_left_out(params):
  sj = scribe.ScribeJudge(judge=make(params, empty_reward=-7.0), library=LIB, unrouted='skip')
  result = sj.score(['p', 'p'], ['alpha\nnothing', 'nothing at all'])
  assert [len(s) for s in result.step_scores] == [1, 0]
  assert result.rewards_N[1] == -7.0  # No routed step: the judge's empty reward.
  assert result.metrics()['scribe/unrouted'] == 2
  assert result.metrics()['judge/steps_judged'] == 1


def test_unrouted_error_names_the_step_before_the_model_runs():
  # params=None everywhere: the judge would refuse to run, so the error comes from routing.
  sj = scribe.ScribeJudge(judge=make(None), library=LIB, unrouted='error')
  with pytest.raises(ValueError, match=r"step 2 of completion 0 .* 'nothing here'"):
    sj.score(['p'], ['alpha\nnothing here'], params={'not': 'used'})


def test_bad_libraries_and_options_name_the_field(params):
  with pytest.raises(ValueError, match="'bad'.*not a regular expression"):
    scribe.SkillPrototype('bad', ('(unclosed',), '{step}')
  with pytest.raises(ValueError, match="'r'.*rubric"):
    scribe.SkillPrototype('r', ('x',), '{nope}')
  with pytest.raises(ValueError, match='names repeat'):
    scribe.ScribeJudge(judge=make(params), library=(A, A))
  with pytest.raises(ValueError, match='unrouted'):
    scribe.ScribeJudge(judge=make(params), library=LIB, unrouted='drop')
  c = config_lib.default()
  c.judge.update(enabled=True, rubrics='nope')
  with pytest.raises(ValueError, match=r"judge.rubrics='nope'; known libraries"):
    config_lib.validate(c, num_devices=1)
  c.judge.update(enabled=False, rubrics='tools')
  with pytest.raises(ValueError, match='judge.rubrics routes'):
    config_lib.validate(c, num_devices=1)


def test_config_wraps_the_judge():
  c = config_lib.default().judge
  c.update(enabled=True, model='random-tiny', rubrics='clinmpo', unrouted='skip')
  j, _ = judge.from_config(c, policy_cfg=CFG, policy_tok=TOK)
  sj = scribe.wrap(c, j)
  assert [p.name for p in sj.library][0] == 'symptom_inquiry' and sj.unrouted == 'skip'
