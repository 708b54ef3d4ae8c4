"""Prompt sources as grain pipelines whose iterator state is checkpointable.

Three kinds of source, one output: a `grain.IterDataset` of `tasks.Example`, and `batched`
turns it into lists of B examples per RL step (tokenization happens in train.py).

  synthetic_stream(task, ...)    infinite stream of train-split problems of a synthetic task
  held_out_set(task, n, ...)     a fixed list of n distinct held-out problems
  load_jsonl / load_parquet      GSM8K-, MATH- and plain question/answer files (FORMATS)
  load_countdown                 the d1 Countdown file ({"input": "30,100,93", "output": "23"})
  build_tfds / tfds_dataset      Examples written as a tfds dataset in array_record files and
                                 read back with tfds.data_source, without TensorFlow
  examples_dataset               a list (or MapDataset) of Examples -> sharded, shuffled stream

Iterators are plain grain iterators: `it.get_state()` is a small JSON-able dict that
checkpoint.py saves, and `it.set_state(state)` on a fresh iterator of the same pipeline resumes
with exactly the elements the old one had yet to yield. Every pipeline takes `shard_index` and
`shard_count` (pass `jax.process_index()` and `jax.process_count()`), so each host reads its
own disjoint slice.

Synthetic problem i of a host is drawn from (seed, i): the stream is random by construction,
so it needs no shuffle buffer, and it skips the problems `tasks.split_of` holds out.

Not here: tokenization, prompt templates, prompt scheduling (HeaPA's pool: prompt_schedule.py),
multiprocess reading (prompts are small; threads would only fight over the GIL).
"""

import dataclasses
import functools
import json
import sys
import zlib
from pathlib import Path
from typing import Any, Mapping, Sequence

import grain
import numpy as np
import pyarrow.parquet as pq
import tensorflow_datasets as tfds

from rlreason import tasks
from rlreason.tasks import countdown

# Sources are in memory or cheap to generate: reader threads would only contend for the GIL.
_READ_OPTIONS = grain.ReadOptions(num_threads=0, prefetch_buffer_size=0)


def _check_shard(shard_index: int, shard_count: int) -> None:
  if not 0 <= shard_index < shard_count:
    raise ValueError(f'shard_index={shard_index} must be in [0, shard_count={shard_count}).')


def batched(ds: grain.IterDataset, batch_size: int, *,
            drop_remainder: bool = True) -> grain.IterDataset:
  """Lists of `batch_size` Examples: the B prompts of one step."""
  return ds.batch(batch_size, drop_remainder=drop_remainder, batch_fn=list)


# ---------------------------------------------------------------------------- synthetic tasks


def _draw(index: int, *, task: str, seed: int, difficulties: tuple[int, ...],
          weights: tuple[float, ...] | None, options: Mapping[str, Any]) -> tasks.Example:
  difficulty = difficulties[0]
  if len(difficulties) > 1:
    # Its own generator, so the choice of difficulty does not shift the problem's draws.
    rng = np.random.default_rng([zlib.crc32(b'difficulty'), seed, index])
    difficulty = difficulties[rng.choice(len(difficulties), p=weights)]
  return tasks.get_task(task).generate(seed, index, difficulty=difficulty, **options)


def _in_train(example: tasks.Example, *, held_out_fraction: float) -> bool:
  return tasks.split_of(example, held_out_fraction=held_out_fraction) == tasks.TRAIN


