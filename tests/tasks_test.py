"""Tests for rlreason.tasks: determinism, difficulty, splits, and correct worked solutions."""

import ast
import collections
import fractions
import math
import re

import numpy as np
import pytest

from rlreason import tasks
from rlreason.tasks import arithmetic
from rlreason.tasks import countdown
from rlreason.tasks import group_composition
from rlreason.tasks import policy_recall

# Difficulties exercised per task: small enough to be fast, varied enough to matter.
DIFFICULTIES = {
    'arithmetic': (1, 2, 5, 9),
    'countdown': (2, 3, 4),
    'group_composition': (1, 3, 8),
    'policy_recall': (1, 4, 7),
}
BUILT_IN = sorted(DIFFICULTIES)  # rlreason.envs.tasks registers its tool tasks when imported.


def _examples(name, n, seed=0, **options):
  task = tasks.get_task(name)
  ds = DIFFICULTIES[name]
  return [task.generate(seed, i, difficulty=ds[i % len(ds)], **options) for i in range(n)]


@pytest.mark.parametrize("name", BUILT_IN)
def test_same_seed_and_index_give_the_same_example(name):
  a, b = _examples(name, 50), _examples(name, 50)
  assert a == b
  other = _examples(name, 50, seed=1)
  assert sum(x.prompt == y.prompt for x, y in zip(a, other)) < 10
  assert len({x.id for x in a}) == 50


def test_golden_arithmetic_example():
  # Pins the numpy stream: if this changes, seeds no longer reproduce old runs' data.
  ex = tasks.get_task('arithmetic').generate(0, 0, difficulty=5)
  assert ex == tasks.Example(
      id='arithmetic/s0/d5/0', prompt='34838+76388=', answer='111226',
      solution='6,1 2,1 2,1 1,1 1,1 #### 111226', task='arithmetic', difficulty=5,
      meta={'operands': [34838, 76388], 'carries': 5})


@pytest.mark.parametrize("name", BUILT_IN)
def test_every_character_is_in_the_task_vocabulary(name):
  chars = set(tasks.get_task(name).chars)
  for ex in _examples(name, 2000):
    assert set(ex.prompt + ex.solution + ex.answer) <= chars, ex
    assert ex.task == name


@pytest.mark.parametrize("name", BUILT_IN)
def test_reference_solutions_score_correct_under_the_verifiers(name):
  # The contract with rlreason.verifiers: answer and meta form the item, and the worked
  # solution is a completion the checker of the same name accepts.
  from rlreason.verifiers import registry  # pylint: disable=g-import-not-at-top
  verify = registry.get_verifier(name)
  for ex in _examples(name, 400):
    verdict = verify({'completion': ex.solution, 'answer': ex.answer, **ex.meta})
    assert verdict.status == 'correct', (ex, verdict)


def test_get_task_lists_known_names():
  assert tasks.get_task('countdown').name == 'countdown'
  with pytest.raises(KeyError, match='arithmetic, .*countdown, group_composition, .*policy_recall'):
    tasks.get_task('sudoku')


# Spaces small enough that every problem comes up many times: 9*9 one-digit additions,
# 6*6 pairs in S3, and so on.
SMALL_SPACES = {
    'arithmetic': dict(difficulty=1),
    'countdown': dict(difficulty=2, max_number=6, max_target=12),
    'group_composition': dict(difficulty=2, group='S3'),
    'policy_recall': dict(difficulty=2),
}


@pytest.mark.parametrize("name", BUILT_IN)
def test_a_problem_generated_twice_lands_in_the_same_split(name):
  task = tasks.get_task(name)
  splits = collections.defaultdict(set)
  for seed in range(3):
    for i in range(1500):
      ex = task.generate(seed, i, **SMALL_SPACES[name])
      splits[task.problem_key(ex)].add(tasks.split_of(ex, held_out_fraction=0.3))
  assert len(splits) < 1500  # Duplicates did occur...
  assert all(len(s) == 1 for s in splits.values())  # ...and never straddled the split.
  assert {tasks.TRAIN, tasks.HELD_OUT} == set().union(*splits.values())


