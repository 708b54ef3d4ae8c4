"""Tests for rlreason.tasks.data: streams, splits, sharding, file loaders, tfds, exact resume."""

import ast
import fractions
import itertools
import json
import os
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from rlreason import tasks
from rlreason.envs import tasks as env_tasks  # noqa: F401 (registers the tool tasks)
from rlreason.tasks import data

REPO = Path(__file__).resolve().parents[1]
SHARED_DATA = Path(__file__).resolve().parents[2] / 'shared' / 'data'
needs_data = pytest.mark.skipif(
    not SHARED_DATA.is_dir(),
    reason=f'shared data not found at {SHARED_DATA} (checkout without ../shared next to it)')


def _take(iterator, n):
  return list(itertools.islice(iterator, n))


def _assert_resumes_exactly(ds, consumed, remaining):
  """Takes `consumed` elements, saves the state, and checks a fresh iterator continues alike."""
  it = iter(ds)
  _take(it, consumed)
  state = json.loads(json.dumps(it.get_state()))  # What a checkpoint would store.
  expected = _take(it, remaining)
  resumed = iter(ds)
  resumed.set_state(state)
  assert _take(resumed, remaining) == expected
  return expected


# ----------------------------------------------------------------------------- synthetic


def test_synthetic_stream_is_deterministic_and_seeded():
  ds = data.synthetic_stream('arithmetic', seed=7)
  first = _take(iter(ds), 40)
  assert _take(iter(data.synthetic_stream('arithmetic', seed=7)), 40) == first
  other = _take(iter(data.synthetic_stream('arithmetic', seed=8)), 40)
  assert not {e.prompt for e in first} & {e.prompt for e in other}
  assert all(e.difficulty == 5 for e in first)


# Fixed (collection order decides whether rlreason.envs.tasks has registered its tasks yet);
# search_qa's split is tested in envs_search_task_test.py (3000 corpora take ~10 s).
@pytest.mark.parametrize('name', ['arithmetic', 'calc_multiply', 'countdown',
                                  'group_composition', 'kb_qa', 'policy_recall', 'ts_query'])
def test_train_stream_and_held_out_set_never_overlap(name):
  train = _take(iter(data.synthetic_stream(name, seed=0)), 3000)
  held_out = data.held_out_set(name, 300, seed=0)
  task = tasks.get_task(name)
  train_keys = {task.problem_key(e) for e in train}
  held_keys = {task.problem_key(e) for e in held_out}
  assert len(held_keys) == 300  # Distinct...
  assert not train_keys & held_keys  # ...and never trained on,
  if name not in ('kb_qa', 'ts_query'):  # Their problem is the prompt with its graph/series.
    assert not {e.prompt for e in train} & {e.prompt for e in held_out}  # not even verbatim.
  assert data.held_out_set(name, 300, seed=0) == held_out


def test_difficulty_mixture_and_options():
  ds = data.synthetic_stream('group_composition', seed=0, difficulty=[2, 6], weights=[3, 1],
                             options={'group': 'Z7'})
  exs = _take(iter(ds), 2000)
  share = sum(e.difficulty == 2 for e in exs) / len(exs)
  assert abs(share - 0.75) < 4 * (0.75 * 0.25 / 2000)**0.5  # Binomial, 4 sd.
  assert {(e.meta['group'], e.meta['n']) for e in exs} == {('Z', 7)}
  hard = _take(iter(data.synthetic_stream('arithmetic', seed=0, difficulty=4,
                                          options={'min_carries': 4})), 50)
  assert all(e.meta['carries'] == 4 for e in hard)


def test_shards_split_the_indices_between_hosts():
  shards = [_take(iter(data.synthetic_stream('countdown', seed=3, shard_index=i, shard_count=3)),
                  100) for i in range(3)]
  ids = [{e.id for e in s} for s in shards]
  assert not ids[0] & ids[1] and not ids[1] & ids[2] and not ids[0] & ids[2]
  # Host i draws indices i, i + 3, ...: together they are the unsharded stream's problems.
  whole = {e.id for e in _take(iter(data.synthetic_stream('countdown', seed=3)), 150)}
  assert whole <= set().union(*ids)
  assert all(int(e.id.rsplit('/', 1)[1]) % 3 == i for i, s in enumerate(shards) for e in s)
  with pytest.raises(ValueError, match='shard_index'):
    data.synthetic_stream('countdown', seed=0, shard_index=3, shard_count=3)


