"""Compiles train_step and the sampler for a TPU topology ahead of time and prints bytes per chip.

  python launch/aot_check.py --topology v5e-64 --config experiments/grpo_gsm8k.py:qwen2.5-1.5b
  python launch/aot_check.py --topology v5p-128 --config experiments/grpo_gsm8k.py:qwen2.5-0.5b \
      --model qwen2.5-7b --set mesh.tensor=4 --set rl.micro_batches=4

Nothing is rented: the devices are abstract TPU devices from libtpu
(`jax.experimental.topologies`, the `tpu` extra), and XLA's TPU compiler runs on this host.
Per chip it prints, for each config:

  params, opt_state   exact shard sizes of the training layout (TRAIN_RULES)
  sample_params       the sampling copy (SAMPLE_RULES), alive while the sampler runs
  kv_cache            analytic: 2 x layers x rows x (P + L) x kv_heads x head_dim per chip
  train_temp          XLA's memory analysis of the compiled train_step: temporaries
                      (activations, gradients, micro-batch buffers)
  sample_temp         XLA's memory analysis of the compiled sampler (includes its KV cache)
  peak                max(train_step args + outputs - aliased + temps,
                          train state + sample params + sampler args + temps)

and whether the peak fits the chip's HBM. Model shapes come from the checkpoint the config
names (launch/model_shapes.py) or --model; weights are never read. Without libtpu (the `tpu`
extra) there are no TPU devices to compile for, and it says so and exits.
"""

import argparse
import json
import math
import os
import pathlib
import sys

_ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(_ROOT))
sys.path.insert(0, str(_ROOT / 'launch'))

# Named slices -> (libtpu topology, HBM bytes per chip). v5p counts TensorCores in its name.
TOPOLOGIES = {
    'v5e-4': ('v5e:2x2', 16), 'v5e-8': ('v5e:2x4', 16), 'v5e-16': ('v5e:4x4', 16),
    'v5e-32': ('v5e:4x8', 16), 'v5e-64': ('v5e:8x8', 16), 'v5e-256': ('v5e:16x16', 16),
    'v5p-8': ('v5p:2x2x1', 95), 'v5p-32': ('v5p:2x2x4', 95), 'v5p-128': ('v5p:4x4x4', 95),
    'v5p-256': ('v5p:4x4x8', 95),
    'v6e-4': ('v6e:2x2', 32), 'v6e-8': ('v6e:2x4', 32), 'v6e-64': ('v6e:8x8', 32),
    'v6e-256': ('v6e:16x16', 32),
}
_HBM_BY_KIND = {'v5e': 16, 'v5litepod': 16, 'v5p': 95, 'v6e': 32, 'v4': 32}
GiB = 2**30


def topology(name: str):
  """(libtpu topology string, HBM bytes per chip) for 'v5e-64' or a raw 'v5e:8x8'."""
  if name in TOPOLOGIES:
    topo, hbm = TOPOLOGIES[name]
    return topo, hbm * GiB
  kind = name.split(':')[0]
  if ':' not in name or kind not in _HBM_BY_KIND:
    raise SystemExit(f'aot_check: --topology {name!r}; known: {sorted(TOPOLOGIES)} or '
                     "'<kind>:<AxB[xC]>' with kind in v5e, v5p, v6e, v4.")
  return name, _HBM_BY_KIND[kind] * GiB


def tpu_devices(topo: str):
  os.environ.setdefault('TPU_SKIP_MDS_QUERY', '1')  # No metadata server off a TPU VM.
  os.environ.setdefault('ALLOW_MULTIPLE_LIBTPU_LOAD', '1')  # Do not take the TPU lockfile.
  try:
    import libtpu  # noqa: F401  pylint: disable=unused-import
  except ImportError:
    raise SystemExit('aot_check: libtpu is not installed (pip install .[tpu]); it provides '
                     'the TPU compiler that runs on this host.') from None
  from jax.experimental import topologies
  return topologies.get_topology_desc(topo, 'tpu').devices


def load_config(spec: str, overrides: list[str]):
  import importlib.util
  import ast
  path, _, arg = spec.partition(':')
  module_spec = importlib.util.spec_from_file_location(f'_aot_{pathlib.Path(path).stem}', path)
  module = importlib.util.module_from_spec(module_spec)
  module_spec.loader.exec_module(module)
  config = module.get_config(arg) if arg else module.get_config()
  for item in overrides:
    key, _, value = item.partition('=')
    *parents, leaf = key.split('.')
    node = config
    for p in parents:
      node = node[p]
    try:
      node[leaf] = ast.literal_eval(value)
    except (ValueError, SyntaxError):
      node[leaf] = value
  return config


