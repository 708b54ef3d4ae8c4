"""Exports a LoRA adapter (lora.py) as a merged HF checkpoint or a PEFT adapter directory.

  save_merged(out, model_cfg, base, adapter, lora_cfg)    # transformers loads it
  save_peft(out, model_cfg, adapter, lora_cfg, 'Qwen/Qwen2.5-0.5B')   # peft loads it

The PEFT directory holds adapter_config.json (peft_type LORA, r, lora_alpha, target_modules as
HF module names) and adapter_model.safetensors with PEFT's tensor names, e.g.
base_model.model.model.layers.3.self_attn.q_proj.lora_A.weight ([r, in]) and .lora_B.weight
([out, r]); the embedding's are lora_embedding_A ([r, vocab]) and lora_embedding_B ([D, r]).
Head-split layouts flatten as weights.py flattens the base weights: q's B [r, H, Dh] becomes
[H*Dh, r], o's A [H, Dh, r] becomes [r, H*Dh]. PEFT scales by lora_alpha / r (no rsLoRA), as
lora.merge does. Targets that cover every layer alike are written as a list of names; others
as one regex of the exact module names (PEFT full-matches a string target_modules).

Refused, each with the reason: a PEFT export of an adapter trained on a quantised base unless
the dequantised base is written too (the adapter was trained against it, not against the
full-precision checkpoint); a PEFT export of an embedding adapter of a tied model (PEFT's
embedding adapter changes the input lookup only, ours the shared matrix, LM head included).

Deliberately not here: hub uploads, loading PEFT adapters back, DoRA or other PEFT types.
"""

import json
import pathlib
import re

import jax
import numpy as np
import safetensors.numpy

from rlreason.model import lora
from rlreason.model import transformer
from rlreason.model import weights

_PREFIX = 'base_model.model.'


def save_merged(path, model_cfg: transformer.ModelConfig, base: transformer.Params,
                adapter: transformer.Params, lora_cfg: lora.LoraConfig, dtype: str | None = None):
  """A HF checkpoint of the merged weights W + (alpha / rank) A B (a quantised base is
  dequantised first), written by weights.save in `dtype` (default model_cfg.param_dtype)."""
  lora.check(model_cfg, lora_cfg)
  merged = jax.jit(lora.merge, static_argnums=(2, 3))(base, adapter, model_cfg, lora_cfg)
  weights.save(path, model_cfg, merged, dtype=dtype)


def hf_module_name(path: tuple[str, ...]) -> str:
  """Our params path of a targetable weight -> the HF module it belongs to."""
  if path == ('embed',):
    return 'model.embed_tokens'
  if path == ('lm_head',):
    return 'lm_head'
  _, i, block, n = path
  return f'model.layers.{i}.{"self_attn" if block == "attn" else "mlp"}.{n}_proj'


def peft_tensors(model_cfg: transformer.ModelConfig, adapter: transformer.Params,
                 lora_cfg: lora.LoraConfig) -> dict[str, np.ndarray]:
  """PEFT's state dict (name -> fp32 array in torch layout) of an adapter."""
  out = {}
  for path in lora.target_paths(model_cfg, lora_cfg):
    ab = lora._get(adapter, path)  # pylint: disable=protected-access
    a, b = (np.asarray(jax.device_get(ab[k]), np.float32) for k in ('a', 'b'))
    r, name = lora_cfg.rank, _PREFIX + hf_module_name(path)
    if a.shape[-1] != r or b.shape[0] != r:
      raise ValueError(f'save_peft: adapter at {".".join(path)} has shapes {a.shape}, {b.shape}, '
                       f'not rank {r}.')
    if path == ('embed',):  # PEFT: after_A = embedding(x, A.T); out += after_A @ B.T * s.
      out[name + '.lora_embedding_A'] = np.ascontiguousarray(a.T)
      out[name + '.lora_embedding_B'] = np.ascontiguousarray(b.T)
    else:
      out[name + '.lora_A.weight'] = np.ascontiguousarray(a.reshape(-1, r).T)
      out[name + '.lora_B.weight'] = np.ascontiguousarray(b.reshape(r, -1).T)
  return out


