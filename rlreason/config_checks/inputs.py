"""Start-up checks of what a run reads: model, tokenizer, data files and the reward.

They run in `config.validate`, before anything is built or compiled, so a typo in a path or a
reward that cannot be imported stops the run in a second with the offending field named
(instead of a crash after minutes, or a run that trains on reward 0). Remote paths (gs://,
any `scheme://`) are not checked here: their reader reports them.

Not here: the data files' full contents (tasks/data.py names the file and line of a bad
record when it loads them) and the model's shapes (weights.py).
"""

import pathlib


def _local(path: str) -> bool:
  return bool(path) and '://' not in path


def _exists(path: str) -> bool:
  if path.startswith('pkg:'):
    from rlreason.model import gguf_file
    try:
      gguf_file.resolve(path)
    except Exception:  # pylint: disable=broad-except  (its message is in the one below)
      return False
    return True
  return pathlib.Path(path).expanduser().exists()


def check_paths(c, check) -> None:
  """model.path, tokenizer.path (or the model's, which it follows when empty), data files."""
  if c.model.init == 'hf' and _local(c.model.path):
    check(_exists(c.model.path), f'model.path={c.model.path!r} does not exist.')
  if c.tokenizer.kind == 'hf':
    path = c.tokenizer.path or c.model.path
    check(bool(path), "tokenizer.kind='hf' needs tokenizer.path (or model.path, which it "
                      'follows when empty).')
    if _local(path) and path != c.model.path:
      check(_exists(path), f'tokenizer.path={path!r} does not exist.')
  if c.data.source in ('jsonl', 'parquet'):
    from rlreason.tasks import data
    try:
      data.record_format(c.data.format)
    except ValueError as e:
      check(False, str(e))
    for field in ('path', 'eval_path'):
      path = c.data[field]
      if _local(path):
        check(pathlib.Path(path).expanduser().is_file(),
              f'data.{field}={path!r} is not a file.')


def check_reward(c, check) -> None:
  """A user's reward ('module:function' or 'file.py:function') imports and runs on the first
  example of the data file (its gold answer as the completion) without raising."""
  from rlreason.verifiers import registry
  name = c.verifier.name
  try:
    registry.check_name(name)  # An ill-formed name is reported by validate itself.
  except ValueError:
    return
  if name in registry.VERIFIERS:
    return
  try:
    registry.check_importable(name)
  except ValueError as e:
    check(False, f'verifier.name: {e}')
    return
  item = _first_item(c)
  if item is None:
    return
  try:
    registry.probe(name, item)
  except ValueError as e:
    check(False, f'verifier.name: {e}')


def _first_item(c):
  """The verifier item of the run's first example, or None if it cannot be read here."""
  from rlreason import tasks
  from rlreason.tasks import data
  from rlreason.tasks.example import verifier_item
  example = None
  try:
    if c.data.source == 'task' and c.data.task in tasks.TASKS:
      example = tasks.get_task(c.data.task).generate(0, 0, difficulty=c.data.difficulty,
                                                     **dict(c.data.task_options))
    elif c.data.source == 'jsonl' and _local(c.data.path):
      records = data._jsonl_records(pathlib.Path(c.data.path))  # pylint: disable=protected-access
      example = data.record_to_example(records[0][1], data.record_format(c.data.format),
                                       default_id='first') if records else None
  except (ValueError, IndexError, KeyError, OSError):
    return None  # The loader names the problem when the run reads the file.
  if example is None:
    return None
  return verifier_item(example, example.solution or example.answer, num_tokens=1, max_len=2,
                       cache_len=1, penalty_factor=1.0)
