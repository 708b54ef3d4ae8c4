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
# Which areas (subpackages, or top-level modules) each area may import. rl/ is the core of
# the loop and names no method; methods/ (the seed methods) sit on it and plug in through
# rl/extensions.py's registry; dynamics/ and main use them; nothing else does.
ALLOWED = {
    'verifiers': set(),
    'envs': {'tasks', 'verifiers', 'workdir_paths'},
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
    'rl': {'analysis', 'compile_cache', 'config', 'envs', 'model', 'multihost', 'objectives',
           'platforms', 'rollout', 'structs', 'tasks', 'verifiers',  # evaluate's command line.
           'workdir_paths'},
    'methods': {'analysis', 'config', 'envs', 'model', 'multihost', 'objectives', 'rl', 'rollout',
                'structs', 'tasks', 'verifiers', 'workdir_paths'},
    'dynamics': {'model', 'objectives', 'rl', 'structs', 'tasks'},
    'host_malloc': set(),  # Standard library only: runs before anything else is imported.
    'compile_cache': set(),  # JAX only: main, conftest and the sampler process turn it on.
    'platforms': set(),  # Standard library only: main calls it before JAX starts.
    'workdir_paths': set(),  # etils.epath only: every reader and writer of the workdir.
    'main': {'compile_cache', 'config', 'host_malloc', 'methods', 'model', 'multihost',
             'platforms', 'rl', 'workdir_paths'},
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


def module_graph() -> dict[str, set[str]]:
  """{module: the package's modules it imports}, over every module of the package, counting
  imports inside functions too; `from pkg import name` counts pkg.name when that is a module,
  else pkg."""
  modules = {}
  for path in PACKAGE.rglob('*.py'):
    parts = ('rlreason',) + path.relative_to(PACKAGE).with_suffix('').parts
    modules['.'.join(parts[:-1] if parts[-1] == '__init__' else parts)] = path
  graph = {}
  for name, path in modules.items():
    package = name if path.name == '__init__.py' else name.rpartition('.')[0]
    targets = set()
    for node in ast.walk(ast.parse(path.read_text())):
      if isinstance(node, ast.ImportFrom):
        base = node.module or ''
        if node.level:  # Relative: from the package, up level - 1.
          up = package.split('.')[:len(package.split('.')) - node.level + 1]
          base = '.'.join(up + ([base] if base else []))
        targets.update(f'{base}.{a.name}' if f'{base}.{a.name}' in modules else base
                       for a in node.names)
      elif isinstance(node, ast.Import):
        targets.update(a.name for a in node.names)
    found = set()
    for target in targets:
      while target and target not in modules:  # rlreason.x.y.attr -> rlreason.x.y
        target = target.rpartition('.')[0]
      if target and target != name:
        found.add(target)
    graph[name] = found
  return graph


def strongly_connected(graph: dict[str, set[str]]) -> list[list[str]]:
  """Tarjan's strongly connected components of more than one node (the import circles)."""
  index, low, stack, on_stack, circles = {}, {}, [], set(), []

  def visit(v):
    index[v] = low[v] = len(index)
    stack.append(v)
    on_stack.add(v)
    for w in sorted(graph.get(v, ())):
      if w not in index:
        visit(w)
        low[v] = min(low[v], low[w])
      elif w in on_stack:
        low[v] = min(low[v], index[w])
    if low[v] == index[v]:
      component = []
      while True:
        w = stack.pop()
        on_stack.discard(w)
        component.append(w)
        if w == v:
          break
      if len(component) > 1:
        circles.append(sorted(component))

  for v in sorted(graph):
    if v not in index:
      visit(v)
  return circles


def test_strongly_connected_finds_a_circle_and_only_it():
  graph = {'a': {'b'}, 'b': {'c'}, 'c': {'a'}, 'd': {'a'}, 'e': {'e'}}
  assert strongly_connected(graph) == [['a', 'b', 'c']]


def test_no_import_circles_between_modules():
  graph = module_graph()
  assert len(graph) > 100 and 'rlreason.rl.train' in graph['rlreason.main']
  circles = strongly_connected(graph)
  assert not circles, '\n'.join(' <-> '.join(c) for c in circles)


def test_the_core_loop_imports_no_method():
  graph = module_graph()
  core = [m for m in graph if m.startswith('rlreason.rl.')]
  assert 'rlreason.rl.train' in core
  for name in core:
    methods = {m for m in graph[name] if m.startswith('rlreason.methods')}
    assert not methods, (name, methods)
