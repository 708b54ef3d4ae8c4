"""Synthetic tool-use tasks for the calculator, kb, timeseries and search tools.

Each generator is a pure function of (seed, index, difficulty) through rlreason.tasks'
`example_rng`, and returns an rlreason.tasks `Example` whose `meta` is the tool context plus
the gold tool calls:

  meta['tools']        tool names the episode offers (rlreason.envs.registry)
  meta['graph'] / meta['series'] / meta['corpus']   the context `tool.new_session(example.meta)`
                       reads
  meta['gold_calls']   [{'name', 'arguments'}]: a call sequence that finds the answer; a string
                       '$k' in the arguments stands for call k's JSON output, '$k[0]' for its
                       first element (`run_gold` substitutes them)
  meta['answer_field'] timeseries: the key of the last stats output that is the answer;
                       search: the words before the answer in the last call's top passage

  task           question                                            difficulty
  calc_multiply  the product of two numbers of `difficulty` digits   digits (default 12)
  kb_qa          a 2-3 call question over a graph of fictional       graph size
                 people, companies and cities
  ts_query       the index of the spike, or the maximum of a window  series length
  search_qa      a 2-3 hop question ("Where was the founder of X     corpus size
                 born?") over one-fact passages about fictional
                 people, companies, cities and products

The answer is what `answer_of` reads from the last gold observation. The split is by content:
`split_of` hashes `problem_key` (the unordered operands, or the prompt plus the tool context).
`_register()`, run on import, adds these tasks to rlreason.tasks.TASKS (rlreason.tasks must
not import rlreason.envs, so the registration lives here).

Not here: rewards, chat formatting. search_qa's gold queries are literal, written by the
generator (a '$k' reference cannot pick a name out of a passage): they show that a chain of
searches reaches the answer, not how a model would find the next query.
"""

import json
import re
import string

from rlreason.envs import artist  # noqa: F401 (registers ARTIST's ts_rare_event task)
from rlreason.envs import base
from rlreason.envs import patient  # noqa: F401 (registers MIND's patient_dx task)
from rlreason.envs import prolog_tasks  # noqa: F401 (registers prolog_arith)
from rlreason.envs import registry
from rlreason import tasks as tasks_lib
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
  companies = [n + ' Corp' for n in _names(rng, 2 + 4 * difficulty, 2, taken)]
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


# relation -> (the words between subject and object in its passage, the gold query's keyword)
_RELATIONS = {
    'founded_by': (' was founded by ', 'founded'),
    'headquartered_in': (' is headquartered in ', 'headquartered'),
    'born_in': (' was born in ', 'born'),
    'works_for': (' works for ', 'works'),
    'made_by': (' is made by ', 'made'),
}
# (question, the relations followed from its entity, the kind of entity it names)
_SEARCH_QUESTIONS = (
    ('Where was the founder of {} born?', ('founded_by', 'born_in'), 'company'),
    ('In which city are the headquarters of the employer of {}?',
     ('works_for', 'headquartered_in'), 'person'),
    ('Who is the founder of the company that makes {}?', ('made_by', 'founded_by'), 'product'),
    ('Where was the founder of the company that makes {} born?',
     ('made_by', 'founded_by', 'born_in'), 'product'),
)
# A generated name never spells a word of the passages or questions ('Made Corp').
_RESERVED = frozenset(w.capitalize() for text in [p for p, _ in _RELATIONS.values()] +
                      [q for q, _, _ in _SEARCH_QUESTIONS] for w in text.split())


def search_qa(seed: int, index: int, *, difficulty: int = 2) -> example_lib.Example:
  """A 2-3 hop question over a corpus of one-fact passages about fictional entities.

  Every company has one founder (distinct people) and one headquarters city, every person
  one birthplace and one employer, every product one maker, so following the question's
  relations from its entity gives exactly one answer. All of these facts are in the corpus,
  one per passage: the other entities' passages are the distractors, and `difficulty`
  scales their number (14 + 28 * difficulty passages). The question names only the first
  entity, in other words than the passages use ('founder', 'employer', 'headquarters'); each
  later entity is read from the previous hop's passage. The gold calls are one search per
  hop, the entity's name plus the relation's word; the answer ends the last one's top passage.
  """
  rng = example_lib.example_rng('search_qa', seed, index, difficulty)
  taken = set(_RESERVED)
  cities = _names(rng, 4 + 2 * difficulty, 3, taken)
  companies = [n + ' Corp' for n in _names(rng, 2 + 4 * difficulty, 2, taken)]
  n_people = 2 * len(companies)
  people = [f'{first} {last}' for first, last in zip(_names(rng, n_people, 2, taken),
                                                     _names(rng, n_people, 3, taken))]
  products = _names(rng, len(companies), 3, taken)
  founders = [people[int(i)] for i in rng.permutation(n_people)[:len(companies)]]
  facts = {'founded_by': dict(zip(companies, founders)),
           'headquartered_in': {c: str(rng.choice(cities)) for c in companies},
           'born_in': {p: str(rng.choice(cities)) for p in people},
           'works_for': {p: str(rng.choice(companies)) for p in people},
           'made_by': {p: str(rng.choice(companies)) for p in products}}
  passages = [subject + _RELATIONS[relation][0] + obj + '.'
              for relation, objects in facts.items() for subject, obj in objects.items()]
  corpus = [passages[int(i)] for i in rng.permutation(len(passages))]
  question, chain, kind = _SEARCH_QUESTIONS[int(rng.integers(len(_SEARCH_QUESTIONS)))]
  entity = str(rng.choice({'company': companies, 'person': people, 'product': products}[kind]))
  gold, subject = [], entity
  for relation in chain:
    gold.append({'name': 'search',
                 'arguments': {'query': f'{subject} {_RELATIONS[relation][1]}'}})
    subject = facts[relation][subject]
  meta = {'tools': ['search'], 'corpus': corpus, 'answer_field': _RELATIONS[chain[-1]][0],
          'gold_calls': gold}
  return _example('search_qa', seed, index, difficulty,
                  question.format(entity) + ' Use the search tool on the document collection.',
                  subject, meta)


