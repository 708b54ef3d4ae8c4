"""Mixture-of-Experts configuration for Qwen3-MoE and Qwen2-MoE, its checks, and the HF names.

`MoEConfig` holds the fields of a Qwen2/Qwen3-MoE HF config.json that the MoE block reads;
`moe_config_from_hf` reads them (missing keys take the transformers config class's defaults
for that model_type); `is_moe_layer` is transformers' rule for which decoder layers carry an
MoE block; `check_moe` rejects bad configs naming the field. `moe_params_from_hf` and
`moe_params_to_hf` convert one layer's MoE weights between HF tensors and this package's
stacked layout (moe.py), and `tensor_map` lists them for weights.py's streaming load/save:

  router [D, E]            <- mlp.gate.weight [E, D]
  gate, up [E, D, I]       <- mlp.experts.{e}.{gate,up}_proj.weight [I, D]  (safetensors on disk)
                              or mlp.experts.gate_up_proj [E, 2I, D]  (transformers 5.x in memory)
  down [E, I, D]           <- mlp.experts.{e}.down_proj.weight [D, I]
                              or mlp.experts.down_proj [E, D, I]
  shared.{gate,up} [D, Is] <- mlp.shared_expert.{gate,up}_proj.weight [Is, D]  (Qwen2-MoE only)
  shared.down [Is, D]      <- mlp.shared_expert.down_proj.weight [D, Is]
  shared_expert_gate [D]   <- mlp.shared_expert_gate.weight [1, D]

transformers 5.24 keeps experts fused in memory (gate_up_proj, its gate half first) and writes
per-expert keys in save_pretrained (conversion_mapping.py's 'qwen2_moe' entry, which Qwen3-MoE
shares); export writes the per-expert form, import reads either.

Deliberately not here: the forward (moe.py), mesh or rule tables (sharding.py).
"""

from collections.abc import Mapping
import dataclasses

import numpy as np

# transformers 5.24's Qwen3MoeConfig / Qwen2MoeConfig defaults, for keys a config.json omits.
_HF_DEFAULTS = {
    'qwen3_moe': dict(num_experts=128, num_experts_per_tok=8, moe_intermediate_size=768,
                      norm_topk_prob=False, decoder_sparse_step=1, mlp_only_layers=(),
                      shared_expert_intermediate_size=0, router_aux_loss_coef=0.001),
    'qwen2_moe': dict(num_experts=60, num_experts_per_tok=4, moe_intermediate_size=1408,
                      norm_topk_prob=False, decoder_sparse_step=1, mlp_only_layers=(),
                      shared_expert_intermediate_size=5632, router_aux_loss_coef=0.001),
}


@dataclasses.dataclass(frozen=True)
class MoEConfig:
  """An MoE block's architecture; hashable, so it can be a static jit arg.

  shared_expert_intermediate_size: 0 for none (Qwen3-MoE), else Qwen2-MoE's sigmoid-gated
  shared expert's width.
  """
  num_experts: int
  num_experts_per_tok: int
  moe_intermediate_size: int
  norm_topk_prob: bool = False
  decoder_sparse_step: int = 1
  mlp_only_layers: tuple[int, ...] = ()
  shared_expert_intermediate_size: int = 0
  router_aux_loss_coef: float = 0.001


def moe_config_from_hf(hf: Mapping) -> MoEConfig:
  """The MoE fields of an HF config.json dict (model_type 'qwen3_moe' or 'qwen2_moe'; other
  types must spell every field). transformers 5.24 writes Qwen3-MoE's num_experts as
  `num_local_experts` (its attribute_map); released checkpoints spell `num_experts`."""
  defaults = _HF_DEFAULTS.get(hf.get('model_type'), {})
  values = {}
  for field in dataclasses.fields(MoEConfig):
    value = hf.get(field.name)
    if value is None and field.name == 'num_experts':
      value = hf.get('num_local_experts')
    if value is None:
      if field.name not in defaults:
        raise ValueError(f"HF config: {field.name!r} missing and model_type="
                         f"{hf.get('model_type')!r} has no default; known: {sorted(_HF_DEFAULTS)}")
      value = defaults[field.name]
    values[field.name] = value
  values['mlp_only_layers'] = tuple(int(i) for i in values['mlp_only_layers'])
  values['norm_topk_prob'] = bool(values['norm_topk_prob'])
  for name in ('num_experts', 'num_experts_per_tok', 'moe_intermediate_size', 'decoder_sparse_step',
               'shared_expert_intermediate_size'):
    values[name] = int(values[name])
  values['router_aux_loss_coef'] = float(values['router_aux_loss_coef'])
  return MoEConfig(**values)


def is_moe_layer(layer: int, cfg: MoEConfig) -> bool:
  """transformers' rule (Qwen{2,3}MoeDecoderLayer): sparse iff the layer is not in
  mlp_only_layers, there are experts, and (layer + 1) % decoder_sparse_step == 0."""
  return (layer not in cfg.mlp_only_layers and cfg.num_experts > 0
          and (layer + 1) % cfg.decoder_sparse_step == 0)


