"""TRAIN and SAMPLE rules on the real shapes of Qwen2.5 0.5B/1.5B/7B, Qwen3 4B/8B, Llama 3 8B.

Shapes come from `transformer.abstract_params` (nothing is allocated) and meshes are abstract, so
pod-sized meshes (64 chips) are checked on a laptop. For each leaf, bytes per chip are the
shard shape's; the checks say how much of the model a chip holds and which leaves fall back
to replication because a mesh axis does not divide them.
"""

import math
import pathlib
import sys

import numpy as np
import pytest
from jax.sharding import AbstractMesh, AxisType

from rlreason.model import sharding
from rlreason.model import transformer

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / 'launch'))
import model_shapes  # noqa: E402  (launch/ is not a package the library imports)


def _mesh(data, fsdp, tensor):
  return AbstractMesh((data, fsdp, tensor), sharding.MESH_AXES,
                      axis_types=(AxisType.Auto,) * 3)


def _layout(cfg, mesh, rules):
  """[(path, shape, spec, bytes per chip)] for every parameter."""
  flat_shapes = _flatten(transformer.abstract_params(cfg))
  flat_axes = dict(_flatten(transformer.param_axes(cfg), is_axes=True))
  out = []
  for path, x in flat_shapes:
    spec = sharding.logical_to_spec(flat_axes[path], rules, mesh, x.shape)
    split = [math.prod(mesh.shape[a] for a in ((s,) if isinstance(s, str) else s))
             if s is not None else 1 for s in spec] + [1] * (len(x.shape) - len(spec))
    per_chip = math.prod(d // k for d, k in zip(x.shape, split)) * np.dtype(x.dtype).itemsize
    out.append((path, x.shape, spec, per_chip))
  return out


def _flatten(tree, prefix='', is_axes=False):
  items = []
  for k, v in tree.items():
    path = f'{prefix}/{k}'
    if isinstance(v, dict):
      items += _flatten(v, path, is_axes)
    else:
      items.append((path, v))
  return items


def _total_bytes(cfg):
  return sum(math.prod(x.shape) * np.dtype(x.dtype).itemsize
             for _, x in _flatten(transformer.abstract_params(cfg)))


def test_table_matches_published_parameter_counts():
  for name in model_shapes.ARCHS:
    billions = model_shapes.model_config(name).num_params() / 1e9
    assert billions == pytest.approx(model_shapes.PUBLISHED_BILLIONS[name], abs=0.006), name


# (model, a TRAIN mesh it is meant for). FSDP x TP on 64 chips for the 4B-8B models (a v5p-128
# or v5e-64); the small Qwen2.5 have 14 / 12 query heads and 2 kv heads: tensor = 2.
CASES = [('qwen2.5-0.5b', (1, 4, 2)), ('qwen2.5-1.5b', (1, 8, 2)), ('qwen2.5-7b', (1, 16, 4)),
         ('qwen3-4b', (1, 16, 4)), ('qwen3-8b', (1, 16, 4)), ('llama3-8b', (1, 16, 4))]


@pytest.mark.parametrize('name, shape', CASES)
def test_train_rules_shard_every_large_leaf_over_all_chips(name, shape):
  cfg = model_shapes.model_config(name)
  mesh = _mesh(*shape)
  chips = math.prod(shape)
  layout = _layout(cfg, mesh, sharding.TRAIN_RULES)
  total = _total_bytes(cfg)
  per_chip = sum(b for *_, b in layout)
  # Only norm scales and biases (< 0.1% of the bytes) stay replicated.
  assert per_chip <= total / chips * 1.01, (name, per_chip, total / chips)
  for path, shape_, spec, _ in layout:
    if len(shape_) >= 2 and math.prod(shape_) >= 2**20:
      used = {a for s in spec if s for a in ((s,) if isinstance(s, str) else s)}
      assert used == {'fsdp', 'tensor'}, (name, path, shape_, spec)


@pytest.mark.parametrize('name, shape', CASES)
def test_sample_rules_keep_weights_whole_across_fsdp(name, shape):
  cfg = model_shapes.model_config(name)
  mesh = _mesh(*shape)
  layout = _layout(cfg, mesh, sharding.SAMPLE_RULES)
  for path, _, spec, _ in layout:
    assert 'fsdp' not in str(spec), (name, path, spec)  # No all-gathers in the decode loop.
  per_chip = sum(b for *_, b in layout)
  assert per_chip <= _total_bytes(cfg) / shape[2] * 1.01


def test_kv_heads_that_do_not_divide_tensor_fall_back_to_replication():
  # Qwen2.5-1.5B: 12 query heads split 4 ways, but its 2 kv heads cannot be: k/v projections
  # replicate over tensor (correct, larger), which is why CASES picks tensor = 2 for it.
  cfg = model_shapes.model_config('qwen2.5-1.5b')
  layout = {p: spec for p, _, spec, _ in _layout(cfg, _mesh(1, 16, 4), sharding.TRAIN_RULES)}
  k = next(spec for p, spec in layout.items() if p.endswith('attn/k'))
  q = next(spec for p, spec in layout.items() if p.endswith('attn/q'))
  assert 'tensor' not in str(k) and 'tensor' in str(q)


def test_host_data_parallel_sampling_mesh_replicates_weights_per_host():
  # 16 hosts x 4 chips: the sampling mesh puts hosts on 'data' and the 4 local chips on
  # 'tensor'; a 7B model in bf16 is then 15.2 GB / 4 = 3.8 GB per chip, and no weight
  # collective crosses hosts while decoding.
  cfg = model_shapes.model_config('qwen2.5-7b', param_dtype='bfloat16')
  layout = _layout(cfg, _mesh(16, 1, 4), sharding.SAMPLE_RULES)
  for path, _, spec, _ in layout:
    assert 'data' not in str(spec), (path, spec)
  per_chip = sum(b for *_, b in layout)
  assert per_chip == pytest.approx(_total_bytes(cfg) / 4, rel=0.01)
