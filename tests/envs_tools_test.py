"""calculator, kb and timeseries tools through run_tool, and their synthetic tasks."""

import collections
import dataclasses
import json

import pytest

from rlreason.envs import base
from rlreason.envs import calculator
from rlreason.envs import kb
from rlreason.envs import registry
from rlreason.envs import tasks
from rlreason.envs import timeseries


def _run(tool, arguments, context=None):
  return base.run_tool({tool.spec.name: tool}, {}, base.ToolCall(tool.spec.name, arguments),
                       context=context or {})


# --- calculator ---


@pytest.mark.parametrize('expression, expected', [
    # 123456789 * 987654321 = 121932631112635269 (exact, past float precision).
    ('123456789 * 987654321', '121932631112635269'),
    ('2**64 + 1', '18446744073709551617'),
    ('0.1 + 0.2', '0.3'),  # Exact: 1/10 + 2/10 = 3/10, not 0.30000000000000004.
    ('1/4', '0.25'),
    ('1/3', '0.333333333333'),  # 12 significant digits.
    ('-7 // 2', '-4'),  # Floor, as in Python.
    ('-7 % 3', '2'),
    ('2**-2', '0.25'),
    ('-(3 - 5) * (2 + 1)', '6'),
    ('1**100000000000', '1'),  # Cheap however large the exponent.
    ('10**20 + 0.5', '1.00000000000E+20'),
])
def test_calculator_values(expression, expected):
  assert _run(calculator.TOOL, {'expression': expression}) == base.ToolResult(expected)


def test_calculator_big_powers_exact_up_to_the_limit():
  # 2**10000 = 1995063116...9376 has floor(10000 * log10(2)) + 1 = 3011 digits: allowed, but
  # longer than an observation, so run_tool truncates it.
  text = calculator.evaluate('2**10000')
  assert len(text) == 3011 and text.startswith('19950631168807') and text.endswith('9376')
  assert int(text) == 2**10000
  assert len(calculator.evaluate('3**20000')) == 9543  # floor(20000 * log10(3)) + 1
  assert _run(calculator.TOOL, {'expression': '7**5000'}).error == base.OVERSIZED


@pytest.mark.parametrize('expression', ['2**40000', '10**100000', '10**10**10', '1e999999999',
                                        '(10**5000) * (10**5001)'])
def test_calculator_refuses_huge_values(expression):
  # 2**40000 has 12042 digits; 10**10**10 would have 10**10 + 1; each is refused before or
  # right after the one multiplication that makes it.
  result = _run(calculator.TOOL, {'expression': expression})
  assert result.error == base.TOOL_FAILED and '10000 digits' in result.content


@pytest.mark.parametrize('expression', ['1/0', '5 % 0', '3 // (2 - 2)', '0**-1'])
def test_calculator_division_by_zero(expression):
  result = _run(calculator.TOOL, {'expression': expression})
  assert result.error == base.TOOL_FAILED and 'division by zero' in result.content


@pytest.mark.parametrize('expression, named', [
    ('x + 1', "name 'x'"), ('abs(-1)', 'function call'), ('__import__("os").system("ls")',
                                                          'function call'),
    ('(1).real', 'attribute .real'), ('"a" * 3', 'str literal'), ('1 ^ 2', 'BitXor'),
    ('1 < 2', 'Compare'), ('[1, 2]', 'List'), ('1 +', 'cannot parse'), ('1' * 5000, 'parse'),
])
def test_calculator_rejects_non_arithmetic(expression, named):
  result = _run(calculator.TOOL, {'expression': expression})
  assert result.error == base.BAD_ARGUMENTS and named in result.content


@pytest.mark.parametrize('arguments', [{'expression': 5}, {}, {'expr': '1'}, ['1+1'],
                                       {'expression': '1', 'x': 2}])