def synthetic_stream(task: str, *, seed: int, difficulty: int | Sequence[int] | None = None,
                     weights: Sequence[float] | None = None,
                     options: Mapping[str, Any] | None = None,
                     held_out_fraction: float = tasks.HELD_OUT_FRACTION,
                     shard_index: int = 0, shard_count: int = 1) -> grain.IterDataset:
  """An infinite stream of train-split problems of `task`.

  Host `shard_index` draws the problems of indices shard_index, shard_index + shard_count, ...
  A sequence of difficulties mixes them (equally, or by `weights`), e.g. the {L, 3L} horizon
  mixtures of the implicit-curriculum experiments. `options` go to the task's generator
  (`min_carries`, `group`, ...). Train and evaluation must agree on `held_out_fraction`.
  """
  spec = tasks.get_task(task)
  _check_shard(shard_index, shard_count)
  if difficulty is None:
    difficulty = spec.default_difficulty
  if isinstance(difficulty, (int, np.integer)):
    difficulty = (difficulty,)
  difficulties = tuple(int(d) for d in difficulty)
  if weights is not None:
    if len(weights) != len(difficulties):
      raise ValueError(f'{len(weights)} weights for {len(difficulties)} difficulties.')
    weights = tuple(float(w) / sum(weights) for w in weights)
  draw = functools.partial(_draw, task=task, seed=seed, difficulties=difficulties,
                           weights=weights, options=dict(options or {}))
  ds = grain.MapDataset.range(sys.maxsize)[shard_index::shard_count].map(draw)
  ds = ds.filter(functools.partial(_in_train, held_out_fraction=held_out_fraction))
  return ds.to_iter_dataset(_READ_OPTIONS)


def held_out_set(task: str, n: int, *, seed: int, difficulty: int | None = None,
                 options: Mapping[str, Any] | None = None,
                 held_out_fraction: float = tasks.HELD_OUT_FRACTION) -> list[tasks.Example]:
  """The first n distinct held-out problems drawn from `seed` (same list on every host)."""
  spec = tasks.get_task(task)
  difficulty = spec.default_difficulty if difficulty is None else difficulty
  if not 0.0 < held_out_fraction < 1.0:
    raise ValueError(f'held_out_fraction={held_out_fraction} must be in (0, 1).')
  examples, seen = [], set()
  max_draws = int(20 * n / held_out_fraction) + 1000
  for index in range(max_draws):
    example = spec.generate(seed, index, difficulty=difficulty, **dict(options or {}))
    key = spec.problem_key(example)
    split = tasks.split_of(example, held_out_fraction=held_out_fraction)
    if key in seen or split != tasks.HELD_OUT:
      continue
    seen.add(key)
    examples.append(example)
    if len(examples) == n:
      return examples
  raise ValueError(f'only {len(examples)} distinct held-out {task} problems in {max_draws} '
                   f'draws at difficulty {difficulty}; the problem space is too small for n={n}.')


# ----------------------------------------------------------------------------- JSONL, Parquet


@dataclasses.dataclass(frozen=True)
class RecordFormat:
  """Where the fields of an Example live in a JSONL or Parquet record.

  answer_after_hashes: the answer field is a GSM8K worked solution ending in '#### <number>';
    the number (commas removed) becomes `answer` and the whole text `solution`.
  Fields not named here go to `meta`.
  """
  task: str
  question_field: str = 'question'
  answer_field: str = 'answer'
  solution_field: str | None = None
  id_field: str | None = None
  difficulty_field: str | None = None
  answer_after_hashes: bool = False


GSM8K = RecordFormat(task='gsm8k', answer_after_hashes=True)
MATH = RecordFormat(task='math', question_field='problem', solution_field='solution',
                    id_field='unique_id', difficulty_field='level')
# A user's own data: {"question": ..., "answer": <the final answer>}; any other fields go to meta.
PLAIN = RecordFormat(task='plain')
FORMATS = {'gsm8k': GSM8K, 'math': MATH, 'plain': PLAIN}


def record_format(name: str) -> RecordFormat:
  """The RecordFormat named by `data.format`; a ValueError lists the known names."""
  if name not in FORMATS:
    raise ValueError(f'data.format={name!r} is not a known format; known: '
                     + ', '.join(f'{k!r} (fields: {", ".join(required_fields(f))})'
                                 for k, f in FORMATS.items()))
  return FORMATS[name]


def required_fields(fmt: RecordFormat) -> tuple[str, ...]:
  """The fields every record must have; the solution, id and difficulty fields are optional."""
  return (fmt.question_field, fmt.answer_field)


def _text(value: Any) -> str:
  if isinstance(value, float) and value.is_integer():
    value = int(value)  # SVAMP-style 51.0 -> '51'.
  return value if isinstance(value, str) else str(value)


