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


def setup(config, cfg, params, mesh, param_shardings):
  """(Adapter, the fresh adapter params placed on the mesh, their shardings).

  `params` are the base's (any placement); checks the LoRA config against the model first.
  """
  lora_cfg = lora_config(config)
  lora.check(cfg, lora_cfg)
  if config.export.get('peft_path'):  # Fail now, not after training, if PEFT cannot load it.
    adapter_export.check_peft(cfg, lora_cfg)
  base = lora.quantize_base(params, cfg, lora_cfg) if lora_cfg.quantize else params
  base_sh = sharding.tree_shardings(jax.eval_shape(lambda: base), lora.base_axes(cfg, lora_cfg),
                                    mesh, sharding.TRAIN_RULES)
  base = jax.device_put(base, base_sh)
  fresh = lora.init(cfg, lora_cfg, jax.random.fold_in(jax.random.key(config.seed), 7))
  adapter_sh = sharding.tree_shardings(jax.eval_shape(lambda: fresh),
                                       lora.adapter_axes(cfg, lora_cfg), mesh,
                                       sharding.TRAIN_RULES)
  merge = jax.jit(lambda b, a: lora.merge(b, a, cfg, lora_cfg), out_shardings=param_shardings)
  adapter = Adapter(lora_cfg=lora_cfg, base=base, fingerprint=base_fingerprint(config),
                    merge=merge)
  return adapter, jax.device_put(fresh, adapter_sh), adapter_sh


def to_model(adapter: Adapter | None, base, cfg) -> Callable | None:
  """The `to_model` of update.train_step / sft_step, inside a jit whose argument is `base`."""
  if adapter is None:
    return None
  return lambda trainable: lora.merge(base, trainable, cfg, adapter.lora_cfg)


def check_resume(saved_config: dict, adapter: Adapter | None, config) -> None:
  """Raises ValueError when a checkpoint's base is not this run's (or LoRA was on or off)."""
  saved = (saved_config or {}).get(FINGERPRINT_KEY)
  if adapter is None and saved is None:
    return
  if adapter is None or saved is None:
    raise ValueError(
        f'the checkpoint was written with lora.enabled={saved is not None} and this run has '
        f'lora.enabled={adapter is not None}: its params cannot be restored here.')
  if saved != adapter.fingerprint:
    raise ValueError(
        f'the checkpoint\'s LoRA adapter was trained on another base model (fingerprint '
        f'{saved[:12]}...) than this run\'s (model.init={config.model.init!r}, '
        f'model.path={config.model.path!r}: {adapter.fingerprint[:12]}...); point model.path '
        'at the original base or start a fresh workdir.')