def test_calculator_ill_typed_arguments(arguments):
  with pytest.raises(base.ToolError) as e:
    base.check_arguments(calculator.TOOL.spec, arguments)
  assert e.value.kind == base.BAD_ARGUMENTS
  assert _run(calculator.TOOL, arguments).error == base.BAD_ARGUMENTS


def test_calculator_deep_nesting_is_bad_arguments_not_a_crash():
  assert calculator.evaluate('+'.join(['1'] * 500)) == '500'
  assert _run(calculator.TOOL, {'expression': '+'.join(['1'] * 9000)}).error == (
      base.BAD_ARGUMENTS)
  assert _run(calculator.TOOL, {'expression': '(' * 300 + '1' + ')' * 300}).error == (
      base.BAD_ARGUMENTS)


# --- kb ---

GRAPH = {'graph': [['Ann', 'employer', 'Acme'], ['Bob', 'employer', 'Acme'],
                   ['Cid', 'employer', 'Bolt'], ['Acme', 'located_in', 'Oslo'],
                   ['Ann', 'lives_in', 'Oslo'], ['Bob', 'lives_in', 'Rome']]}


@pytest.mark.parametrize('arguments, expected', [
    ({'action': 'relations', 'entity': 'Ann'}, '["employer", "lives_in"]'),
    # Oslo is the object of Acme's located_in and of Ann's lives_in.
    ({'action': 'relations', 'entity': 'Oslo'}, '["lives_in^-1", "located_in^-1"]'),
    ({'action': 'neighbours', 'entity': 'Ann', 'relation': 'employer'}, '["Acme"]'),
    ({'action': 'neighbours', 'entity': 'Acme', 'relation': 'employer^-1'}, '["Ann", "Bob"]'),
    ({'action': 'neighbours', 'entities': ['Ann', 'Bob'], 'relation': 'lives_in'},
     '["Oslo", "Rome"]'),
    ({'action': 'intersection', 'sets': [['Ann', 'Bob'], ['Bob', 'Cid', 'Ann'], ['Ann']]},
     '["Ann"]'),
    ({'action': 'intersection', 'sets': [['Ann'], ['Bob']]}, '[]'),
    ({'action': 'count', 'entities': ['Ann', 'Bob', 'Ann']}, '2'),  # Distinct entities.
])
def test_kb_actions(arguments, expected):
  assert _run(kb.TOOL, arguments, GRAPH) == base.ToolResult(expected)


@pytest.mark.parametrize('arguments, kind, named', [
    ({'action': 'relations', 'entity': 'Zed'}, base.TOOL_FAILED, "no entity 'Zed'"),
    ({'action': 'neighbours', 'entity': 'Zed', 'relation': 'employer'}, base.TOOL_FAILED,
     "no entity 'Zed'"),
    ({'action': 'neighbours', 'entity': 'Ann', 'relation': 'boss'}, base.TOOL_FAILED,
     '["employer", "lives_in"]'),
    ({'action': 'neighbours', 'entity': 'Ann'}, base.BAD_ARGUMENTS, 'relation'),
    ({'action': 'neighbours', 'relation': 'employer'}, base.BAD_ARGUMENTS, 'entity'),
    ({'action': 'intersection', 'sets': [['Ann']]}, base.BAD_ARGUMENTS, 'two or more'),
    ({'action': 'intersection', 'sets': [['Ann'], 'Ann']}, base.BAD_ARGUMENTS, 'sets[1]'),
    ({'action': 'jump'}, base.BAD_ARGUMENTS, "unknown action 'jump'"),
    ({'action': 'count', 'entities': 'Ann'}, base.BAD_ARGUMENTS, 'entities must be array'),
])
def test_kb_failures(arguments, kind, named):
  result = _run(kb.TOOL, arguments, GRAPH)
  assert result.error == kind and named in result.content


def test_kb_without_a_graph():
  result = _run(kb.TOOL, {'action': 'relations', 'entity': 'Ann'}, {})
  assert result.error == base.TOOL_FAILED and 'no knowledge graph' in result.content


