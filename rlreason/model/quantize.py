"""Weight-only quantisation of a frozen base: int8 per output channel, and NF4 (4-bit).

  q = quantize_int8(w, in_axes=(0,))      # {'int8': int8 like w, 'scale': fp32}
  w_hat = dequantize(q, w.shape)
  q = quantize_nf4(w, block=64)           # {'nf4': uint8 [..., last/2], 'absmax': fp32}

int8: scale = max |w| over the input axes / 127 per output channel, codes round(w / scale)
in [-127, 127]; the error is at most scale / 2 per element.

NF4 (QLoRA, arXiv:2305.14314, as bitsandbytes stores it): blocks of `block` consecutive
elements of the last axis are divided by their absmax and each value becomes the index of the
nearest of the 16 NF4 levels (`NF4_CODE`, bitsandbytes' table); two indices share a byte, the
first in the high nibble. The error is at most absmax * 0.1519 (half the widest gap between
levels, -1.0 .. -0.6962). Blocks run along the last axis, not the flattened array, so the codes
keep the weight's leading axes and shard with the same logical axes (`quantized_axes`).

Why not qwix's quantisers: its QArray is a pytree class from a private module (`qwix._src`)
whose int8 bound is 127.5 rather than absmax, its NF4 codes are uint4 arrays (one byte each on
XLA:CPU, so no memory saved), and it has no block-wise NF4 absmax.

Deliberately not here: double quantisation of the NF4 absmax (QLoRA's 8-bit absmax; ours
are fp32, 0.5 bit per weight at block 64), activation quantisation, quantised matmuls (the
weight is dequantised before use).
"""

import jax
import jax.numpy as jnp
import numpy as np

# bitsandbytes' NF4 levels (functional.py get_4bit_type('nf4')), the quantiles of N(0, 1)
# scaled to [-1, 1] with an exact zero (QLoRA appendix E).
NF4_CODE = np.array([
    -1.0, -0.6961928009986877, -0.5250730514526367, -0.39491748809814453,
    -0.28444138169288635, -0.18477343022823334, -0.09105003625154495, 0.0,
    0.07958029955625534, 0.16093020141124725, 0.24611230194568634, 0.33791524171829224,
    0.44070982933044434, 0.5626170039176941, 0.7229568362236023, 1.0], np.float32)
# Decision thresholds: a value goes to the level above once it passes the midpoint.
_NF4_MIDPOINTS = (NF4_CODE[1:] + NF4_CODE[:-1]) / 2


def quantize_int8(w, in_axes: tuple[int, ...]) -> dict:
  """int8 codes and fp32 scales, one scale per output channel (in_axes kept as size 1)."""
  w = w.astype(jnp.float32)
  absmax = jnp.max(jnp.abs(w), axis=in_axes, keepdims=True)
  scale = absmax / 127.0
  codes = jnp.clip(jnp.round(w / jnp.where(scale == 0, 1.0, scale)), -127, 127)
  return {'int8': codes.astype(jnp.int8), 'scale': scale}


def quantize_nf4(w, block: int) -> dict:
  """NF4 codes packed two per byte along the last axis, and each block's fp32 absmax."""
  *lead, last = w.shape
  if block % 2 or last % block:
    raise ValueError(f'quantize_nf4: block={block} must be even and divide the last axis '
                     f'({last}) of a {list(w.shape)} weight.')
  w_LxBxK = w.astype(jnp.float32).reshape(*lead, last // block, block)
  absmax = jnp.max(jnp.abs(w_LxBxK), axis=-1)
  normed = w_LxBxK / jnp.where(absmax == 0, 1.0, absmax)[..., None]
  codes = jnp.searchsorted(jnp.asarray(_NF4_MIDPOINTS), normed.reshape(*lead, last),
                           side='left').astype(jnp.uint8)
  packed = (codes[..., 0::2] << 4) | codes[..., 1::2]
  return {'nf4': packed, 'absmax': absmax}


def nf4_codes(q: dict):
  """The unpacked level indices (uint8 in [0, 16)) of a quantize_nf4 result."""
  packed = q['nf4']
  pairs = jnp.stack([packed >> 4, packed & 0xF], axis=-1)
  return pairs.reshape(*packed.shape[:-1], 2 * packed.shape[-1])


def dequantize(q: dict, dtype=jnp.float32):
  """The weight a quantize_* result stands for."""
  if 'int8' in q:
    return (q['int8'].astype(jnp.float32) * q['scale']).astype(dtype)
  codes = nf4_codes(q)
  *lead, last = codes.shape
  nblocks = q['absmax'].shape[-1]
  values = jnp.take(jnp.asarray(NF4_CODE), codes.astype(jnp.int32), axis=0)
  w = values.reshape(*lead, nblocks, last // nblocks) * q['absmax'][..., None]
  return w.reshape(*lead, last).astype(dtype)


def is_quantized(leaf) -> bool:
  return isinstance(leaf, dict) and ('int8' in leaf or 'nf4' in leaf)


def quantized_axes(axes: tuple, mode: str, in_axes: tuple[int, ...]) -> dict:
  """Logical axes of a quantize_* result for a weight with these axes: the codes keep the
  weight's axes; int8 scales drop the input axes (size 1), NF4 absmax keeps them all."""
  if mode == 'int8':
    return {'int8': axes, 'scale': tuple(None if i in in_axes else a for i, a in enumerate(axes))}
  return {'nf4': axes, 'absmax': axes}


def max_error(q: dict) -> jax.Array:
  """The per-element error bound of a quantize_* result, broadcastable to the weight."""
  if 'int8' in q:
    return q['scale'] / 2
  half_gap = float(np.max(np.diff(NF4_CODE))) / 2
  last = 2 * q['nf4'].shape[-1]
  return half_gap * jnp.repeat(q['absmax'], last // q['absmax'].shape[-1], axis=-1)
