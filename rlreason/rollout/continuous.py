"""Continuous batching: a fixed number of decode slots, refilled from a queue of prompt groups.

  rollout = continuous.generate(params, prompts, cfg=cfg, group_size=8, slots=64,
                                max_new_tokens=256, rng=key, stop_tokens=(eos,))

The static sampler (sampler.py) decodes all B*G rows together until the longest one stops:
with heavy-tailed lengths most rows sit finished (masked, but computed) for most steps. Here
`slots` rows decode at a time. When a row finishes (a stop token, max_new_tokens, or its own
limit in `max_new_tokens_N`), its slot is free; at the next step, if G slots are free, the
next group in the queue (prompts in order b = 0, 1, ...) is admitted: its prompt is prefilled
once, its G rows' prefixes (if any) after it, and the keys and values are written into the G
free slots' caches (at most one group per step; the first slots/G groups start together). A
group is released whole: it counts as done at the step its last member finishes
(`Stats.released_B`), and the Rollout holds every group's G rows together, row n = b*G + g as
in the static sampler's output, which is what the trainer consumes.

Shapes are static: one jit per (prompt bucket, prefix length, G, slots, max_new_tokens,
sampling options) and one `lax.while_loop` over decode steps, so nothing recompiles after
the first call (tests/continuous_batching_test.py counts backend compilations). Each slot
has its own one-row KVCache of P + Q + L - 1 columns (prompt, prefix, the row's fed tokens),
written at the row's own column: rows in different slots are at different positions, and a
KVCache's write index is shared by its rows, so the decode step is `transformer.apply` under
`jax.vmap` over slots (the per-row writes become one scatter). Admission computes the new
group's keys under a `lax.cond` and scatters them outside it: a cond or inner loop that
carries the caches made XLA copy them at every step (small config: 28.7 ms a step, 6.4
without). Attention ignores slot order (RoPE positions travel with the keys), so a row's
cache needs no particular layout, only its mask.

Random streams: token j of row n is drawn with sampling.step_keys(row_keys(rng, n), j), so a
row's draws depend on (its group and member index, its token index), never on its slot or
step; the static sampler with `row_rng=True` uses the same streams, and the two give the same
tokens and log-probs up to rounding (attention sums in another order). Log-probs are recorded
as in sampler.py: plain tempered and behaviour (after top-k/top-p).

Our formalisation of continuous batching as in vLLM/Orca (iteration-level scheduling, Yu et
al., OSDI 2022), without paging: each slot reserves its row's whole length, so the cache is
slots x (P + Q + L) columns, read in full at every step (the static sampler's decode chunks
read fewer; sampler.decode_chunks).

The scheduler's state is a pool of K groups (`new_pool`: the slots' caches, each row's
tokens, log-probs, sampling versions, random key and limit); `admit_first`, `decode` (until
`target` groups are done) and `release` (a Rollout of chosen groups) act on it. The pool,
its admission and the memory estimate live in continuous_pool.py (re-exported here). `generate`
runs them once over its B prompts; partial.py carries a pool across weight updates.

Deliberately not here: row sharding over devices (with a mesh, rows are replicated and the
params' sharding is GSPMD's), multi-process sampling. Multi-turn episodes:
continuous_episodes.py.
"""

from collections.abc import Sequence
import functools

import flax
import jax
import jax.numpy as jnp

from rlreason.model import transformer
from rlreason.rollout import continuous_pool
from rlreason.rollout import sampler
from rlreason.rollout import sampling
from rlreason.rollout.continuous_pool import (admit_first, check_slots, max_slots,  # noqa: F401
                                              memory_estimate, new_pool, sample_params)
from rlreason.structs import Prefixes, Prompts, Rollout


@flax.struct.dataclass
class Stats:
  """What the scheduler did (device arrays).

  steps: decode steps run (each one forward of every slot).
  admitted_B: the step each group's G rows entered their slots.
  released_B: the step each group's last member sampled its last token.
  finished_N: the step each row sampled its last token.
  slot_N: the slot each row ran in.
  """
  steps: jax.Array
  admitted_B: jax.Array
  released_B: jax.Array
  finished_N: jax.Array
  slot_N: jax.Array


