"""Countdown (all shared problems), PolicyRecall, exact/regex/format, DAPO overlong, and the
synthetic-task checkers, called in-process (the pool is tested elsewhere)."""

import json
import pathlib

import pytest

from rlreason.verifiers import countdown
from rlreason.verifiers import overlong
from rlreason.verifiers import policy_recall as PR
from rlreason.verifiers import synthetic_tasks as S
from rlreason.verifiers import text_answer as T
from rlreason.verifiers import verdict as V

DATA = pathlib.Path(__file__).resolve().parents[2] / 'shared' / 'data'


def countdown_problems():
  path = DATA / 'countdown' / 'countdown_cd3_test.jsonl'
  if not path.exists():
    pytest.skip(f'shared data not found at {path}')
  return [json.loads(line) for line in path.read_text().splitlines()]


def test_every_countdown_problem_correct_scores_one_wrong_scores_zero():
  problems = countdown_problems()
  assert len(problems) == 256
  for p in problems:
    numbers = countdown.parse_numbers(p['input'])
    expression = countdown.solve(numbers, int(p['output']))
    assert expression is not None, p
    item = {'numbers': p['input'], 'answer': p['output']}
    right = countdown.verify_countdown({**item, 'completion': f'<answer>{expression}</answer>'})
    assert (right.status, right.reward) == (V.CORRECT, 1.0), (p, expression)
    # Wrong value: same numbers, the target is off by one.
    off = countdown.verify_countdown({**item, 'answer': str(int(p['output']) + 1),
                                      'completion': f'<answer>{expression}</answer>'})
    assert (off.status, off.reward) == (V.WRONG, 0.0)
    # Wrong numbers: leaving one out is wrong whatever the value.
    cheat = f'<answer>{numbers[0]} + {numbers[1]}</answer>'
    bad = countdown.verify_countdown({**item, 'completion': cheat})
    assert (bad.status, bad.reward) == (V.WRONG, 0.0)


@pytest.mark.parametrize('completion, status', [
    ('<answer>(100 - 93) + 30</answer>', V.CORRECT),
    ('<answer>(100 - 93) + 30 = 37</answer>', V.CORRECT),
    ('Let me see.\n37 = 30 + 100 - 93', V.CORRECT),
    ('<answer>30 + 100 - 93 + 93 - 93</answer>', V.WRONG),  # reuses 93.
    ('<answer>30 × (100 − 93) / 30 + 30</answer>', V.WRONG),  # reuses 30.
    ('<answer>100 - 93 + 30.0</answer>', V.PARSE_FAILURE),
    ('<answer>-93 + 100 + 30</answer>', V.PARSE_FAILURE),  # no unary minus.
    ('<answer>__import__("os")</answer>', V.PARSE_FAILURE),
    ('<answer>30 / (100 - 100)</answer>', V.WRONG),
])
def test_countdown_formats(completion, status):
  item = {'completion': completion, 'numbers': [30, 100, 93], 'answer': 37}
  assert countdown.verify_countdown(item).status == status


def test_policy_recall_per_algorithms_md_19():
  catalogue = ['POL-1', 'POL-2', 'POL-3', 'POL-4']

  def item(text, gold):
    return {'completion': text, 'answer': gold, 'catalogue': catalogue}

  perfect = PR.verify_policy_recall(item('<policies>POL-1, POL-3</policies>', ['POL-1', 'POL-3']))
  assert (perfect.status, perfect.reward) == (V.CORRECT, 1.0)
  disjoint = PR.verify_policy_recall(item('cites POL-2', 'POL-1 POL-3'))
  assert disjoint.components['recall'] == 0.0
  # Jaccard {1,2} vs {2,3} = 1/3 both ways (symmetric).
  assert PR.jaccard({'a', 'b'}, {'b', 'c'}) == PR.jaccard({'b', 'c'}, {'a', 'b'}) == 1 / 3
  assert PR.jaccard(set(), set()) == 1.0
  # Fabricated POL-9 on top of perfect recall: J({1,3,9},{1,3}) = 2/3, penalty -1/3.
  fake = PR.verify_policy_recall(item('<policies>POL-1 POL-3 POL-9</policies>', 'POL-1,POL-3'))
  assert fake.components == pytest.approx({'recall': 2 / 3, 'hallucination': -1 / 3})
  assert fake.reward == pytest.approx(1 / 3) and fake.status == V.WRONG
  dupes = PR.verify_policy_recall(item('POL-1 POL-1 POL-3 POL-3', 'POL-1,POL-3'))
  assert dupes.reward == 1.0
  assert PR.verify_policy_recall({'completion': 'x', 'answer': 'POL-1'}).status == V.INVALID_INPUT


def test_policy_task():
  base = {'answer': 'deny', 'policies': ['POL-2'], 'catalogue': ['POL-1', 'POL-2']}
  good = PR.verify_policy_task({**base, 'completion': '<policies>POL-2</policies>\n<answer>Deny</answer>'})
  assert (good.status, good.reward) == (V.CORRECT, 2.0)
  # Right decision, one extra real id: task 1 + J({1,2},{2}) = 0.5, no penalty.
  extra = PR.verify_policy_task({**base, 'completion': '<policies>POL-1 POL-2</policies><answer>deny</answer>'})
  assert extra.reward == pytest.approx(1.5) and extra.status == V.WRONG
  missing = PR.verify_policy_task({**base, 'completion': '<policies>POL-2</policies>'})
  assert missing.status == V.PARSE_FAILURE


