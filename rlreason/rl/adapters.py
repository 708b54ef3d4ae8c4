"""LoRA runs: a frozen base, a trained adapter, and the merged policy everything else sees.

With `config.lora.enabled`, the TrainState's params are the adapter (model/lora.py) and the
optimizer holds state for it alone. The base params stay on the training mesh, frozen
(quantised when lora.quantize says so), as `Adapter.base`, outside the TrainState and the
checkpoints. `Run.policy(trainable)` merges them, jitted, into the model's params in the
training layout: the sampler, the old and reference log-probs, evaluation and export all take
that, so every rollout samples the current adapter (there is no stale merged copy to refresh).
The update differentiates through the same merge (`update.train_step(to_model=...)`).

Checkpoints hold only the trainable state, plus the base's fingerprint in the saved config
(`FINGERPRINT_KEY`): resuming onto another base fails at start-up, naming both.

  c.lora = dict(enabled=True, rank=16, alpha=32.0, targets=('q', 'k', 'v', 'o'), quantize='')

With `lora.routing='dart'` (model/dart.py) the trainable tree is two adapters, {'reason',
'tool'}, routed per token, and `merge` does not merge: it returns the (dequantised) base with
the adapters attached unmerged under params['dart'], so the sampler and the learner run the
routed policy. A merged HF export cannot represent routing (refused at start-up); with
export.peft_path each adapter is written in PEFT format, to peft_path/reason and
peft_path/tool (`export_dart`).

Not here: the LoRA math and quantisation (model/lora.py, model/quantize.py), PEFT export
(model/adapter_export.py).
"""

import dataclasses
import hashlib
import json
import pathlib
from typing import Any, Callable

import jax

from rlreason.model import adapter_export
from rlreason.model import dart
from rlreason.model import dart_init
from rlreason.model import lora
from rlreason.model import sharding

FINGERPRINT_KEY = 'lora_base_fingerprint'


@dataclasses.dataclass
class Adapter:
  """The frozen side of a LoRA run."""
  lora_cfg: lora.LoraConfig
  base: Any  # the frozen base params (quantised leaves as model/quantize.py stores them)
  fingerprint: str  # of the base checkpoint's files, or of the random init's recipe
  merge: Callable  # jitted (base, adapter) -> model params in the training layout
  routing: str = ''  # '' (one adapter, merged) or 'dart' (two, routed per token)
  spec: Any = None  # With an env's call format: dart.route_spec (DART's routes, CEA's split)
  cea: Callable | None = None  # methods/cea.py's jitted metrics, built on first use


def lora_config(config) -> lora.LoraConfig | None:
  """config.lora as a LoraConfig, or None when LoRA is off."""
  c = config.get('lora')
  if c is None or not c.enabled:
    return None
  return lora.LoraConfig(rank=c.rank, alpha=float(c.alpha), dropout=float(c.dropout),
                         targets=tuple(c.targets), quantize=c.quantize)


def base_fingerprint(config) -> str:
  """sha256 over the base checkpoint's config and weight files (their names, sizes and
  bytes), or over the recipe of a random init (architecture, dtype, seed)."""
  digest = hashlib.sha256()
  m = config.model
  if m.init == 'hf':
    root = pathlib.Path(m.path)
    files = sorted([*root.glob('*.safetensors'), root / 'config.json'])
    for file in files:
      digest.update(f'{file.name}:{file.stat().st_size}\n'.encode())
      with open(file, 'rb') as f:
        for chunk in iter(lambda: f.read(1 << 24), b''):
          digest.update(chunk)
  else:
    recipe = dict(arch=dict(m.arch), param_dtype=m.param_dtype, seed=config.seed)
    digest.update(json.dumps(recipe, sort_keys=True, default=str).encode())
  return digest.hexdigest()


def routing(config) -> str:
  return config.lora.get('routing', '') if config.get('lora') is not None else ''


