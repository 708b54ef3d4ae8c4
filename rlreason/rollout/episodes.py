"""Multi-turn episodes with tools: decode, run the calls on the host, prefill the results, go on.

  episodes = run_episodes(params, env, renderer, tok, examples, cfg=cfg, group_size=8,
                          max_turns=4, max_turn_tokens=64, max_observation_tokens=128,
                          max_total_tokens=384, rng=key)
  episodes.rollout      # a Rollout whose loss_mask_NxL is 1 on sampled tokens only
  episodes.rewards_BxG  # from the environment

Token in, token out. Each row's prompt is rendered and encoded once (`renderer.prompt_text`),
its G rows read the prompt's cache as one shared frozen segment (as in sampler.py). A turn
decodes every live row until it samples an EOS or the call's closing token sequence
(`stop_sequences`: only when the renderer's tool_calls_per_turn is 'one'; with 'many', Qwen's
default, a turn holds parallel calls), or `max_turn_tokens`; the host decodes each row's new
tokens to text (invalid unicode replaced) and steps its environment, all rows' tool calls at
once (a thread per row, `max_workers`); each observation (the template's text between this
turn and the next, `renderer.observation_pieces`) is encoded with its messages' content as
plain text (`tok.encode_pieces`: a tool cannot write control tokens) and fed into that row's
existing cache, never re-prefilling the conversation. Rows
whose episode ended wait, masked. An observation that would take the row past
`max_total_tokens` ends its episode truncated (so does a turn that reaches it).

Every row owns one cache of `max_turns * max_turn_tokens + (max_turns - 1) *
max_observation_tokens` slots, written at a shared position (a masked slot for rows that
wait); RoPE positions count a row's real tokens only, so attention sees exactly the
conversation a full forward would. The completion columns hold the row's real tokens packed
left (sampled, observation, sampled, ...): `loss_mask_NxL` marks the sampled ones, `turn_NxL`
the turn each token belongs to (an observation carries the index of the turn it answers).
Three jitted functions (start, decode a turn, observe) with shapes fixed by the arguments:
an episode batch compiles once per prompt bucket, whatever the number of turns. Params that
carry DART's routed adapters (model/dart.py) get each fed token's route from a per-row
recurrence state carried in `_State.route`.

Deliberately not here: a paged or per-turn segmented cache (every decode step reads the
row's whole cache), asynchronous tool calls overlapping decoding, rewriting earlier turns
(Qwen3's template drops old reasoning when re-rendering; the episode keeps what was sampled),
and CLEANER's rollback of failed calls, which hooks in here (rollback.py).
"""

from collections.abc import Sequence
import concurrent.futures
import dataclasses
import functools
from typing import Any

import flax
import jax
import jax.numpy as jnp
import numpy as np

from rlreason.envs import formats
from rlreason.envs import render
from rlreason.model import dart
from rlreason.model import sharding
from rlreason.model import transformer
from rlreason.rollout import rollback as rollback_lib
from rlreason.rollout import sampler
from rlreason.rollout import sampling
from rlreason.structs import Prompts, Rollout


@flax.struct.dataclass
class _State:
  """The device side of a batch of episodes between jitted calls."""
  cache: transformer.KVCache
  logits_NxV: jax.Array
  tokens_NxL: jax.Array
  logp_NxL: jax.Array
  blogp_NxL: jax.Array
  sampled_NxL: jax.Array  # bool: a token the policy sampled (the loss mask)
  turn_NxL: jax.Array
  count_N: jax.Array  # real completion tokens so far
  route: Any = None  # With DART adapters in the params: each row's dart.RouteState.