def test_held_out_fraction_is_respected_and_nested():
  task = tasks.get_task('arithmetic')
  exs = [task.generate(0, i, difficulty=6) for i in range(8000)]
  held = [tasks.split_of(e, held_out_fraction=0.1) == tasks.HELD_OUT for e in exs]
  # Binomial(8000, 0.1): sd = sqrt(8000 * 0.1 * 0.9) = 26.8; allow 4 sd.
  assert abs(sum(held) - 800) < 4 * 26.8
  wider = [tasks.split_of(e, held_out_fraction=0.2) == tasks.HELD_OUT for e in exs]
  assert all(w for h, w in zip(held, wider) if h)
  with pytest.raises(ValueError, match='held_out_fraction'):
    tasks.split_of(exs[0], held_out_fraction=1.0)


# ------------------------------------------------------------------------------ arithmetic


def _carries(a, b):
  """Independent carry count: compare digit sums with the sum's digits."""
  digit_sum = lambda n: sum(int(c) for c in str(n))
  # Each carry turns 10 in one column into 1 in the next: digitsum(a+b) = ds(a)+ds(b)-9*carries.
  return (digit_sum(a) + digit_sum(b) - digit_sum(a + b)) // 9


def test_arithmetic_difficulty_is_digits_and_min_carries_holds():
  task = tasks.get_task('arithmetic')
  for d in (1, 3, 5, 8):
    for min_carries in (0, 1, d // 2, d):
      for i in range(100):
        ex = task.generate(0, i, difficulty=d, min_carries=min_carries)
        a, b = ex.meta['operands']
        assert len(str(a)) == len(str(b)) == d
        assert ex.prompt == f'{a}+{b}='
        assert _carries(a, b) == ex.meta['carries'] >= min_carries
  mean = lambda m: np.mean([task.generate(0, i, difficulty=6, min_carries=m).meta['carries']
                            for i in range(300)])
  assert mean(0) < mean(3) < mean(6) == 6
  with pytest.raises(ValueError, match='min_carries'):
    task.generate(0, 0, difficulty=3, min_carries=4)


def test_arithmetic_chain_reproduces_the_sum():
  # Hand-computed: 12345+67890: 5+0=5; 4+9=13; 3+8+1=12; 2+7+1=10; 1+6+1=8 -> 80235.
  ex = tasks.Example(id='x', prompt='12345+67890=', answer='', solution=None, task='arithmetic',
                     difficulty=5, meta={'operands': [12345, 67890]})
  assert arithmetic.flawed_solution(ex, rng=np.random.default_rng(0), drop_carry_prob=0.0) == (
      '5,0 3,1 2,1 0,1 8,0 #### 80235')
  for ex in _examples('arithmetic', 3000):
    a, b = ex.meta['operands']
    pairs, answer = arithmetic.parse_solution(ex.solution)
    assert len(pairs) == ex.difficulty
    value = sum(d * 10**i for i, (d, _) in enumerate(pairs)) + pairs[-1][1] * 10**len(pairs)
    assert value == a + b and answer == ex.answer == str(a + b)
    carry = 0
    for i, (d, c) in enumerate(pairs):
      s = a // 10**i % 10 + b // 10**i % 10 + carry
      assert (d, c) == (s % 10, s // 10)
      carry = c


def _teacher_columns(ex, solution, sums):
  """(qualifying columns, dropped columns) of a teacher solution, checking its consistency."""
  a, b = ex.meta['operands']
  pairs, answer = arithmetic.parse_solution(solution)
  qualifying = dropped = carry = 0
  for i, (d, c) in enumerate(pairs):
    s = a // 10**i % 10 + b // 10**i % 10 + carry
    assert d == s % 10
    if c != s // 10:
      assert c == 0 and s in sums  # The only flaw: a dropped carry in a qualifying column.
      dropped += 1
    qualifying += s in sums
    carry = c
  # The teacher's answer is its own chain read back.
  assert answer == ('1' if pairs[-1][1] else '') + ''.join(str(d) for d, _ in reversed(pairs))
  return qualifying, dropped, answer


def test_flawed_teacher_is_wrong_exactly_when_it_drops_a_carry_at_the_given_rate():
  from rlreason.verifiers import registry  # pylint: disable=g-import-not-at-top
  verify = registry.get_verifier('arithmetic')
  rng = np.random.default_rng(0)
  exs = [tasks.get_task('arithmetic').generate(3, i, difficulty=5) for i in range(3000)]
  qualifying = dropped = wrong = 0
  for ex in exs:
    solution = arithmetic.flawed_solution(ex, rng=rng)
    q, dr, answer = _teacher_columns(ex, solution, (10, 11, 12))
    assert (answer != ex.answer) == (dr > 0)
    status = verify({'completion': solution, 'answer': ex.answer}).status
    assert status == ('wrong' if dr else 'correct')
    qualifying, dropped, wrong = qualifying + q, dropped + dr, wrong + (dr > 0)
  # Binomial(qualifying, 0.75): allow 4 sd.
  assert abs(dropped / qualifying - 0.75) < 4 * math.sqrt(0.75 * 0.25 / qualifying)
  assert 0.3 < 1 - wrong / len(exs) < 0.7  # The teacher is right on some problems, not most.
  for ex in exs[:200]:
    assert arithmetic.flawed_solution(ex, rng=rng, drop_carry_prob=0.0) == ex.solution
    q, dr, _ = _teacher_columns(ex, arithmetic.flawed_solution(ex, rng=rng, drop_carry_prob=1.0,
                                                               sums=(14,)), (14,))
    assert q == dr


# ------------------------------------------------------------------------------- countdown


def _evaluate(expression):
  """Value (exact) and numbers used, of an expression of integers and + - * / only."""
  numbers = []

  def ev(node):
    if isinstance(node, ast.Constant) and isinstance(node.value, int):
      numbers.append(node.value)
      return fractions.Fraction(node.value)
    ops = {ast.Add: lambda x, y: x + y, ast.Sub: lambda x, y: x - y,
           ast.Mult: lambda x, y: x * y, ast.Div: lambda x, y: x / y}
    assert isinstance(node, ast.BinOp) and type(node.op) in ops, ast.dump(node)
    return ops[type(node.op)](ev(node.left), ev(node.right))

  return ev(ast.parse(expression, mode='eval').body), sorted(numbers)


def test_countdown_solutions_evaluate_to_the_target_with_each_number_once():
  for ex in _examples('countdown', 2000):
    value, used = _evaluate(ex.solution)
    assert value == int(ex.answer) and 1 <= int(ex.answer) <= 100
    assert used == sorted(ex.meta['numbers'])
    assert len(ex.meta['numbers']) == ex.difficulty
    assert all(1 <= n <= 100 for n in ex.meta['numbers'])
    assert f'[{", ".join(map(str, ex.meta["numbers"]))}]' in ex.prompt
    assert f'equals {ex.answer}.' in ex.prompt and 'exactly once' in ex.prompt
  ex = tasks.get_task('countdown').generate(0, 0, difficulty=6, max_target=1000)
  assert _evaluate(ex.solution)[0] == int(ex.answer)


def test_countdown_parenthesises_only_where_needed_and_solves():
  atom = lambda n: (fractions.Fraction(n), str(n), 3)
  sub = countdown._combine(atom(7), '-', atom(2))
  assert countdown._combine(atom(9), '-', sub)[1] == '9-(7-2)'
  assert countdown._combine(sub, '-', atom(1))[1] == '7-2-1'
  assert countdown._combine(sub, '*', atom(3))[1] == '(7-2)*3'
  assert countdown._combine(atom(8), '/', countdown._combine(atom(2), '*', atom(2)))[1] == '8/(2*2)'
  for numbers, target in (([30, 100, 93], 23), ([4, 7, 8], 4), ([3, 3, 8, 8], 24)):
    value, used = _evaluate(countdown.solve(numbers, target))
    assert value == target and used == sorted(numbers)
  assert countdown.solve([2, 3], 7) is None
  assert countdown.solve([4, 7, 8], 2) is None  # 8/4 = 2, but 7 must be used too.


# ----------------------------------------------------------------------- group composition


def _matrix(perm):
  """Permutation matrix M with M e_x = e_{perm(x)}, from '[2 3 1]' (1-based one-line)."""
  images = [int(v) - 1 for v in re.findall(r'\d+', perm)]
  m = np.zeros((len(images), len(images)), dtype=int)
  for x, image in enumerate(images):
    m[image, x] = 1
  return m


def _one_line(m):
  return '[' + ' '.join(str(int(np.argmax(m[:, x])) + 1) for x in range(m.shape[0])) + ']'


def test_group_composition_matches_matrix_products_and_sums_mod_n():
  task = tasks.get_task('group_composition')
  for group in ('S3', 'S4', 'S5'):
    for i in range(300):
      ex = task.generate(0, i, difficulty=1 + i % 12, group=group)
      chain, answer = ex.solution.split(' #### ')
      states = re.findall(r'\[[^]]*\]', chain)
      assert ex.prompt == f'{group}: {" ".join(ex.meta["elements"])} ='
      assert (ex.meta['group'], ex.meta['n']) == ('S', int(group[1:]))
      assert len(ex.meta['elements']) == len(states) == ex.difficulty
      m = np.eye(int(group[1:]), dtype=int)
      for g, s in zip(ex.meta['elements'], states):
        m = _matrix(g) @ m  # s_k = g_k . s_{k-1}: s_{k-1} acts first.
        assert s == _one_line(m)
      assert ex.answer == answer == states[-1]
  for i in range(300):
    ex = task.generate(1, i, difficulty=1 + i % 20, group='Z97')
    assert (ex.meta['group'], ex.meta['n']) == ('Z', 97)
    assert ex.answer == str(sum(int(g) for g in ex.meta['elements']) % 97)
  # Hand-computed in S3: [2 1 3] . [1 3 2] maps 1->1->2, 2->3->3, 3->2->1 = [2 3 1].
  assert group_composition.multiply('S3', '[2 1 3]', '[1 3 2]') == '[2 3 1]'
  # The module docstring's example: s_2 = [1 3 2] . [2 1 3] = [3 1 2], s_3 = [3 2 1] . s_2.
  assert group_composition.multiply('S3', '[1 3 2]', '[2 1 3]') == '[3 1 2]'
  assert group_composition.multiply('S3', '[3 2 1]', '[3 1 2]') == '[1 3 2]'
  assert len(set(group_composition.elements('S4'))) == 24
  with pytest.raises(ValueError, match='S<n>'):
    task.generate(0, 0, group='S10')


def test_group_composition_elements_are_uniform():
  exs = [tasks.get_task('group_composition').generate(0, i, difficulty=1, group='S3')
         for i in range(6000)]
  counts = collections.Counter(ex.answer for ex in exs)
  assert set(counts) == set(group_composition.elements('S3'))
  assert all(abs(c - 1000) < 4 * math.sqrt(6000 * (1 / 6) * (5 / 6)) for c in counts.values())


# --------------------------------------------------------------------------- policy recall


def test_policy_recall_hand_computed_cases():
  rel = policy_recall.relevant_policies
  # A refund 40 days after purchase over $600: too late (POL-1), needs a manager (POL-2).
  assert rel({'request': 'refund', 'days': 40, 'amount': 600}) == ['POL-1', 'POL-2']
  # The same refund within the EU's 14 days: POL-6, and POL-2 still; POL-1 no longer.
  assert rel({'request': 'refund', 'days': 10, 'amount': 600, 'region': 'EU'}) == [
      'POL-2', 'POL-6']
  # Cancelling a shipped $1500 order: POL-10 and the identity check POL-13.
  assert rel({'request': 'cancellation', 'status': 'shipped', 'amount': 1500}) == [
      'POL-10', 'POL-13']
  assert rel({'request': 'exchange'}) == []


def test_policy_recall_answer_solution_and_difficulty():
  task = tasks.get_task('policy_recall')
  sizes = collections.defaultdict(list)
  for ex in _examples('policy_recall', 3000):
    facts = ex.meta['facts']
    assert len(facts) == ex.difficulty and 'request' in facts
    relevant = policy_recall.relevant_policies(facts)
    assert ex.answer == ', '.join(relevant)
    assert ex.meta['catalogue'] == [f'POL-{i}' for i in range(1, 17)]
    recalled, block = ex.solution.split('<policies>')
    assert recalled == ''.join(f'{pid}: {policy_recall.POLICIES[pid]}\n' for pid in relevant)
    assert block == f'{ex.answer}</policies>'
    assert 'Policies:' not in ex.prompt
    sizes[ex.difficulty].append(len(relevant))
  assert np.mean(sizes[1]) < np.mean(sizes[4]) < np.mean(sizes[7])
  with_catalogue = task.generate(0, 0, include_catalogue=True)
  assert with_catalogue.prompt.startswith('Policies:\nPOL-1: ')
  assert with_catalogue.prompt.endswith(task.generate(0, 0).prompt)