def setup(config, cfg, params, mesh, param_shardings, tok=None):
  """(Adapter, the fresh adapter params placed on the mesh, their shardings).

  `params` are the base's (any placement); checks the LoRA config against the model first.
  `tok` encodes the env's call tags for DART's routes and CEA's token split.
  """
  lora_cfg = lora_config(config)
  route = routing(config)
  (dart_init.check if route else lora.check)(cfg, lora_cfg)
  if config.export.get('peft_path'):  # Fail now, not after training, if PEFT cannot load it.
    adapter_export.check_peft(cfg, lora_cfg)
  spec = None
  if tok is not None and config.env.enabled and config.env.family in dart.OPEN_TAGS:
    spec = dart.route_spec(tok, config.env.family)
  if route and spec is None:
    raise ValueError("lora.routing='dart' needs env.enabled with a call format that has an open "
                     f"tag ({sorted(dart.OPEN_TAGS)}) and the run's tokenizer.")
  base = lora.quantize_base(params, cfg, lora_cfg) if lora_cfg.quantize else params
  base_sh = sharding.tree_shardings(jax.eval_shape(lambda: base), lora.base_axes(cfg, lora_cfg),
                                    mesh, sharding.TRAIN_RULES)
  base = jax.device_put(base, base_sh)
  key = jax.random.fold_in(jax.random.key(config.seed), 7)
  fresh = dart_init.init(cfg, lora_cfg, key) if route else lora.init(cfg, lora_cfg, key)
  axes = lora.adapter_axes(cfg, lora_cfg)
  adapter_sh = sharding.tree_shardings(jax.eval_shape(lambda: fresh),
                                       {k: axes for k in dart.ADAPTERS} if route else axes, mesh,
                                       sharding.TRAIN_RULES)
  adapter = Adapter(lora_cfg=lora_cfg, base=base, fingerprint=base_fingerprint(config),
                    merge=None, routing=route, spec=spec)
  out_sh = param_shardings
  if route:  # The adapters ride unmerged beside the model's params; spec and scale replicated.
    out_sh = rollout_shardings(adapter, param_shardings, adapter_sh, mesh)
  adapter.merge = jax.jit(lambda b, a: to_model(adapter, b, cfg)(a), out_shardings=out_sh)
  return adapter, jax.device_put(fresh, adapter_sh), adapter_sh


def rollout_shardings(adapter: Adapter | None, model_shardings, adapter_shardings, mesh):
  """The shardings of `Run.policy`'s params: `model_shardings`, plus DART's adapters
  (`adapter_shardings`, moved to `mesh`) with the route spec and scale replicated."""
  if adapter is None or not adapter.routing:
    return model_shardings
  replicated = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec())
  moved = jax.tree.map(lambda s: jax.sharding.NamedSharding(mesh, s.spec), adapter_shardings)
  return {**model_shardings, dart.KEY: {**moved, 'open': replicated, 'close': replicated,
                                        'scale': replicated}}


def to_model(adapter: Adapter | None, base, cfg) -> Callable | None:
  """The `to_model` of update.train_step / sft_step, inside a jit whose argument is `base`."""
  if adapter is None:
    return None
  if adapter.routing:  # DART: the base (dequantised, no gradient) + the adapters, unmerged.
    frozen = lambda: lora.dequantize_base(jax.lax.stop_gradient(base), cfg)
    return lambda trainable: dart.attach(frozen(), trainable, adapter.spec,
                                         adapter.lora_cfg.scale)
  return lambda trainable: lora.merge(base, trainable, cfg, adapter.lora_cfg)


def export_dart(config, cfg, adapter: Adapter, trainable) -> None:
  """DART's two adapters in PEFT format: export.peft_path/reason and .../tool. Each is the
  routed policy only where every token takes that adapter; PEFT cannot route per token."""
  path = pathlib.Path(config.export.peft_path)
  quantized = adapter.lora_cfg.quantize
  # A quantised base is written dequantised beside the adapters: peft applies them to that.
  base_name = (str(path / 'dequantized-base') if quantized else
               config.model.path if config.model.init == 'hf' else '')
  trainable = jax.device_get(trainable)
  for name in dart.ADAPTERS:
    adapter_export.save_peft(path / name, cfg, trainable[name], adapter.lora_cfg, base_name,
                             quantized_base=jax.device_get(adapter.base) if quantized else None)


def check_resume(saved_config: dict, adapter: Adapter | None, config) -> None:
  """Raises ValueError when a checkpoint's base is not this run's (or LoRA was on or off)."""
  saved = (saved_config or {}).get(FINGERPRINT_KEY)
  if adapter is None and saved is None:
    return
  if adapter is None or saved is None:
    raise ValueError(
        f'the checkpoint was written with lora.enabled={saved is not None} and this run has '
        f'lora.enabled={adapter is not None}: its params cannot be restored here.')
  saved_routing = (saved_config.get('lora') or {}).get('routing', '')
  if saved_routing != adapter.routing:
    raise ValueError(
        f"the checkpoint was written with lora.routing={saved_routing!r} and this run has "
        f"lora.routing={adapter.routing!r}: one adapter and DART's two are different trees; "
        'start a fresh workdir or restore the routing.')
  if saved != adapter.fingerprint:
    raise ValueError(
        f'the checkpoint\'s LoRA adapter was trained on another base model (fingerprint '
        f'{saved[:12]}...) than this run\'s (model.init={config.model.init!r}, '
        f'model.path={config.model.path!r}: {adapter.fingerprint[:12]}...); point model.path '
        'at the original base or start a fresh workdir.')
