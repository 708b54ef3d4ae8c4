"""Device mesh, logical-axis rule tables, and shardings for pytrees.

The mesh has three axes, ('data', 'fsdp', 'tensor'), plus 'expert' when asked for (an MoE
model's experts are sharded over it, composing with fsdp and tensor; MoE layers exchange
tokens over it by all-to-all, model/moe.py). Arrays name their dimensions with logical axes
('vocab', 'embed', 'heads', 'kv_heads', 'head_dim', 'mlp', 'norm', and for MoE 'expert',
'moe_mlp' for parameters; 'batch', 'seq' for activations); a rule table maps each logical
axis to mesh axes, and a mesh axis the mesh does not have is skipped (so the rules serve
meshes with and without 'expert'). Training shards weights over fsdp and tensor; sampling
keeps weights whole across fsdp (no per-token all-gathers in the decode loop) and splits
only over tensor (and expert).

A dimension that a mesh axis does not divide stays unsharded on that axis (a model with
2 kv heads on a tensor axis of 4 replicates its k/v projections) rather than failing:
correctness first, and `describe` shows what happened.
"""

from collections.abc import Mapping, Sequence
import math
import os
import warnings

import jax
from jax.sharding import AxisType, Mesh, NamedSharding, PartitionSpec

MESH_AXES = ('data', 'fsdp', 'tensor')
EXPERT_AXIS = 'expert'  # Optional fourth axis, last: MESH_AXES + (EXPERT_AXIS,).

Rules = tuple[tuple[str, tuple[str, ...]], ...]

TRAIN_RULES: Rules = (
    ('batch', ('data', 'fsdp', 'expert')),
    ('vocab', ('tensor',)),
    ('embed', ('fsdp',)),
    ('heads', ('tensor',)),
    ('kv_heads', ('tensor',)),
    ('mlp', ('tensor',)),
    ('head_dim', ()),
    ('norm', ()),
    ('seq', ()),
    ('expert', ('expert',)),
    ('moe_mlp', ('tensor',)),
)

SAMPLE_RULES: Rules = (
    ('batch', ('data', 'fsdp', 'expert')),
    ('vocab', ('tensor',)),
    ('embed', ()),
    ('heads', ('tensor',)),
    ('kv_heads', ('tensor',)),
    ('mlp', ('tensor',)),
    ('head_dim', ()),
    ('norm', ()),
    ('seq', ()),
    ('expert', ('expert',)),
    ('moe_mlp', ('tensor',)),
)


def mesh_shape(sizes: Mapping[str, int] | Sequence[int], num_devices: int) -> tuple[int, ...]:
  """Fills in the one -1 among the ('data', 'fsdp', 'tensor'[, 'expert']) sizes and checks
  the product. Four sizes come back for a sequence of four or a mapping whose 'expert' is not
  1, else three: an expert axis of 1 is left out, so a dense run's mesh stays as it was."""
  axes = MESH_AXES
  if isinstance(sizes, Mapping):
    axes = MESH_AXES + ((EXPERT_AXIS,) if sizes.get(EXPERT_AXIS, 1) != 1 else ())
    unknown = set(sizes) - set(MESH_AXES + (EXPERT_AXIS,))
    if unknown:
      raise ValueError(f'mesh: unknown axes {sorted(unknown)}; '
                       f'known: {MESH_AXES + (EXPERT_AXIS,)}.')
    sizes = [sizes.get(a, 1) for a in axes]
  sizes = list(sizes)
  if len(sizes) == len(MESH_AXES) + 1:
    axes = MESH_AXES + (EXPERT_AXIS,)
  if len(sizes) != len(axes):
    raise ValueError(f'mesh: need {len(MESH_AXES)} sizes for {MESH_AXES} (or a fourth for '
                     f'{EXPERT_AXIS!r}), got {sizes}.')
  if sizes.count(-1) > 1:
    raise ValueError(f'mesh: at most one size may be -1, got {dict(zip(axes, sizes))}.')
  if any(s == 0 or s < -1 for s in sizes):
    raise ValueError(f'mesh: sizes must be positive or -1, got {dict(zip(axes, sizes))}.')
  known = math.prod(s for s in sizes if s != -1)
  if -1 in sizes:
    if num_devices % known:
      raise ValueError(f'mesh: {num_devices} devices are not divisible by the fixed sizes '
                       f'{dict(zip(axes, sizes))} (product {known}).')
    sizes[sizes.index(-1)] = num_devices // known
  if math.prod(sizes) != num_devices:
    raise ValueError(f'mesh: sizes {dict(zip(axes, sizes))} multiply to '
                     f'{math.prod(sizes)}, but there are {num_devices} devices.')
  return tuple(sizes)


def make_mesh(sizes: Mapping[str, int] | Sequence[int] = (1, -1, 1), devices=None) -> Mesh:
  """A ('data', 'fsdp', 'tensor'[, 'expert']) mesh with classic (Auto) sharding propagation."""
  devices = jax.devices() if devices is None else list(devices)
  shape = mesh_shape(sizes, len(devices))
  axes = MESH_AXES + (EXPERT_AXIS,) * (len(shape) - len(MESH_AXES))
  return jax.make_mesh(shape, axes, axis_types=(AxisType.Auto,) * len(axes), devices=devices)