@dataclasses.dataclass
class Episodes:
  """B*G episodes, prompt-major. `rollout` holds the device arrays (Rollout fields plus
  loss_mask_NxL and turn_NxL); the rest is per-episode host data."""
  rollout: Rollout
  rewards_N: np.ndarray  # float32: the environment's reward, summed over the episode
  turns_N: np.ndarray  # int32: assistant turns taken
  tool_calls_N: np.ndarray  # int32: calls the environment ran
  errors_N: dict[str, np.ndarray]  # error kind -> int32 count per episode
  observation_tokens_N: np.ndarray  # int32
  truncated_N: np.ndarray  # bool: ended by the token budget or max_turns
  transcripts: list[list[dict]]  # per episode: {'turn', 'text', 'observation', 'reward', ...}
  rollback: rollback_lib.Stats | None = None  # with `rollback` settings (CLEANER, rollback.py)

  @property
  def rewards_BxG(self) -> np.ndarray:
    return self.rewards_N.reshape(-1, self.rollout.group_size)

  def __getattr__(self, name):  # tokens_NxL, loss_mask_NxL, turn_NxL, ... from the rollout
    if name.endswith(('_NxL', '_N')) and name != 'rollout':
      return getattr(self.__dict__['rollout'], name)
    raise AttributeError(name)


def correct_N(episodes: Episodes) -> np.ndarray:
  """Whether each episode's final answer was judged correct by the environment's verifier."""
  return np.array([bool(t) and t[-1].get('status') == 'correct' for t in episodes.transcripts])


def ok_calls_N(episodes: Episodes) -> np.ndarray:
  """Calls per episode that ran without an error (an unknown tool or bad arguments count in
  tool_calls_N and in errors_N; a malformed call, envs.base.MALFORMED, only in errors_N)."""
  failed = sum((n for kind, n in episodes.errors_N.items() if kind != 'malformed'),
               np.zeros_like(episodes.tool_calls_N))
  return episodes.tool_calls_N - failed


def metrics(episodes: Episodes) -> dict[str, float]:
  """Per-episode means: turns, tool calls, errors by kind, observation tokens, truncation."""
  out = {
      'episodes/turns_mean': float(episodes.turns_N.mean()),
      'episodes/tool_calls_mean': float(episodes.tool_calls_N.mean()),
      'episodes/tool_call_frac': float((episodes.tool_calls_N > 0).mean()),
      'episodes/ok_call_frac': float((ok_calls_N(episodes) > 0).mean()),
      'episodes/observation_tokens_mean': float(episodes.observation_tokens_N.mean()),
      'episodes/truncated_frac': float(episodes.truncated_N.mean()),
      'episodes/tool_errors_mean': float(sum(episodes.errors_N.values(), np.zeros(1)).mean()),
  }
  for kind, count_N in episodes.errors_N.items():
    out[f'episodes/tool_errors/{kind}_mean'] = float(count_N.mean())
  out.update(rollback_lib.metrics(episodes))
  return out


def stop_sequences(tok, fmt, calls_per_turn: str = '') -> tuple[tuple[int, ...], ...]:
  """Token sequences that end a turn besides EOS: the format's call end, as encoded, when a
  turn holds one call (`calls_per_turn` 'one', or '' and the format's default is 'one');
  none when it may hold several ('many': the turn ends at its EOS)."""
  one = formats.calls_per_turn(fmt, calls_per_turn) == 'one'
  return (tuple(tok.encode(fmt.call_end)),) if one and fmt.call_end else ()


def turn_stops(tok, env, renderer) -> tuple[tuple[int, ...], ...]:
  """The episode loops' default stop sequences: the renderer's tool_calls_per_turn (set by
  render.make_renderer from env.tool_calls_per_turn) over the environment's format."""
  return stop_sequences(tok, env.format, getattr(renderer, 'tool_calls_per_turn', ''))


def cache_slots(max_turns: int, max_turn_tokens: int, max_observation_tokens: int) -> int:
  return max_turns * max_turn_tokens + (max_turns - 1) * max_observation_tokens


def check_budgets(max_turns: int, max_turn_tokens: int, max_total_tokens: int,
                  max_observation_tokens: int) -> None:
  """The episode budgets an episode loop needs (static or continuous_episodes.py)."""
  if max_turns < 1 or max_turn_tokens < 1 or max_total_tokens < 1:
    raise ValueError(f'max_turns={max_turns}, max_turn_tokens={max_turn_tokens} and '
                     f'max_total_tokens={max_total_tokens} must be >= 1.')
  if max_turns > 1 and max_observation_tokens < 1:
    raise ValueError(f'max_observation_tokens={max_observation_tokens} must be >= 1 when '
                     f'max_turns={max_turns} > 1.')