def model_cfg(config, model_name: str | None):
  import model_shapes
  from rlreason.model import transformer
  m = config.model
  dtypes = dict(param_dtype=m.param_dtype, compute_dtype=m.compute_dtype, remat=m.remat)
  name = model_name or (model_shapes.guess(m.path) if m.init == 'hf' else None)
  if name:
    return name, model_shapes.model_config(name, **dtypes)
  if m.init == 'hf':
    raise SystemExit(f'aot_check: cannot tell the architecture of model.path={m.path!r}; pass '
                     f'--model (one of {sorted(model_shapes.ARCHS)}).')
  arch = dict(m.arch)
  if not arch['vocab_size']:
    from rlreason.rl import run_setup
    arch['vocab_size'] = run_setup._tokenizer(config).vocab_size  # pylint: disable=protected-access
  return 'config.model.arch', transformer.ModelConfig(**arch, **dtypes)


def _shard_bytes(tree) -> int:
  import jax
  import numpy as np
  return sum(math.prod(x.sharding.shard_shape(x.shape)) * np.dtype(x.dtype).itemsize
             for x in jax.tree.leaves(tree))


def _with(tree, shardings):
  import jax
  return jax.tree.map(lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s),
                      tree, shardings)


def _peak(stats) -> int:
  return (stats.argument_size_in_bytes + stats.output_size_in_bytes
          - stats.alias_size_in_bytes + stats.temp_size_in_bytes)


def check(config, *, devices, model_name=None) -> dict[str, object]:
  """Compiles both programs for `devices` and returns the byte counts per chip."""
  import jax
  import jax.numpy as jnp
  from rlreason.model import sharding
  from rlreason.rl import run_setup
  from rlreason.rl import update
  from rlreason.rollout import sampler
  from rlreason.structs import Prompts, TrainBatch
  name, cfg = model_cfg(config, model_name)
  mesh = sharding.make_mesh(dict(config.mesh), devices=devices)
  rl = config.rl
  param_sh = sharding.param_shardings(cfg, mesh, sharding.TRAIN_RULES)
  sample_sh = sharding.param_shardings(cfg, mesh, sharding.SAMPLE_RULES)
  from rlreason.model import transformer
  params = _with(transformer.abstract_params(cfg), param_sh)
  opt = config.optimizer
  optimizer = run_setup.make_optimizer(lr=opt.lr, warmup_steps=opt.warmup_steps, b1=opt.b1,
                                       b2=opt.b2, weight_decay=opt.weight_decay,
                                       grad_clip=opt.grad_clip)
  abstract_state = jax.eval_shape(lambda p: update.init_state(p, optimizer), params)
  state_sh = update.state_shardings(abstract_state, param_sh, mesh)
  state = _with(abstract_state, state_sh)
  o = config.objective
  length = rl.max_new_tokens
  objective = update.Objective(
      policy_loss=o.policy_loss, loss_kwargs=tuple(sorted(dict(o.loss_kwargs).items())),
      aggregation=o.aggregation, max_len=length, kl_coef=o.kl_coef,
      kl_estimator=o.kl_estimator, entropy_coef=o.entropy_coef,
      temperature=max(rl.temperature, 1e-6), group_size=rl.group_size)
  p = max(config.data.prompt_buckets)
  n = rl.prompts_per_step // rl.minibatches * rl.group_size
  rows = lambda shape, dtype: jax.ShapeDtypeStruct(
      shape, dtype, sharding=sharding.data_sharding(mesh, shape))
  f32 = jnp.float32
  batch = TrainBatch(
      tokens_NxT=rows((n, p + length), jnp.int32), mask_NxT=rows((n, p + length), bool),
      loss_mask_NxL=rows((n, length), bool), advantages_NxL=rows((n, length), f32),
      old_logprobs_NxL=rows((n, length), f32), ref_logprobs_NxL=rows((n, length), f32),
      behaviour_logprobs_NxL=rows((n, length), f32), prefix_mask_NxL=rows((n, length), bool))
  train = jax.jit(
      lambda s, b: update.train_step(s, b, cfg=cfg, objective=objective, optimizer=optimizer,
                                     micro_batches=rl.micro_batches),
      out_shardings=(state_sh, None), donate_argnums=0)
  with jax.set_mesh(mesh):
    train_stats = train.lower(state, batch).compile().memory_analysis()
  # The sampler's jitted body, as sampler.generate builds it (generate itself wants concrete
  # prompts to validate).
  b = rl.prompts_per_step
  srows = lambda shape, dtype: jax.ShapeDtypeStruct(
      shape, dtype, sharding=sharding.data_sharding(mesh, shape, sharding.SAMPLE_RULES))
  prompts = Prompts(tokens_BxP=srows((b, p), jnp.int32), mask_BxP=srows((b, p), bool))
  key = jax.ShapeDtypeStruct((), jax.random.key(0).dtype,
                             sharding=jax.sharding.NamedSharding(mesh, jax.P()))
  temp = jax.ShapeDtypeStruct((), f32, sharding=jax.sharding.NamedSharding(mesh, jax.P()))
  generate = sampler._generate_fn(  # pylint: disable=protected-access
      cfg, rl.group_size, length, False, int(rl.top_k), float(rl.top_p), (0,), 0, None, mesh,
      int(rl.decode_chunks))
  with jax.set_mesh(mesh):
    sample_stats = generate.lower(_with(transformer.abstract_params(cfg), sample_sh), prompts, None,
                                  temp, key).compile().memory_analysis()
  shape = sharding.mesh_shape(dict(config.mesh), len(devices))
  kv_split = shape[0] * shape[1] * (shape[2] if cfg.num_kv_heads % shape[2] == 0 else 1)
  cache_bytes = jnp.dtype(cfg.compute_dtype).itemsize
  # The prompt's slots once per group (shared by its G rows), each row's own after them.
  kv = 2 * cfg.num_layers * b * (p + rl.group_size * length) * cfg.num_kv_heads * cfg.head_dim
  out = {
      'model': name, 'params_B': cfg.num_params() / 1e9, 'mesh': dict(zip(sharding.MESH_AXES,
                                                                          shape)),
      'params': _shard_bytes(state.params), 'opt_state': _shard_bytes(state.opt_state),
      'sample_params': _shard_bytes(_with(transformer.abstract_params(cfg), sample_sh)),
      'kv_cache': kv * cache_bytes // kv_split,
      'train_temp': train_stats.temp_size_in_bytes, 'sample_temp': sample_stats.temp_size_in_bytes,
  }
  resident = out['params'] + out['opt_state']
  out['peak'] = max(_peak(train_stats),
                    resident + _peak(sample_stats))
  return out