def test_batched_synthetic_stream_resumes_exactly():
  ds = data.batched(data.synthetic_stream('policy_recall', seed=1, difficulty=[2, 5]), 16)
  batches = _assert_resumes_exactly(ds, consumed=5, remaining=7)
  assert all(len(b) == 16 and all(isinstance(e, tasks.Example) for e in b) for b in batches)


# ----------------------------------------------------------------------------- files


@needs_data
def test_gsm8k_jsonl():
  train = data.load_jsonl(SHARED_DATA / 'gsm8k' / 'train.jsonl', data.GSM8K)
  assert len(train) == 7473
  first = train[0]
  assert first.prompt.startswith('Natalia sold clips to 48 of her friends in April')
  assert first.answer == '72'
  assert first.solution.startswith('Natalia sold 48/2 = <<48/2=24>>24 clips in May.')
  assert first.solution.endswith('#### 72')
  assert (first.id, first.task, first.meta) == ('gsm8k/train/0', 'gsm8k', {})
  assert [e.answer for e in train[:3]] == ['72', '10', '5']
  assert train[345].answer == '1080'  # '#### 1,080' upstream.
  for e in train:
    float(e.answer)  # Every GSM8K answer is a number.
  assert len(data.load_jsonl(SHARED_DATA / 'gsm8k' / 'test.first_half.jsonl', data.GSM8K)) == 659


@needs_data
def test_math500_jsonl():
  exs = data.load_jsonl(SHARED_DATA / 'math500' / 'test.first_half.jsonl', data.MATH)
  assert len(exs) == 250 and len({e.id for e in exs}) == 250
  first = exs[0]
  assert first.id == 'test/precalculus/807.json'
  assert first.prompt.startswith('Convert the point $(0,3)$ in rectangular coordinates')
  assert first.answer == r'\left( 3, \frac{\pi}{2} \right)'
  assert r'\boxed' in first.solution
  assert (first.task, first.difficulty, first.meta) == ('math', 2, {'subject': 'Precalculus'})
  assert all(1 <= e.difficulty <= 5 and e.answer in e.solution for e in exs)


def _value(expression):
  node = ast.parse(expression, mode='eval').body

  def ev(n):
    if isinstance(n, ast.Constant):
      return fractions.Fraction(n.value), [n.value]
    (a, x), (b, y) = ev(n.left), ev(n.right)
    op = {ast.Add: a + b, ast.Sub: a - b, ast.Mult: a * b}.get(type(n.op))
    return (a / b if isinstance(n.op, ast.Div) else op), x + y

  return ev(node)


@needs_data
def test_countdown_jsonl():
  exs = data.load_countdown(SHARED_DATA / 'countdown' / 'countdown_cd3_test.jsonl')
  assert len(exs) == 256
  first = exs[0]
  assert (first.meta, first.answer) == ({'numbers': [30, 100, 93]}, '23')
  assert 'exactly once' in first.prompt and first.task == 'countdown' and first.difficulty == 3
  for e in exs:
    value, used = _value(e.solution)
    assert value == int(e.answer) and sorted(used) == sorted(e.meta['numbers'])


def test_parquet_matches_jsonl(tmp_path):
  rows = [{'question': 'What is 1,000 + 1?', 'answer': 'It is 1000+1 = 1001.\n#### 1,001'},
          {'question': 'Ünïcödé?', 'answer': 'yes\n#### 3'}]
  math_rows = [{'problem': 'x?', 'solution': r'$\boxed{2}$', 'answer': '2', 'level': 3,
                'subject': 'Algebra', 'unique_id': 'test/algebra/1.json'}]
  for name, records, fmt in (('gsm', rows, data.GSM8K), ('math', math_rows, data.MATH)):
    pq.write_table(pa.Table.from_pylist(records), tmp_path / f'{name}.parquet')
    (tmp_path / f'{name}.jsonl').write_text(''.join(json.dumps(r) + '\n' for r in records))
    from_parquet = data.load_parquet(tmp_path / f'{name}.parquet', fmt)
    assert from_parquet == data.load_jsonl(tmp_path / f'{name}.jsonl', fmt)
  gsm = data.load_parquet(tmp_path / 'gsm.parquet', data.GSM8K)
  assert [e.answer for e in gsm] == ['1001', '3'] and gsm[0].id == 'gsm8k/gsm/0'
  assert from_parquet[0].meta == {'subject': 'Algebra'} and from_parquet[0].difficulty == 3
  custom = data.RecordFormat(task='qa', question_field='q', answer_field='a')
  (tmp_path / 'bad.jsonl').write_text('{"q": "hi"}\n')
  with pytest.raises(ValueError, match=r"bad.jsonl:line 1: qa/bad/0: missing field\(s\) \['a'\]"):
    data.load_jsonl(tmp_path / 'bad.jsonl', custom)


