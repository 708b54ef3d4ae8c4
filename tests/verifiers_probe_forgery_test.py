"""Forgery through the probe side of python_tests, and its direct call's budget and errors.

Two attack classes (issue 33): (a) the solution shadows a name the test's expected side uses
(a builtin, a module it imports, a name the test imports); (b) the solution's object answers
a question asked of the value it returned (`.startswith`, `.find`, `.issubset`, `.keys()`,
`__eq__`, `__len__`, ...). Each attack must score 0 through the direct call, the pool and
the CLI, and a good item scored after it must still score 1. Honest solutions under the
same test shapes must score 1 (and wrong ones 0).
"""

import json
import subprocess
import sys
import time

import pytest

from rlreason.verifiers import pool as pool_lib
from rlreason.verifiers import python_tests
from rlreason.verifiers import test_probes
from rlreason.verifiers import verdict as V

GOOD = {'completion': 'def add(a, b):\n  return a + b',
        'tests': ['assert add(1, 2) == 3', 'assert add(-1, 1) == 0']}

# name: (solution, tests). Each solution is wrong; it only tries to make the checks pass.
SHADOWING = {
    'hex': ('hex = lambda x: "0x10"\ndef f(x):\n  return 0', ['assert hex(f(16)) == "0x10"']),
    'next_iter': ('next = lambda *a: 7\ndef f(x):\n  return [1]',
                  ['assert next(iter(f(1))) == 7']),
    'len_in_comprehension': ('len = lambda x: 1\ndef f(x):\n  return []',
                             ['assert [len(f(i)) for i in range(3)] == [1, 1, 1]']),
    'abs_in_comprehension': ('abs = lambda x: 0\ndef f(x):\n  return -5',
                             ['assert max([abs(f(i) - 2 * i) for i in range(3)]) < 1e-9']),
    'set_in_comprehension': ('set = lambda x: {1, 2}\ndef f(x):\n  return [7]',
                             ['assert [set(f(i)) for i in range(2)] == [{1, 2}, {1, 2}]']),
    'math_isclose_patched': ('import math\nmath.isclose = lambda *a, **k: True\n'
                             'def f(x):\n  return 0.0',
                             ['assert all([math.isclose(f(i), i + 0.5) for i in range(3)])']),
    'imported_module_patched': ('import collections\ncollections.Counter = lambda *a: 1\n'
                                'def f(x):\n  return "zz"',
                                ['assert collections.Counter(f(1)) == collections.Counter("ab")']),
    'test_import_shadowed': ('isclose = lambda *a, **k: True\ndef f(x):\n  return 0.0',
                             ['from math import isclose\nassert isclose(f(1), 0.5)']),
    'star_import_shadowed': ('from math import *\nsqrt = lambda x: 9\ndef f(x):\n  return 2.0',
                             ['assert sqrt(f(1)) == 9']),
    'sorted_builtin_shadowed': ('sorted = lambda *a, **k: [1, 2, 3]\ndef f(x):\n  return [9]',
                                ['assert sorted(f(1)) == [1, 2, 3]']),
}
METHODS = {
    'startswith': ('class S:\n  def startswith(self, p):\n    return True\n'
                   'def f(x):\n  return S()', ["assert f(1).startswith('abc')"]),
    'find': ('class S:\n  def find(self, p):\n    return 2\ndef f(x):\n  return S()',
             ["assert f(1).find('c') == 2"]),
    'issubset': ('class S:\n  def issubset(self, o):\n    return True\ndef f(x):\n  return S()',
                 ['assert f(1).issubset({1, 2})']),
    'keys': ('class D:\n  def keys(self):\n    return ["a", "b"]\ndef f(x):\n  return D()',
             ["assert sorted(f(1).keys()) == ['a', 'b']"]),
    'eq_dunder': ('class A:\n  def __eq__(self, o):\n    return True\ndef f(x):\n  return A()',
                  ['assert f(1).__eq__([1, 2])']),
    'len_dunder': ('class A:\n  def __len__(self):\n    return 3\ndef f(x):\n  return A()',
                   ['assert f(1).__len__() == 3']),
    'iter_protocol': ('class A:\n  def __iter__(self):\n    return iter([1, 2])\n'
                      'def f(x):\n  return A()', ['assert list(f(1)) == [1, 2]']),
    'eq_operator': ('class A:\n  def __eq__(self, o):\n    return True\n  __hash__ = None\n'
                    'def f(x):\n  return A()', ['assert f(1) == [1, 2]', 'assert [1, 2] == f(1)']),
    'str_subclass_startswith': ('class S(str):\n  def startswith(self, p):\n    return True\n'
                                'def f(x):\n  return S("zzz")', ["assert f(1).startswith('a')"]),
    'dict_subclass_get': ('class D(dict):\n  def get(self, k, d=None):\n    return 5\n'
                          'def f(x):\n  return D()', ["assert f(1).get('a') == 5"]),
    'count_on_class': ('class L:\n  def count(self, x):\n    return 2\ndef f(x):\n  return L()',
                       ['assert f(1).count(3) == 2']),
    'chained_methods': ('class S:\n  def strip(self):\n    return self\n'
                        '  def upper(self):\n    return "ABC"\ndef f(x):\n  return S()',
                        ["assert f(1).strip().upper() == 'ABC'"]),
}
ATTACKS = {**{f'shadow_{k}': v for k, v in SHADOWING.items()},
           **{f'method_{k}': v for k, v in METHODS.items()}}

