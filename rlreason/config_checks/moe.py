"""Start-up checks of a Mixture-of-Experts model (model/moe_config.py) against the mesh.

The MoE fields come from model.moe (a random model, model.init='random') or from the HF
checkpoint's config.json (model.init='hf'; its model_type 'qwen3_moe' or 'qwen2_moe').
Refused, naming the field: top-k above the expert count (model.moe.num_experts_per_tok, or
the checkpoint's num_experts_per_tok), an `expert` mesh axis that does not divide the
experts (mesh.expert), an expert axis > 1 for a dense model, LoRA (lora.enabled: model/lora.py
knows 2-D weights only), an expert axis with per-host sampling meshes, and the rest of
moe_config.check_moe. rlreason.config_checks.validate calls `check_moe_mesh`.
"""

import json
import pathlib


def _checkpoint_moe(c):
  """(the MoEConfig of model.path's config.json, or None when dense or unreadable; where)."""
  from rlreason.model import moe_config
  path = pathlib.Path(c.model.path) / 'config.json'
  if not path.is_file():  # inputs.check_paths reports a missing checkpoint.
    return None, ''
  try:
    hf = json.loads(path.read_text())
  except (OSError, ValueError):
    return None, ''
  if not str(hf.get('model_type', '')).endswith('_moe'):
    return None, ''
  return moe_config.moe_config_from_hf(hf), f'{path}: '


def check_moe_mesh(c, check) -> None:
  """model.moe (or the checkpoint's MoE fields) against mesh.expert."""
  from rlreason.model import moe_config
  expert_axis = int(c.mesh.get('expert', 1))
  where = 'model.moe.'
  if c.model.init == 'hf':
    try:
      moe, where = _checkpoint_moe(c)
    except ValueError as e:
      check(False, f'model.path: {e}')
      return
  elif c.model.get('moe') is not None and c.model.moe.num_experts:
    moe = moe_config.MoEConfig(**{**dict(c.model.moe),
                                  'mlp_only_layers': tuple(c.model.moe.mlp_only_layers)})
  else:
    moe = None
  if moe is None:
    check(expert_axis == 1, f'mesh.expert={expert_axis} but the model has no experts (dense); '
                            'use mesh.expert=1.')
    return
  check(not (c.get('lora') is not None and c.lora.enabled),
        "lora.enabled with an MoE model: LoRA (and DART) adapt the dense layers' 2-D weights; "
        'the stacked expert weights are not supported.')
  kind = (c.get('sample_mesh') or {}).get('kind', 'train')
  check(expert_axis == 1 or kind == 'train',
        f"mesh.expert={expert_axis} with sample_mesh.kind={kind!r}: per-host sampling meshes "
        "(multihost.sample_mesh) have no expert axis; use sample_mesh.kind='train'.")
  check(moe.num_experts_per_tok <= moe.num_experts,
        f'{where}num_experts_per_tok={moe.num_experts_per_tok} > num_experts='
        f'{moe.num_experts}: top-k cannot exceed the experts.')
  check(expert_axis >= 1 and moe.num_experts % expert_axis == 0,
        f'mesh.expert={expert_axis} does not divide {where}num_experts={moe.num_experts}.')
  try:
    moe_config.check_moe(moe, num_layers=None if c.model.init == 'hf' else c.model.arch.num_layers)
  except ValueError as e:
    if 'num_experts_per_tok' not in str(e):  # Reported above, with the field's full name.
      check(False, f'{where.rstrip(".")}: {e}')