def main(argv=None) -> None:
  parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  parser.add_argument('--topology', required=True, help=f'one of {sorted(TOPOLOGIES)} or v5e:8x8')
  parser.add_argument('--config', action='append', required=True,
                      help='experiments/FILE.py[:ARG]; repeat for a table')
  parser.add_argument('--model', default=None, help='override the architecture (model_shapes)')
  parser.add_argument('--set', action='append', default=[], metavar='KEY=VALUE',
                      help='config override, e.g. mesh.tensor=4 (applies to every config)')
  parser.add_argument('--json', action='store_true', help='one JSON line of bytes per config')
  args = parser.parse_args(argv)
  topo, hbm = topology(args.topology)
  devices = tpu_devices(topo)
  cols = ('params', 'opt_state', 'sample_params', 'kv_cache', 'train_temp', 'sample_temp',
          'peak')
  if not args.json:
    print(f'# AOT-compiled by XLA:TPU for {args.topology} = {topo}: {len(devices)} abstract '
          f'{devices[0].device_kind} chips, {hbm / GiB:.0f} GiB HBM each. params, opt_state, '
          'sample_params: exact shard bytes; kv_cache: analytic; *_temp: XLA memory analysis; '
          'peak: see the module docstring. MiB per chip.')
    print('| config | model | mesh | ' + ' | '.join(cols) + ' | fits |')
    print('|' + '---|' * (len(cols) + 4))
  for spec in args.config:
    config = load_config(spec, args.set)
    r = check(config, devices=devices, model_name=args.model)
    if args.json:
      print(json.dumps({'config': spec, 'topology': topo, 'hbm': hbm, 'fits': r['peak'] <= hbm,
                        **r}), flush=True)
      continue
    mesh = 'x'.join(str(v) for v in r['mesh'].values())
    cells = ' | '.join(f'{r[c] / 2**20:.1f}' for c in cols)
    fits = 'yes' if r['peak'] <= hbm else 'NO'
    count = r['params_B']
    size = f'{count:.2f}B' if count >= 1 else f'{count * 1e3:.3g}M'
    print(f'| {spec} | {r["model"]} ({size}) | {mesh} | {cells} | {fits} |', flush=True)


if __name__ == '__main__':
  main()