def _target_modules(model_cfg, paths) -> list[str] | str:
  by_layer = {}
  for path in paths:
    if path[0] == 'layers':
      by_layer.setdefault(path[1], set()).add(f'{path[3]}_proj')
  layer_sets = list(by_layer.values())
  uniform = not layer_sets or (len(by_layer) == model_cfg.num_layers and
                               all(s == layer_sets[0] for s in layer_sets))
  if not uniform:
    return '|'.join(re.escape(hf_module_name(p)) for p in paths)
  names = sorted(layer_sets[0]) if layer_sets else []
  return names + [hf_module_name(p).split('.')[-1] for p in paths if p[0] != 'layers']


def check_peft(model_cfg: transformer.ModelConfig, lora_cfg: lora.LoraConfig) -> None:
  """Raises ValueError if no PEFT adapter can reproduce this LoRA setup (call it at start-up
  when a PEFT export will be asked for); lora.check's errors too."""
  if model_cfg.tie_embeddings and ('embed',) in lora.target_paths(model_cfg, lora_cfg):
    raise ValueError(
        "save_peft: the adapter targets 'embed' of a model with tied embeddings. Ours changes "
        "the shared matrix, so the LM head too; PEFT's embedding adapter changes only the input "
        'lookup, so the PEFT model would compute different logits. Use save_merged.')


def save_peft(path, model_cfg: transformer.ModelConfig, adapter: transformer.Params,
              lora_cfg: lora.LoraConfig, base_model_name_or_path: str, *,
              quantized_base: transformer.Params | None = None):
  """A PEFT LoRA adapter directory for `base_model_name_or_path`.

  Args:
    path: output directory (created).
    model_cfg, adapter, lora_cfg: the adapter, as from lora.init and training.
    base_model_name_or_path: written to adapter_config.json; the base peft applies it to.
    quantized_base: required when lora_cfg.quantize is set: the quantised base the adapter
      was trained on. Its dequantised weights are written (fp32, weights.save) to
      base_model_name_or_path, which must then be a local directory.
  """
  check_peft(model_cfg, lora_cfg)
  paths = lora.target_paths(model_cfg, lora_cfg)
  if lora_cfg.quantize:
    if quantized_base is None:
      raise ValueError(
          f"save_peft: the adapter was trained on a {lora_cfg.quantize}-quantised base, whose "
          f'dequantised weights differ from the full-precision {base_model_name_or_path!r}; '
          'applied there it would not reproduce the trained policy. Pass quantized_base= to '
          'also write the dequantised base to base_model_name_or_path, or use save_merged.')
    weights.save(base_model_name_or_path, model_cfg,
                 lora.dequantize_base(quantized_base, model_cfg), dtype='float32')
  tensors = peft_tensors(model_cfg, adapter, lora_cfg)
  config = {
      'peft_type': 'LORA', 'task_type': 'CAUSAL_LM',
      'base_model_name_or_path': str(base_model_name_or_path),
      'r': lora_cfg.rank, 'lora_alpha': lora_cfg.alpha, 'lora_dropout': lora_cfg.dropout,
      'target_modules': _target_modules(model_cfg, paths),
      'bias': 'none', 'fan_in_fan_out': False, 'use_rslora': False, 'use_dora': False,
      'init_lora_weights': True, 'inference_mode': True, 'modules_to_save': None,
      'layers_to_transform': None, 'layers_pattern': None, 'rank_pattern': {},
      'alpha_pattern': {},
  }
  path = pathlib.Path(path)
  path.mkdir(parents=True, exist_ok=True)
  (path / 'adapter_config.json').write_text(json.dumps(config, indent=2) + '\n')
  safetensors.numpy.save_file(tensors, str(path / 'adapter_model.safetensors'),
                              metadata={'format': 'pt'})