def test_examples_dataset_shards_shuffles_and_resumes():
  exs = [tasks.get_task('arithmetic').generate(0, i, difficulty=3) for i in range(10)]
  shards = [list(data.examples_dataset(exs, seed=None, num_epochs=1, shard_index=i,
                                       shard_count=3)) for i in range(3)]
  assert [len(s) for s in shards] == [3, 3, 3]  # The 10th example is dropped: equal shards.
  assert sorted(e.id for s in shards for e in s) == sorted(e.id for e in exs[:9])
  ds = data.examples_dataset(exs, seed=5, num_epochs=3)
  epochs = [e.id for e in ds]
  assert len(epochs) == 30 and epochs[:10] != epochs[10:20]  # Reshuffled each epoch.
  assert all(sorted(epochs[i:i + 10]) == sorted(e.id for e in exs) for i in (0, 10, 20))
  # Resume across an epoch boundary, with a partial last batch.
  _assert_resumes_exactly(data.batched(ds, 4, drop_remainder=False), consumed=2, remaining=6)


# ----------------------------------------------------------------------------- tfds

_TFDS_SCRIPT = """
import dataclasses, json, pathlib, sys
from rlreason import tasks
from rlreason.tasks import data
examples = data.load_jsonl(sys.argv[1], data.GSM8K) + [
    tasks.get_task('policy_recall').generate(0, 1, difficulty=7),  # Nested meta.
    dataclasses.replace(tasks.get_task('arithmetic').generate(0, 1), solution=None)]
data.build_tfds('rlreason_gsm_probe', {'train': examples, 'test': examples[:2]},
                data_dir=sys.argv[2])
train = data.tfds_dataset('rlreason_gsm_probe', data_dir=sys.argv[2], split='train')
assert list(train) == examples, (list(train), examples)
ds = data.batched(data.examples_dataset(train, seed=0, shard_index=1, shard_count=2), 2)
it = iter(ds)
next(it)
state = json.loads(json.dumps(it.get_state()))
expected = [next(it) for _ in range(3)]
resumed = iter(ds)
resumed.set_state(state)
assert [next(resumed) for _ in range(3)] == expected
try:
  data.build_tfds('rlreason_gsm_probe', {'train': examples}, data_dir=sys.argv[2])
except FileExistsError:
  pass
else:
  raise AssertionError('rebuilt over a prepared dataset')
print(json.dumps({'tensorflow_loaded': 'tensorflow' in sys.modules,
                  'test_ids': [e.id for e in data.tfds_dataset(
                      'rlreason_gsm_probe', data_dir=sys.argv[2], split='test')],
                  'files': sorted(p.name for p in
                                  pathlib.Path(sys.argv[2]).rglob('*.array_record*'))}))
"""


def test_tfds_array_record_round_trip_without_tensorflow(tmp_path):
  rows = [{'question': f'Q{i}: Ünïcödé {i}?', 'answer': f'work {i}\n#### {i},000'}
          for i in range(9)]
  jsonl = tmp_path / 'toy.jsonl'
  jsonl.write_text(''.join(json.dumps(r) + '\n' for r in rows))
  # A fresh interpreter: this test process may have imported TensorFlow through other tests.
  out = subprocess.run([sys.executable, '-c', _TFDS_SCRIPT, str(jsonl), str(tmp_path / 'tfds')],
                       capture_output=True, text=True, timeout=300, cwd=REPO,
                       env={**os.environ, 'PYTHONPATH': str(REPO)})
  assert out.returncode == 0, out.stderr[-3000:]
  result = json.loads(out.stdout.strip().splitlines()[-1])
  assert result['tensorflow_loaded'] is False
  assert result['test_ids'] == ['gsm8k/toy/0', 'gsm8k/toy/1']
  assert result['files'] == ['rlreason_gsm_probe-test.array_record-00000-of-00001',
                             'rlreason_gsm_probe-train.array_record-00000-of-00001']
