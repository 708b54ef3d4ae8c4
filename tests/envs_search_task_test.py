"""search_qa: a multi-hop question over a generated corpus, answered by BM25 searches."""

import collections

import pytest

from rlreason import tasks as tasks_lib
from rlreason.envs import base
from rlreason.envs import search
from rlreason.envs import tasks

SUFFIX = ' Use the search tool on the document collection.'
# Read back from the passages independently of the generator: relation words -> relation.
PHRASES = {' was founded by ': 'founded_by', ' is headquartered in ': 'headquartered_in',
           ' was born in ': 'born_in', ' works for ': 'works_for', ' is made by ': 'made_by'}
QUESTIONS = {  # the question's words around its entity -> the relations followed from it
    ('Where was the founder of ', ' born?'): ('founded_by', 'born_in'),
    ('In which city are the headquarters of the employer of ', '?'): ('works_for',
                                                                       'headquartered_in'),
    ('Who is the founder of the company that makes ', '?'): ('made_by', 'founded_by'),
    ('Where was the founder of the company that makes ', ' born?'): ('made_by', 'founded_by',
                                                                     'born_in'),
}


def _triples(corpus):
  triples = []
  for passage in corpus:
    assert passage.endswith('.'), passage
    (phrase,) = [p for p in PHRASES if p in passage]
    subject, obj = passage[:-1].split(phrase)
    triples.append((subject, PHRASES[phrase], obj))
  return triples


def _question(prompt):
  """(entity, relations) of a prompt; the longest matching template wins."""
  question = prompt.removesuffix(SUFFIX)
  matches = [(len(a), question[len(a):-len(b)], chain) for (a, b), chain in QUESTIONS.items()
             if question.startswith(a) and question.endswith(b)]
  _, entity, chain = max(matches)
  return entity, chain


def _search(example, query, k=search.DEFAULT_K):
  return base.run_tool({'search': search.TOOL}, {}, base.ToolCall('search', {'query': query,
                                                                             'k': k}),
                       context=example.meta)


def test_corpus_size_scales_with_difficulty():
  # 2 + 4d companies (founder, headquarters: 2 passages each), twice as many people
  # (birthplace, employer: 2 each), as many products as companies (maker: 1):
  # (2 + 4 + 1) * (2 + 4d) = 14 + 28d passages.
  for difficulty in (0, 1, 2, 5):
    ex = tasks.search_qa(0, 0, difficulty=difficulty)
    assert len(ex.meta['corpus']) == 14 + 28 * difficulty
    assert ex.meta['tools'] == ['search'] and ex.difficulty == difficulty
  assert tasks.DEFAULT_DIFFICULTY['search_qa'] == 2
  assert tasks.search_qa(5, 9) == tasks.search_qa(5, 9, difficulty=2)


def test_every_answer_is_unique_and_every_name_distinct():
  chains = collections.Counter()
  for i in range(200):
    ex = tasks.search_qa(0, i)
    triples = _triples(ex.meta['corpus'])
    objects = collections.defaultdict(set)
    for subject, relation, obj in triples:
      objects[subject, relation].add(obj)
    # One fact per (entity, relation), stated once: no question can have two answers.
    assert len(objects) == len(triples) and all(len(o) == 1 for o in objects.values())
    entity, chain = _question(ex.prompt)
    frontier = {entity}
    for relation in chain:
      frontier = set().union(*(objects.get((e, relation), set()) for e in frontier))
    assert frontier == {ex.answer}, ex.prompt
    chains[chain] += 1
    # No word of one entity's name is a word of another's ('Corp' aside), so a query that
    # names an entity finds that entity's passages only.
    owners = collections.defaultdict(set)
    for subject, _, obj in triples:
      for name in (subject, obj):
        for word in name.split():
          owners[word].add(name)
    assert all(len(names) == 1 for word, names in owners.items() if word != 'Corp')
  assert len(chains) == len(QUESTIONS) and min(chains.values()) > 30


def test_the_gold_chain_retrieves_every_hop():
  # Each gold query is the hop's entity plus the relation's keyword: BM25 ranks the one
  # passage stating that fact first, and it names the next hop's entity (the next query's
  # subject); the last one states the answer.
  hops = 0
  for i in range(200):
    ex = tasks.search_qa(1, i)
    entity, chain = _question(ex.prompt)
    facts = {(s, r): o for s, r, o in _triples(ex.meta['corpus'])}
    results = tasks.run_gold(ex)
    assert len(results) == len(chain) >= 2
    for call, result, relation in zip(ex.meta['gold_calls'], results, chain):
      assert result.error is None
      assert call['arguments']['query'].startswith(entity + ' ')
      top = result.content.splitlines()[0]
      entity = facts[entity, relation]
      assert top.startswith('[1] ') and top.endswith(entity + '.'), (call, result.content)
      hops += 1
    assert ex.answer in results[-1].content
    assert tasks.answer_of(results[-1].content, ex.meta) == ex.answer
  assert hops > 400  # 2 or 3 hops each.


def test_the_question_alone_rarely_finds_the_answer():
  # One search with the question text, default k=3, over 200 examples at the default
  # difficulty. Measured (bm25s 0.3.16): the answer appears in 23 of 200 observations, mostly
  # a city named in some other passage; the passage stating it in 4; with k=10 (the most),
  # 74 and 37, and all of the chain's passages together in 9.
  contains = states = 0
  for i in range(200):
    ex = tasks.search_qa(0, i)
    last = tasks.run_gold(ex)[-1].content.splitlines()[0].removeprefix('[1] ')
    observation = _search(ex, ex.prompt.removesuffix(SUFFIX)).content
    contains += ex.answer in observation
    states += last in observation
  assert contains <= 35 and states <= 10, (contains, states)


def test_problem_key_is_the_prompt_and_the_corpus():
  ex = tasks.search_qa(0, 3)
  key = tasks.problem_key(ex)
  assert key.startswith(ex.prompt + '\0') and ex.meta['corpus'][0] in key
  other = tasks.search_qa(0, 3)
  other.meta['gold_calls'][0]['arguments']['query'] = 'another way to the answer'
  assert tasks.problem_key(other) == key  # The gold calls are not part of the problem...
  other.meta['corpus'][-1] = other.meta['corpus'][-1].upper()
  assert tasks.problem_key(other) != key  # ...but every passage is.


@pytest.mark.parametrize('difficulty', [1, 3])
def test_splits_are_disjoint_and_hash_the_content(difficulty):
  examples = [tasks.search_qa(seed, i, difficulty=difficulty) for seed in (0, 1, 2)
              for i in range(100)]
  by_split = collections.defaultdict(set)
  for ex in examples:
    by_split[tasks.split_of(ex)].add(tasks.problem_key(ex))
    assert tasks_lib.split_of(ex) == tasks.split_of(ex)  # Through rlreason.tasks' registry.
  assert len(by_split['train']) + len(by_split['held_out']) == 300
  assert not by_split['train'] & by_split['held_out']
  # Binomial(300, 0.1): mean 30, sd 5.2; 10 and 50 are beyond 3.8 sd.
  assert 10 < len(by_split['held_out']) < 50


def test_registered_in_rlreason_tasks():
  task = tasks_lib.get_task('search_qa')
  assert task.default_difficulty == 2 and task.problem_key is tasks.problem_key
  ex = task.generate(0, 4, difficulty=2)
  assert ex == tasks.search_qa(0, 4) and ex.task == 'search_qa'
  assert set(ex.prompt + ex.answer + ''.join(ex.meta['corpus'])) <= set(task.chars)