def generate(params, prompts: Prompts, *, cfg: transformer.ModelConfig, group_size: int,
             slots: int, max_new_tokens: int, rng: jax.Array, temperature: float = 1.0,
             top_k: int = 0, top_p: float = 1.0, stop_tokens: Sequence[int] = (),
             pad_id: int = 0, prefixes: Prefixes | None = None, cache_dtype: str | None = None,
             mesh: jax.sharding.Mesh | None = None, memory_budget_bytes: int | None = None,
             sample_dtype: str | None = None, max_new_tokens_N=None,
             return_stats: bool = False):
  """Samples G completions for each of B prompts with `slots` rows decoding at a time.

  Arguments as sampler.generate (which see), plus:
    slots: rows decoding at once, a multiple of group_size, at most B*G.
    max_new_tokens_N: optional per-row limits (int (N,), each in [1, max_new_tokens]).
    return_stats: also return the scheduler's Stats.
  Random streams are per row (sampler.generate's row_rng=True draws the same tokens).

  Returns:
    A Rollout (rows b*G + g), or (Rollout, Stats) with return_stats.
  """
  sampler._validate(prompts, cfg, group_size, max_new_tokens, temperature, top_k, top_p,
                    stop_tokens, prefixes)
  b, p = prompts.tokens_BxP.shape
  n = b * group_size
  check_slots(slots, group_size=group_size, rows=n)
  if sample_dtype not in (None, 'bfloat16'):
    raise ValueError(f"sample_dtype={sample_dtype!r}; known: None (cfg's dtypes), 'bfloat16'.")
  if jax.process_count() > 1:
    raise ValueError('continuous batching samples in one process; use the static sampler '
                     "(rl.sampler='static') on several hosts.")
  limit_N = (jnp.full((n,), max_new_tokens, jnp.int32) if max_new_tokens_N is None else
             sampler.check_row_limits(max_new_tokens_N, n, max_new_tokens))
  q = 0 if prefixes is None else prefixes.tokens_NxQ.shape[1]
  if memory_budget_bytes is not None:
    kw = dict(rows=n, group_size=group_size, prompt_len=p, max_new_tokens=max_new_tokens,
              prefix_len=q, cache_dtype=cache_dtype, sample_dtype=sample_dtype)
    est = memory_estimate(cfg, slots=slots, **kw)
    if est['total'] > memory_budget_bytes:
      parts = ', '.join(f'{k}={v / 2**20:.1f} MiB' for k, v in est.items())
      raise ValueError(
          f'slots={slots}: the continuous sampler memory estimate exceeds memory_budget_bytes='
          f'{memory_budget_bytes / 2**20:.1f} MiB ({parts}); at most '
          f'{max_slots(memory_budget_bytes, cfg, **kw)} slots fit. Lower slots (rl.slots), '
          'max_new_tokens, or use cache_dtype="bfloat16".')
  if prefixes is not None and prefixes.logprobs_NxQ is None:
    prefixes = prefixes.replace(logprobs_NxQ=jnp.full(prefixes.tokens_NxQ.shape, jnp.nan))
  if mesh is not None:  # Fixed (replicated) input layouts: one compilation whatever the caller's.
    replicated = jax.sharding.NamedSharding(mesh, jax.P())
    prompts, prefixes, rng, limit_N = jax.device_put((prompts, prefixes, rng, limit_N),
                                                     replicated)
  fn = _generate_fn(cfg, group_size, int(slots), max_new_tokens, temperature == 0, int(top_k),
                    float(top_p), tuple(int(t) for t in stop_tokens), int(pad_id), cache_dtype,
                    sample_dtype)
  rollout, stats = fn(params, prompts, prefixes, jnp.float32(max(temperature, 1e-6)), rng,
                      limit_N)
  return (rollout, stats) if return_stats else rollout


@functools.lru_cache(maxsize=16)
def _generate_fn(cfg, group_size, slots, max_new_tokens, greedy, top_k, top_p, stop_tokens,
                 pad_id, cache_dtype, sample_dtype):
  kw = dict(cfg=cfg, group_size=group_size, slots=slots, max_new_tokens=max_new_tokens,
            greedy=greedy, top_k=top_k, top_p=top_p, stop_tokens=stop_tokens, pad_id=pad_id,
            cache_dtype=cache_dtype)

  def run(params, prompts, prefixes, temperature, rng, limit_N):
    params, sample_cfg = sample_params(params, cfg, sample_dtype)
    b = prompts.tokens_BxP.shape[0]
    q = 0 if prefixes is None else prefixes.tokens_NxQ.shape[1]
    keys_N = jax.random.key_data(sampling.row_keys(rng, jnp.arange(b * group_size)))
    skw = dict(kw, cfg=sample_cfg)
    st = new_pool(prompts, keys_N, limit_N, prefix_len=q, **skw)
    st = admit_first(params, st, prefixes, temperature, jnp.int32(0), **skw)
    st = decode(params, st, prefixes, temperature, jnp.int32(0), target=b, **skw)
    return release(st, jnp.arange(b), prefixes, t0=0, group_size=group_size, pad_id=pad_id)

  return jax.jit(run)


