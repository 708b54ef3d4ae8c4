"""ARTIST's role episodes: a controller row and a reasoner row per episode, advantages per role.

  episodes = run_role_episodes(params, env, tok, examples, cfg=cfg, group_size=8,
                               max_turn_tokens=8, prompt_tokens=64, rng=key)
  episodes.rollout             # 2 rows per episode, row (b*G + g)*2 + r: r = 0 controller,
                               # r = 1 reasoner
  episodes.role_rewards_BxGxR  # per role (envs/artist.py), NaN where a role had no turn

One policy plays both roles (envs/artist.py: the role is in the prompt). The controller row
is prompted with the question and the series' static summary and selects a segment; the
environment runs the `timeseries` tool on it; the reasoner row is prompted with the question
and that tool output alone (its own prompt, not a continuation of the controller's), and
answers. So each role's turn is its own row, as typed-state turns are in typed_episodes.py:
every turn samples all B*G rows at once with sampler.generate (group_size 1, one prompt bucket
of `prompt_tokens`, `max_turn_tokens` new tokens), so the sampler compiles once; a reasoner
row whose controller failed (malformed action, bad segment) is in the batch with an
all-False mask. Both roles' rows go into one train batch.

Credit (`role_advantages`, our formalisation of the abstract's "hierarchical policy
optimisation"; the paper's own is not known):

  A_{b,g,r} = (R_{b,g,r} - mean_{g'} R_{b,g',r}) / (std_{g'} R_{b,g',r} + eps)

over the rows g' of prompt b that have role r's turn (a GRPO group per role: the controller
is compared with the other controllers of its prompt, the reasoner with the other
reasoners); 0 for a missing row, and for a role with fewer than two rows (std_ddof=1) or
equal rewards. With env.options.credit='episode', rl/rl_batch.py's advantages_for instead
repeats the episode's success advantage over both rows: plain GRPO on the same episodes.

Not here: several selections per episode, a reasoner that sees the controller's context.
"""

from collections.abc import Sequence
import dataclasses

import jax
import jax.numpy as jnp
import numpy as np

from rlreason.envs import render
from rlreason.rollout import sampler
from rlreason.rollout import typed_episodes

ROLES = 2  # controller, reasoner


def role_advantages(rewards_BxGxR: jax.Array, *, std_ddof: int = 1,
                    eps: float = 1e-6) -> jax.Array:
  """GRPO's group advantage within each role over the present rows (NaN: absent, A = 0)."""
  present = ~jnp.isnan(rewards_BxGxR)
  r = jnp.where(present, rewards_BxGxR, 0.0)
  count_BxR = present.sum(axis=1)
  mean_BxR = r.sum(axis=1) / jnp.maximum(count_BxR, 1)
  dev = jnp.where(present, r - mean_BxR[:, None], 0.0)
  var_BxR = (dev**2).sum(axis=1) / jnp.maximum(count_BxR - std_ddof, 1)
  std_BxR = jnp.where(count_BxR > std_ddof, jnp.sqrt(var_BxR), 0.0)
  return jnp.where(present, dev / (std_BxR[:, None] + eps), 0.0)


@dataclasses.dataclass
class RoleEpisodes(typed_episodes.TypedEpisodes):
  """Episodes of two rows each (turn_rows = 2), with per-role rewards and the credit mode."""
  role_rewards_N: np.ndarray | None = None  # N x 2, NaN where the role had no turn
  credit: str = 'roles'

  @property
  def role_rewards_BxGxR(self) -> np.ndarray:
    return self.role_rewards_N.reshape(-1, self.group_size, ROLES)

  @property
  def credit_BxGxR(self) -> np.ndarray | None:
    """The per-role rewards the advantages use, or None for the episode's (credit 'episode')."""
    return self.role_rewards_BxGxR if self.credit == 'roles' else None

  def role_metrics(self) -> dict[str, float]:
    """Segment-selection accuracy (every episode), the reasoner's accuracy on the segment it
    was shown (episodes that reached it), and the episode's success."""
    ctl = np.array([bool(t[0].get('contains')) for t in self.transcripts])
    rsn = self.role_rewards_N[:, 1]
    reached = ~np.isnan(rsn)
    return {'artist/segment_accuracy': float(ctl.mean()),
            'artist/reasoner_accuracy': float(rsn[reached].mean()) if reached.any() else 0.0,
            'artist/reached_reasoner_frac': float(reached.mean()),
            'artist/answer_accuracy': float(self.rewards_N.mean())}


