"""Mesh arithmetic, rule tables and resharding between the train and sample layouts."""

import os
import subprocess
import sys

import jax
import numpy as np
import pytest

from rlreason.model import sharding
from rlreason.model import transformer

P = jax.P


def test_mesh_shape_fills_the_one_unknown():
  assert sharding.mesh_shape({'data': 2, 'fsdp': -1, 'tensor': 2}, 8) == (2, 2, 2)
  assert sharding.mesh_shape((-1, 1, 4), 8) == (2, 1, 4)
  assert sharding.mesh_shape({'tensor': 8}, 8) == (1, 1, 8)


@pytest.mark.parametrize('sizes, match', [
    ({'data': -1, 'fsdp': -1}, 'at most one'),
    ({'data': 3, 'fsdp': -1}, 'not divisible'),
    ({'data': 2, 'fsdp': 2}, 'multiply to 4'),
    ({'model': 8}, "unknown axes \\['model'\\]"),
    ((0, -1, 1), 'positive'),
])
def test_mesh_shape_errors_name_the_problem(sizes, match):
  with pytest.raises(ValueError, match=match):
    sharding.mesh_shape(sizes, 8)


def test_make_mesh_uses_all_devices_with_auto_axes():
  mesh = sharding.make_mesh({'data': 2, 'fsdp': -1, 'tensor': 2})
  assert dict(mesh.shape) == {'data': 2, 'fsdp': 2, 'tensor': 2}
  assert all(t == jax.sharding.AxisType.Auto for t in mesh.axis_types)


def test_logical_to_spec_drops_axes_that_do_not_divide():
  mesh = sharding.make_mesh({'fsdp': 2, 'tensor': 4})
  rules = sharding.TRAIN_RULES
  assert sharding.logical_to_spec(('embed', 'mlp'), rules, mesh, (64, 96)) == P('fsdp', 'tensor')
  # 2 kv heads cannot be split 4 ways: replicated over tensor instead of failing.
  assert sharding.logical_to_spec(('embed', 'kv_heads', 'head_dim'), rules, mesh,
                                  (64, 2, 16)) == P('fsdp', None, None)
  # Batch takes both data-parallel axes; a mesh axis is never used twice in one spec.
  assert sharding.logical_to_spec(('batch', 'embed'), rules, mesh, (8, 64)) == P(
      ('data', 'fsdp'), None)
  with pytest.raises(ValueError, match="'experts' has no rule"):
    sharding.logical_to_spec(('experts',), rules)


def test_reshard_train_to_sample_keeps_values():
  cfg = transformer.ModelConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_layers=1,
                          num_heads=4, num_kv_heads=2, head_dim=8)
  mesh = sharding.make_mesh({'fsdp': 2, 'tensor': 4})
  train = sharding.param_shardings(cfg, mesh, sharding.TRAIN_RULES)
  sample = sharding.param_shardings(cfg, mesh, sharding.SAMPLE_RULES)
  params = jax.device_put(transformer.init_params(cfg, jax.random.key(0)), train)
  host = jax.device_get(params)
  moved = sharding.reshard(params, sample, donate=True)
  assert moved['layers']['0']['mlp']['up'].sharding.spec == P(None, 'tensor')
  assert moved['embed'].sharding.spec == P('tensor', None)
  jax.tree.map(np.testing.assert_array_equal, jax.device_get(moved), host)
  assert 'lm_head' in sharding.describe(sample)


def test_split_cpu_host_makes_single_threaded_devices_in_a_fresh_process():
  code = ('import os, jax, jax.numpy as jnp\n'
          'from rlreason.model import sharding\n'
          'sharding.split_cpu_host(2)\n'
          'mesh = sharding.make_mesh({"data": 2, "fsdp": 1, "tensor": 1})\n'
          'x = jax.device_put(jnp.arange(8.0), sharding.data_sharding(mesh, (8,)))\n'
          'print(jax.device_count(), len(x.addressable_shards), float((x * 2).sum()),\n'
          '      os.environ["XLA_FLAGS"])\n')
  env = dict(os.environ, JAX_PLATFORMS='cpu', XLA_FLAGS='')
  out = subprocess.run([sys.executable, '-c', code], env=env, capture_output=True, text=True,
                       timeout=120, check=True).stdout.split()
  assert out == ['2', '2', '56.0', '--xla_cpu_multi_thread_eigen=false'], out


def test_split_cpu_host_refuses_what_it_cannot_honour(monkeypatch):
  with pytest.raises(ValueError, match='devices must be >= 1, got 0'):
    sharding.split_cpu_host(0)
  monkeypatch.setenv('XLA_FLAGS', '--xla_force_host_platform_device_count=8')
  with pytest.raises(ValueError, match='already sets --xla_force_host_platform_device_count'):
    sharding.split_cpu_host(2)
  monkeypatch.setenv('XLA_FLAGS', '')
  jax.numpy.zeros(1).block_until_ready()  # The backend exists (conftest made 8 devices).
  with pytest.raises(RuntimeError, match='before the first JAX computation'):
    sharding.split_cpu_host(2)
  assert os.environ['XLA_FLAGS'] == ''