# --- timeseries ---

SERIES = {'series': [1.0, 3.0, 2.0, 6.0, 6.0, 0.5]}


@pytest.mark.parametrize('arguments, expected', [
    ({'action': 'length'}, 6),
    ({'action': 'window', 'start': 1, 'end': 4}, [3, 2, 6]),
    # values[1:5] = 3, 2, 6, 6: mean 17/4 = 4.25; deviations -1.25, -2.25, 1.75, 1.75, squares
    # 1.5625 + 5.0625 + 3.0625 + 3.0625 = 12.75, /4 = 3.1875, sqrt = 1.785357...; the first 6 is
    # at index 3.
    ({'action': 'stats', 'start': 1, 'end': 5},
     {'min': 2, 'max': 6, 'mean': 4.25, 'std': 1.78536, 'argmin': 2, 'argmax': 3}),
    ({'action': 'stats', 'start': 5, 'end': 6},
     {'min': 0.5, 'max': 0.5, 'mean': 0.5, 'std': 0, 'argmin': 5, 'argmax': 5}),
])
def test_timeseries_actions(arguments, expected):
  result = _run(timeseries.TOOL, arguments, SERIES)
  assert result.error is None and json.loads(result.content) == expected


def test_timeseries_window_with_timestamps():
  context = {'series': [1, 2.5, 4], 'timestamps': ['mon', 'tue', 'wed']}
  result = _run(timeseries.TOOL, {'action': 'window', 'start': 1, 'end': 3}, context)
  assert json.loads(result.content) == [['tue', 2.5], ['wed', 4]]


@pytest.mark.parametrize('arguments, named', [
    ({'action': 'window', 'start': -1, 'end': 2}, 'start=-1'),
    ({'action': 'window', 'start': 6, 'end': 7}, 'start=6'),
    ({'action': 'stats', 'start': 2, 'end': 2}, 'end=2'),
    ({'action': 'stats', 'start': 0, 'end': 7}, 'end=7'),
    ({'action': 'window', 'start': 0}, 'needs end'),
    ({'action': 'window', 'start': 0, 'end': 2.5}, 'end must be integer'),
    ({'action': 'mean'}, "unknown action 'mean'"),
])
def test_timeseries_bad_bounds(arguments, named):
  result = _run(timeseries.TOOL, arguments, SERIES)
  assert result.error == base.BAD_ARGUMENTS and named in result.content


def test_timeseries_window_cap_but_stats_uncapped():
  context = {'series': list(range(500))}
  assert _run(timeseries.TOOL, {'action': 'window', 'start': 0, 'end': 200}, context).error is None
  capped = _run(timeseries.TOOL, {'action': 'window', 'start': 0, 'end': 201}, context)
  assert capped.error == base.BAD_ARGUMENTS and 'at most 200' in capped.content
  # mean of 0..499 = 249.5.
  stats = json.loads(_run(timeseries.TOOL, {'action': 'stats', 'start': 0, 'end': 500},
                          context).content)
  assert stats['mean'] == 249.5 and stats['argmax'] == 499


# --- run_tool never raises ---


class _Fake:
  spec = base.ToolSpec('fake', 'test double', {'type': 'object', 'properties': {
      'mode': {'type': 'string'}}, 'required': ['mode']})

  def new_session(self, context):
    return context

  def call(self, session, arguments):
    if arguments['mode'] == 'huge':
      return 'x' * 10_000_000
    if arguments['mode'] == 'crash':
      raise KeyError('boom')
    return 42  # Not text.


