"""The continuous sampler's slot pool (continuous.py): its memory estimate and slot checks, the
pool's state (`new_pool`), and admission of prompt groups into free slots.

  pool = continuous_pool.new_pool(prompts, key_data_N, limit_N, cfg=cfg, group_size=G,
                                  slots=S, max_new_tokens=M)
  pool = continuous_pool.admit_first(params, pool, None, temperature, version, cfg=cfg, ...)

A group's prompt is prefilled once (`admit_groups`), its G rows' prefixes after it, and the
keys and values are scattered into G free slots' caches (`admit`); the decode loop
(continuous.decode) and the episode pool (continuous_episodes.py) build on these. Written
scatters drop out-of-range indices, so nothing admitted writes nothing and the big buffers
never pass through control flow (see continuous.py's docstring for why).
"""

import jax
import jax.numpy as jnp
import numpy as np

from rlreason.model import transformer
from rlreason.rollout import sampling
from rlreason.structs import Prompts


def memory_estimate(cfg: transformer.ModelConfig, *, slots: int, rows: int, group_size: int,
                    prompt_len: int, max_new_tokens: int, prefix_len: int = 0,
                    cache_dtype=None, sample_dtype: str | None = None) -> dict[str, int]:
  """Bytes of the continuous sampler's large buffers (one device), by part.

  kv_cache: each slot's segment of prompt + prefix + max_new_tokens - 1 columns, and the
  one-column cache of a step. admission: one prompt's prefill (activations, its cache) and
  its group's prefix cache. decode_logits: the carried SxV logits and three transients of
  the sampling step. outputs: the N rows' tokens, log-probs and bookkeeping.
  """
  slot_bytes = 2 * cfg.num_layers * cfg.num_kv_heads * cfg.head_dim * np.dtype(
      cache_dtype or sample_dtype or cfg.compute_dtype).itemsize
  width = prompt_len + prefix_len + max_new_tokens - 1
  est = {
      'params': cfg.num_params() * np.dtype(cfg.param_dtype).itemsize,
      'kv_cache': slots * (width + 1) * slot_bytes,
      'admission': (prompt_len * (4 * cfg.hidden_size + 2 * cfg.intermediate_size
                                  + cfg.num_heads * prompt_len) * 4
                    + (prompt_len + group_size * prefix_len) * slot_bytes
                    + group_size * (prefix_len + 1) * cfg.vocab_size * 4),
      'decode_logits': 4 * slots * cfg.vocab_size * 4,
      'outputs': rows * (prefix_len + max_new_tokens) * 4 * 4,
  }
  if sample_dtype is not None and sample_dtype != cfg.param_dtype:
    est['sample_params'] = cfg.num_params() * np.dtype(sample_dtype).itemsize
  est['total'] = sum(est.values())
  return est


