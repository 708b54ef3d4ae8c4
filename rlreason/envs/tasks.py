"""Synthetic tool-use tasks for the calculator, kb and timeseries tools.

Each generator is a pure function of (seed, index, difficulty) through rlreason.tasks'
`example_rng`, and returns an rlreason.tasks `Example` whose `meta` is the tool context plus
the gold tool calls:

  meta['tools']        tool names the episode offers (rlreason.envs.registry)
  meta['graph'] / meta['series']   the context `tool.new_session(example.meta)` reads
  meta['gold_calls']   [{'name', 'arguments'}]: a call sequence that finds the answer; a string
                       '$k' in the arguments stands for call k's JSON output, '$k[0]' for its
                       first element (`run_gold` substitutes them)
  meta['answer_field'] timeseries only: the key of the last stats output that is the answer

  task           question                                            difficulty
  calc_multiply  the product of two numbers of `difficulty` digits   digits (default 12)
  kb_qa          a 2-3 call question over a graph of fictional       graph size
                 people, companies and cities
  ts_query       the index of the spike, or the maximum of a window  series length

The answer is what `answer_of` reads from the last gold observation. The split is by content:
`split_of` hashes `problem_key` (the unordered operands, or the prompt plus the tool context).

Not here: rewards, chat formatting, registration in rlreason.tasks.TASKS (these examples need
the tools, and rlreason.tasks must not import rlreason.envs).
"""

import json
import re

from rlreason.envs import base
from rlreason.envs import registry
from rlreason.envs import timeseries
from rlreason.tasks import example as example_lib

_REF = re.compile(r'\$(\d+)(\[0\])?')
_CONSONANTS, _VOWELS = 'bdfgklmnprstvz', 'aeiou'


def _digits(rng, n: int) -> int:
  return int(str(rng.integers(1, 10)) + ''.join(str(d) for d in rng.integers(0, 10, n - 1)))


def _example(task, seed, index, difficulty, prompt, answer, meta) -> example_lib.Example:
  return example_lib.Example(id=example_lib.example_id(task, seed, index, difficulty),
                             prompt=prompt, answer=answer, solution=None, task=task,
                             difficulty=difficulty, meta=meta)


def calc_multiply(seed: int, index: int, *, difficulty: int = 12) -> example_lib.Example:
  """'What is a * b?' for two `difficulty`-digit numbers: too long to multiply in one's head."""
  rng = example_lib.example_rng('calc_multiply', seed, index, difficulty)
  a, b = _digits(rng, difficulty), _digits(rng, difficulty)
  meta = {'tools': ['calculator'],
          'gold_calls': [{'name': 'calculator', 'arguments': {'expression': f'{a} * {b}'}}]}
  return _example('calc_multiply', seed, index, difficulty,
                  f'What is {a} * {b}? Use the calculator.', str(a * b), meta)


def _names(rng, count: int, syllables: int, taken: set) -> list[str]:
  names = []
  while len(names) < count:
    name = ''.join(rng.choice(list(_CONSONANTS)) + rng.choice(list(_VOWELS))
                   for _ in range(syllables)).capitalize()
    if name not in taken:
      taken.add(name)
      names.append(name)
  return names


def _neighbours(**arguments) -> dict:
  return {'name': 'kb', 'arguments': {'action': 'neighbours', **arguments}}


def kb_qa(seed: int, index: int, *, difficulty: int = 2) -> example_lib.Example:
  """A question over people (employer, lives_in), companies (located_in) and cities."""
  rng = example_lib.example_rng('kb_qa', seed, index, difficulty)
  taken = set()
  cities = _names(rng, 2 + difficulty, 3, taken)
  companies = [n + ' Corp' for n in _names(rng, 2 + difficulty, 2, taken)]
  people = _names(rng, 3 + 3 * difficulty, 2, taken)
  located = {c: str(rng.choice(cities)) for c in companies}
  employer = {p: str(rng.choice(companies)) for p in people}
  home = {p: str(rng.choice(cities)) for p in people}
  graph = ([[c, 'located_in', located[c]] for c in companies] +
           [[p, 'employer', employer[p]] for p in people] +
           [[p, 'lives_in', home[p]] for p in people])
  person = str(rng.choice(people))
  kind = int(rng.integers(3))
  both = [p for p in people if employer[p] == employer[person] and home[p] == home[person]]
  if kind == 2 and len(both) > 1:
    kind = 0  # The intersection question needs a unique answer.
  if kind == 0:
    prompt = f'In which city is the employer of {person} located?'
    answer = located[employer[person]]
    gold = [_neighbours(entity=person, relation='employer'),
            _neighbours(entity='$0[0]', relation='located_in')]
  elif kind == 1:
    prompt = f'How many people work for {employer[person]}?'
    answer = str(sum(e == employer[person] for e in employer.values()))
    gold = [_neighbours(entity=employer[person], relation='employer^-1'),
            {'name': 'kb', 'arguments': {'action': 'count', 'entities': '$0'}}]
  else:
    prompt = f'Who works for {employer[person]} and lives in {home[person]}?'
    answer = person
    gold = [_neighbours(entity=employer[person], relation='employer^-1'),
            _neighbours(entity=home[person], relation='lives_in^-1'),
            {'name': 'kb', 'arguments': {'action': 'intersection', 'sets': ['$0', '$1']}}]
  meta = {'tools': ['kb'], 'graph': graph, 'gold_calls': gold}
  return _example('kb_qa', seed, index, difficulty,
                  prompt + ' Use the kb tool on the knowledge graph.', answer, meta)