def record_to_example(record: Mapping[str, Any], fmt: RecordFormat, *,
                      default_id: str) -> tasks.Example:
  """One file record as an Example; raises ValueError naming `default_id` if malformed."""
  if not isinstance(record, Mapping):
    raise ValueError(f'{default_id}: a record must be a JSON object, got '
                     f'{type(record).__name__}.')
  missing = [f for f in required_fields(fmt) if f not in record]
  if missing:
    raise ValueError(f'{default_id}: missing field(s) {missing} of format {fmt.task!r} '
                     f'(needs {list(required_fields(fmt))}); the record has {sorted(record)}.')
  answer = _text(record[fmt.answer_field])
  solution = record.get(fmt.solution_field) if fmt.solution_field else None
  solution = None if solution is None else _text(solution)
  if fmt.answer_after_hashes:
    if '####' not in answer:
      raise ValueError(
          f'{default_id}: no "####" in field {fmt.answer_field!r} (format {fmt.task!r} reads '
          'a GSM8K worked solution ending in "#### <answer>"; for a bare final answer use '
          "data.format='plain').")
    solution = answer
    answer = answer.rsplit('####', 1)[1].strip().replace(',', '')
  used = {fmt.question_field, fmt.answer_field, fmt.solution_field, fmt.id_field,
          fmt.difficulty_field}
  example_id = record.get(fmt.id_field) if fmt.id_field else None
  difficulty = record.get(fmt.difficulty_field) if fmt.difficulty_field else None
  try:
    difficulty = int(difficulty or 0)
  except (TypeError, ValueError):
    raise ValueError(f'{default_id}: field {fmt.difficulty_field!r}={difficulty!r} is not an '
                     'integer.') from None
  return tasks.Example(
      id=default_id if example_id is None else _text(example_id),
      prompt=_text(record[fmt.question_field]),
      answer=answer,
      solution=solution,
      task=fmt.task,
      difficulty=difficulty,
      meta={k: v for k, v in record.items() if k not in used},
  )


def _jsonl_records(path: Path) -> list[tuple[int, Any]]:
  """(1-based line number, parsed record) for every non-blank line."""
  try:
    with path.open(encoding='utf-8') as f:
      lines = list(f)
  except (OSError, UnicodeDecodeError) as e:
    raise ValueError(f'cannot read data file {path}: {e}') from None
  records = []
  for number, line in enumerate(lines, 1):
    if line.strip():
      try:
        records.append((number, json.loads(line)))
      except json.JSONDecodeError as e:
        raise ValueError(f'{path}:{number}: not a JSON object ({e.msg}).') from None
  return records


def _examples(path: Path, numbered_records, fmt: RecordFormat,
              unit: str) -> list[tasks.Example]:
  examples = []
  for i, (number, record) in enumerate(numbered_records):
    try:
      examples.append(record_to_example(record, fmt, default_id=f'{fmt.task}/{path.stem}/{i}'))
    except ValueError as e:
      raise ValueError(f'{path}:{unit} {number}: {e}') from None
  if not examples:
    raise ValueError(f'data file {path} holds no examples.')
  return examples


def load_jsonl(path: str | Path, fmt: RecordFormat) -> list[tasks.Example]:
  """Every line of a JSONL file as an Example; ids default to '<task>/<file stem>/<line>'.

  Errors name the file and the 1-based line; an empty file is an error."""
  path = Path(path)
  return _examples(path, _jsonl_records(path), fmt, 'line')


def load_parquet(path: str | Path, fmt: RecordFormat) -> list[tasks.Example]:
  """Every row of a Parquet file as an Example; ids default to '<task>/<file stem>/<row>'."""
  path = Path(path)
  try:
    rows = pq.read_table(path).to_pylist()
  except (OSError, ValueError) as e:
    raise ValueError(f'cannot read data file {path}: {e}') from None
  return _examples(path, enumerate(rows), fmt, 'row')


