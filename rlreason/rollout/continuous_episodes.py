"""Continuous batching of multi-turn episodes: a fixed number of slots, one episode per slot.

  episodes, stats = run_episodes(params, env, renderer, tok, examples, cfg=cfg, group_size=8,
                                 slots=32, max_turns=4, max_turn_tokens=64,
                                 max_observation_tokens=128, max_total_tokens=384, rng=key,
                                 prompt_buckets=(64,), return_stats=True)

The static episode loop (episodes.py) runs every row's turn t together: a turn lasts as long
as its longest row, and the batch as long as its longest episode, so with a heavy-tailed mix
of turn counts most rows wait, masked. Here `slots` rows decode at a time, each holding one
episode: a decode chunk (at most `chunk_steps` steps, a `lax.while_loop`) advances every slot
that is in a turn; a slot whose row ends its turn (EOS, the call's closing sequence,
max_turn_tokens or the total budget) stops and waits for the chunk's end. The host then
takes every waiting row's turn at once: decodes its new tokens to text and steps its
environment (the chunk's tool calls in one thread pool, as the static loop does for a turn);
an episode that goes on has its observation prefilled into its own slot's cache (one jitted
call for all slots, loss mask 0) and starts its next turn; one that ends frees its slot. When
G slots are free, the next group in the queue (prompts b = 0, 1, ...) is admitted: its prompt
prefilled once and copied into G free slots (continuous_pool.admit_groups). A group's
episodes live in their rows b*G + g of the result whatever slots ran them, and the result is
the static loop's Episodes: tokens packed left (sampled, observation, ...), loss_mask_NxL on
sampled tokens, turn_NxL, per-episode rewards, turns, tool calls, errors and transcripts.

Shapes are static: three jitted functions (admit, decode a chunk, observe) whose shapes depend
on the arguments only, so a call compiles once whatever its turn counts (tests count
compilations). Each slot's cache holds its row's prompt and conversation (P + L columns at most),
written at the row's own column under `jax.vmap` (as continuous.py), plus O scratch columns
that slots with nothing to write fill with masked keys.

Random streams are per row: row n's token at completion column c is drawn with
sampling.step_keys(row_keys(rng, n), c), so the static loop with row_rng=True draws the same
tokens; the two agree up to rounding of the attention sums (the prompt's keys are the slot's
own copy here, a shared frozen segment there). Host-side turn bookkeeping (budgets,
truncation, transcripts) follows episodes.run_episodes line by line.

Our formalisation of iteration-level scheduling (Orca, Yu et al., OSDI 2022) for agent
loops, where a turn's end hands the row to the host rather than ending it.

Deliberately not here: rollback of failed calls (rollback.py), DART's routed adapters, row
sharding over devices, partial episodes carried across a weight update.
"""

from collections.abc import Sequence
import concurrent.futures
import dataclasses
import functools
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from rlreason.envs import render
from rlreason.model import dart
from rlreason.model import transformer
from rlreason.rollout import continuous_pool
from rlreason.rollout import episodes as episodes_lib
from rlreason.rollout import sampler
from rlreason.rollout import sampling
from rlreason.structs import Prompts, Rollout


@dataclasses.dataclass
class Stats:
  """What the scheduler did (host arrays). steps: decode steps run (each one forward of every
  slot); chunks: decode chunks (host round trips); admitted_B: the step each group's G
  episodes entered their slots; released_B: the step its last episode ended; finished_N: the
  step each episode ended; slot_N: the slot each episode ran in."""
  steps: int
  chunks: int
  admitted_B: np.ndarray
  released_B: np.ndarray
  finished_N: np.ndarray
  slot_N: np.ndarray


