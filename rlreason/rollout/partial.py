"""Partial rollouts: continuous batching (continuous.py) whose unfinished rows survive a weight
update and continue under the new params.

  pool = partial.start(params, prompts, key_data_N, limit_N, temperature=1.0, version=0, **kw)
  rollout, groups_B, stats, pool = partial.advance(params, pool, next_prompts, next_keys,
                                                   next_limits, temperature=1.0, version=1, **kw)

The pool holds K = 2B groups: the B carried from the last call, and B new ones the call puts
at its tail. `advance` decodes until B groups are done (every member finished; groups are
never split), returns them (rows b*G + g of the done groups in pool order, `groups_B` their
pool indices) and carries the other B: rows still decoding keep their slot, their tokens,
log-probs and caches; groups not yet admitted stay queued, in order (the next call admits
them before its new ones). `start` queues the first batch and admits its first slots // G
groups, so a run's first step reads two batches and every later step one.

Each sampled token records the version of the params whose logits it was drawn from
(Rollout.version_NxL): a row may hold tokens of versions t-2 and t-1. By default the keys and
values of the tokens a row generated before the update stay as the old params computed them,
and its first token after the update is drawn from the logits the old params computed; later
tokens attend to that old cache under the new params, as PipelineRL's in-flight weight
updates keep it (arXiv 2509.19128). With recompute=True (rl.partial_recompute) `advance` first prefills every
carried row again under the new params (its prompt and sampled tokens: one forward of
slots x (P + M - 1)), so its tokens after the update are the new params' alone: AReaL's
interruptible rollout workers (arXiv 2505.24298) recompute the cache this way, and Kimi
k1.5's partial rollouts (arXiv 2501.12599) continue saved segments in a later iteration.
Behaviour log-probs are the ones recorded at sampling time; objective.correction weighs the
stale tokens.

The returned groups are the first B to finish: short answers come out earlier, long ones
later and staler (the length bias of every partial-rollout scheme; the staleness histogram in
provenance_metrics shows it). A row's random stream is its own (key_data_N), so with the same
params throughout, every row samples the tokens continuous.generate would give it.

Deliberately not here: prefixes (prefix_rollouts), the host-side bookkeeping of examples and
checkpoints (methods/partial_rollouts.py).
"""

import functools

import jax
import jax.numpy as jnp

from rlreason.model import transformer
from rlreason.rollout import continuous
from rlreason.structs import Prompts

# The pool's per-group and per-row arrays (the rest: the slots, the step count, the queue head).
_GROUP_FIELDS = ('admitted_K', 'prompt_tokens_KxP', 'prompt_mask_KxP')
_ROW_FIELDS = ('tok_NxM', 'lp_NxM', 'blp_NxM', 'version_NxM', 'sampled_N', 'stopped_N',
               'done_N', 'finished_N', 'slot_N', 'prefix_lp_NxQ', 'key_data_N', 'limit_N')


def start(params, prompts: Prompts, key_data_N, limit_N, *, temperature, version, **kw):
  """A pool of 2B groups: `prompts`' B queued (the first slots // G admitted), B empty."""
  kw.pop('donate', None)
  kw.pop('recompute', None)
  return _start_fn(**kw)(params, prompts, key_data_N, limit_N,
                         jnp.float32(max(temperature, 1e-6)), jnp.int32(version))


def advance(params, pool, prompts: Prompts, key_data_N, limit_N, *, temperature, version, **kw):
  """Queues `prompts` (B groups) behind the carried ones, decodes with `params` (version
  `version`) until B groups are done: (Rollout of those B groups with version_NxL, their pool
  indices groups_B, continuous.Stats of this call, the carried pool)."""
  return _advance_fn(**kw)(params, pool, prompts, key_data_N, limit_N,
                           jnp.float32(max(temperature, 1e-6)), jnp.int32(version))


