"""Plain data across the sandbox boundary: tagged JSON that only holds values, never objects.

  data = encode_value((1, {'a': [2.5]}))  # {'tuple': [{'int': '1'}, {'dict': [...]}]}
  decode_value(json.loads(json.dumps(data))) == (1, {'a': [2.5]})

Plain data is None, bool, int, float, complex, str, bytes, and lists, tuples, dicts, sets
and frozensets of them. Subclasses of the plain types are read through the base type's own
C-level accessors, so an object whose `__eq__`, `__iter__` or `__str__` lies is seen as the
data it stores; anything else (a class instance, a function, a generator) raises TypeError.

This module imports nothing and defines only these two functions and their tables: its whole
source is sent into the sandbox (python_tests' op runner), and test_probes' trusted evaluator
imports it outside any package __init__.
"""


def encode_value(value, _depth=0, _budget=None):
  """Plain data as JSON-able tagged data; TypeError for anything else, ValueError if too big."""
  budget = [100_000] if _budget is None else _budget
  budget[0] -= 1
  if budget[0] < 0 or _depth > 64:
    raise ValueError('value too large or too deeply nested to cross the sandbox boundary')
  enc = lambda v: encode_value(v, _depth + 1, budget)  # pylint: disable=unnecessary-lambda-assignment
  if value is None or value is True or value is False:
    return value
  if isinstance(value, int):
    return {'int': int.__repr__(int.__index__(value))}
  if isinstance(value, float):
    return {'float': float.__repr__(float.__float__(value))}
  if isinstance(value, complex):
    c = complex.__complex__(value)
    return {'complex': [float.__repr__(c.real), float.__repr__(c.imag)]}
  if isinstance(value, str):
    return str.__str__(value)
  if isinstance(value, bytes):
    return {'bytes': bytes.hex(bytes.__bytes__(value))}
  if isinstance(value, list):
    return [enc(v) for v in list.__iter__(value)]
  if isinstance(value, tuple):
    return {'tuple': [enc(v) for v in tuple.__iter__(value)]}
  if isinstance(value, frozenset):
    return {'frozenset': [enc(v) for v in frozenset.__iter__(value)]}
  if isinstance(value, set):
    return {'set': [enc(v) for v in set.__iter__(value)]}
  if isinstance(value, dict):
    return {'dict': [[enc(k), enc(v)] for k, v in dict.items(value)]}
  raise TypeError(f'a {type(value).__name__} cannot cross the sandbox boundary '
                  '(plain data only)')


_DECODERS = {
    'int': int, 'float': float, 'bytes': bytes.fromhex,
    'complex': lambda parts: complex(float(parts[0]), float(parts[1])),
}
_CONTAINERS = {'tuple': tuple, 'set': set, 'frozenset': frozenset}


def decode_value(data):
  """The inverse of encode_value, from untrusted JSON; malformed data raises ValueError."""
  if data is None or isinstance(data, (bool, str)):
    return data
  if isinstance(data, list):
    return [decode_value(v) for v in data]
  if not isinstance(data, dict) or len(data) != 1:
    raise ValueError(f'malformed value {str(data)[:80]}')
  (tag, body), = data.items()
  try:
    if tag in _DECODERS:
      return _DECODERS[tag](body)
    if tag in _CONTAINERS:
      return _CONTAINERS[tag](decode_value(v) for v in body)
    if tag == 'dict':
      return {decode_value(k): decode_value(v) for k, v in body}
  except (TypeError, ValueError, OverflowError) as e:
    raise ValueError(f'malformed {tag}: {e}') from None
  raise ValueError(f'unknown tag {tag!r}')