TASKS = {'calc_multiply': calc_multiply, 'kb_qa': kb_qa, 'ts_query': ts_query,
         'search_qa': search_qa}
DEFAULT_DIFFICULTY = {'calc_multiply': 12, 'kb_qa': 2, 'ts_query': 2, 'search_qa': 2}
# Prompts, calls and observations (JSON, names, decimals) are printable ASCII.
CHARS = string.printable


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
  """The answer a gold observation states: a lone list element, a stats field, a number, or
  (search) what follows meta['answer_field'] in the top passage, up to its final period."""
  if meta['tools'] == ['search']:
    top = observation.split('\n', 1)[0]
    return top.partition(meta['answer_field'])[2].removesuffix('.')
  value = json.loads(observation)
  if isinstance(value, dict):
    value = value[meta['answer_field']]
  if isinstance(value, list) and len(value) == 1:
    value = value[0]
  return value if isinstance(value, str) else json.dumps(value)


def _register() -> None:
  """Makes the tool-use tasks streamable by rlreason.tasks.data (data.task='calc_multiply')."""
  for name, fn in TASKS.items():
    tasks_lib.register(tasks_lib.Task(name=name, generate=fn, problem_key=problem_key,
                                      default_difficulty=DEFAULT_DIFFICULTY[name], chars=CHARS))


_register()


def calculator_trace(example: example_lib.Example, rng, *, call_prob: float = 0.25,
                     head_error_digits: int = 1, answer_prefix: str = '',
                     spaced: bool = False, right_align: bool = False,
                     wrong_tool: str = '') -> list[list]:
  """A flawed SFT teacher for calc_multiply in the 'tags' format (an episode as [text,
  trained] segments; the observation is the calculator's output, never trained).

  With probability `call_prob` it calls the calculator and copies the result; otherwise it
  answers from its head: the true product with `head_error_digits` random digits changed
  (never right). SFT on it learns mostly to guess; RL on the environment's reward has to
  discover that the call pays.

  answer_prefix: written before either answer ('#### ': the exact verifier reads what
    follows). Then the first token alone says call or guess, so a greedy student guesses
    whenever call_prob < 0.5; with bare numbers a guess's first digit is spread over 1-9,
    and a student's greedy first token was the call's '<' even at call_prob 0.25.
  spaced: the expression as the question writes it ('1234 * 5678'), a verbatim copy of the
    prompt's text, instead of '1234*5678'.
  right_align: spaces before an answer shorter than the longest product (2 x difficulty
    digits; the verifier ignores them), so that every answer digit sits at one fixed distance
    from its digit in the observation. Left-aligned, a student that copied 8-digit results
    at that distance wrote every 7-digit one (17% of products) wrong, and GRPO could not
    repair it: all of a group's episodes failed alike.
  wrong_tool: when set (e.g. 'calculater', as long as 'calculator'), the head-answer traces
    first call this unknown tool with the same expression, show the environment's error
    message (base.run_tool's, exactly) and then guess. Every trace then copies the operands
    at the same distance from the prompt, so the copy is learned from all of them, and the
    call-or-guess choice sits at the tool name's first differing letter. Without it, a
    student that sees the operand copy in only `call_prob` of its traces did not learn it
    (seed 2, call_prob 0.3: no right call in 1600 SFT steps; call_prob 1.0: all right after
    200).
  """
  expression = example.meta['gold_calls'][0]['arguments']['expression']
  if not spaced:
    expression = expression.replace(' ', '')
  width = 2 * example.difficulty if right_align else 0
  if rng.random() < call_prob:
    call = f'<call>calculator: {{"expression": "{expression}"}}</call>'
    return [[call, True], [f'<result>{example.answer}</result>', False],
            [answer_prefix + example.answer.rjust(width), True]]
  digits = list(example.answer)
  for i in rng.choice(len(digits), size=min(head_error_digits, len(digits)), replace=False):
    digits[i] = str((int(digits[i]) + int(rng.integers(1, 10))) % 10)
  if digits[0] == '0':
    digits[0] = str(int(rng.integers(1, 10)))
  guess = ''.join(digits)
  guess = guess if guess != example.answer else guess + '0'
  if not wrong_tool:
    return [[answer_prefix + guess.rjust(width), True]]
  error = base.run_tool(registry.get_tools(example.meta['tools']), {},
                        base.ToolCall(wrong_tool, {'expression': expression}),
                        context=example.meta, deadline_s=None).content
  call = f'<call>{wrong_tool}: {{"expression": "{expression}"}}</call>'
  return [[call, True], [f'<result>{error}</result>', False],
          [answer_prefix + guess.rjust(width), True]]


def resolved_gold_calls(example: example_lib.Example) -> list[base.ToolCall]:
  """meta['gold_calls'] as run_gold executes them: each '$k' replaced by call k's output."""
  calls, outputs = [], []
  for call, result in zip(example.meta['gold_calls'], run_gold(example)):
    calls.append(base.ToolCall(call['name'],
                               {k: _resolve(v, outputs) for k, v in call['arguments'].items()}))
    outputs.append(result.content)
  return calls
