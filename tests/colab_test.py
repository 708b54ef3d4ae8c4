"""Executes every colab/*.ipynb with the reduced settings, so no notebook rots.

Half the notebooks run here, the other half in colab_odd_test.py: xdist's `--dist loadfile`
runs a file on one worker, and all of them in one file were the suite's longest file (16 min).

Each notebook runs in a fresh python3 kernel of this interpreter (jupyter_client launches the
kernelspec's `python` as sys.executable; the venv's bin is also put first on PATH), with the
repository root as working directory and the environment a notebook expects from the suite:
RLREASON_SMOKE=1 (its settings cell shrinks everything), MPLBACKEND=Agg, CPU JAX. XLA compiles
at optimisation level 0 there (compile time dominates these seconds-long runs; the numbers a
smoke run produces are not checked) and shares the suite's persistent compilation cache.

A probe cell appended to each notebook checks that it drew at least one matplotlib figure.
"""

import os
import pathlib
import sys

import jax
import nbclient
import nbformat
import pytest

REPO = pathlib.Path(__file__).resolve().parents[1]
NOTEBOOKS = sorted((REPO / 'colab').glob('*.ipynb'))
CELL_TIMEOUT_S = 600  # a hang guard, not a speed check.
_PROBE = ("import sys\n_plt = sys.modules.get('matplotlib.pyplot')\n"
          "print('RLREASON_FIGURES', len(_plt.get_fignums()) if _plt else 0)")


def test_there_are_notebooks():
  assert NOTEBOOKS, 'colab/ has no notebooks'


@pytest.mark.parametrize('path', NOTEBOOKS[0::2], ids=lambda p: p.name)
def test_notebook_executes(path, monkeypatch):
  execute_notebook(path, monkeypatch)


def execute_notebook(path, monkeypatch):
  """Runs the notebook in a fresh kernel; fails on a cell's error or on drawing no figure."""
  monkeypatch.setenv('RLREASON_SMOKE', '1')
  monkeypatch.setenv('MPLBACKEND', 'Agg')
  monkeypatch.setenv('JAX_PLATFORMS', 'cpu')
  monkeypatch.setenv('XLA_FLAGS', '--xla_backend_optimization_level=0 '
                     '--xla_cpu_use_fusion_emitters=false')  # as conftest: compiles faster
  # conftest points the suite at it.
  monkeypatch.setenv('JAX_COMPILATION_CACHE_DIR', str(jax.config.jax_compilation_cache_dir))
  monkeypatch.setenv('JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS',
                     str(jax.config.jax_persistent_cache_min_compile_time_secs))
  monkeypatch.setenv('PATH', os.pathsep.join([str(pathlib.Path(sys.executable).parent),
                                              os.environ.get('PATH', '')]))
  nb = nbformat.read(str(path), as_version=4)
  assert nb.cells and nb.cells[0].cell_type == 'markdown', f'{path.name}: first cell must be ' \
      'markdown with the question'
  nb.cells.append(nbformat.v4.new_code_cell(_PROBE))
  client = nbclient.NotebookClient(nb, kernel_name='python3', timeout=CELL_TIMEOUT_S,
                                   resources={'metadata': {'path': str(REPO)}})
  client.execute()  # raises CellExecutionError, with the failing cell and traceback.
  probe = ''.join(o.get('text', '') for o in nb.cells[-1].outputs)
  figures = int(probe.split('RLREASON_FIGURES')[1].split()[0])
  assert figures >= 1, f'{path.name} drew no matplotlib figure'
