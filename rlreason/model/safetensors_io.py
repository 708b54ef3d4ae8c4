"""Safetensors files read by hand: an 8-byte header length, a JSON header, raw little-endian
bytes (model/weights.py maps the tensors to and from transformer.py params).

Parsed here rather than with `safe_open(framework='numpy')`, which has no bfloat16;
`ml_dtypes.bfloat16` stands in for it. Every header entry's byte range is checked before any
tensor is read, so a truncated download fails at once.
"""

import json
import math
import os
import pathlib
from typing import Any, NamedTuple

import ml_dtypes
import numpy as np

DTYPES = {'F64': np.float64, 'F32': np.float32, 'F16': np.float16, 'BF16': ml_dtypes.bfloat16}
DTYPE_NAMES = {np.dtype(t): name for name, t in DTYPES.items()}
# Bytes per element of every safetensors dtype, also those we do not load (checked anyway).
ITEMSIZE = {'BOOL': 1, 'U8': 1, 'I8': 1, 'F8_E5M2': 1, 'F8_E4M3': 1, 'I16': 2, 'U16': 2,
            'F16': 2, 'BF16': 2, 'I32': 4, 'U32': 4, 'F32': 4, 'I64': 8, 'U64': 8, 'F64': 8}
SINGLE, INDEX = 'model.safetensors', 'model.safetensors.index.json'


class CheckpointError(ValueError):
  """A checkpoint or its config that this module cannot read or write."""


class Entry(NamedTuple):
  """Where one tensor lives: its file, safetensors dtype name, shape and byte range."""
  file: pathlib.Path
  dtype: str
  shape: tuple[int, ...]
  begin: int
  end: int


def read_json(raw, file: pathlib.Path):
  try:
    return json.loads(raw)
  except ValueError as e:
    raise CheckpointError(f'{file}: invalid JSON ({e}).') from None


def read_header(file: pathlib.Path) -> dict[str, Entry]:
  with open(file, 'rb') as fh:
    file_bytes = os.fstat(fh.fileno()).st_size
    raw = fh.read(8)
    size = int.from_bytes(raw, 'little') if len(raw) == 8 else -1
    if not 0 < size <= min(100 * 2**20, file_bytes - 8):
      raise CheckpointError(f'{file}: not a safetensors file (header size {size}, '
                            f'file size {file_bytes}).')
    header = read_json(fh.read(size), file)
  if not isinstance(header, dict):
    raise CheckpointError(f'{file}: the header is not a JSON object.')
  start = 8 + size
  entries = {name: _header_entry(file, name, h, start, file_bytes - start)
             for name, h in header.items() if name != '__metadata__'}
  _check_overlaps(file, entries)
  return entries


def _header_entry(file: pathlib.Path, name: str, h: Any, start: int, data_bytes: int) -> Entry:
  """One tensor's Entry, once its byte range is known to lie in the data section.

  Checked here, before any tensor is read, so that a truncated download fails at once
  instead of after the tensors before the cut were placed on the devices.
  """
  try:
    dtype, shape, (begin, end) = h['dtype'], tuple(h['shape']), h['data_offsets']
  except (TypeError, KeyError, ValueError):
    raise CheckpointError(f'{file}: tensor {name}: malformed header entry {h!r}.') from None
  if not all(isinstance(n, int) and n >= 0 for n in (*shape, begin, end)):
    raise CheckpointError(f'{file}: tensor {name}: malformed shape {list(shape)} or '
                          f'data_offsets {[begin, end]}.')
  if begin > end:
    raise CheckpointError(f'{file}: tensor {name}: data_offsets {[begin, end]} end before '
                          'they begin.')
  if end > data_bytes:
    raise CheckpointError(f'{file}: tensor {name}: data_offsets {[begin, end]} run past the end '
                          f'of the data section ({data_bytes} bytes); is the file truncated?')
  if dtype in ITEMSIZE and end - begin != ITEMSIZE[dtype] * math.prod(shape):
    raise CheckpointError(f'{file}: tensor {name}: data_offsets {[begin, end]} hold '
                          f'{end - begin} bytes, but {dtype} {list(shape)} needs '
                          f'{ITEMSIZE[dtype] * math.prod(shape)}.')
  return Entry(file, dtype, shape, start + begin, start + end)


def _check_overlaps(file: pathlib.Path, entries: dict[str, Entry]):
  spans = sorted((e.begin, e.end, name) for name, e in entries.items() if e.end > e.begin)
  for (_, end, first), (begin, _, second) in zip(spans, spans[1:]):
    if begin < end:
      raise CheckpointError(f'{file}: tensors {first} and {second} overlap.')


def read_tensor(e: Entry) -> np.ndarray:
  dtype = np.dtype(DTYPES[e.dtype])
  out = np.empty(e.shape, dtype)  # _header_entry checked that the byte range fits.
  with open(e.file, 'rb') as fh:
    fh.seek(e.begin)
    if fh.readinto(out.reshape(-1).view(np.uint8)) != out.nbytes:
      raise CheckpointError(f'{e.file}: truncated while reading bytes {e.begin}..{e.end}.')
  return out


def index_checkpoint(path: pathlib.Path) -> dict[str, Entry]:
  """Every tensor's Entry, from the single file or the index and its shards."""
  if (path / SINGLE).is_file():
    files, weight_map = [path / SINGLE], None
  elif (path / INDEX).is_file():
    weight_map = read_json((path / INDEX).read_text(), path / INDEX)['weight_map']
    files = [path / name for name in sorted(set(weight_map.values()))]
    missing = [str(f) for f in files if not f.is_file()]
    if missing:
      raise CheckpointError(f'{path / INDEX} points at missing shard files: {missing}.')
  else:
    extra = ' (only safetensors are read, not pytorch_model*.bin)' if any(
        path.glob('pytorch_model*.bin')) else ''
    raise CheckpointError(f'{path}: no {SINGLE} or {INDEX}{extra}.')
  entries = {}
  for file in files:
    for name, e in read_header(file).items():
      if name in entries:
        raise CheckpointError(f'{name} is in both {entries[name].file} and {file}.')
      entries[name] = e
  wrong = sorted(n for n, f in (weight_map or {}).items()
                 if n not in entries or entries[n].file.name != f)
  if wrong:
    raise CheckpointError(f'{path / INDEX}: these tensors are not in the shards it names: {wrong}.')
  return entries
