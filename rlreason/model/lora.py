"""LoRA (arXiv:2106.09685) as a pure transformation of the params tree, optionally over a
quantised frozen base (QLoRA, arXiv:2305.14314).

  lora_cfg = LoraConfig(rank=16, alpha=32.0)
  check(model_cfg, lora_cfg)
  adapter = init(model_cfg, lora_cfg, rng)           # only this is trained
  base = quantize_base(params, model_cfg, lora_cfg)  # unchanged unless lora_cfg.quantize
  logits, _ = transformer.apply(merge(base, adapter, model_cfg, lora_cfg), tokens, cfg=model_cfg)

For each targeted weight W, merge returns W' = W + (alpha / rank) * A @ B, computed inside the
caller's jit on every call, with the base under stop_gradient: gradients reach only A and B,
and the sampler and the learner, calling the same merge, always run the current adapter.
(Why not qwix: it needs disable_jit=True with our pinned jax/flax, intercepts matmuls by param
identity, so the MLP's stacked gate/up prefill path would run without the adapter while decode
ran with it, and it wraps a stateful nnx model where `transformer.apply` is functional.)

Targets are fnmatch patterns (not regexes) over the weights' dotted paths: 'layers.3.attn.q',
'layers.0.mlp.down', 'embed', 'lm_head' (untied models only). A pattern without a dot also
matches the last component, so 'q' means every layer's q and 'layers.1.*' all of layer 1's.
Every pattern must match at least one weight. Layouts follow transformer.py: A maps the
weight's input axes to the rank, B the rank to its output axes (q: a DxR, b RxHxDh; o: a
HxDhxR, b RxD; embed: a VxR, b RxD), so `adapter_axes` reuses the base's logical axes.

Initialisation: A as PEFT's default (kaiming-uniform with a = sqrt(5): U(+-1/sqrt(fan_in))),
B zeros, fp32; so an initial adapter is the base model exactly. For the embedding A is N(0, 1)
and B zeros, where PEFT draws B and zeros A: B = 0 then means "no change" for every target.

Dropout is refused (any value but 0). Merged weights cannot drop the adapter's input per
token, and dropping it per step (a mask on W') would make the learner's log-probs those of a
randomly thinned policy, while the sampler's behaviour log-probs (and the old log-probs of
the PPO/GRPO ratio) come from the full one: the ratio would compare two different policies.

Quantised base ('int8' or 'nf4', see quantize.py): every attention and MLP projection of every
layer is stored quantised, targeted or not (the base is frozen either way); the embedding,
LM head, norms and biases stay in their dtype, as in QLoRA. merge dequantises them each call.

Deliberately not here: DoRA/rsLoRA; unmerged (x A) B matmuls and per-token adapter routing
(DART's two adapters) are model/dart.py.
"""

import dataclasses
import fnmatch
import math
from typing import Any

import jax
import jax.numpy as jnp

from rlreason.model import quantize
from rlreason.model import transformer
from rlreason.model import weights

Params = Any
QUANTIZE_MODES = ('', 'int8', 'nf4')
_ATTN, _MLP = ('q', 'k', 'v', 'o'), ('gate', 'up', 'down')


@dataclasses.dataclass(frozen=True)
class LoraConfig:
  """rank, alpha (scale alpha / rank), dropout (must be 0, see the module docstring), target
  patterns, base quantisation ('' | 'int8' | 'nf4') and the NF4 block size."""
  rank: int
  alpha: float
  dropout: float = 0.0
  targets: tuple[str, ...] = ('q', 'k', 'v', 'o', 'gate', 'up', 'down')
  quantize: str = ''
  nf4_block: int = 64

  @property
  def scale(self) -> float:
    return self.alpha / self.rank


def modules(model_cfg: transformer.ModelConfig) -> dict[str, tuple[tuple[str, ...], int]]:
  """Every weight LoRA can target: dotted path -> (params path, number of input axes)."""
  out = {}
  for i in range(model_cfg.num_layers):
    for n in _ATTN:
      out[f'layers.{i}.attn.{n}'] = (('layers', str(i), 'attn', n), 2 if n == 'o' else 1)
    for n in _MLP:
      out[f'layers.{i}.mlp.{n}'] = (('layers', str(i), 'mlp', n), 1)
  out['embed'] = (('embed',), 1)
  if not model_cfg.tie_embeddings:
    out['lm_head'] = (('lm_head',), 1)
  return out


