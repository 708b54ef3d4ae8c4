"""Typed-state episodes (MIND): every turn is its own row, prompted with the environment's state.

  episodes = run_typed_episodes(params, env, renderer, tok, examples, cfg=cfg, group_size=8,
                                max_turns=6, max_turn_tokens=8, state_tokens=96, rng=key)
  episodes.rollout      # B*G*T rows, row (b*G + g)*T + t: episode b*G + g's turn t
  episodes.rewards_BxG  # the environment's return of each episode

rollout/episodes.py grows one context per episode: observations are appended token in, token
out. A typed state (MIND: observed evidence, unresolved checks, differentials, supports,
reliability) instead *replaces* the context each turn, so the turn's prompt is
`renderer.prompt_text(example) + env.state_text(state)` and nothing before it. Of the two
ways to fit that into rows, this module takes the faithful one: each turn is its own row
(prompt = the state, completion = the action), so the policy conditions on the state alone.
(Appending each new state as an observation to one growing row would keep the history in the
context, which is what the raw mode already is.)

Static shapes: every turn samples all B*G rows at once with sampler.generate (group_size 1,
one prompt bucket of `state_tokens`, `max_turn_tokens` new tokens), so the sampler compiles
once whatever the number of turns; rows whose episode has ended, or that were never reached
because all episodes ended early, are in the batch with an all-False mask (a state longer
than `state_tokens` ends its episode truncated, as a raw history past its budget does). A turn
ends at an EOS or at the format's call end, which must be one token here.

Credit: the episode's return (the environment's per-turn rewards summed: outcome plus
information-gain process rewards) is every one of its turn rows' reward; rl/rl_batch.py's
advantages_for repeats each episode's group advantage over its T rows (`turn_rows`). So GRPO
compares the same G episode returns in both modes, and only what the policy conditions on
differs.

`conversation` is the episodes as raw conversations (actions trained, answers not) for
transcripts and token counts; each transcript turn also carries the 'state' it was prompted
with. Not here: batching rows of different episodes' turns together across steps, a state
longer than one bucket.
"""

from collections.abc import Sequence
import dataclasses
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from rlreason.envs import render
from rlreason.rollout import episodes as episodes_lib
from rlreason.rollout import sampler


@dataclasses.dataclass(frozen=True)
class Conversation:
  """Per episode, the actions and answers in order: what transcripts print."""
  tokens_NxL: np.ndarray
  loss_mask_NxL: np.ndarray
  lengths_N: np.ndarray
  group_size: int


@dataclasses.dataclass
class TypedEpisodes(episodes_lib.Episodes):
  """Episodes whose rollout has `turn_rows` rows per episode (see the module docstring)."""
  group_size: int = 1
  turn_rows: int = 1
  conversation: Conversation | None = None

  @property
  def rewards_BxG(self) -> np.ndarray:
    return self.rewards_N.reshape(-1, self.group_size)


def turn_stop_tokens(tok, fmt) -> tuple[int, ...]:
  """EOS ids and the format's call end, which must encode to a single token."""
  stops = set(tok.eos_ids)
  if fmt.call_end:
    ids = tok.encode(fmt.call_end)
    if len(ids) != 1:
      raise ValueError(f'env.state="typed" stops a turn on one token; the {fmt.family} format\'s '
                       f'call end {fmt.call_end!r} encodes to {len(ids)} tokens.')
    stops.add(int(ids[0]))
  return tuple(sorted(stops))


def _stack_turns(rollouts: Sequence[Any], n: int, turns: int):
  """[T] per-turn rollouts of N rows -> one of N*T rows, episode-major (row n*T + t)."""
  def stack(*xs):
    x = jnp.stack(xs, axis=1)  # N x T x ...
    return x.reshape((n * turns,) + x.shape[2:])
  return jax.tree.map(stack, *rollouts)