def decode(params, st, prefixes, temperature, version, *, target, cfg, group_size, slots,
           max_new_tokens, greedy, top_k, top_p, stop_tokens, pad_id, cache_dtype=None):
  """Decode steps until `target` groups are done (every member finished) or nothing is left
  to run. Tokens sampled now carry, in version_NxM, the version of the params whose logits
  they were drawn from (logits_version_S: a slot's first token after new params were handed
  in comes from logits the old ones computed); `version` is the params' own."""
  g, s, m = group_size, slots, max_new_tokens
  k, p = st['prompt_tokens_KxP'].shape
  n = k * g
  q = st['prefix_lp_NxQ'].shape[1]
  width = st['hist_mask'].shape[1]
  stop_S = jnp.asarray(stop_tokens if stop_tokens else (-1,), jnp.int32)
  rope_table = transformer.rope_table(cfg, p + q + m)
  admit_kw = dict(cfg=cfg, group_size=g, cache_dtype=cache_dtype, greedy=greedy)

  def admit_one(st):  # At most one group per step, when G slots are free.
    ok = (st['next_b'] < k) & (jnp.sum(~st['live_S']) >= g)
    make = lambda: continuous_pool.admit_groups(
        params, continuous_pool.pool_prompts(st), prefixes, st['next_b'], 1, temperature,
        **admit_kw)
    zeros = lambda: jax.tree.map(lambda x: jnp.zeros(x.shape, x.dtype), jax.eval_shape(make))
    slots_G = jnp.where(ok, jnp.nonzero(~st['live_S'], size=g)[0], s)  # The first G free.
    return continuous_pool.admit(st, ok, slots_G, 1, lambda: jax.lax.cond(ok, make, zeros),
                                 version, group_size=g)

  def one_row(tok, feed, keys, values, mask_W, col, pos):
    cache = transformer.KVCache(keys=tuple(x[None] for x in keys),
                                values=tuple(v[None] for v in values), mask_NxS=mask_W[None],
                                end=col, pos_N=pos[None])
    logits, cache = transformer.apply(params, tok[None, None], cfg=cfg,
                                      mask_NxT=feed[None, None], cache=cache,
                                      rope_table=rope_table)
    return (logits[0, 0], tuple(x[0] for x in cache.keys), tuple(v[0] for v in cache.values),
            cache.mask_NxS[0], cache.pos_N[0])

  def step(st):
    st = admit_one(st)
    active_S, row_S, j_S = st['live_S'], st['row_S'], st['j_S']
    keys_S = sampling.step_keys(jax.random.wrap_key_data(st['key_data_N'][row_S]), j_S)
    tok_S, lp_S, blp_S = sampling.next_token(st['logits_SxV'], keys_S, temperature,
                                             greedy=greedy, top_k=top_k, top_p=top_p,
                                             per_row_keys=True)
    tok_S = jnp.where(active_S, tok_S, pad_id)
    out_row_S = jnp.where(active_S, row_S, n)  # Out of range: dropped.
    st = dict(st)
    for name, x_S in (('tok_NxM', tok_S), ('lp_NxM', lp_S), ('blp_NxM', blp_S),
                      ('version_NxM', st['logits_version_S'])):
      st[name] = st[name].at[out_row_S, j_S].set(x_S, mode='drop')
    stop_S_hit = jnp.any(tok_S[:, None] == stop_S, axis=-1) & active_S
    new_j_S = j_S + active_S
    finish_S = active_S & (stop_S_hit | (new_j_S >= st['limit_N'][row_S]))
    st['sampled_N'] = st['sampled_N'].at[out_row_S].set(new_j_S, mode='drop')
    st['stopped_N'] = st['stopped_N'].at[out_row_S].set(stop_S_hit, mode='drop')
    finished_row_S = jnp.where(finish_S, row_S, n)
    st['finished_N'] = st['finished_N'].at[finished_row_S].set(st['t'], mode='drop')
    st['done_N'] = st['done_N'].at[finished_row_S].set(True, mode='drop')
    feed_S = active_S & ~finish_S
    # Each slot is its own one-row KVCache over its segment, written at the row's own column
    # (vmap turns the per-row write into one scatter, done before attention reads the cache,
    # so XLA updates the segments in place). A slot not fed writes a masked column.
    col_S = jnp.minimum(p + q + j_S, width - 1)
    logits_SxV, keys, values, mask_SxW, pos_S = jax.vmap(one_row)(
        tok_S, feed_S, st['hist_k'], st['hist_v'], st['hist_mask'], col_S, st['pos_S'])
    st['hist_k'], st['hist_v'], st['hist_mask'] = keys, values, mask_SxW
    st['pos_S'], st['j_S'], st['live_S'] = pos_S, new_j_S, feed_S
    st['logits_SxV'] = logits_SxV
    st['logits_version_S'] = jnp.where(feed_S, version, st['logits_version_S'])
    st['t'] = st['t'] + 1
    return st

  def running(st):
    done_groups = jnp.sum(st['done_N'].reshape(k, g).all(axis=1))
    return (done_groups < target) & ((st['next_b'] < k) | jnp.any(st['live_S']))

  return jax.lax.while_loop(running, step, st)