def run_episodes(params, env, renderer, tok, examples: Sequence[Any], *, cfg, group_size: int,
                 max_turns: int, max_turn_tokens: int, max_observation_tokens: int,
                 max_total_tokens: int, rng: jax.Array, prompt_buckets: Sequence[int],
                 temperature: float = 1.0, top_k: int = 0, top_p: float = 1.0,
                 pad_id: int = 0, stop_seqs: Sequence[Sequence[int]] | None = None,
                 cache_dtype: str | None = None, mesh=None, max_workers: int = 8,
                 rollback: rollback_lib.Settings | None = None,
                 row_rng: bool = False) -> Episodes:
  """Runs G episodes per example to their end; see the module docstring. With `rollback`,
  failed calls of its error classes are replaced by their corrections (rollback.py).
  row_rng: row n's token at completion column c is drawn with sampling.step_keys(row_keys(
  rng, n), c), whatever the batch or turn (continuous_episodes.py draws the same tokens)."""
  if row_rng and rollback is not None:
    raise ValueError('run_episodes: row_rng=True does not support rollback (its retries draw '
                     'from their own keys).')
  check_budgets(max_turns, max_turn_tokens, max_total_tokens, max_observation_tokens)
  if stop_seqs is None:  # The call's closing text, from the environment's tool-call format.
    stop_seqs = turn_stops(tok, env, renderer)
  stop_seqs = tuple(tuple(int(t) for t in seq) for seq in stop_seqs)
  eos = tuple(sorted(tok.eos_ids))
  prompt_ids = [tok.encode(renderer.prompt_text(ex)) for ex in examples]
  prompts = sampler.prepare_prompts(prompt_ids, buckets=prompt_buckets, pad_id=pad_id)
  n = len(examples) * group_size
  slots = cache_slots(max_turns, max_turn_tokens, max_observation_tokens)
  if rollback is not None:
    slots += rollback_lib.extra_slots(rollback, max_turns=max_turns,
                                      max_turn_tokens=max_turn_tokens,
                                      max_observation_tokens=max_observation_tokens)
  static = dict(cfg=cfg, group_size=group_size, length=max_total_tokens, slots=slots,
                pad_id=int(pad_id), cache_dtype=cache_dtype, mesh=mesh)
  if mesh is not None:
    rows = lambda x: jax.device_put(x, sharding.data_sharding(mesh, x.shape, sharding.SAMPLE_RULES))
    prompts = jax.tree.map(rows, prompts)
  state = _start_fn(**static)(params, prompts)
  decode = _decode_fn(**static, steps=max_turn_tokens, greedy=temperature == 0, top_k=int(top_k),
                      top_p=float(top_p), eos=eos, stop_seqs=stop_seqs,
                **({'row_rng': True} if row_rng else {}))  # The default's cache key unchanged.
  observe = _observe_fn(**static, width=max_observation_tokens)
  temp = jnp.float32(max(temperature, 1e-6))

  states = [env.reset(examples[i // group_size]) for i in range(n)]
  live = np.ones(n, bool)
  truncated = np.zeros(n, bool)
  obs_tokens = np.zeros(n, np.int32)
  transcripts = [[] for _ in range(n)]
  count = np.zeros(n, np.int32)
  pool = concurrent.futures.ThreadPoolExecutor(max_workers=max(1, max_workers))
  tracker = None if rollback is None else rollback_lib.Tracker(
      rollback, n=n, length=max_total_tokens, env=env, tok=tok, renderer=renderer,
      fit=_fit_observation, observation_width=max_observation_tokens, turn_width=max_turn_tokens,
      eos=eos, pool=pool, cfg=cfg, pad_id=pad_id, greedy=temperature == 0)
  try:
    for turn in range(max_turns):
      saved = rollback_lib.save(state) if tracker else None
      state = decode(params, state, jnp.asarray(live), jnp.int32(turn), temp,
                     rng if row_rng else jax.random.fold_in(rng, turn))
      tokens = np.asarray(jax.device_get(state.tokens_NxL))
      new_count = np.asarray(jax.device_get(state.count_N))
      rows = np.flatnonzero(live)
      turn_ids = [tokens[r, count[r]:new_count[r]].tolist() for r in rows]
      texts = [render.valid_unicode(t) for t in tok.decode_batch(turn_ids,
                                                                 skip_special_tokens=True)]
      snapshots = [rollback_lib.copy_state(states[r]) for r in rows] if tracker else None
      steps = list(pool.map(lambda a: env.step(states[a[0]], a[1]), zip(rows, texts)))
      if tracker and turn < max_turns - 1:
        state, turn_ids, texts, steps = tracker.retry(
            params, state, saved, turn=turn, rows=rows, turn_ids=turn_ids, texts=texts,
            steps=steps, snapshots=snapshots, states=states, count=count, decode=decode,
            observe=observe, temperature=temp, rng=rng)
        new_count = np.asarray(jax.device_get(state.count_N))
      obs = np.zeros((n, max_observation_tokens), np.int32)
      obs_mask = np.zeros((n, max_observation_tokens), bool)
      for r, ids, text, step in zip(rows, turn_ids, texts, steps):
        entry = {'turn': turn, 'text': text, 'tokens': len(ids), 'reward': step.reward,
                 **{k: v for k, v in step.info.items() if k != 'messages'}}
        if tracker and turn in tracker.attempts[r]:
          entry['rollbacks'] = tracker.attempts[r][turn]
        transcripts[r].append(entry)
        at_budget = new_count[r] >= max_total_tokens
        if step.done or at_budget or turn == max_turns - 1:
          live[r] = False
          truncated[r] = bool(step.info.get('truncated')) or (not step.done)
          continue
        ended = bool(ids) and ids[-1] in tok.eos_ids
        ids_obs = _fit_observation(tok, renderer, step.info['messages'], ended,
                                   max_observation_tokens)
        if new_count[r] + len(ids_obs) > max_total_tokens - 1 or len(ids_obs) == 0:
          live[r], truncated[r] = False, True
          entry['observation'] = None
          continue
        entry['observation'] = tok.decode(ids_obs)
        obs[r, :len(ids_obs)], obs_mask[r, :len(ids_obs)] = ids_obs, True
        obs_tokens[r] += len(ids_obs)
      count = new_count + obs_mask.sum(axis=1, dtype=np.int32)
      if not live.any():
        break
      state = observe(params, state, jnp.asarray(obs), jnp.asarray(obs_mask), jnp.int32(turn))
  finally:
    pool.shutdown(wait=True)

  mask_NxL = jnp.arange(max_total_tokens)[None, :] < state.count_N[:, None]
  rollout = Rollout(
      prompts=prompts, tokens_NxL=state.tokens_NxL, mask_NxL=mask_NxL,
      prefix_mask_NxL=jnp.zeros_like(mask_NxL), logprobs_NxL=state.logp_NxL,
      behaviour_logprobs_NxL=state.blogp_NxL, truncated_N=jnp.asarray(truncated),
      lengths_N=state.count_N, group_size=group_size, loss_mask_NxL=state.sampled_NxL & mask_NxL,
      turn_NxL=state.turn_NxL)
  stats = tracker.stats() if tracker else None
  if stats is not None:
    rollout = tracker.tag(rollout, stats)
  kinds = sorted({k for s in states for k in s.errors})
  return Episodes(
      rollout=rollout, rewards_N=np.array([s.reward for s in states], np.float32),
      turns_N=np.array([s.turns for s in states], np.int32),
      tool_calls_N=np.array([s.tool_calls for s in states], np.int32),
      errors_N={k: np.array([s.errors[k] for s in states], np.int32) for k in kinds},
      observation_tokens_N=obs_tokens, truncated_N=truncated, transcripts=transcripts,
      rollback=stats)


def _fit_observation(tok, renderer, messages, ended: bool, width: int) -> list[int]:
  """The observation's ids within `width` tokens: the result with the most text left is cut
  (a marker says by how much) until it fits; [] if the template's own text cannot fit.
  Message content never becomes control tokens (render.py's pieces, tok.encode_pieces)."""
  messages = render.clean_messages(messages)
  originals = [str(m['content']) for m in messages]
  keep = [len(c) for c in originals]
  encode = lambda: tok.encode_pieces(render.observation_pieces(renderer, messages, ended))
  ids = encode()
  while len(ids) > width:
    i = int(np.argmax(keep)) if keep else 0
    if not keep or keep[i] == 0:
      return []
    # Cut at least the excess in characters (a token holds >= 1), or proportionally: each
    # round keeps strictly less, so the loop ends.
    keep[i] = max(0, min(keep[i] - (len(ids) - width), keep[i] * width // len(ids)))
    cut = len(originals[i]) - keep[i]
    messages[i]['content'] = originals[i][:keep[i]] + f'...[truncated {cut} characters]'
    ids = encode()
  return ids


def _on_rows(x, mesh, axis=0):
  if mesh is None or x.ndim == 0:
    return x
  axes = tuple('batch' if d == axis else None for d in range(x.ndim))
  spec = sharding.logical_to_spec(axes, sharding.SAMPLE_RULES, mesh, x.shape)
  return jax.lax.with_sharding_constraint(x, jax.sharding.NamedSharding(mesh, spec))


@functools.lru_cache(maxsize=16)
def _start_fn(*, cfg, group_size, length, slots, pad_id, cache_dtype, mesh):

  def start(params, prompts: Prompts) -> _State:
    b, p = prompts.tokens_BxP.shape
    n = b * group_size
    prompt_cache = transformer.init_cache(cfg, b, p, cache_dtype)
    route_BxP, route = dart.feed(params, prompts.tokens_BxP, prompts.mask_BxP, None)
    h_BxPxD, prompt_cache = transformer.apply(params, prompts.tokens_BxP, cfg=cfg,
                                              mask_NxT=prompts.mask_BxP, cache=prompt_cache,
                                              return_hidden=True, route_NxT=route_BxP)
    logits_BxV = transformer.logits_from_hidden(params, h_BxPxD[:, -1:], cfg=cfg)[:, 0]
    rows = functools.partial(_on_rows, mesh=mesh)
    shared = jax.tree.map(rows, transformer.freeze(prompt_cache))
    pos_N = rows(jnp.repeat(prompt_cache.pos_N, group_size))
    cache = jax.tree.map(rows, transformer.init_cache(cfg, n, slots, cache_dtype, pos_N=pos_N))
    zeros = lambda dtype: rows(jnp.zeros((n, length), dtype))
    return _State(cache=cache.replace(frozen=(shared,)),
                  logits_NxV=rows(jnp.repeat(logits_BxV, group_size, axis=0)),
                  tokens_NxL=rows(jnp.full((n, length), pad_id, jnp.int32)),
                  logp_NxL=zeros(jnp.float32), blogp_NxL=zeros(jnp.float32),
                  sampled_NxL=zeros(bool), turn_NxL=zeros(jnp.int32),
                  count_N=rows(jnp.zeros((n,), jnp.int32)),
                  route=jax.tree.map(lambda x: rows(jnp.repeat(x, group_size, axis=0)), route))

  return jax.jit(start)


def _write(buf_NxL, col_N, x_N, ok_N):
  """buf[n, col_N[n]] = x_N[n] where ok_N (others, and columns past the end, untouched)."""
  col_N = jnp.where(ok_N, col_N, buf_NxL.shape[1])
  return buf_NxL.at[jnp.arange(buf_NxL.shape[0]), col_N].set(x_N.astype(buf_NxL.dtype),
                                                              mode='drop')


@functools.lru_cache(maxsize=16)
def _decode_fn(*, cfg, group_size, length, slots, pad_id, cache_dtype, mesh, steps, greedy,
               top_k, top_p, eos, stop_seqs, row_rng=False):
  del group_size, cache_dtype
  eos_E = jnp.asarray(eos or (-1,), jnp.int32)
  width = max([len(s) for s in stop_seqs] + [1])
  # Stop sequences right-aligned in a WxK table; -1 pads match any token.
  table = np.full((max(len(stop_seqs), 1), width), -2, np.int32)
  for i, seq in enumerate(stop_seqs):
    table[i, :] = -1
    table[i, width - len(seq):] = seq
  stop_SxW = jnp.asarray(table)

  def decode(params, state: _State, live_N, turn, temperature, rng) -> _State:
    # A row's RoPE positions stay below its prompt's length + `length`.
    rope_table = transformer.rope_table(cfg, state.cache.frozen[0].mask_AxS.shape[1] + length + 1)
    n = live_N.shape[0]
    keys_N = sampling.row_keys(rng, jnp.arange(n)) if row_rng else None

    def body(carry):
      i, st, going_N, recent_NxW = carry
      key = (sampling.step_keys(keys_N, st.count_N) if row_rng else jax.random.fold_in(rng, i))
      tok_N, lp_N, blp_N = sampling.next_token(st.logits_NxV, key, temperature, greedy=greedy,
                                               top_k=top_k, top_p=top_p, per_row_keys=row_rng)
      tok_N = jnp.where(going_N, tok_N, pad_id)
      col_N = st.count_N
      st = st.replace(
          tokens_NxL=_write(st.tokens_NxL, col_N, tok_N, going_N),
          logp_NxL=_write(st.logp_NxL, col_N, lp_N, going_N),
          blogp_NxL=_write(st.blogp_NxL, col_N, blp_N, going_N),
          sampled_NxL=_write(st.sampled_NxL, col_N, jnp.ones_like(going_N), going_N),
          turn_NxL=_write(st.turn_NxL, col_N, jnp.broadcast_to(turn, (n,)), going_N),
          count_N=st.count_N + going_N)
      route_Nx1, route = dart.feed(params, tok_N[:, None], going_N[:, None], st.route)
      logits, cache = transformer.apply(params, tok_N[:, None], cfg=cfg,
                                        mask_NxT=going_N[:, None], cache=st.cache,
                                        rope_table=rope_table, route_NxT=route_Nx1)
      st = st.replace(cache=cache, logits_NxV=jnp.where(going_N[:, None], logits[:, 0],
                                                        st.logits_NxV), route=route)
      recent_NxW = jnp.where(going_N[:, None],
                             jnp.concatenate([recent_NxW[:, 1:], tok_N[:, None]], 1), recent_NxW)
      hit_eos = jnp.any(tok_N[:, None] == eos_E, axis=-1)
      hit_seq = jnp.any(jnp.all((stop_SxW[None] == recent_NxW[:, None]) | (stop_SxW[None] == -1),
                                axis=-1), axis=-1)
      going_N = going_N & ~hit_eos & ~hit_seq & (st.count_N < length)
      return i + 1, st, going_N, recent_NxW

    cond = lambda carry: (carry[0] < steps) & jnp.any(carry[2])
    going_N = live_N & (state.count_N < length)
    recent = jnp.full((n, width), -3, jnp.int32)
    _, state, _, _ = jax.lax.while_loop(cond, body, (jnp.int32(0), state, going_N, recent))
    return state

  return jax.jit(decode)


@functools.lru_cache(maxsize=16)
def _observe_fn(*, cfg, group_size, length, slots, pad_id, cache_dtype, mesh, width):
  del group_size, slots, pad_id, cache_dtype, mesh

  def observe(params, state: _State, obs_NxO, mask_NxO, turn) -> _State:
    n = obs_NxO.shape[0]
    route_NxO, route = dart.feed(params, obs_NxO, mask_NxO, state.route)
    h_NxOxD, cache = transformer.apply(params, obs_NxO, cfg=cfg, mask_NxT=mask_NxO,
                                       cache=state.cache, return_hidden=True, route_NxT=route_NxO)
    len_N = mask_NxO.sum(axis=1, dtype=jnp.int32)
    last_N = jnp.maximum(len_N - 1, 0)
    h_NxD = jnp.take_along_axis(h_NxOxD, last_N[:, None, None], axis=1)[:, 0]
    logits_NxV = transformer.logits_from_hidden(params, h_NxD[:, None], cfg=cfg)[:, 0]
    cols_NxO = state.count_N[:, None] + jnp.arange(width)[None, :]
    cols_NxO = jnp.where(mask_NxO, cols_NxO, length)  # dropped
    put = lambda buf, x: buf.at[jnp.arange(n)[:, None], cols_NxO].set(x.astype(buf.dtype),
                                                                      mode='drop')
    return state.replace(
        cache=cache, route=route,
        logits_NxV=jnp.where((len_N > 0)[:, None], logits_NxV, state.logits_NxV),
        tokens_NxL=put(state.tokens_NxL, obs_NxO),
        turn_NxL=put(state.turn_NxL, jnp.broadcast_to(turn, obs_NxO.shape)),
        count_N=state.count_N + len_N)

  return jax.jit(observe)
