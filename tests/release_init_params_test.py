"""Run.restore_or_init(release_init_params=True): the fresh TrainState takes over the loaded
params' buffers (donated), holds the same values, and Run.init_params keeps their shapes."""

import jax
import numpy as np

from rlreason.rl import run_setup
from train_test import tiny_config  # tests/ is on sys.path


def _leaves(tree):
  return [np.asarray(x) for x in jax.tree.leaves(jax.device_get(tree))]


def test_released_init_params_become_shapes_and_the_state_holds_their_values(tmp_path):
  run = run_setup.build(tiny_config(), str(tmp_path / 'kept'))
  kept_state, _ = run.restore_or_init()
  assert not isinstance(run.init_params['embed'], jax.ShapeDtypeStruct)  # Default: kept.
  expected = _leaves(kept_state.params)
  run.close()

  run = run_setup.build(tiny_config(), str(tmp_path / 'released'))
  loaded = jax.tree.leaves(run.init_params)
  state, step = run.restore_or_init(release_init_params=True)
  assert step == 0 and all(x.is_deleted() for x in loaded)  # Donated, not copied.
  for shape, x in zip(jax.tree.leaves(run.init_params), jax.tree.leaves(state.params)):
    assert isinstance(shape, jax.ShapeDtypeStruct)
    assert (shape.shape, shape.dtype, shape.sharding) == (x.shape, x.dtype, x.sharding)
  for a, b in zip(_leaves(state.params), expected):
    np.testing.assert_array_equal(a, b)
  # What later code does with them: shapes of a TrainState.
  assert jax.eval_shape(run.init_state, run.init_params).params['embed'].shape == (
      state.params['embed'].shape)
  run.close()
