"""Small-scale dynamics studies (issue #8): one module per study, each with a colab notebook.

A study module has a docstring (question, command, runtime, result), `simulate(smoke)`,
`figure(results)` and `summary(results)` functions that use only numpy, jax, matplotlib and
the public rlreason API, and a `main()` that hands them to `run_study`, which runs them
and saves the figure under colab/figures/. Its notebook colab/<nn>_<name>.ipynb is generated from the same source by
`write_notebook` (`python -m experiments.dynamics.<name> --write_notebook`), so the two cannot
drift apart: the notebook's cells are the module's import lines, the source of those
functions, and the docstring's question and result.

Deliberately not here: shared toy-loop code (rlreason/dynamics/bandit.py), the test that executes
the notebooks (tests/colab_test.py).
"""

import argparse
import ast
import inspect
import pathlib
import sys
import types

REPO = pathlib.Path(__file__).resolve().parents[2]
FIGURES = REPO / 'colab' / 'figures'

_INSTALL = """\
import os, sys
# In Colab, install the package first (set RLREASON_PIP to a wheel, path or git URL of rlreason);
# anywhere else this cell does nothing.
if 'google.colab' in sys.modules:
  !pip install -q "{os.environ.get('RLREASON_PIP', 'rlreason[colab]')}"
"""

_SETTINGS = """\
import os
SMOKE = os.environ.get('RLREASON_SMOKE') == '1'  # the test suite's reduced settings
"""


def _docstring_parts(module: types.ModuleType) -> tuple[str, str, str]:
  """(title, question, result) from a study docstring with 'Question:' and 'Result:' sections."""
  doc = inspect.getdoc(module)
  title, rest = doc.split('\n', 1)
  try:
    question = rest.split('Question:', 1)[1].split('\n\n', 1)[0].strip()
    result = rest.split('Result:', 1)[1].strip()
  except IndexError as e:
    raise ValueError(f'{module.__name__}: docstring needs "Question:" and "Result:" '
                     'sections.') from e
  return title, question[:1].upper() + question[1:], result


def _import_lines(module: types.ModuleType) -> str:
  """The module's top-level import statements, minus the ones only its script side needs."""
  source = inspect.getsource(module)
  statements = [ast.get_source_segment(source, node) for node in ast.parse(source).body
                if isinstance(node, (ast.Import, ast.ImportFrom))]
  return '\n'.join(s for s in statements
                   if not any(x in s for x in ('experiments', 'argparse', 'pathlib')))


def write_notebook(module: types.ModuleType, *, path: pathlib.Path, steps: list[str]) -> None:
  """Write `module`'s notebook to `path`, without outputs.

  Each entry of `steps` that names a function of `module` becomes a cell with its source;
  any other entry is a code cell as written (e.g. 'results = simulate(SMOKE)').
  """
  import nbformat  # Only the generator needs it (the `colab`/`test` extras), not the study.
  title, question, result = _docstring_parts(module)
  v4 = nbformat.v4
  cells = [
      v4.new_markdown_cell(f'# {title}\n\n**Question.** {question}'),
      v4.new_code_cell(_INSTALL),
      v4.new_code_cell(_SETTINGS),
      v4.new_code_cell(_import_lines(module)),
      *(v4.new_code_cell(inspect.getsource(getattr(module, step)) if step.isidentifier()
                         else step) for step in steps),
      v4.new_markdown_cell(f"## What the plot shows vs the paper's claim\n\n{result}"),
  ]
  for i, cell in enumerate(cells):  # Stable ids, so regenerating an unchanged study is a no-op.
    cell.id = f'{path.stem[:2]}-{i:02d}'
  nb = v4.new_notebook(cells=cells, metadata={
      'kernelspec': {'name': 'python3', 'display_name': 'Python 3', 'language': 'python'},
      'language_info': {'name': 'python'}})
  nbformat.write(nb, str(path))


def run_study(module_name: str, *, notebook: str, helpers: tuple[str, ...] = (),
              before: tuple[str, ...] = (), dpi: int = 60) -> None:
  """A study's command line: the full run (saves its figure), `--smoke`, `--write_notebook`.

  `notebook` names both colab/<notebook>.ipynb and colab/figures/<notebook>.png; `helpers`
  are the module's other functions that `figure` and `summary` call, which the notebook
  needs as cells of their own; `before` those that `simulate` calls (e.g. make_config), whose
  cells come first.
  """
  module = sys.modules[module_name]
  parser = argparse.ArgumentParser(description=module.__doc__.split('\n')[0])
  parser.add_argument('--smoke', action='store_true', help='reduced settings (seconds)')
  parser.add_argument('--write_notebook', action='store_true', help='regenerate the notebook')
  args = parser.parse_args()
  if args.write_notebook:
    write_notebook(module, path=REPO / 'colab' / f'{notebook}.ipynb', steps=[
        *before, 'simulate', 'results = simulate(SMOKE)', *helpers, 'figure', 'summary',
        'fig = figure(results)\nprint(summary(results))'])
    return
  results = module.simulate(args.smoke)
  print(module.summary(results))
  fig = module.figure(results)
  if not args.smoke:
    fig.savefig(FIGURES / f'{notebook}.png', dpi=dpi)  # dpi keeps each PNG under 200 KB.
