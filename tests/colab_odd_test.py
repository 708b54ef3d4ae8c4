"""The other half of colab/*.ipynb (colab_test.py runs the first, and says why two files)."""

import pytest

from colab_test import NOTEBOOKS, execute_notebook  # tests/ is on sys.path


@pytest.mark.parametrize('path', NOTEBOOKS[1::2], ids=lambda p: p.name)
def test_notebook_executes(path, monkeypatch):
  execute_notebook(path, monkeypatch)
