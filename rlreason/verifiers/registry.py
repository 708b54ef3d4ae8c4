"""Verifier names -> functions, and the lookup the pool's workers use.

A verifier is `fn(item: Mapping) -> Verdict` (see verdict.py for the item contract). Besides
the names below, `get_verifier` accepts "package.module:function", so a task can ship its
own checker without editing this table; the module is imported inside the worker.

Not here: the `judge` reward. It samples a model with rlreason's JAX sampler, so it lives
beside this package (which never imports JAX) and meets these scores in the reward
composition (composition.py) as one more named component.
"""

import importlib
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
  """Raises ValueError, listing the known names, unless `name` can be resolved."""
  if name in VERIFIERS or (isinstance(name, str) and name.count(':') == 1 and
                           all(name.split(':'))):
    return
  raise ValueError(f'unknown verifier {name!r}; known: {", ".join(sorted(VERIFIERS))} '
                   '(or "package.module:function")')


def get_verifier(name: str) -> Verifier:
  check_name(name)
  if name in VERIFIERS:
    return VERIFIERS[name]
  module, attr = name.split(':')
  return getattr(importlib.import_module(module), attr)