def check_moe(cfg: MoEConfig, *, expert_axis_size: int = 1, num_layers: int | None = None) -> None:
  """Raises ValueError naming the field for a config the MoE block cannot run."""
  if cfg.num_experts < 1:
    raise ValueError(f'moe: num_experts={cfg.num_experts} must be >= 1')
  if not 1 <= cfg.num_experts_per_tok <= cfg.num_experts:
    raise ValueError(f'moe: num_experts_per_tok={cfg.num_experts_per_tok} must be in '
                     f'[1, num_experts={cfg.num_experts}]')
  if cfg.moe_intermediate_size < 1:
    raise ValueError(f'moe: moe_intermediate_size={cfg.moe_intermediate_size} must be >= 1')
  if cfg.decoder_sparse_step < 1:
    raise ValueError(f'moe: decoder_sparse_step={cfg.decoder_sparse_step} must be >= 1')
  if cfg.shared_expert_intermediate_size < 0:
    raise ValueError(f'moe: shared_expert_intermediate_size={cfg.shared_expert_intermediate_size} '
                     'must be >= 0 (0: no shared expert)')
  if num_layers is not None and any(not 0 <= i < num_layers for i in cfg.mlp_only_layers):
    raise ValueError(f'moe: mlp_only_layers={list(cfg.mlp_only_layers)} names layers outside '
                     f'[0, num_layers={num_layers})')
  if expert_axis_size < 1 or cfg.num_experts % expert_axis_size:
    raise ValueError(f'mesh.expert={expert_axis_size} does not divide '
                     f'moe num_experts={cfg.num_experts}')


def moe_params_from_hf(tensors: Mapping, prefix: str, *, num_experts: int,
                       shared_expert: bool) -> dict:
  """One layer's MoE params from HF tensors (numpy-convertible), `prefix` e.g.
  'model.layers.3.mlp.'; reads the per-expert (safetensors) or fused (in-memory) layout."""
  get = lambda name: np.asarray(tensors[prefix + name])
  params = {'router': get('gate.weight').T}
  if prefix + 'experts.gate_up_proj' in tensors:
    gate_up_Ex2IxD = get('experts.gate_up_proj')
    inter = gate_up_Ex2IxD.shape[1] // 2
    params['gate'] = gate_up_Ex2IxD[:, :inter].transpose(0, 2, 1)
    params['up'] = gate_up_Ex2IxD[:, inter:].transpose(0, 2, 1)
    params['down'] = get('experts.down_proj').transpose(0, 2, 1)
  else:
    missing = [prefix + f'experts.{e}.gate_proj.weight' for e in range(num_experts)
               if prefix + f'experts.{e}.gate_proj.weight' not in tensors]
    if missing:
      raise ValueError(f'HF tensors: no {prefix}experts.gate_up_proj and missing {missing[:3]}')
    for name in ('gate', 'up', 'down'):
      params[name] = np.stack([get(f'experts.{e}.{name}_proj.weight').T
                               for e in range(num_experts)])
  if shared_expert:
    params['shared'] = {name: get(f'shared_expert.{name}_proj.weight').T
                        for name in ('gate', 'up', 'down')}
    params['shared_expert_gate'] = get('shared_expert_gate.weight')[0]
  return params


def moe_params_to_hf(params: Mapping, prefix: str) -> dict[str, np.ndarray]:
  """One layer's MoE params as HF safetensors tensors (per-expert keys, as save_pretrained
  writes them)."""
  out = {prefix + 'gate.weight': np.asarray(params['router']).T}
  for name in ('gate', 'up', 'down'):
    stacked = np.asarray(params[name])
    for e in range(stacked.shape[0]):
      out[prefix + f'experts.{e}.{name}_proj.weight'] = np.ascontiguousarray(stacked[e].T)
  if 'shared' in params:
    for name in ('gate', 'up', 'down'):
      out[prefix + f'shared_expert.{name}_proj.weight'] = np.asarray(params['shared'][name]).T
    out[prefix + 'shared_expert_gate.weight'] = np.asarray(params['shared_expert_gate'])[None]
  return {k: np.ascontiguousarray(v) for k, v in out.items()}


def tensor_map(cfg: MoEConfig, *, hidden_size: int, prefix: str, ours: tuple) -> dict:
  """One MoE layer's HF safetensors names -> (params path, HF shape, transposed), the form of
  weights.py's tensor map; `prefix` e.g. 'model.layers.3.mlp.', `ours` the layer's MLP path.
  A path ending in an int e is expert e's slice of the stacked leaf."""
  d, e, i = hidden_size, cfg.num_experts, cfg.moe_intermediate_size
  s = cfg.shared_expert_intermediate_size
  m = {prefix + 'gate.weight': (ours + ('router',), (e, d), True)}
  for n, shape in (('gate', (i, d)), ('up', (i, d)), ('down', (d, i))):
    for x in range(e):
      m[f'{prefix}experts.{x}.{n}_proj.weight'] = (ours + (n, x), shape, True)
  if s:
    for n, shape in (('gate', (s, d)), ('up', (s, d)), ('down', (d, s))):
      m[f'{prefix}shared_expert.{n}_proj.weight'] = (ours + ('shared', n), shape, True)
    m[prefix + 'shared_expert_gate.weight'] = (ours + ('shared_expert_gate',), (1, d), False)
  return m
