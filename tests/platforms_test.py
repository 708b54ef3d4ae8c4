"""Entry points default to the CPU platform on hosts without an accelerator."""

import os
import subprocess
import sys

import pytest

from rlreason import platforms


def test_cpu_default_only_without_accelerator_or_user_setting(tmp_path):
  (tmp_path / 'accel0').touch()
  env = {}
  assert platforms.default_to_cpu(env, patterns=(str(tmp_path / 'none*'),))
  assert env == {'JAX_PLATFORMS': 'cpu'}
  env = {'JAX_PLATFORMS': 'tpu'}
  assert not platforms.default_to_cpu(env, patterns=())
  assert env == {'JAX_PLATFORMS': 'tpu'}
  env = {}
  assert not platforms.default_to_cpu(env, patterns=(str(tmp_path / 'accel*'),))
  assert env == {}


@pytest.mark.skipif(platforms.has_accelerator(), reason='this host has an accelerator')
def test_main_entry_point_sets_the_cpu_default_before_jax():
  # app.run replaced: the entry point's environment is printed instead of training.
  code = ("import os, runpy; from absl import app; "
          "app.run = lambda main: print('JAX_PLATFORMS=' + os.environ.get('JAX_PLATFORMS', '')); "
          "runpy.run_module('rlreason.main', run_name='__main__')")
  env = {k: v for k, v in os.environ.items() if k != 'JAX_PLATFORMS'}
  env['RLREASON_HOST_MALLOC'] = 'default'  # No re-exec of a `python -c` process.
  p = subprocess.run([sys.executable, '-c', code], capture_output=True, text=True, timeout=120,
                     env=env)
  assert p.returncode == 0 and 'JAX_PLATFORMS=cpu' in p.stdout, (p.stdout, p.stderr[-2000:])