def max_slots(budget_bytes: int, cfg: transformer.ModelConfig, **kw) -> int:
  """The most slots (a multiple of group_size) whose memory_estimate fits budget_bytes."""
  one = memory_estimate(cfg, slots=1, **kw)['total']
  per_slot = memory_estimate(cfg, slots=2, **kw)['total'] - one
  fit = (budget_bytes - (one - per_slot)) // per_slot
  return max(0, int(fit) // kw['group_size'] * kw['group_size'])


def check_slots(slots, *, group_size: int, rows: int) -> None:
  """ValueError naming `slots` unless it is a positive multiple of group_size, at most rows."""
  if not isinstance(slots, (int, np.integer)) or isinstance(slots, bool):
    raise ValueError(f'slots={slots!r} must be an int.')
  if slots < group_size or slots % group_size:
    raise ValueError(f'slots={slots} must be a positive multiple of group_size={group_size} '
                     '(a group is admitted into G slots at once).')
  if slots > rows:
    raise ValueError(f'slots={slots} exceeds the B*G={rows} rows of the call; at most {rows}.')


def admit_groups(params, prompts, prefixes, bi, count, temperature, *, cfg, group_size,
                  cache_dtype, greedy):
  """Groups bi .. bi + count - 1: each prompt prefilled once, then its G rows' prefixes after
  it (as sampler.py). Returns, for their count*G = R rows: keys and values per layer over
  P + Q columns, mask RxW, pos_R, logits_RxV and the prefix plain log-probs RxQ (or None)."""
  r = group_size * count
  p = prompts.tokens_BxP.shape[1]
  tok_CxP = jax.lax.dynamic_slice_in_dim(prompts.tokens_BxP, bi, count, 0)
  mask_CxP = jax.lax.dynamic_slice_in_dim(prompts.mask_BxP, bi, count, 0)
  cache = transformer.init_cache(cfg, count, p, cache_dtype)
  h_CxPxD, cache = transformer.apply(params, tok_CxP, cfg=cfg, mask_NxT=mask_CxP, cache=cache,
                                     return_hidden=True)
  rep = lambda x: jnp.repeat(x, group_size, axis=0)
  logits_RxV = rep(transformer.logits_from_hidden(params, h_CxPxD[:, -1:], cfg=cfg)[:, 0])
  pos_R = rep(cache.pos_N)
  keys = [rep(k) for k in cache.keys]
  values = [rep(v) for v in cache.values]
  mask_RxW = rep(cache.mask_NxS)
  lp_RxQ = None
  if prefixes is not None:
    q = prefixes.tokens_NxQ.shape[1]
    tok_RxQ = jax.lax.dynamic_slice_in_dim(prefixes.tokens_NxQ, bi * group_size, r, 0)
    pmask_RxQ = jax.lax.dynamic_slice_in_dim(prefixes.mask_NxQ, bi * group_size, r,
                                             0).astype(bool)
    q_R = pmask_RxQ.sum(axis=1, dtype=jnp.int32)
    pcache = transformer.init_cache(cfg, r, q, cache_dtype, pos_N=pos_R).replace(
        frozen=(transformer.freeze(cache),))
    h_RxQxD, pcache = transformer.apply(params, tok_RxQ, cfg=cfg, mask_NxT=pmask_RxQ,
                                        cache=pcache, return_hidden=True)
    tempered = (lambda lg: lg) if greedy else (lambda lg: lg / temperature)

    def prefix_logprob(prev_logits_RxV, xs):  # As sampler.py: one position at a time.
      tok_R, h_RxD = xs
      nxt_RxV = transformer.logits_from_hidden(params, h_RxD[:, None], cfg=cfg)[:, 0]
      return nxt_RxV, sampling.token_logprob(tempered(prev_logits_RxV), tok_R)

    _, lp_QxR = jax.lax.scan(prefix_logprob, logits_RxV, (tok_RxQ.T, jnp.swapaxes(h_RxQxD, 0, 1)))
    lp_RxQ = jnp.where(pmask_RxQ, lp_QxR.T, 0.0)
    last_R = jnp.maximum(q_R - 1, 0)
    h_last_RxD = jnp.take_along_axis(h_RxQxD, last_R[:, None, None], axis=1)[:, 0]
    after_RxV = transformer.logits_from_hidden(params, h_last_RxD[:, None], cfg=cfg)[:, 0]
    logits_RxV = jnp.where((q_R > 0)[:, None], after_RxV, logits_RxV)
    pos_R = pcache.pos_N
    keys = [jnp.concatenate([k, pk.astype(k.dtype)], axis=3) for k, pk in zip(keys, pcache.keys)]
    values = [jnp.concatenate([v, pv.astype(v.dtype)], axis=2)
              for v, pv in zip(values, pcache.values)]
    mask_RxW = jnp.concatenate([mask_RxW, pcache.mask_NxS], axis=1)
  return keys, values, mask_RxW, pos_R, logits_RxV, lp_RxQ


def sample_params(params, cfg, sample_dtype):
  """(params, cfg) to sample with: cast once inside the jit, as sampler.py, for bfloat16."""
  if sample_dtype is None:
    return params, cfg
  return (jax.tree.map(lambda x: x.astype(sample_dtype), params),
          cfg.replace(param_dtype=sample_dtype, compute_dtype=sample_dtype))


def new_pool(prompts: Prompts, key_data_N, limit_N, *, cfg, group_size, slots, max_new_tokens,
             prefix_len=0, cache_dtype=None, pad_id=0, **unused) -> dict:
  """The scheduler's state over the K groups of `prompts`, none admitted: the while loop's
  carry (and partial.py's in-flight state). Rows n = k*G + g; each row's random stream is
  key_data_N[n] (raw key data: it goes into checkpoints), its length limit limit_N[n]."""
  del unused
  k, p = prompts.tokens_BxP.shape
  g, s, m, q = group_size, slots, max_new_tokens, prefix_len
  n = k * g
  width = p + q + m - 1  # The last sampled token is never fed, so it needs no column.
  kdt = cache_dtype or cfg.compute_dtype
  kh, dh = cfg.num_kv_heads, cfg.head_dim
  zeros = lambda shape, dtype=jnp.int32: jnp.zeros(shape, dtype)
  return dict(
      t=jnp.int32(0), next_b=jnp.int32(0),
      hist_k=tuple(zeros((s, kh, dh, width), kdt) for _ in range(cfg.num_layers)),
      hist_v=tuple(zeros((s, kh, width, dh), kdt) for _ in range(cfg.num_layers)),
      hist_mask=zeros((s, width), bool), row_S=zeros((s,)), j_S=zeros((s,)), pos_S=zeros((s,)),
      live_S=zeros((s,), bool), logits_SxV=zeros((s, cfg.vocab_size), jnp.float32),
      logits_version_S=zeros((s,)),
      tok_NxM=jnp.full((n, m), pad_id, jnp.int32), lp_NxM=zeros((n, m), jnp.float32),
      blp_NxM=zeros((n, m), jnp.float32), version_NxM=zeros((n, m)), sampled_N=zeros((n,)),
      stopped_N=zeros((n,), bool), done_N=zeros((n,), bool), finished_N=zeros((n,)),
      slot_N=zeros((n,)), admitted_K=zeros((k,)), prefix_lp_NxQ=zeros((n, q), jnp.float32),
      prompt_tokens_KxP=prompts.tokens_BxP, prompt_mask_KxP=prompts.mask_BxP,
      key_data_N=key_data_N, limit_N=jnp.asarray(limit_N, jnp.int32))


def admit(st, admitted, slots_R, count, make, version, *, group_size):
  """Writes `count` groups from the queue head (made by `make`) into slots_R; slots_R = S and
  rows = N where nothing is admitted (dropped), so the big buffers never pass through control
  flow (a cond or inner loop that carries them copies them every step)."""
  g, (s, width), k = group_size, st['hist_mask'].shape, st['admitted_K'].shape[0]
  n = k * g
  bi = st['next_b']
  keys, values, mask_RxW, pos_R, logits_RxV, lp_RxQ = make()
  pq = mask_RxW.shape[1]
  rows_R = jnp.where(admitted, bi * g + jnp.arange(count * g), n)
  st = dict(st)
  kdt = st['hist_k'][0].dtype
  st['hist_k'] = tuple(h.at[slots_R, :, :, :pq].set(x.astype(kdt), mode='drop')
                       for h, x in zip(st['hist_k'], keys))
  st['hist_v'] = tuple(h.at[slots_R, :, :pq].set(x.astype(kdt), mode='drop')
                       for h, x in zip(st['hist_v'], values))
  st['hist_mask'] = st['hist_mask'].at[slots_R].set(
      jnp.pad(mask_RxW, ((0, 0), (0, width - pq))), mode='drop')
  for name, x_R in (('row_S', rows_R), ('j_S', 0), ('pos_S', pos_R), ('live_S', True),
                    ('logits_SxV', logits_RxV), ('logits_version_S', version)):
    st[name] = st[name].at[slots_R].set(x_R, mode='drop')
  st['slot_N'] = st['slot_N'].at[rows_R].set(slots_R, mode='drop')
  st['admitted_K'] = st['admitted_K'].at[jnp.where(admitted, bi + jnp.arange(count), k)].set(
      st['t'], mode='drop')
  if lp_RxQ is not None:
    st['prefix_lp_NxQ'] = st['prefix_lp_NxQ'].at[rows_R].set(lp_RxQ, mode='drop')
  st['next_b'] = bi + jnp.where(admitted, count, 0)
  return st


def pool_prompts(st) -> Prompts:
  return Prompts(tokens_BxP=st['prompt_tokens_KxP'], mask_BxP=st['prompt_mask_KxP'])


def admit_first(params, st, prefixes, temperature, version, *, cfg, group_size, slots,
                cache_dtype=None, greedy=False, **unused):
  """The first min(K, slots // G) groups start together, their prompts prefilled in one call
  (the pool must have no live slot)."""
  del unused
  first = min(st['admitted_K'].shape[0], slots // group_size)
  make = lambda: admit_groups(params, pool_prompts(st), prefixes, 0, first, temperature,
                               cfg=cfg, group_size=group_size, cache_dtype=cache_dtype,
                               greedy=greedy)
  return admit(st, True, jnp.arange(first * group_size), first, make, version,
                group_size=group_size)
