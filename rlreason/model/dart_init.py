"""DART's adapter pair (model/dart.py): the target check and the initialisation, in lora.py's
layouts. Apart from dart.py, which the forward imports: lora.py imports the transformer.
"""

import jax

from rlreason.model import dart
from rlreason.model import lora

Params = dart.Params


def check(model_cfg, lora_cfg) -> None:
  """lora.check, plus: DART adapters on the attention and MLP projections only."""
  lora.check(model_cfg, lora_cfg)
  bad = [p for p in lora.target_paths(model_cfg, lora_cfg) if p[0] != 'layers']
  if bad:
    raise ValueError(f'lora.targets={lora_cfg.targets} with lora.routing=\'dart\': '
                     f'{[".".join(p) for p in bad]} cannot be routed per token here (only the '
                     'attention and MLP projections); drop them from the targets.')


def init(model_cfg, lora_cfg, rng: jax.Array) -> Params:
  """{'reason': adapter, 'tool': adapter}, each as lora.init (B = 0), from split keys."""
  check(model_cfg, lora_cfg)
  k_reason, k_tool = jax.random.split(rng)
  return {'reason': lora.init(model_cfg, lora_cfg, k_reason),
          'tool': lora.init(model_cfg, lora_cfg, k_tool)}