def run_episodes(params, env, renderer, tok, examples: Sequence[Any], *, cfg, group_size: int,
                 slots: int, max_turns: int, max_turn_tokens: int, max_observation_tokens: int,
                 max_total_tokens: int, rng: jax.Array, prompt_buckets: Sequence[int],
                 temperature: float = 1.0, top_k: int = 0, top_p: float = 1.0,
                 pad_id: int = 0, stop_seqs: Sequence[Sequence[int]] | None = None,
                 cache_dtype: str | None = None, max_workers: int = 8,
                 chunk_steps: int | None = None, return_stats: bool = False):
  """G episodes per example with `slots` rows decoding at a time; see the module docstring.

  Arguments as episodes.run_episodes (which see), plus:
    slots: episodes decoding at once, a multiple of group_size, at most B*G.
    chunk_steps: decode steps between host round trips (default max_turn_tokens // 4, >= 1).
    return_stats: also return the scheduler's Stats.
  Returns episodes.Episodes (rows b*G + g), or (Episodes, Stats) with return_stats.
  """
  episodes_lib.check_budgets(max_turns, max_turn_tokens, max_total_tokens, max_observation_tokens)
  if dart.has(params):
    raise ValueError("continuous episodes do not carry DART's routing state: params with "
                     "routed adapters need the static loop (rl.sampler='static').")
  b, g = len(examples), group_size
  n = b * g
  continuous_pool.check_slots(slots, group_size=g, rows=n)
  chunk = max(1, max_turn_tokens // 4) if chunk_steps is None else int(chunk_steps)
  if chunk < 1:
    raise ValueError(f'chunk_steps={chunk_steps} must be >= 1.')
  if stop_seqs is None:
    stop_seqs = episodes_lib.turn_stops(tok, env, renderer)
  stop_seqs = tuple(tuple(int(t) for t in seq) for seq in stop_seqs)
  eos = tuple(sorted(tok.eos_ids))
  prompt_ids = [tok.encode(renderer.prompt_text(ex)) for ex in examples]
  prompts = sampler.prepare_prompts(prompt_ids, buckets=prompt_buckets, pad_id=pad_id)
  length, width = max_total_tokens, max(max_observation_tokens, 1)
  static = dict(cfg=cfg, group_size=g, slots=int(slots), length=length, width=width,
                pad_id=int(pad_id), cache_dtype=cache_dtype)
  keys = jax.random.key_data(sampling.row_keys(rng, jnp.arange(n)))
  content = min(length, episodes_lib.cache_slots(max_turns, max_turn_tokens, width))
  pool = _new_pool(prompts, keys, stop_width=_stop_table(stop_seqs).shape[1], content=content,
                   **static)
  admit = _admit_fn(**static)
  decode = _decode_fn(**static, chunk=chunk, turn_tokens=int(max_turn_tokens),
                      greedy=temperature == 0, top_k=int(top_k), top_p=float(top_p), eos=eos,
                      stop_seqs=stop_seqs)
  observe = _observe_fn(**static)
  temp = jnp.float32(max(temperature, 1e-6))

  states = [env.reset(examples[i // g]) for i in range(n)]
  truncated = np.zeros(n, bool)
  obs_tokens = np.zeros(n, np.int32)
  transcripts = [[] for _ in range(n)]
  turn_N = np.zeros(n, np.int32)  # The turn each row is in.
  start_N = np.zeros(n, np.int32)  # Its completion column when that turn began.
  row_S = np.full(slots, -1)  # The row each slot holds (-1: free).
  admitted_B, finished_N, slot_N = np.zeros(b, np.int64), np.zeros(n, np.int64), np.zeros(n, int)
  next_b, steps, chunks = 0, 0, 0
  executor = concurrent.futures.ThreadPoolExecutor(max_workers=max(1, max_workers))
  try:
    while True:
      while next_b < b and (row_S < 0).sum() >= g:  # Admit whole groups into free slots.
        slots_G = np.flatnonzero(row_S < 0)[:g]
        rows_G = next_b * g + np.arange(g)
        pool = admit(params, pool, jnp.int32(next_b), jnp.asarray(slots_G, jnp.int32))
        row_S[slots_G], slot_N[rows_G], admitted_B[next_b] = rows_G, slots_G, steps
        next_b += 1
      if (row_S < 0).all():
        break
      pool, ran = decode(params, pool, temp)
      steps, chunks = steps + int(ran), chunks + 1
      going_S = np.asarray(jax.device_get(pool['going_S']))
      waiting = np.flatnonzero((row_S >= 0) & ~going_S)
      if not len(waiting):
        continue
      tokens, count = jax.device_get((pool['tokens_NxL'], pool['count_N']))
      rows = row_S[waiting]
      turn_ids = [tokens[r, start_N[r]:count[r]].tolist() for r in rows]
      texts = [render.valid_unicode(t) for t in tok.decode_batch(turn_ids,
                                                                 skip_special_tokens=True)]
      outs = list(executor.map(lambda a: env.step(states[a[0]], a[1]), zip(rows, texts)))
      obs_SxO = np.zeros((slots, width), np.int32)
      obs_mask_SxO = np.zeros((slots, width), bool)
      resume_S = np.zeros(slots, bool)
      for s, r, ids, text, step in zip(waiting, rows, turn_ids, texts, outs):
        turn = int(turn_N[r])
        ids_obs = _after_turn(step, r, ids, text, turn, count[r], transcripts, truncated,
                              tok=tok, renderer=renderer, max_turns=max_turns,
                              max_total_tokens=max_total_tokens, width=max_observation_tokens)
        if ids_obs is None:  # The episode ended: its slot is free.
          row_S[s], finished_N[r] = -1, steps
          continue
        obs_SxO[s, :len(ids_obs)], obs_mask_SxO[s, :len(ids_obs)] = ids_obs, True
        obs_tokens[r] += len(ids_obs)
        resume_S[s] = True
        turn_N[r], start_N[r] = turn + 1, count[r] + len(ids_obs)
      if resume_S.any():
        pool = observe(params, pool, jnp.asarray(obs_SxO), jnp.asarray(obs_mask_SxO),
                       jnp.asarray(resume_S))
  finally:
    executor.shutdown(wait=True)

  count_N = pool['count_N']
  mask_NxL = jnp.arange(length)[None, :] < count_N[:, None]
  rollout = Rollout(
      prompts=prompts, tokens_NxL=pool['tokens_NxL'], mask_NxL=mask_NxL,
      prefix_mask_NxL=jnp.zeros_like(mask_NxL), logprobs_NxL=pool['logp_NxL'],
      behaviour_logprobs_NxL=pool['blogp_NxL'], truncated_N=jnp.asarray(truncated),
      lengths_N=count_N, group_size=g, loss_mask_NxL=pool['sampled_NxL'] & mask_NxL,
      turn_NxL=pool['turn_NxL'])
  kinds = sorted({k for s in states for k in s.errors})
  episodes = episodes_lib.Episodes(
      rollout=rollout, rewards_N=np.array([s.reward for s in states], np.float32),
      turns_N=np.array([s.turns for s in states], np.int32),
      tool_calls_N=np.array([s.tool_calls for s in states], np.int32),
      errors_N={k: np.array([s.errors[k] for s in states], np.int32) for k in kinds},
      observation_tokens_N=obs_tokens, truncated_N=truncated, transcripts=transcripts)
  if not return_stats:
    return episodes
  stats = Stats(steps=steps, chunks=chunks, admitted_B=admitted_B,
                released_B=finished_N.reshape(b, g).max(axis=1), finished_N=finished_N,
                slot_N=slot_N)
  return episodes, stats


def _after_turn(step, r, ids, text, turn, count, transcripts, truncated, *, tok, renderer,
                max_turns, max_total_tokens, width):
  """A row's turn as episodes.run_episodes records it: its transcript entry, and the ids of
  its observation, or None when the episode ends (truncated[r] set as the static loop does)."""
  entry = {'turn': turn, 'text': text, 'tokens': len(ids), 'reward': step.reward,
           **{k: v for k, v in step.info.items() if k != 'messages'}}
  transcripts[r].append(entry)
  if step.done or count >= max_total_tokens or turn == max_turns - 1:
    truncated[r] = bool(step.info.get('truncated')) or (not step.done)
    return None
  ended = bool(ids) and ids[-1] in tok.eos_ids
  fit = episodes_lib._fit_observation  # pylint: disable=protected-access
  ids_obs = fit(tok, renderer, step.info['messages'], ended, width)
  if count + len(ids_obs) > max_total_tokens - 1 or len(ids_obs) == 0:
    truncated[r] = True
    entry['observation'] = None
    return None
  entry['observation'] = tok.decode(ids_obs)
  return ids_obs


def _new_pool(prompts: Prompts, key_data_N, *, cfg, group_size, slots, length, width, pad_id,
              cache_dtype, stop_width, content):
  """Slots of P + C + O cache columns (prompt, the C = min(L, cache_slots) a conversation
  feeds, O scratch) and the N rows' outputs, no episode admitted. Copies its inputs: the jitted
  calls donate the pool."""
  b, p = prompts.tokens_BxP.shape
  n, s, cols = b * group_size, slots, p + content + width
  kdt = cache_dtype or cfg.compute_dtype
  kh, dh = cfg.num_kv_heads, cfg.head_dim
  zeros = lambda shape, dtype=jnp.int32: jnp.zeros(shape, dtype)
  return dict(
      hist_k=tuple(zeros((s, kh, dh, cols), kdt) for _ in range(cfg.num_layers)),
      hist_v=tuple(zeros((s, kh, cols, dh), kdt) for _ in range(cfg.num_layers)),
      hist_mask=zeros((s, cols), bool), pos_S=zeros((s,)), col_S=zeros((s,)),
      row_S=zeros((s,)), going_S=zeros((s,), bool), turn_S=zeros((s,)), steps_S=zeros((s,)),
      recent_SxW=jnp.full((s, stop_width), -3, jnp.int32),
      logits_SxV=zeros((s, cfg.vocab_size), jnp.float32),
      tokens_NxL=jnp.full((n, length), pad_id, jnp.int32), count_N=zeros((n,)),
      logp_NxL=zeros((n, length), jnp.float32), blogp_NxL=zeros((n, length), jnp.float32),
      sampled_NxL=zeros((n, length), bool), turn_NxL=zeros((n, length)),
      prompt_tokens_KxP=jnp.array(prompts.tokens_BxP),
      prompt_mask_KxP=jnp.array(prompts.mask_BxP), key_data_N=jnp.array(key_data_N))


def _set(x, idx, value):
  return x.at[idx].set(value, mode='drop')


@functools.lru_cache(maxsize=16)
def _admit_fn(*, cfg, group_size, slots, length, width, pad_id, cache_dtype):
  del slots, length, width, pad_id

  def admit(params, pool, b, slots_G):
    """Group b's prompt prefilled once, its keys copied into slots_G, its rows' turns begun."""
    keys, values, mask_GxP, pos_G, logits_GxV, _ = continuous_pool.admit_groups(
        params, continuous_pool.pool_prompts(pool), None, b, 1, jnp.float32(1.0), cfg=cfg,
        group_size=group_size, cache_dtype=cache_dtype, greedy=False)
    p, cols = mask_GxP.shape[1], pool['hist_mask'].shape[1]
    pool = dict(pool)
    kdt = pool['hist_k'][0].dtype
    pool['hist_k'] = tuple(h.at[slots_G, :, :, :p].set(x.astype(kdt))
                           for h, x in zip(pool['hist_k'], keys))
    pool['hist_v'] = tuple(h.at[slots_G, :, :p].set(x.astype(kdt))
                           for h, x in zip(pool['hist_v'], values))
    pool['hist_mask'] = pool['hist_mask'].at[slots_G].set(
        jnp.pad(mask_GxP, ((0, 0), (0, cols - p))))
    rows_G = b * group_size + jnp.arange(group_size)
    for name, x in (('pos_S', pos_G), ('col_S', p), ('row_S', rows_G), ('going_S', True),
                    ('turn_S', 0), ('steps_S', 0), ('logits_SxV', logits_GxV)):
      pool[name] = _set(pool[name], slots_G, x)
    return pool

  return jax.jit(admit, donate_argnums=(1,))


def _one_slot(params, cfg, rope_table, tok_T, mask_T, keys, values, mask_W, col, pos):
  """T tokens fed into one slot's cache at column `col` (a one-row KVCache): (hidden TxD, its
  keys, values, mask and next position)."""
  cache = transformer.KVCache(keys=tuple(x[None] for x in keys),
                              values=tuple(v[None] for v in values), mask_NxS=mask_W[None],
                              end=col, pos_N=pos[None])
  h, cache = transformer.apply(params, tok_T[None], cfg=cfg, mask_NxT=mask_T[None], cache=cache,
                               rope_table=rope_table, return_hidden=True)
  return (h[0], tuple(x[0] for x in cache.keys), tuple(v[0] for v in cache.values),
          cache.mask_NxS[0], cache.pos_N[0])


def _rope_table(cfg, pool):
  """RoPE's table over every position a slot reaches (below its prompt's length + L)."""
  return transformer.rope_table(cfg, pool['prompt_tokens_KxP'].shape[1]
                                + pool['tokens_NxL'].shape[1] + 1)


def _feed(params, cfg, rope_table, pool, tok_SxT, mask_SxT, col_S):
  h_SxTxD, keys, values, mask_SxW, pos_S = jax.vmap(
      functools.partial(_one_slot, params, cfg, rope_table))(
          tok_SxT, mask_SxT, pool['hist_k'], pool['hist_v'], pool['hist_mask'], col_S,
          pool['pos_S'])
  pool = dict(pool, hist_k=keys, hist_v=values, hist_mask=mask_SxW, pos_S=pos_S)
  return pool, h_SxTxD


def _stop_table(stop_seqs):
  """Stop sequences right-aligned in a table (as episodes._decode_fn); -1 pads match any."""
  w = max([len(s) for s in stop_seqs] + [1])
  table = np.full((max(len(stop_seqs), 1), w), -2, np.int32)
  for i, seq in enumerate(stop_seqs):
    table[i, :] = -1
    table[i, w - len(seq):] = seq
  return table


@functools.lru_cache(maxsize=16)
def _decode_fn(*, cfg, group_size, slots, length, width, pad_id, cache_dtype, chunk,
               turn_tokens, greedy, top_k, top_p, eos, stop_seqs):
  del group_size, cache_dtype
  eos_E = jnp.asarray(eos or (-1,), jnp.int32)
  table = _stop_table(stop_seqs)
  stop_KxW = jnp.asarray(table)

  def decode(params, pool, temperature):
    """Up to `chunk` steps of every slot in a turn; returns (pool, steps run)."""
    n = pool['count_N'].shape[0]
    cols = pool['hist_mask'].shape[1]
    recent = jnp.full(pool['recent_SxW'].shape, -3, jnp.int32)
    rope_table = _rope_table(cfg, pool)

    def body(carry):
      i, st, recent_SxW = carry
      going_S, row_S = st['going_S'], st['row_S']
      col_N = st['count_N'][row_S]
      keys_S = sampling.step_keys(jax.random.wrap_key_data(st['key_data_N'][row_S]), col_N)
      tok_S, lp_S, blp_S = sampling.next_token(st['logits_SxV'], keys_S, temperature,
                                               greedy=greedy, top_k=top_k, top_p=top_p,
                                               per_row_keys=True)
      tok_S = jnp.where(going_S, tok_S, pad_id)
      out_S = jnp.where(going_S, row_S, n)  # Out of range: dropped.
      st = dict(st)
      for name, x_S in (('tokens_NxL', tok_S), ('logp_NxL', lp_S), ('blogp_NxL', blp_S),
                        ('sampled_NxL', True), ('turn_NxL', st['turn_S'])):
        st[name] = st[name].at[out_S, col_N].set(x_S, mode='drop')
      st['count_N'] = _set(st['count_N'], out_S, col_N + 1)
      # Every sampled token is fed (as the static loop); a slot not in a turn writes a masked
      # scratch column.
      st, h_Sx1xD = _feed(params, cfg, rope_table, st, tok_S[:, None], going_S[:, None],
                          jnp.where(going_S, st['col_S'], cols - 1))
      logits_SxV = transformer.logits_from_hidden(params, h_Sx1xD, cfg=cfg)[:, 0]
      st['logits_SxV'] = jnp.where(going_S[:, None], logits_SxV, st['logits_SxV'])
      st['col_S'] = st['col_S'] + going_S
      st['steps_S'] = st['steps_S'] + going_S
      recent_SxW = jnp.where(going_S[:, None],
                             jnp.concatenate([recent_SxW[:, 1:], tok_S[:, None]], 1), recent_SxW)
      hit_eos = jnp.any(tok_S[:, None] == eos_E, axis=-1)
      hit_seq = jnp.any(jnp.all((stop_KxW[None] == recent_SxW[:, None]) | (stop_KxW[None] == -1),
                                axis=-1), axis=-1)
      st['going_S'] = (going_S & ~hit_eos & ~hit_seq & (col_N + 1 < length)
                       & (st['steps_S'] < turn_tokens))
      return i + 1, st, recent_SxW

    # A turn's stop window restarts with the turn; a chunk may start mid-turn, so it is kept
    # in the pool between chunks.
    recent = jnp.where((pool['steps_S'] == 0)[:, None], recent, pool['recent_SxW'])
    cond = lambda carry: (carry[0] < chunk) & jnp.any(carry[1]['going_S'])
    i, pool, recent = jax.lax.while_loop(cond, body, (jnp.int32(0), pool, recent))
    return dict(pool, recent_SxW=recent), i

  return jax.jit(decode, donate_argnums=(1,))


@functools.lru_cache(maxsize=16)
def _observe_fn(*, cfg, group_size, slots, length, width, pad_id, cache_dtype):
  del group_size, slots, pad_id, cache_dtype

  def observe(params, pool, obs_SxO, mask_SxO, resume_S):
    """Each observing slot's observation fed into its cache at its column (others write
    masked scratch columns), written into its row's completion, and its next turn begun."""
    cols = pool['hist_mask'].shape[1]
    len_S = mask_SxO.sum(axis=1, dtype=jnp.int32)
    row_S = pool['row_S']
    count_S = pool['count_N'][row_S]
    pool, h_SxOxD = _feed(params, cfg, _rope_table(cfg, pool), pool, obs_SxO, mask_SxO,
                          jnp.where(len_S > 0, pool['col_S'], cols - width))
    h_SxD = jnp.take_along_axis(h_SxOxD, jnp.maximum(len_S - 1, 0)[:, None, None], axis=1)
    logits_SxV = transformer.logits_from_hidden(params, h_SxD, cfg=cfg)[:, 0]
    n = pool['count_N'].shape[0]
    out_SxO = jnp.where(mask_SxO, count_S[:, None] + jnp.arange(width)[None], length)
    rows_SxO = jnp.where(mask_SxO, row_S[:, None], n)
    pool = dict(pool)
    pool['tokens_NxL'] = pool['tokens_NxL'].at[rows_SxO, out_SxO].set(obs_SxO, mode='drop')
    pool['turn_NxL'] = pool['turn_NxL'].at[rows_SxO, out_SxO].set(
        jnp.broadcast_to(pool['turn_S'][:, None], obs_SxO.shape), mode='drop')
    pool['count_N'] = _set(pool['count_N'], jnp.where(len_S > 0, row_S, n), count_S + len_S)
    pool['logits_SxV'] = jnp.where((len_S > 0)[:, None], logits_SxV, pool['logits_SxV'])
    pool['col_S'] = pool['col_S'] + len_S
    pool['going_S'] = pool['going_S'] | resume_S
    pool['turn_S'] = pool['turn_S'] + resume_S
    pool['steps_S'] = jnp.where(resume_S, 0, pool['steps_S'])
    return pool

  return jax.jit(observe, donate_argnums=(1,))
