"""Verifier names -> functions, and the lookup the pool's workers use.

A verifier is `fn(item: Mapping) -> Verdict` (see verdict.py for the item contract). Besides
the names below, `get_verifier` accepts a user's reward as "package.module:function" or
"path/to/file.py:function", so a task can ship its own checker without editing this table; it
is imported inside the worker. A user's function may return a number (or bool) instead of a
Verdict: reward > 0 counts as correct. `check_importable` and `probe` are the start-up checks:
the reward imports, and runs on one example without raising.

Not here: the `judge` reward. It samples a model with rlreason's JAX sampler, so it lives
beside this package (which never imports JAX) and meets these scores in the reward
composition (composition.py) as one more named component.
"""

import hashlib
import importlib
import importlib.util
import numbers
import pathlib
import sys
import traceback
from typing import Any, Callable, Mapping

from rlreason.verifiers import countdown
from rlreason.verifiers import math_answer
from rlreason.verifiers import overlong
from rlreason.verifiers import policy_recall
from rlreason.verifiers import prolog
from rlreason.verifiers import python_tests
from rlreason.verifiers import synthetic_tasks
from rlreason.verifiers import text_answer
from rlreason.verifiers import verdict

Verifier = Callable[[Mapping[str, Any]], verdict.Verdict]

VERIFIERS: dict[str, Verifier] = {
    'arithmetic': synthetic_tasks.verify_arithmetic,
    'countdown': countdown.verify_countdown,
    'exact': text_answer.verify_exact,
    'format': text_answer.verify_format,
    'group_composition': synthetic_tasks.verify_group_composition,
    'math': math_answer.verify_math,
    'overlong': overlong.verify_overlong,
    'policy_recall': policy_recall.verify_policy_recall,
    'policy_task': policy_recall.verify_policy_task,
    'prolog': prolog.verify_prolog,
    'python_tests': python_tests.verify_python_tests,
    'regex': text_answer.verify_regex,
}

# Verifiers that execute model-written code in the sandbox: a run using one checks the
# sandbox's isolation at start-up (config.validate).
RUNS_CODE = frozenset({'prolog', 'python_tests'})


def check_name(name: str) -> None:
  """Raises ValueError, listing the known names, unless `name` has a resolvable form."""
  if name in VERIFIERS or (isinstance(name, str) and name.count(':') == 1 and
                           all(name.split(':'))):
    return
  raise ValueError(f'unknown verifier {name!r}; known: {", ".join(sorted(VERIFIERS))} '
                   '(or "package.module:function", or "path/to/file.py:function")')


def _import_file(path: str):
  """The module at `path`, imported once per process under a name derived from the path."""
  resolved = pathlib.Path(path).expanduser().resolve()
  name = f'_rlreason_reward_{hashlib.sha1(str(resolved).encode()).hexdigest()[:12]}'
  if name in sys.modules:
    return sys.modules[name]
  if not resolved.is_file():
    raise ModuleNotFoundError(f'reward file {path} does not exist')
  spec = importlib.util.spec_from_file_location(name, resolved)
  module = importlib.util.module_from_spec(spec)
  sys.modules[name] = module
  try:
    spec.loader.exec_module(module)
  except BaseException:
    del sys.modules[name]
    raise
  return module


def _as_verdict(fn: Callable[[Mapping[str, Any]], Any]) -> Verifier:
  """A user's function, whose number (or bool) result becomes a Verdict (> 0: correct)."""
  def wrapped(item):
    result = fn(item)
    if isinstance(result, verdict.Verdict):
      return result
    if isinstance(result, (bool, numbers.Real)):
      return verdict.judged(float(result) > 0, reward=float(result))
    raise TypeError(f'reward {fn.__module__}.{fn.__qualname__} returned '
                    f'{type(result).__name__}; return a number or a Verdict')
  return wrapped


def get_verifier(name: str) -> Verifier:
  check_name(name)
  if name in VERIFIERS:
    return VERIFIERS[name]
  module_name, attr = name.split(':')
  if module_name.endswith('.py') or '/' in module_name:
    module = _import_file(module_name)
  else:
    module = importlib.import_module(module_name)
  fn = getattr(module, attr, None)
  if not callable(fn):
    raise AttributeError(f'{module_name} has no function {attr!r}')
  return _as_verdict(fn)


def check_importable(name: str) -> None:
  """Raises ValueError naming the reward and the cause unless `name` resolves to a function."""
  check_name(name)
  try:
    get_verifier(name)
  except Exception as e:  # The user's module may raise anything at import.
    hint = (' (is its module on PYTHONPATH, or give "path/to/file.py:function")'
            if isinstance(e, ModuleNotFoundError) else '')
    raise ValueError(f'verifier {name!r} cannot be loaded: {type(e).__name__}: {e}{hint}') from None


def probe(name: str, item: Mapping[str, Any]) -> None:
  """Runs the verifier on one item in this process; raises ValueError with its traceback's
  last lines if it raises or returns something that is not a reward."""
  check_importable(name)
  try:
    result = get_verifier(name)(item)
    if not isinstance(result, verdict.Verdict):
      raise TypeError(f'returned {type(result).__name__}, not a Verdict')
  except Exception as e:
    tail = ''.join(traceback.format_exception(e)[-3:]).strip()
    raise ValueError(f'verifier {name!r} fails on the first example ({type(e).__name__}: {e}):'
                     f'\n{tail}') from None