def _turn(params, tok, texts, live, *, cfg, prompt_tokens, max_turn_tokens, rng, stops,
          pad_id, **sample):
  """Samples one turn for every row (a dead row gets a one-token dummy prompt and is masked):
  (rollout with this turn's masks, sampled ids per live row, their decoded texts)."""
  ids = [tok.encode(t) if ok else [pad_id] for t, ok in zip(texts, live)]
  too_long = [(r, len(x)) for r, x in enumerate(ids) if len(x) > prompt_tokens]
  if too_long:
    r, n = too_long[0]
    raise ValueError(f'ARTIST: row {r}\'s role prompt is {n} tokens, more than '
                     f'max(data.prompt_buckets)={prompt_tokens}: {texts[r]!r}')
  prompts = sampler.prepare_prompts(ids, buckets=(prompt_tokens,), pad_id=pad_id)
  rollout = sampler.generate(params, prompts, cfg=cfg, group_size=1,
                             max_new_tokens=max_turn_tokens, rng=rng, stop_tokens=stops,
                             pad_id=pad_id, **sample)
  tokens, mask = (np.asarray(x) for x in jax.device_get((rollout.tokens_NxL, rollout.mask_NxL)))
  rows = np.flatnonzero(live)
  sampled = [tokens[r, mask[r]].tolist() for r in rows]
  real_Nx1 = jnp.asarray(live)[:, None]
  rollout = rollout.replace(
      mask_NxL=rollout.mask_NxL & real_Nx1, loss_mask_NxL=rollout.mask_NxL & real_Nx1,
      lengths_N=jnp.where(real_Nx1[:, 0], rollout.lengths_N, 0))
  texts = tok.decode_batch(sampled, skip_special_tokens=True)
  return rollout, rows, sampled, [render.valid_unicode(t) for t in texts]


def run_role_episodes(params, env, tok, examples: Sequence, *, cfg, group_size: int,
                      max_turn_tokens: int, prompt_tokens: int, rng: jax.Array,
                      temperature: float = 1.0, top_k: int = 0, top_p: float = 1.0,
                      pad_id: int = 0, mesh=None,
                      max_chunks: int = sampler.MAX_CHUNKS) -> RoleEpisodes:
  """Runs G episodes per example (controller turn, tool, reasoner turn); see the docstring."""
  if max_turn_tokens < 1 or prompt_tokens < 1:
    raise ValueError(f'max_turn_tokens={max_turn_tokens} and prompt_tokens={prompt_tokens} '
                     'must be >= 1.')
  stops = typed_episodes.turn_stop_tokens(tok, env.format)
  n = len(examples) * group_size
  states = [env.reset(examples[i // group_size]) for i in range(n)]
  transcripts = [[] for _ in range(n)]
  conv_ids, conv_trained = [[] for _ in range(n)], [[] for _ in range(n)]
  sample = dict(cfg=cfg, prompt_tokens=prompt_tokens, max_turn_tokens=max_turn_tokens,
                stops=stops, pad_id=pad_id, temperature=temperature, top_k=top_k, top_p=top_p,
                mesh=mesh, max_chunks=max_chunks)
  rollouts = []
  for role in range(ROLES):
    live = np.ones(n, bool) if role == 0 else np.array([not s.done for s in states])
    prompt = env.controller_prompt if role == 0 else env.reasoner_prompt
    texts = [prompt(s) if ok else '' for s, ok in zip(states, live)]
    rollout, rows, sampled, actions = _turn(params, tok, texts, live,
                                            rng=jax.random.fold_in(rng, role), **sample)
    rollouts.append(rollout.replace(turn_NxL=jnp.full(rollout.tokens_NxL.shape, role,
                                                      jnp.int32)))
    for r, ids, action in zip(rows, sampled, actions):
      step = (env.select if role == 0 else env.answer)(states[r], action)
      transcripts[r].append({'turn': role, 'prompt': texts[r], 'text': action,
                             'tokens': len(ids), 'reward': step.reward, **step.info})
      conv_ids[r] += ids
      conv_trained[r] += [True] * len(ids)
      if role == 0 and not step.done:
        seen = tok.encode_pieces([('= ', True), (render.valid_unicode(str(step.observation)),
                                                 False), ('\n', True)])  # no control ids
        conv_ids[r] += seen
        conv_trained[r] += [False] * len(seen)
  role_rewards = np.array([[s.role_rewards[0], s.role_rewards[1] if s.turns == 2 else np.nan]
                           for s in states], np.float32)
  width = max([len(x) for x in conv_ids] + [1])
  conv_tokens, conv_mask = np.full((n, width), pad_id, np.int32), np.zeros((n, width), bool)
  for r in range(n):
    conv_tokens[r, :len(conv_ids[r])] = conv_ids[r]
    conv_mask[r, :len(conv_ids[r])] = conv_trained[r]
  kinds = sorted({k for s in states for k in s.errors})
  return RoleEpisodes(
      rollout=jax.tree.map(lambda *xs: _interleave(xs, n), *rollouts),
      rewards_N=np.array([s.reward for s in states], np.float32),
      turns_N=np.array([s.turns for s in states], np.int32),
      tool_calls_N=np.array([s.tool_calls for s in states], np.int32),
      errors_N={k: np.array([s.errors[k] for s in states], np.int32) for k in kinds},
      observation_tokens_N=np.array([len(x) - sum(m) for x, m in zip(conv_ids, conv_trained)],
                                    np.int32),
      truncated_N=np.zeros(n, bool), transcripts=transcripts, group_size=group_size,
      turn_rows=ROLES, conversation=typed_episodes.Conversation(
          tokens_NxL=conv_tokens, loss_mask_NxL=conv_mask,
          lengths_N=np.array([len(x) for x in conv_ids], np.int32), group_size=group_size),
      role_rewards_N=role_rewards, credit=env.credit)


def _interleave(xs, n: int):
  """R arrays of N rows -> N*R rows, episode-major (row n*R + r)."""
  x = jnp.stack(xs, axis=1)
  return x.reshape((n * len(xs),) + x.shape[2:])