# Honest and wrong solutions under the same test shapes, and the shapes the split allows.
HONEST = [
    ('def f(x):\n  return x', ['assert hex(f(16)) == "0x10"', 'assert next(iter([f(1)])) == 1',
                               'assert [len(str(f(i))) for i in range(3)] == [1, 1, 1]']),
    ('def f(x):\n  return 2 * x + 0.5', [
        'assert max([abs(f(i) - 2 * i) for i in range(3)]) < 0.6',
        'import math\nassert all([math.isclose(f(i), 2 * i + 0.5) for i in range(3)])',
        'from math import isclose\nassert isclose(f(1), 2.5)']),
    ('from math import *\ndef f(x):\n  return 4.0', ['assert sqrt(f(1)) == 2']),
    ('import collections\ndef f(x):\n  return "ab"',
     ['assert collections.Counter(f(1)) == collections.Counter("ba")',
      "assert f(1).startswith('a') and f(1).find('b') == 1", 'assert set(f(1)) == {"a", "b"}',
      'assert sorted(f(1), reverse=True) == ["b", "a"]', 'assert set(f(1)).issubset("abc")']),
    ('def f(x):\n  return {"a": x}', ["assert sorted(f(1).keys()) == ['a']",
                                      "assert f(2).get('a') == 2", 'assert f(1) == {"a": 1}']),
    ('class Solution:\n  def twoSum(self, n, t):\n    return [0, 1]\n'
     'class P:\n  def __init__(self, x):\n    self.x = x\n'
     'def g(x):\n  return x + 1\ndef f(x):\n  return 2 * x\nLIMIT = 10',
     ['assert Solution().twoSum([2, 7], 9) == [0, 1]', 'assert P(3).x == 3',
      'assert f(g(1)) == 4', 'assert all(f(i) == 2 * i for i in range(3))', 'assert LIMIT == 10',
      'assert f(*[1]) == 2 and f(x=2) == 4']),
]
WRONG = [
    ('def f(x):\n  return "ba"', ["assert f(1).startswith('a')"]),
    ('def f(x):\n  return [2, 1]', ['assert sorted(f(1)) == [1, 2, 3]']),
    ('class Solution:\n  def twoSum(self, n, t):\n    return [1, 0]',
     ['assert Solution().twoSum([2, 7], 9) == [0, 1]']),
    ('def f(x):\n  return 1 / 0', ['assert f(1) == 1']),
]


def item(name):
  code, tests = ATTACKS[name]
  return {'completion': f'```python\n{code}\n```', 'tests': tests, 'cpu_s': 2}


@pytest.mark.parametrize('name', sorted(ATTACKS))
def test_direct_call_scores_zero(name):
  verdict = python_tests.verify_python_tests(item(name))
  assert verdict.reward == 0.0 and verdict.status != V.CORRECT, (name, verdict)


def test_honest_solutions_score_one_and_wrong_ones_zero():
  for code, tests in HONEST:
    verdict = python_tests.verify_python_tests({'completion': code, 'tests': tests})
    assert verdict.status == V.CORRECT, (code, verdict)
  for code, tests in WRONG:
    verdict = python_tests.verify_python_tests({'completion': code, 'tests': tests})
    assert verdict.status == V.WRONG and verdict.reward == 0.0, (code, verdict)