def ts_query(seed: int, index: int, *, difficulty: int = 2) -> example_lib.Example:
  """The spike's index, or the maximum of a short window, of a noisy series near 10."""
  rng = example_lib.example_rng('ts_query', seed, index, difficulty)
  n = 40 + 20 * difficulty
  series = [round(10.0 + float(rng.normal()), 2) for _ in range(n)]
  if rng.integers(2) == 0:
    spike = int(rng.integers(n))
    series[spike] = round(max(series) + 5.0 + float(rng.uniform(0, 5)), 2)
    prompt = f'The series of {n} values has one spike. At which index (from 0) does it occur?'
    answer, field, start, end = str(spike), 'argmax', 0, n
  else:
    start = int(rng.integers(n - 15))
    end = start + int(rng.integers(5, 16))
    prompt = f'What is the largest value of the series between index {start} and index {end - 1}?'
    answer = json.dumps(timeseries.rounded(max(series[start:end])))
    field = 'max'
  meta = {'tools': ['timeseries'], 'series': series, 'answer_field': field,
          'gold_calls': [{'name': 'timeseries',
                          'arguments': {'action': 'stats', 'start': start, 'end': end}}]}
  return _example('ts_query', seed, index, difficulty, prompt + ' Use the timeseries tool.',
                  answer, meta)


TASKS = {'calc_multiply': calc_multiply, 'kb_qa': kb_qa, 'ts_query': ts_query}


def problem_key(example: example_lib.Example) -> str:
  """The canonical problem: a*b and b*a are one; otherwise the prompt and the tool context."""
  if example.task == 'calc_multiply':
    a, b = example.meta['gold_calls'][0]['arguments']['expression'].split(' * ')
    return '*'.join(sorted([a, b], key=int))
  context = {k: v for k, v in example.meta.items() if k not in ('gold_calls', 'answer_field')}
  return example.prompt + '\0' + json.dumps(context, sort_keys=True)


def split_of(example: example_lib.Example, *,
             held_out_fraction: float = example_lib.HELD_OUT_FRACTION) -> str:
  return example_lib.split_of_key(example.task, problem_key(example),
                                  held_out_fraction=held_out_fraction)


def _resolve(value, outputs: list):
  if isinstance(value, list):
    return [_resolve(v, outputs) for v in value]
  match = _REF.fullmatch(value) if isinstance(value, str) else None
  if not match:
    return value
  parsed = json.loads(outputs[int(match.group(1))])
  return parsed[0] if match.group(2) else parsed


def run_gold(example: example_lib.Example) -> list[base.ToolResult]:
  """Executes meta['gold_calls'] through run_tool, substituting '$k' references."""
  tools = registry.get_tools(example.meta['tools'])
  sessions, outputs, results = {}, [], []
  for call in example.meta['gold_calls']:
    arguments = {k: _resolve(v, outputs) for k, v in call['arguments'].items()}
    result = base.run_tool(tools, sessions, base.ToolCall(call['name'], arguments),
                           context=example.meta)
    results.append(result)
    outputs.append(result.content)
  return results


def answer_of(observation: str, meta: dict) -> str:
  """The answer a gold observation states: a lone list element, a stats field, or a number."""
  value = json.loads(observation)
  if isinstance(value, dict):
    value = value[meta['answer_field']]
  if isinstance(value, list) and len(value) == 1:
    value = value[0]
  return value if isinstance(value, str) else json.dumps(value)