def _matches(pattern: str, dotted: str) -> bool:
  return fnmatch.fnmatchcase(dotted, pattern) or (
      '.' not in pattern and fnmatch.fnmatchcase(dotted.rsplit('.', 1)[-1], pattern))


def _quantized_paths(model_cfg, lora_cfg) -> list[tuple[str, ...]]:
  if not lora_cfg.quantize:
    return []
  return [path for dotted, (path, _) in modules(model_cfg).items() if dotted.startswith('layers.')]


_get, _set = weights.tree_get, weights.tree_set


def _copy(tree):
  """The nested dicts rebuilt (leaves shared), so _set does not write into the caller's tree."""
  return {k: _copy(v) for k, v in tree.items()} if isinstance(tree, dict) else tree


def check(model_cfg: transformer.ModelConfig, lora_cfg: LoraConfig) -> None:
  """Raises ValueError naming the first bad field, pattern or layer."""
  c = lora_cfg
  if not isinstance(c.rank, int) or c.rank <= 0:
    raise ValueError(f'LoraConfig.rank={c.rank!r} must be a positive integer.')
  if not c.alpha > 0:
    raise ValueError(f'LoraConfig.alpha={c.alpha!r} must be > 0 (the update is scaled by '
                     'alpha / rank).')
  if not 0 <= c.dropout < 1:
    raise ValueError(f'LoraConfig.dropout={c.dropout!r} must be in [0, 1).')
  if c.dropout:
    raise ValueError(
        f'LoraConfig.dropout={c.dropout!r}: only 0 is supported. Adapters are merged into the '
        'weights (W + s A B), which cannot drop the adapter input per token; dropping per step '
        'would make the learner score a randomly thinned policy while the sampler and the '
        'ratio\'s old log-probs use the full one.')
  if c.quantize not in QUANTIZE_MODES:
    raise ValueError(f'LoraConfig.quantize={c.quantize!r}; known: {QUANTIZE_MODES}.')
  if (not isinstance(c.targets, tuple) or not c.targets
      or not all(isinstance(p, str) for p in c.targets)):
    raise ValueError(f'LoraConfig.targets={c.targets!r} must be a non-empty tuple of patterns.')
  available = modules(model_cfg)
  for pattern in c.targets:
    if not any(_matches(pattern, dotted) for dotted in available):
      names = sorted({d.rsplit('.', 1)[-1] for d in available})
      raise ValueError(
          f'LoraConfig.targets: {pattern!r} matches no weight. Module names: {names}; paths look '
          f'like layers.<0..{model_cfg.num_layers - 1}>.attn.q, layers.0.mlp.down, embed'
          + (' (tied embeddings: no lm_head)' if model_cfg.tie_embeddings else ', lm_head') + '.')
  abstract = transformer.abstract_params(model_cfg)
  for dotted in _target_names(model_cfg, c):
    path, n_in = available[dotted]
    shape = _get(abstract, path).shape
    fan_in, fan_out = math.prod(shape[:n_in]), math.prod(shape[n_in:])
    if c.rank > min(fan_in, fan_out):
      raise ValueError(f'LoraConfig.rank={c.rank} exceeds min(in, out) = min({fan_in}, '
                       f'{fan_out}) of the targeted layer {dotted}.')
  if c.quantize == 'nf4':
    for path in _quantized_paths(model_cfg, c):
      last = _get(abstract, path).shape[-1]
      if c.nf4_block <= 0 or c.nf4_block % 2 or last % c.nf4_block:
        raise ValueError(f'LoraConfig.nf4_block={c.nf4_block} must be even and divide the last '
                         f'axis ({last}) of {".".join(path)}.')


def _target_names(model_cfg, lora_cfg) -> list[str]:
  return [d for d in modules(model_cfg) if any(_matches(p, d) for p in lora_cfg.targets)]


def target_paths(model_cfg: transformer.ModelConfig, lora_cfg: LoraConfig) -> list[tuple[str, ...]]:
  """The params paths of the targeted weights, in layer order then embed, lm_head."""
  check(model_cfg, lora_cfg)
  available = modules(model_cfg)
  return [available[d][0] for d in _target_names(model_cfg, lora_cfg)]


def _n_in(path: tuple[str, ...]) -> int:
  return 2 if path[-1] == 'o' else 1