def test_pool_scores_zero_then_a_good_item_scores_one():
  names = sorted(ATTACKS)
  with pool_lib.VerifierPool(num_workers=2, item_timeout_s=30, default_reward=0.0) as pool:
    verdicts = pool.score([item(n) for n in names], verifier='python_tests', deadline_s=120)
    assert {n: v.reward for n, v in zip(names, verdicts)} == {n: 0.0 for n in names}, [
        (n, v.status, v.detail) for n, v in zip(names, verdicts) if v.reward]
    good, = pool.score([GOOD], verifier='python_tests', deadline_s=30)
  assert good.reward == 1.0, good


def test_cli_scores_zero_then_a_good_item_scores_one(tmp_path):
  names = sorted(ATTACKS)
  source = tmp_path / 'in.jsonl'
  source.write_text(''.join(json.dumps(item(n)) + '\n' for n in names) + json.dumps(GOOD) + '\n')
  out = tmp_path / 'out.jsonl'
  run = subprocess.run([sys.executable, '-m', 'rlreason.verifiers', 'score', '--verifier',
                        'python_tests', '--input', str(source), '--output', str(out),
                        '--item-timeout-s', '30'], capture_output=True, text=True, timeout=300)
  assert run.returncode == 0, run.stderr
  rewards = [json.loads(line)['reward'] for line in out.read_text().splitlines()]
  assert dict(zip(names, rewards)) == {n: 0.0 for n in names} and rewards[-1] == 1.0


def test_the_sandbox_sees_calls_on_arguments_never_expected_values():
  sentinel = 'EXPECTED-' + 'SENTINEL'
  tests = [f'assert f(1) == {sentinel!r}', f"assert f(2).startswith({sentinel!r})",
           f'assert sorted(f(3), key=lambda t: t) == [{sentinel!r}]',
           f'assert [f(i) for i in range(2)] == [{sentinel!r}] * 2']
  reply = test_probes.evaluate(tests, 'def f(x):\n  return x', {})
  assert sentinel not in json.dumps(reply['ops'])
  calls = [op for op in reply['ops'] if op['kind'] == 'call']
  assert [op['args'] for op in calls] == [[{'v': {'int': str(i)}}] for i in (1, 2, 3, 0, 1)]
  assert {o[0] for o in reply['outcomes']} == {'pending'}


@pytest.mark.parametrize('code, test', [
    ('def f(x):\n  return 10 ** 12', 'assert sum(range(f(1))) == 5'),
    ('def f(x):\n  return 3', 'assert f(1) ** 10 ** 9 > 0'),
])
def test_a_check_computing_on_a_huge_value_times_out_within_the_budget(code, test):
  start = time.monotonic()
  verdict = python_tests.verify_python_tests({'completion': code, 'tests': [test], 'cpu_s': 1})
  assert verdict.status == V.TIMEOUT and verdict.reward == 0.0, verdict
  assert time.monotonic() - start < 1 + 3 + 2 + 3  # cpu_s, wall slack, collect slack, start-up
  assert python_tests.verify_python_tests(GOOD).reward == 1.0


class _Broken(dict):
  def get(self, key, default=None):
    raise IndexError(key)


@pytest.mark.parametrize('record', [
    {'completion': 'def f(x):\n  return x', 'tests': []},
    {'completion': 'def f(x):\n  return x', 'tests': [1]},
    {'completion': 'def f(x):\n  return x', 'tests': {'a': 'assert f(1) == 1'}},
    {'completion': 'def f(x):\n  return x', 'io_cases': [{'input': 1}]},
    {'completion': 'def f(x):\n  return x', 'tests': ['assert f(1) == 1'], 'cpu_s': 10 ** 30},
    {'completion': 'def f(x):\n  return x', 'tests': ['assert f(1) == 1\x00']},
    {'tests': ['assert f(1) == 1']}, [], 'x',
    _Broken(completion='def f(x):\n  return x', tests=['assert f(1) == 1']),
])
def test_a_malformed_record_is_a_failure_verdict_with_a_message(record):
  verdict = python_tests.verify_python_tests(record)
  assert verdict.status in (V.INVALID_INPUT, V.CRASH) and verdict.reward == 0.0 and \
      verdict.detail, verdict