def abstract_pool(*, batch: int, prompt_len: int, **kw):
  """ShapeDtypeStructs of the pool `start` builds (for restoring a checkpoint)."""
  g = kw['group_size']
  prompts = Prompts(tokens_BxP=jax.ShapeDtypeStruct((2 * batch, prompt_len), jnp.int32),
                    mask_BxP=jax.ShapeDtypeStruct((2 * batch, prompt_len), bool))
  key = jax.eval_shape(lambda: jax.random.key_data(jax.random.key(0)))
  keys = jax.ShapeDtypeStruct((2 * batch * g, *key.shape), key.dtype)
  limits = jax.ShapeDtypeStruct((2 * batch * g,), jnp.int32)
  _, cfg = continuous.sample_params(None, kw['cfg'], kw.pop('sample_dtype', None))
  return jax.eval_shape(lambda p, k, l: continuous.new_pool(p, k, l, **dict(kw, cfg=cfg)),
                        prompts, keys, limits)


def _static(cfg, group_size, slots, max_new_tokens, greedy=False, top_k=0, top_p=1.0,
            stop_tokens=(), pad_id=0, cache_dtype=None):
  return dict(cfg=cfg, group_size=group_size, slots=slots, max_new_tokens=max_new_tokens,
              greedy=greedy, top_k=top_k, top_p=top_p, stop_tokens=tuple(stop_tokens),
              pad_id=pad_id, cache_dtype=cache_dtype)


@functools.lru_cache(maxsize=8)
def _start_fn(sample_dtype=None, **kw):
  kw = _static(**kw)

  def run(params, prompts, key_data_N, limit_N, temperature, version):
    params, cfg = continuous.sample_params(params, kw['cfg'], sample_dtype)
    skw = dict(kw, cfg=cfg)
    b, n = prompts.tokens_BxP.shape[0], key_data_N.shape[0]
    both = Prompts(tokens_BxP=jnp.pad(prompts.tokens_BxP, ((0, b), (0, 0))),
                   mask_BxP=jnp.pad(prompts.mask_BxP, ((0, b), (0, 0))))
    pool = continuous.new_pool(both, jnp.pad(key_data_N, ((0, n),) + ((0, 0),) * (
        key_data_N.ndim - 1)), jnp.pad(limit_N, (0, n), constant_values=1), **skw)
    return continuous.admit_first(params, pool, None, temperature, version, **skw)

  return jax.jit(run)


@functools.lru_cache(maxsize=8)
def _advance_fn(sample_dtype=None, donate=True, recompute=False, **kw):
  kw = _static(**kw)

  def run(params, pool, prompts, key_data_N, limit_N, temperature, version):
    params, cfg = continuous.sample_params(params, kw['cfg'], sample_dtype)
    skw = dict(kw, cfg=cfg)
    b = prompts.tokens_BxP.shape[0]
    pool = _queue(pool, prompts, key_data_N, limit_N, pad_id=kw['pad_id'])
    if recompute:
      pool = _recompute(params, pool, version, cfg=cfg, group_size=kw['group_size'],
                        cache_dtype=kw['cache_dtype'])
    t0 = pool['t']
    pool = continuous.decode(params, pool, None, temperature, version, target=b, **skw)
    groups_B = _first_done(pool, b, kw['group_size'])
    rollout, stats = continuous.release(pool, groups_B, None, t0=t0,
                                        group_size=kw['group_size'], pad_id=kw['pad_id'],
                                        with_versions=True)
    return rollout, groups_B, stats, _carry(pool, groups_B, kw['group_size'])

  return jax.jit(run, donate_argnums=(1,) if donate else ())


def _queue(pool, prompts, key_data_N, limit_N, *, pad_id):
  """The B new groups into the pool's last B entries (the ones released last time)."""
  pool = dict(pool)
  b, n = prompts.tokens_BxP.shape[0], key_data_N.shape[0]
  fresh = dict(admitted_K=0, prompt_tokens_KxP=prompts.tokens_BxP,
               prompt_mask_KxP=prompts.mask_BxP, tok_NxM=pad_id, lp_NxM=0.0, blp_NxM=0.0,
               version_NxM=0, sampled_N=0, stopped_N=False, done_N=False, finished_N=0,
               slot_N=0, prefix_lp_NxQ=0.0, key_data_N=key_data_N, limit_N=limit_N)
  for name, value in fresh.items():
    tail = b if name in _GROUP_FIELDS else n
    pool[name] = pool[name].at[-tail:].set(value)
  return pool


