"""The explicit KV cache of `transformer.apply`: written slot by slot, plus frozen segments.

Deliberately not here: the attention that reads it (attention.cache_attention) and the
forward that writes it (layers.Attention).
"""

import flax
import jax
import jax.numpy as jnp


@flax.struct.dataclass
class FrozenKV:
  """A read-only cache segment that new tokens attend to but never write: keys AxKxDhxS and
  values AxKxSxDh per layer, mask_AxS its valid slots. A cache of N rows may hold one with
  A = N/G rows, each read by G consecutive rows (a prompt's cache shared by its samples)."""
  keys: tuple[jax.Array, ...]
  values: tuple[jax.Array, ...]
  mask_AxS: jax.Array


@flax.struct.dataclass
class KVCache:
  """Keys and values of every layer, written slot by slot, after optional frozen segments.

  keys: one NxKxDhxS array per layer; values: one NxKxSxDh array per layer. Both put the
  contracted axis second to last, as a matmul reads it: q . k contracts Dh, p . v contracts S.
  Stored NxKxSxDh, keys make the decode step's scores reduce over the minor Dh axis, which
  XLA:CPU runs 3-4x slower (the sampler benchmark's shapes; ~8x with the demo's Dh = 16).
  mask_NxS: the slot holds a real token (left padding and unused slots are False). end: the
  next slot to write, shared by all rows. pos_N: each row's next RoPE position (its count of
  real tokens so far, frozen segments included). frozen: earlier segments (`freeze`), all
  before this one's slots; new tokens attend to their valid slots and to their own.
  """
  keys: tuple[jax.Array, ...]
  values: tuple[jax.Array, ...]
  mask_NxS: jax.Array
  end: jax.Array
  pos_N: jax.Array
  frozen: tuple[FrozenKV, ...] = ()

  @property
  def size(self) -> int:
    return self.mask_NxS.shape[1]


def init_cache(cfg, batch: int, size: int, dtype=None, *,
               frozen: tuple[FrozenKV, ...] = (), pos_N=None) -> KVCache:
  """An empty cache of `size` slots for `batch` rows (dtype defaults to compute dtype).

  frozen: segments attended before these slots; pos_N: the rows' next RoPE positions (give
  the frozen segments' token counts, e.g. `freeze`'s cache's pos_N; default 0).
  """
  dtype = dtype or cfg.compute_dtype
  n, k, dh = batch, cfg.num_kv_heads, cfg.head_dim
  for seg in frozen:
    if batch % seg.mask_AxS.shape[0]:
      raise ValueError(f'init_cache: a frozen segment has {seg.mask_AxS.shape[0]} rows, which '
                       f'does not divide batch={batch}.')
  zeros = lambda shape: tuple(jnp.zeros(shape, dtype) for _ in range(cfg.num_layers))
  pos_N = jnp.zeros((batch,), jnp.int32) if pos_N is None else jnp.asarray(pos_N, jnp.int32)
  return KVCache(keys=zeros((n, k, dh, size)), values=zeros((n, k, size, dh)),
                 mask_NxS=jnp.zeros((batch, size), bool), end=jnp.zeros((), jnp.int32),
                 pos_N=pos_N, frozen=tuple(frozen))


def freeze(cache: KVCache, after: FrozenKV | None = None) -> FrozenKV:
  """The cache's own slots as a read-only segment (its frozen segments are not included),
  appended to the slots of `after` (same rows) if given: one segment, one copy."""
  seg = FrozenKV(keys=cache.keys, values=cache.values, mask_AxS=cache.mask_NxS)
  if after is None:
    return seg
  cat = lambda axis: lambda a, b: jnp.concatenate([a, b.astype(a.dtype)], axis=axis)
  return FrozenKV(keys=tuple(map(cat(3), after.keys, seg.keys)),
                  values=tuple(map(cat(2), after.values, seg.values)),
                  mask_AxS=cat(1)(after.mask_AxS, seg.mask_AxS))