def release(st, groups_B, prefixes, *, t0, group_size, pad_id, with_versions=False):
  """(Rollout, Stats) of pool groups `groups_B` (ascending), row b*G + g for group b's member
  g; with_versions: Rollout.version_NxL holds each token's sampling version (version_NxM)."""
  g = group_size
  b = groups_B.shape[0]
  n = b * g
  m = st['tok_NxM'].shape[1]
  rows_N = (groups_B[:, None] * g + jnp.arange(g)).reshape(-1)
  take = lambda x: x[rows_N]
  prompts = Prompts(tokens_BxP=st['prompt_tokens_KxP'][groups_B],
                    mask_BxP=st['prompt_mask_KxP'][groups_B])
  sampled_N = take(st['sampled_N'])
  outs = tuple(take(st[name]) for name in ('tok_NxM', 'lp_NxM', 'blp_NxM', 'version_NxM'))
  q = st['prefix_lp_NxQ'].shape[1]
  length = q + m
  if prefixes is None:
    tokens_NxL, logp_NxL, blogp_NxL, version_NxL = outs
    prefix_mask_NxL, q_N = jnp.zeros((n, length), bool), jnp.zeros((n,), jnp.int32)
  else:  # Prefix columns first, then sampled token j at column q_n + j (as sampler.py).
    prefixes = jax.tree.map(take, prefixes)
    prefix_lp_NxQ = take(st['prefix_lp_NxQ'])
    pmask_NxQ = prefixes.mask_NxQ.astype(bool)
    q_N = pmask_NxQ.sum(axis=1, dtype=jnp.int32)
    pad = lambda x, v: jnp.pad(x, ((0, 0), (0, m)), constant_values=v)
    recorded = jnp.where(jnp.isnan(prefixes.logprobs_NxQ), prefix_lp_NxQ,
                         prefixes.logprobs_NxQ)
    base = (pad(jnp.where(pmask_NxQ, prefixes.tokens_NxQ, pad_id), pad_id),
            pad(prefix_lp_NxQ, 0.0), pad(jnp.where(pmask_NxQ, recorded, 0.0), 0.0),
            jnp.zeros((n, length), jnp.int32))
    prefix_mask_NxL = pad(pmask_NxQ, False)
    j_NxL = jnp.arange(length)[None, :] - q_N[:, None]
    from_sample_NxL = (j_NxL >= 0) & (j_NxL < m)
    pick = lambda x_NxM: jnp.take_along_axis(x_NxM, jnp.clip(j_NxL, 0, m - 1), 1)
    tokens_NxL, logp_NxL, blogp_NxL, version_NxL = (jnp.where(from_sample_NxL, pick(x), base_x)
                                                    for x, base_x in zip(outs, base))
  mask_NxL = jnp.arange(length) < (q_N + sampled_N)[:, None]
  rollout = Rollout(
      prompts=prompts, tokens_NxL=tokens_NxL, mask_NxL=mask_NxL, prefix_mask_NxL=prefix_mask_NxL,
      logprobs_NxL=jnp.where(mask_NxL, logp_NxL, 0.0),
      behaviour_logprobs_NxL=jnp.where(mask_NxL, blogp_NxL, 0.0),
      truncated_N=~take(st['stopped_N']), lengths_N=mask_NxL.sum(axis=1, dtype=jnp.int32),
      group_size=g, version_NxL=version_NxL if with_versions else None)
  finished_N = take(st['finished_N'])
  stats = Stats(steps=st['t'] - t0, admitted_B=st['admitted_K'][groups_B],
                released_B=finished_N.reshape(b, g).max(axis=1), finished_N=finished_N,
                slot_N=take(st['slot_N']))
  return rollout, stats