def load_countdown(path: str | Path) -> list[tasks.Example]:
  """The d1 Countdown JSONL file; each problem gets a reference expression by search."""
  path = Path(path)
  return [countdown.from_record([int(x) for x in r['input'].split(',')], int(r['output']),
                                example_id=f'countdown/{path.stem}/{i}')
          for i, (_, r) in enumerate(_jsonl_records(path))]


def examples_dataset(source: Sequence[tasks.Example] | grain.MapDataset, *, seed: int | None,
                     num_epochs: int | None = None, shard_index: int = 0,
                     shard_count: int = 1) -> grain.IterDataset:
  """A finite source as a stream: this host's shard, reshuffled each epoch (seed=None: in order).

  Every shard gets len(source) // shard_count examples (the remainder is dropped), so hosts
  run out of data at the same step. num_epochs=None repeats forever.
  """
  _check_shard(shard_index, shard_count)
  ds = source if isinstance(source, grain.MapDataset) else grain.MapDataset.source(list(source))
  if len(ds) < shard_count:
    raise ValueError(f'{len(ds)} examples cannot fill {shard_count} shards.')
  ds = ds[:len(ds) // shard_count * shard_count][shard_index::shard_count]
  if seed is not None:
    ds = ds.shuffle(seed)
  return ds.repeat(num_epochs).to_iter_dataset(_READ_OPTIONS)


# ------------------------------------------------------------------------ tfds, array_record

_FEATURES = {name: tfds.features.Text() for name in
             ('id', 'prompt', 'answer', 'solution', 'task', 'meta')}


class _ExampleRecords(tfds.core.GeneratorBasedBuilder, skip_registration=True):
  """Examples as a tfds dataset. Not registered: the files on disk are the dataset."""
  VERSION = tfds.core.Version('1.0.0')

  def __init__(self, *, name: str, splits: Mapping[str, Sequence[tasks.Example]], **kwargs):
    self.name = name
    self._splits = splits
    super().__init__(**kwargs)

  def _info(self) -> tfds.core.DatasetInfo:
    features = tfds.features.FeaturesDict(
        _FEATURES | {'difficulty': tfds.features.Scalar(dtype=np.int64)})
    return tfds.core.DatasetInfo(builder=self, features=features, disable_shuffling=True)

  def _split_generators(self, dl_manager):
    del dl_manager  # Nothing to download.
    return {split: self._generate_examples(examples) for split, examples in self._splits.items()}

  def _generate_examples(self, examples):
    for i, ex in enumerate(examples):
      # An absent solution is stored as ''; an empty worked solution means nothing anyway.
      yield i, {'id': ex.id, 'prompt': ex.prompt, 'answer': ex.answer,
                'solution': ex.solution or '', 'task': ex.task, 'difficulty': ex.difficulty,
                'meta': json.dumps(ex.meta, sort_keys=True)}


def build_tfds(name: str, splits: Mapping[str, Sequence[tasks.Example]], *,
               data_dir: str | Path) -> Path:
  """Writes `splits` (e.g. {'train': examples}) as array_record files; returns their folder.

  Refuses to overwrite: a prepared dataset of the same name and version must be removed first.
  """
  builder = _ExampleRecords(name=name, splits=splits, data_dir=str(data_dir),
                            file_format='array_record')
  if builder.is_prepared():
    raise FileExistsError(f'tfds dataset {name!r} already prepared in {builder.data_dir}.')
  builder.download_and_prepare()
  return Path(builder.data_dir)


def _from_record(record: Mapping[str, Any]) -> tasks.Example:
  text = {k: record[k].decode('utf-8') for k in _FEATURES}
  return tasks.Example(id=text['id'], prompt=text['prompt'], answer=text['answer'],
                       solution=text['solution'] or None, task=text['task'],
                       difficulty=int(record['difficulty']), meta=json.loads(text['meta']))


def tfds_dataset(name: str, *, data_dir: str | Path, split: str) -> grain.MapDataset:
  """A dataset written by `build_tfds`, random-access through tfds.data_source (no TensorFlow).

  Feed it to `examples_dataset` for a sharded, shuffled stream.
  """
  source = tfds.data_source(name, data_dir=str(data_dir), split=split)
  return grain.MapDataset.source(source).map(_from_record)