def logical_to_spec(axes: Sequence[str | None], rules: Rules, mesh: Mesh | None = None,
                    shape: Sequence[int] | None = None) -> PartitionSpec:
  """PartitionSpec for an array whose dimensions have these logical names.

  With `mesh` and `shape`, mesh axes that do not divide the dimension are dropped, and a
  mesh axis is used by at most one dimension (the first that asks for it). With `mesh`, rule
  axes the mesh lacks (e.g. 'expert' on a three-axis mesh) are dropped.
  """
  table = dict(rules)
  used: set[str] = set()
  spec = []
  for i, name in enumerate(axes):
    if name is None:
      spec.append(None)
      continue
    if name not in table:
      raise ValueError(f'logical axis {name!r} has no rule; rules cover {sorted(table)}.')
    chosen = []
    for mesh_axis in table[name]:
      if mesh_axis in used or (mesh is not None and mesh_axis not in mesh.axis_names):
        continue
      if mesh is not None and shape is not None:
        size = mesh.shape[mesh_axis] * math.prod(mesh.shape[a] for a in chosen)
        if shape[i] % size:
          continue
      chosen.append(mesh_axis)
    used.update(chosen)
    spec.append(tuple(chosen) if len(chosen) > 1 else (chosen[0] if chosen else None))
  return PartitionSpec(*spec)


def tree_shardings(abstract_tree, axes_tree, mesh: Mesh, rules: Rules):
  """NamedShardings for every leaf of `abstract_tree` (anything with .shape)."""
  return jax.tree.map(
      lambda x, axes: NamedSharding(mesh, logical_to_spec(axes, rules, mesh, x.shape)),
      abstract_tree, axes_tree, is_leaf=lambda x: isinstance(x, tuple))


def param_shardings(cfg, mesh: Mesh, rules: Rules):
  """Shardings for the params of a transformer.ModelConfig under a rule table."""
  from rlreason.model import transformer  # Local: keeps this module importable without flax for launch/.
  return tree_shardings(transformer.abstract_params(cfg), transformer.param_axes(cfg), mesh, rules)


def data_sharding(mesh: Mesh, shape: Sequence[int], rules: Rules = TRAIN_RULES) -> NamedSharding:
  """Rows over the batch axes (those that divide the row count), other dimensions whole."""
  return NamedSharding(mesh, logical_to_spec(('batch',) + (None,) * (len(shape) - 1), rules,
                                             mesh, shape))


def reshard(tree, shardings, *, donate: bool = False):
  """Moves a pytree into new shardings (e.g. TRAIN -> SAMPLE layout) in one jitted copy."""
  if donate:
    # Donation frees the old layout's buffers as soon as the copy exists; XLA warns that it
    # cannot reuse them in place when per-device shapes differ, which is expected here.
    with warnings.catch_warnings():
      warnings.filterwarnings('ignore', message='Some donated buffers were not usable')
      return jax.jit(lambda t: t, out_shardings=shardings, donate_argnums=0)(tree)
  return jax.device_put(tree, shardings)


def describe(shardings_tree) -> str:
  """One line per leaf: its path and PartitionSpec, for logs and debugging."""
  flat = jax.tree_util.tree_flatten_with_path(shardings_tree)[0]
  return '\n'.join(f'{jax.tree_util.keystr(path)}: {s.spec}' for path, s in flat)


def split_cpu_host(devices: int) -> None:
  """Makes this process's CPU backend `devices` XLA devices, each with single-threaded kernels.

  For a multi-core CPU host (a laptop, a CI runner): with one device per core, a batch sharded
  over 'data' runs as `devices` independent streams, where one device would split each small
  op across the cores and wait for them. Measured by experiments/bench/sampler.py on a 2-core
  VM: the small config's sampler runs 1.3-1.6x faster, data-parallel on 2 devices, than on one;
  the mid config's does not (each device reads all the weights, twice the memory traffic).

  Call it right after `import jax`, before anything runs (XLA reads its flags and the device
  count when the first computation creates the backend). It appends
  `--xla_cpu_multi_thread_eigen=false` to XLA_FLAGS and sets `jax_num_cpu_devices`.
  """
  if devices < 1:
    raise ValueError(f'split_cpu_host: devices must be >= 1, got {devices}')
  flags = os.environ.get('XLA_FLAGS', '')
  if '--xla_force_host_platform_device_count' in flags:
    raise ValueError(f'split_cpu_host({devices}): XLA_FLAGS already sets '
                     f'--xla_force_host_platform_device_count ({flags!r}); use one or the other')
  try:
    jax.config.update('jax_num_cpu_devices', devices)
  except RuntimeError as e:
    raise RuntimeError(f'split_cpu_host({devices}) must run before the first JAX computation '
                       'creates the backend (call it right after `import jax`)') from e
  if '--xla_cpu_multi_thread_eigen' not in flags:
    os.environ['XLA_FLAGS'] = f'{flags} --xla_cpu_multi_thread_eigen=false'.strip()
