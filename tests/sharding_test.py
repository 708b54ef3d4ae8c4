"""Mesh arithmetic, rule tables and resharding between the train and sample layouts."""

import jax
import numpy as np
import pytest

from rlreason import model
from rlreason import sharding

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
  cfg = model.ModelConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_layers=1,
                          num_heads=4, num_kv_heads=2, head_dim=8)
  mesh = sharding.make_mesh({'fsdp': 2, 'tensor': 4})
  train = sharding.param_shardings(cfg, mesh, sharding.TRAIN_RULES)
  sample = sharding.param_shardings(cfg, mesh, sharding.SAMPLE_RULES)
  params = jax.device_put(model.init_params(cfg, jax.random.key(0)), train)
  host = jax.device_get(params)
  moved = sharding.reshard(params, sample, donate=True)
  assert moved['layers']['0']['mlp']['up'].sharding.spec == P(None, 'tensor')
  assert moved['embed'].sharding.spec == P('tensor', None)
  jax.tree.map(np.testing.assert_array_equal, jax.device_get(moved), host)
  assert 'lm_head' in sharding.describe(sample)