def init(model_cfg: transformer.ModelConfig, lora_cfg: LoraConfig, rng: jax.Array) -> Params:
  """The adapter: {..path..: {'a': A, 'b': B}} per target, fp32, B zeros; jittable."""
  paths = target_paths(model_cfg, lora_cfg)
  abstract = transformer.abstract_params(model_cfg)
  adapter = {}
  for path, key in zip(paths, jax.random.split(rng, len(paths))):
    shape, n_in, r = _get(abstract, path).shape, _n_in(path), lora_cfg.rank
    a_shape = shape[:n_in] + (r,)
    if path == ('embed',):  # A gather table: unit-variance rows, as PEFT's embedding B.
      a = jax.random.normal(key, a_shape, jnp.float32)
    else:
      bound = 1.0 / math.sqrt(math.prod(shape[:n_in]))
      a = jax.random.uniform(key, a_shape, jnp.float32, -bound, bound)
    _set(adapter, path, {'a': a, 'b': jnp.zeros((r,) + shape[n_in:], jnp.float32)})
  return adapter


def adapter_axes(model_cfg: transformer.ModelConfig, lora_cfg: LoraConfig) -> Params:
  """Logical axes of every adapter leaf: the base weight's input axes then None (A), None
  then its output axes (B), for sharding.tree_shardings."""
  base_axes_tree = transformer.param_axes(model_cfg)
  out = {}
  for path in target_paths(model_cfg, lora_cfg):
    axes, n_in = _get(base_axes_tree, path), _n_in(path)
    _set(out, path, {'a': axes[:n_in] + (None,), 'b': (None,) + axes[n_in:]})
  return out


def quantize_base(params: Params, model_cfg: transformer.ModelConfig,
                  lora_cfg: LoraConfig) -> Params:
  """The base with every layer's attention and MLP projections quantised ({'int8', 'scale'}
  or {'nf4', 'absmax'} dicts); other leaves shared. Identity when lora_cfg.quantize == ''."""
  check(model_cfg, lora_cfg)
  out = _copy(params)
  for path in _quantized_paths(model_cfg, lora_cfg):
    w = _get(params, path)
    if lora_cfg.quantize == 'int8':
      q = quantize.quantize_int8(w, in_axes=tuple(range(_n_in(path))))
    else:
      q = quantize.quantize_nf4(w, lora_cfg.nf4_block)
    _set(out, path, q)
  return out


def base_axes(model_cfg: transformer.ModelConfig, lora_cfg: LoraConfig) -> Params:
  """Logical axes of quantize_base's output (transformer.param_axes when not quantised)."""
  axes = _copy(transformer.param_axes(model_cfg))
  for path in _quantized_paths(model_cfg, lora_cfg):
    _set(axes, path, quantize.quantized_axes(_get(axes, path), lora_cfg.quantize,
                                             tuple(range(_n_in(path)))))
  return axes


def dequantize_base(base: Params, model_cfg: transformer.ModelConfig) -> Params:
  """The base with its quantised weights dequantised to model_cfg.param_dtype."""
  def walk(tree):
    if quantize.is_quantized(tree):
      return quantize.dequantize(tree, model_cfg.param_dtype)
    return {k: walk(v) for k, v in tree.items()} if isinstance(tree, dict) else tree
  return walk(base)


def delta(a, b):
  """A @ B over the rank, in the weight's layout (fp32, full precision on every backend)."""
  return jnp.tensordot(a, b, axes=1, precision=jax.lax.Precision.HIGHEST)


def merge(base: Params, adapter: Params, model_cfg: transformer.ModelConfig,
          lora_cfg: LoraConfig) -> Params:
  """transformer params with W + (alpha / rank) A B at every target; jittable.

  The base is under stop_gradient (a jax.grad w.r.t. it is zero) and dequantised if
  quantised; a targeted weight comes out in the promoted dtype of W and A (fp32 for an fp32
  adapter; transformer.apply casts to the compute dtype). With B = 0 it is W exactly.
  """
  merged = dequantize_base(jax.lax.stop_gradient(base), model_cfg)
  merged = _copy(merged)
  for path in target_paths(model_cfg, lora_cfg):
    w, ab = _get(merged, path), _get(adapter, path)
    dtype = jnp.promote_types(w.dtype, ab['a'].dtype)
    _set(merged, path, w.astype(dtype) + lora_cfg.scale * delta(ab['a'], ab['b']).astype(dtype))
  return merged


def num_bytes(tree) -> int:
  """Bytes of all leaves (arrays or ShapeDtypeStructs)."""
  return sum(math.prod(x.shape) * jnp.dtype(x.dtype).itemsize for x in jax.tree.leaves(tree))