def _recompute(params, pool, version, *, cfg, group_size, cache_dtype):
  """Each live slot's cache and next logits prefilled again under `params` (its prompt and
  the tokens it sampled), so its next tokens are the new params' alone (recompute=True)."""
  s, width = pool['hist_mask'].shape
  p = pool['prompt_tokens_KxP'].shape[1]
  live_S, row_S, j_S = pool['live_S'], pool['row_S'], pool['j_S']
  k_S = row_S // group_size
  fed = width - p  # Sampled tokens a slot's cache holds at most (M - 1).
  tokens_SxW = jnp.concatenate([pool['prompt_tokens_KxP'][k_S],
                                pool['tok_NxM'][row_S, :fed]], axis=1)
  mask_SxW = jnp.concatenate([pool['prompt_mask_KxP'][k_S],
                              jnp.arange(fed)[None] < j_S[:, None]], axis=1)
  cache = transformer.init_cache(cfg, s, width, cache_dtype)
  h_SxWxD, cache = transformer.apply(params, tokens_SxW, cfg=cfg, mask_NxT=mask_SxW,
                                     cache=cache, return_hidden=True)
  h_SxD = jnp.take_along_axis(h_SxWxD, (p + j_S - 1)[:, None, None], axis=1)
  logits_SxV = transformer.logits_from_hidden(params, h_SxD, cfg=cfg)[:, 0]
  pool = dict(pool)
  pick = lambda new, old: jnp.where(live_S.reshape((s,) + (1,) * (old.ndim - 1)),
                                    new.astype(old.dtype), old)
  pool['hist_k'] = tuple(map(pick, cache.keys, pool['hist_k']))
  pool['hist_v'] = tuple(map(pick, cache.values, pool['hist_v']))
  pool['hist_mask'] = pick(mask_SxW, pool['hist_mask'])
  pool['pos_S'] = pick(cache.pos_N, pool['pos_S'])
  pool['logits_SxV'] = pick(logits_SxV, pool['logits_SxV'])
  pool['logits_version_S'] = pick(jnp.broadcast_to(version, (s,)), pool['logits_version_S'])
  return pool


def _first_done(pool, b: int, g: int):
  """Pool indices (ascending) of the first b groups to finish, ties by index."""
  k = pool['admitted_K'].shape[0]
  done_K = pool['done_N'].reshape(k, g).all(axis=1)
  released_K = pool['finished_N'].reshape(k, g).max(axis=1)
  order_K = jnp.where(done_K, released_K, jnp.iinfo(jnp.int32).max // (2 * k)) * k + jnp.arange(k)
  return jnp.sort(jnp.argsort(order_K)[:b])


def _carry(pool, groups_B, g: int):
  """The pool reordered: the groups not released first (in order: admitted ones, then the
  queue), the released ones last (the next call overwrites them); slots follow their rows."""
  k, b = pool['admitted_K'].shape[0], groups_B.shape[0]
  released_K = jnp.zeros((k,), bool).at[groups_B].set(True)
  perm_K = jnp.argsort(jnp.where(released_K, k, 0) + jnp.arange(k))
  rows_N = (perm_K[:, None] * g + jnp.arange(g)).reshape(-1)
  pool = dict(pool)
  for name in _GROUP_FIELDS:
    pool[name] = pool[name][perm_K]
  for name in _ROW_FIELDS:
    pool[name] = pool[name][rows_N]
  new_row_N = jnp.argsort(rows_N)  # Old row index -> its index after the reordering.
  pool['row_S'] = jnp.where(pool['live_S'], new_row_N[pool['row_S']], 0)
  pool['next_b'] = pool['next_b'] - b  # Released groups were all admitted (before next_b).
  return pool