def run_typed_episodes(params, env, renderer, tok, examples: Sequence[Any], *, cfg,
                       group_size: int, max_turns: int, max_turn_tokens: int, state_tokens: int,
                       rng: jax.Array, temperature: float = 1.0, top_k: int = 0,
                       top_p: float = 1.0, pad_id: int = 0, mesh=None,
                       max_chunks: int = sampler.MAX_CHUNKS) -> TypedEpisodes:
  """Runs G episodes per example, a sampler call per turn; see the module docstring."""
  if max_turns < 1 or max_turn_tokens < 1 or state_tokens < 1:
    raise ValueError(f'max_turns={max_turns}, max_turn_tokens={max_turn_tokens} and '
                     f'state_tokens={state_tokens} must be >= 1.')
  stops = turn_stop_tokens(tok, env.format)
  n = len(examples) * group_size
  states = [env.reset(examples[i // group_size]) for i in range(n)]
  live, truncated = np.ones(n, bool), np.zeros(n, bool)
  transcripts = [[] for _ in range(n)]
  conv_ids = [[] for _ in range(n)]
  conv_trained = [[] for _ in range(n)]
  rollouts = []
  for turn in range(max_turns):
    texts = [renderer.prompt_text(s.example) + env.state_text(s) for s in states]
    ids = [tok.encode(t) for t in texts]
    for r in np.flatnonzero(live):
      if len(ids[r]) > state_tokens:  # The state outgrew the prompt budget.
        live[r], truncated[r] = False, True
        transcripts[r].append({'turn': turn, 'state': texts[r], 'text': '', 'tokens': 0,
                               'reward': 0.0, 'over_budget': len(ids[r])})
    row_live = live.copy()
    ids = [x if row_live[r] else [pad_id] for r, x in enumerate(ids)]  # Waiting rows.
    prompts = sampler.prepare_prompts(ids, buckets=(state_tokens,), pad_id=pad_id)
    rollout = sampler.generate(
        params, prompts, cfg=cfg, group_size=1, max_new_tokens=max_turn_tokens,
        rng=jax.random.fold_in(rng, turn), temperature=temperature, top_k=top_k, top_p=top_p,
        stop_tokens=stops, pad_id=pad_id, mesh=mesh, max_chunks=max_chunks)
    tokens, mask = (np.asarray(x) for x in jax.device_get((rollout.tokens_NxL,
                                                           rollout.mask_NxL)))
    rows = np.flatnonzero(row_live)
    sampled = [tokens[r, mask[r]].tolist() for r in rows]
    actions = [render.valid_unicode(t) for t in tok.decode_batch(sampled,
                                                                skip_special_tokens=True)]
    for r, action_ids, action in zip(rows, sampled, actions):
      step = env.step(states[r], action)
      transcripts[r].append({'turn': turn, 'state': texts[r], 'text': action,
                             'tokens': len(action_ids), 'reward': step.reward,
                             **{k: v for k, v in step.info.items() if k != 'messages'}})
      conv_ids[r] += action_ids
      conv_trained[r] += [True] * len(action_ids)
      if step.done or turn == max_turns - 1:
        live[r] = False
        truncated[r] = bool(step.info.get('truncated')) or not step.done
        continue
      answer = tok.encode_pieces(render.observation_pieces(renderer, step.info['messages'],
                                                           True))
      conv_ids[r] += answer
      conv_trained[r] += [False] * len(answer)
    real_Nx1 = jnp.asarray(row_live)[:, None]
    rollouts.append(rollout.replace(
        mask_NxL=rollout.mask_NxL & real_Nx1, loss_mask_NxL=rollout.mask_NxL & real_Nx1,
        turn_NxL=jnp.full(rollout.tokens_NxL.shape, turn, jnp.int32),
        lengths_N=jnp.where(real_Nx1[:, 0], rollout.lengths_N, 0)))
    if not live.any():
      break
  blank = rollouts[-1].replace(  # Turns no episode reached: same shapes, nothing real.
      mask_NxL=jnp.zeros_like(rollouts[-1].mask_NxL),
      loss_mask_NxL=jnp.zeros_like(rollouts[-1].mask_NxL),
      lengths_N=jnp.zeros_like(rollouts[-1].lengths_N))
  rollouts += [blank.replace(turn_NxL=jnp.full_like(blank.turn_NxL, t))
               for t in range(len(rollouts), max_turns)]
  rollout = _stack_turns(rollouts, n, max_turns)
  width = max([len(x) for x in conv_ids] + [1])
  conv_tokens = np.full((n, width), pad_id, np.int32)
  conv_mask = np.zeros((n, width), bool)
  for r in range(n):
    conv_tokens[r, :len(conv_ids[r])] = conv_ids[r]
    conv_mask[r, :len(conv_ids[r])] = conv_trained[r]
  kinds = sorted({k for s in states for k in s.errors})
  return TypedEpisodes(
      rollout=rollout, rewards_N=np.array([s.reward for s in states], np.float32),
      turns_N=np.array([s.turns for s in states], np.int32),
      tool_calls_N=np.array([s.tool_calls for s in states], np.int32),
      errors_N={k: np.array([s.errors[k] for s in states], np.int32) for k in kinds},
      observation_tokens_N=np.array([len(x) - sum(m) for x, m in zip(conv_ids, conv_trained)],
                                    np.int32),
      truncated_N=truncated, transcripts=transcripts, group_size=group_size,
      turn_rows=max_turns, conversation=Conversation(
          tokens_NxL=conv_tokens, loss_mask_NxL=conv_mask,
          lengths_N=np.array([len(x) for x in conv_ids], np.int32), group_size=group_size))