def test_exact_regex_format():
  assert T.verify_exact({'completion': 'It is <answer> Paris. </answer>', 'answer': 'paris'}).reward == 1.0
  assert T.verify_exact({'completion': 'Paris', 'answer': ['Lyon', 'PARIS']}).reward == 1.0
  assert T.verify_exact({'completion': 'Paris', 'answer': 'paris', 'case_sensitive': True}).reward == 0.0
  assert T.verify_regex({'completion': 'The answer is 12 apples', 'answer': r'\d+ apples'}).reward == 1.0
  assert T.verify_regex({'completion': 'x', 'answer': '('}).status == V.INVALID_INPUT
  assert T.verify_regex({'completion': 'a long text with 42 in it', 'answer': r'\b42\b', 'search': True}).reward == 1.0
  think = '<think>steps</think>\n<answer>4</answer>'
  assert T.verify_format({'completion': think}).reward == 1.0
  assert T.verify_format({'completion': 'no tags'}).reward == 0.0
  assert T.verify_format({'completion': think, 'format': 'boxed'}).reward == 0.0
  assert T.verify_format({'completion': 'x', 'format': 'nope'}).status == V.INVALID_INPUT
  assert T.verify_format({'completion': 'abc', 'pattern': 'a.c'}).reward == 1.0


@pytest.mark.parametrize('length, expected', [
    # algorithms.md §3 (L_max 20480, L_cache 4096): (16384 - 18432) / 4096 = -0.5.
    (16384, 0.0), (18432, -0.5), (20480, -1.0), (20481, -1.0), (0, 0.0)])
def test_dapo_overlong(length, expected):
  assert overlong.overlong_penalty(length, max_len=20480, cache_len=4096) == expected
  v = overlong.verify_overlong({'num_tokens': length, 'max_len': 20480, 'cache_len': 4096})
  assert v.reward == expected and v.status == (V.CORRECT if expected == 0 else V.WRONG)


def test_overlong_penalty_factor_and_bad_input():
  assert overlong.overlong_penalty(18432, max_len=20480, cache_len=4096, penalty_factor=2) == -1.0
  assert overlong.verify_overlong({'num_tokens': 5}).status == V.INVALID_INPUT


@pytest.mark.parametrize('completion, status', [
    ('178377', V.CORRECT), ('The answer is 178,377.', V.CORRECT), ('<answer>178377</answer>', V.CORRECT),
    ('\\boxed{178376}', V.WRONG), ('hmm, about a lot', V.PARSE_FAILURE), ('#### 17.5', V.PARSE_FAILURE)])
def test_arithmetic(completion, status):
  assert S.verify_arithmetic({'completion': completion, 'answer': '178377'}).status == status


def test_digit_accuracy():
  # 178377 vs 178376: five of six right-aligned digits agree; 5 vs 123: '  5' vs '123' -> 0.
  assert S.digit_accuracy(178377, 178376) == pytest.approx(5 / 6)
  assert S.digit_accuracy(123, 5) == 0.0


def test_permutation_notation_and_composition():
  # (1 2)(2 3): (2 3) acts first: 1->1->2, 2->3->3, 3->2->1, i.e. [2 3 1] = (1 2 3).
  assert S.format_one_line(S.parse_permutation('(1 2)(2 3)', 3)) == '[2 3 1]'
  assert S.parse_permutation('[2, 3, 1, 5, 4]', 5) == S.parse_permutation('(1 2 3)(4 5)', 5)
  assert S.parse_permutation('()', 4) == S.parse_permutation('e', 4) == (0, 1, 2, 3)
  with pytest.raises(ValueError):
    S.parse_permutation('[1 1 2]', 3)
  # s_2 = g_2 · g_1 with g_1 = (1 2), g_2 = (2 3): 1->2->3, 2->1->1, 3->3->2 = (1 3 2).
  g1, g2 = S.parse_permutation('(1 2)', 3), S.parse_permutation('(2 3)', 3)
  assert S.format_cycles(S.final_state([g1, g2])) == '(1 3 2)'
  for p in ('(1 3 2)', '[3 1 2 4 5]', '(1 2)(4 5)(1 2)'):
    perm = S.parse_permutation(p, 5)
    assert S.parse_permutation(S.format_cycles(perm), 5) == perm


def test_group_composition_checker():
  item = {'n': 3, 'elements': ['(1 2)', '(2 3)']}
  ok = S.verify_group_composition({**item, 'completion': 's1=(1 2) s2=[3 1 2]'})
  assert ok.status == V.CORRECT
  # Intermediate states are not scored: a wrong s1 with the right final state still counts.
  assert S.verify_group_composition({**item, 'completion': 's1=() s2=(1 3 2)'}).status == V.CORRECT
  assert S.verify_group_composition({**item, 'completion': '<answer>(1 2 3)</answer>'}).status == V.WRONG
  assert S.verify_group_composition({**item, 'completion': 'no idea'}).status == V.PARSE_FAILURE
  z = {'n': 7, 'group': 'Z', 'elements': [3, 5, 6], 'completion': 'states 3 1 <answer>0</answer>'}
  assert S.verify_group_composition(z).status == V.CORRECT  # 3 + 5 + 6 = 14 = 0 mod 7.
  assert S.verify_group_composition({'n': 3, 'completion': '()'}).status == V.INVALID_INPUT
