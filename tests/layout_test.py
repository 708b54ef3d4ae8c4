"""The package's shape: every module imports, imports run downward, verifiers stay JAX-free."""

import ast
import collections
import importlib
import pathlib
import pkgutil
import subprocess
import sys

import pytest

import rlreason

PACKAGE = pathlib.Path(rlreason.__file__).parent
# Which areas (subpackages, or top-level modules) each area may import. rl/ is the top of
# the loop; dynamics/ and main use it; nothing else does.
ALLOWED = {
    'verifiers': set(),
    'envs': {'tasks', 'verifiers'},
    'structs': set(),
    'model': {'structs'},
    'objectives': {'model', 'structs'},  # vocab_parallel reads model.sharding's rule tables.
    'tasks': {'verifiers'},
    'multihost': {'verifiers'},
    # envs/ is host-side Python below rollout/ (no JAX, no model): CLEANER's rollback reads
    # the tools' declared error classes from its registry.
    'rollout': {'envs', 'model', 'structs', 'tasks', 'verifiers'},
    'config': {'config_checks'},
    'config_checks': {'envs', 'model', 'objectives', 'rollout', 'tasks', 'verifiers'},
    # analysis/ (logit lens, patching, perplexity) sits below rl/: rl logs its perplexity split.
    'analysis': {'model', 'objectives', 'structs'},
    'rl': {'analysis', 'config', 'envs', 'model', 'multihost', 'objectives', 'rollout', 'structs',
           'tasks', 'verifiers'},
    'dynamics': {'model', 'objectives', 'rl', 'structs', 'tasks'},
    'host_malloc': set(),  # Standard library only: runs before anything else is imported.
    'main': {'config', 'host_malloc', 'model', 'multihost', 'rl'},
    'episodes': {'envs'},
}


def test_every_module_imports():
  names = [m.name for m in pkgutil.walk_packages(rlreason.__path__, 'rlreason.')]
  assert len(names) > 50
  for name in names:
    importlib.import_module(name)


def imports_by_area() -> dict[str, set[str]]:
  found = collections.defaultdict(set)
  for path in PACKAGE.rglob('*.py'):
    parts = path.relative_to(PACKAGE).parts
    area = parts[0] if len(parts) > 1 else path.stem
    for node in ast.walk(ast.parse(path.read_text())):
      if isinstance(node, ast.ImportFrom) and (node.module or '').startswith('rlreason'):
        modules = [f'{node.module}.{alias.name}' for alias in node.names]
      elif isinstance(node, ast.Import):
        modules = [alias.name for alias in node.names if alias.name.startswith('rlreason')]
      else:
        continue
      found[area].update(m.split('.')[1] for m in modules if m.count('.') >= 1)
  return {area: deps - {area} for area, deps in found.items()}


def test_imports_run_downward():
  found = imports_by_area()
  assert set(found) - {'__init__'} <= set(ALLOWED), set(found) - set(ALLOWED)
  for area, deps in found.items():
    assert deps <= ALLOWED.get(area, set()), (area, deps - ALLOWED.get(area, set()))


@pytest.mark.parametrize('package', ['verifiers', 'envs'])
def test_host_side_packages_import_neither_jax_nor_the_model(package):
  code = (f'import pkgutil, importlib, sys, rlreason.{package} as p\n'
          f'for m in pkgutil.walk_packages(p.__path__, "rlreason.{package}."):\n'
          '  try:\n'
          '    importlib.import_module(m.name)\n'
          '  except ImportError as e:\n'  # an optional dependency (e.g. bm25s) is not installed
          '    print("skipped", m.name, e, file=sys.stderr)\n'
          'print(sorted(k for k in sys.modules if k.split(".")[0] in ("jax", "flax") or '
          'k.startswith(("rlreason.model", "rlreason.rl", "rlreason.rollout"))))')
  run = subprocess.run([sys.executable, '-c', code], capture_output=True, text=True,
                       timeout=300, check=True)
  assert run.stdout.strip() == '[]', run.stdout