def test_run_tool_never_raises():
  tools = {'fake': _Fake(), 'calculator': calculator.TOOL}
  run = lambda name, arguments: base.run_tool(tools, {}, base.ToolCall(name, arguments),
                                              context={})
  unknown = run('shell', {'cmd': 'ls'})
  assert unknown.error == base.UNKNOWN_TOOL and 'calculator, fake' in unknown.content
  huge = run('fake', {'mode': 'huge'})
  assert huge.error == base.OVERSIZED
  assert len(huge.content) < base.MAX_OBSERVATION_CHARS + 100
  assert huge.content.endswith(f'[truncated {10_000_000 - base.MAX_OBSERVATION_CHARS} characters]')
  assert run('fake', {'mode': 'crash'}).error == base.CRASH
  assert run('fake', {'mode': 'int'}).error == base.CRASH
  assert run('fake', {}).error == base.BAD_ARGUMENTS


# --- tasks ---


@pytest.mark.parametrize('name', sorted(tasks.TASKS))
def test_tasks_are_deterministic(name):
  generate = tasks.TASKS[name]
  assert generate(3, 7) == generate(3, 7)
  assert generate(3, 7) != generate(3, 8) and generate(3, 7) != generate(4, 7)
  assert generate(3, 7, difficulty=1) != generate(3, 7)


@pytest.mark.parametrize('name', sorted(tasks.TASKS))
def test_tasks_splits_are_disjoint(name):
  examples = [tasks.TASKS[name](seed, i) for seed in (0, 1) for i in range(100)]
  by_split = collections.defaultdict(set)
  for ex in examples:
    by_split[tasks.split_of(ex)].add(tasks.problem_key(ex))
  assert by_split['train'] and not by_split['train'] & by_split['held_out']
  # 200 problems at a 10% held-out fraction: ~20 held out; 5 and 50 are beyond 4 sigma.
  assert 5 < len(by_split['held_out']) < 50


def test_calc_problem_key_ignores_operand_order():
  ex = tasks.calc_multiply(0, 0)
  a, b = ex.meta['gold_calls'][0]['arguments']['expression'].split(' * ')
  swapped = dataclasses.replace(ex, meta={'gold_calls': [
      {'name': 'calculator', 'arguments': {'expression': f'{b} * {a}'}}]})
  assert tasks.problem_key(swapped) == tasks.problem_key(ex)


@pytest.mark.parametrize('name', sorted(tasks.TASKS))
def test_gold_calls_reach_the_answer(name):
  kinds = set()
  for i in range(20):
    ex = tasks.TASKS[name](0, i)
    results = tasks.run_gold(ex)
    assert all(r.error is None for r in results), results
    assert tasks.answer_of(results[-1].content, ex.meta) == ex.answer, (ex.prompt, results)
    kinds.add(ex.prompt.split()[0])
  assert name == 'calc_multiply' or len(kinds) >= 2  # Every task mixes its question types.


def test_task_answers_by_hand():
  ex = tasks.calc_multiply(0, 0, difficulty=8)
  a, b = (int(x) for x in ex.meta['gold_calls'][0]['arguments']['expression'].split(' * '))
  assert len(str(a)) == len(str(b)) == 8 and ex.answer == str(a * b)
  for i in range(20):
    ex = tasks.kb_qa(0, i)
    triples = {tuple(t) for t in ex.meta['graph']}
    if ex.prompt.startswith('In which city'):
      person = ex.prompt.split('employer of ')[1].split(' located')[0]
      company = next(o for s, r, o in triples if s == person and r == 'employer')
      assert (company, 'located_in', ex.answer) in triples
    if ex.prompt.startswith('Who works for'):
      assert (ex.answer, 'employer', ex.prompt.split('works for ')[1].split(' and')[0]) in triples
  for i in range(20):
    ex = tasks.ts_query(0, i)
    series = ex.meta['series']
    if 'spike' in ex.prompt:
      assert series.index(max(series)) == int(ex.answer)


def test_tool_context_is_the_meta():
  for name, generate in tasks.TASKS.items():
    ex = generate(0, 1)
    json.dumps(ex.meta)  # JSON-able, lists not tuples.
    for tool_name in ex.meta['tools']:
      registry.get_tool(tool_name).new_session(ex.meta)
