"""SLATE: truncated step-level sampling with ternary step rewards (arXiv 2602.23440).

  out = sample_steps(params, env, renderer, tok, examples, judge=judge, cfg=cfg, k=5,
                     max_turns=4, max_turn_tokens=64, max_observation_tokens=128,
                     max_total_tokens=448, rng=key, prompt_buckets=(128,))
  out.rollout        # B prompts x G = max_turns * k rows, row b*G + t*k + j
  out.advantages_BxG # A of candidate j at step t of example b (0 on steps never reached)

Per example, from the shared prefix τ_<t (prompt, chosen steps, observations): k candidate next
steps, one assistant turn each. The prefix is the prompt of one `sampler.generate` call with
G = k, so it is prefilled once and its k branches read it as one frozen cache segment, never
a copy. The judge (envs/slate_rules.py's rule judge, or slate_judge.ModelStepJudge) scores
each step's dimensions in {-1, 0, +1}:
  search step  r = r_think + r_query
  answer step  r = r_think + r_answer + λ (B - t) / B     (early-answer bonus, t 0-based)
A_j = (r_j - mean r) / (std r + 1e-6) over the k (unbiased std); the continuation is drawn from
softmax(A / η) and the environment steps on it; at most B = max_turns steps.

Rows for the trainer: row (b, t, j) is the prompt, then the prefix τ_<t as given tokens
(prefix_mask, out of the loss), then candidate j's step tokens, the only ones in
`loss_mask_NxL`; its advantage is A_j on those tokens (objective.advantage='slate',
`slate_advantages`, recomputes it from the step rewards in the loop). The objective is the
loop's: objective.policy_loss 'ppo_clip' (ε = 0.2) per token, objective.kl_coef 0.001 with
the k3 estimator, aggregation 'seq_mean_token_mean' (each candidate's token mean, averaged
over the step's k and the steps).

Provenance. Reference code (algoprog/SLATE @09223bc): k = 5, η = 0.7, B = 4, λ = 0.1 and the
reward composition (configs/slate.yaml, slate/rewards/llm_judge.py), the advantage and the
softmax(A/η) choice (slate/training/step_level_algos.py), the loop (slate/agent_loops/
slate_agent_loop.py), β = 0.001 low_var_kl (= k3) and ε = 0.2. That code's objective
(`aggregate_step_objectives`, Eq. 7) clips a per-candidate ratio exp(mean token log-ratio);
PPO-clip per token with a per-candidate token mean, as here, is our formalisation, and in the
released snapshot that function is never called (the verl trainer does not read the stored
candidates). k = 1: the reference code divides by torch's unbiased std of one value (NaN);
here r - mean = 0 gives A = 0 (our formalisation; verl's GRPO would give A = r).
Deliberately not here: the forced '<think>' / '<search>' tags of the reference loop (the
environment's tool-call format decides what a step is), a final forced answer after B steps.
"""

import dataclasses
from typing import Any, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from rlreason.rollout import episodes as episodes_lib
from rlreason.rollout import sampler
from rlreason.rollout import slate_judge  # Step and parse_step; the judges are passed in.
from rlreason.structs import Rollout

K, ETA, LAMBDA_BONUS, EPS = 5, 0.7, 0.1, 1e-6  # The reference code's defaults.


def step_reward(kind: str, r_think: float, r_action: float, *, step: int, budget: int,
                lambda_bonus: float = LAMBDA_BONUS) -> float:
  """r_think + r_query for a search step; + the early-answer bonus λ(B - t)/B for an answer."""
  if kind == 'search':
    return float(r_think + r_action)
  if kind != 'answer':
    raise ValueError(f"step kind {kind!r}; known: 'search', 'answer'.")
  return float(r_think + r_action + lambda_bonus * (budget - step) / budget)


def step_advantages(rewards_xK, *, eps: float = EPS):
  """A = (r - mean) / (std + eps) over the last axis (unbiased std); 0 everywhere for k = 1.

  For k >= 2 this is objectives.advantages.grpo(scale='group', std_ddof=1, eps) on groups of
  k (tests/slate_test.py checks it); rollout/ does not import objectives/.
  """
  rewards_xK = jnp.asarray(rewards_xK, jnp.float32)
  k = rewards_xK.shape[-1]
  # Equal rewards give exactly 0: the float32 mean of five -0.9 is one ulp off, which
  # (r - mean) / (std + 1e-6) would turn into A = 0.056 for every candidate (as grpo guards).
  flat_x1 = rewards_xK.max(axis=-1, keepdims=True) == rewards_xK.min(axis=-1, keepdims=True)
  centred_xK = jnp.where(flat_x1, 0.0, rewards_xK - rewards_xK.mean(axis=-1, keepdims=True))
  if k == 1:
    return centred_xK  # r - mean = 0; no std of one value.
  std_x1 = jnp.sqrt(jnp.sum(centred_xK**2, axis=-1, keepdims=True) / (k - 1))
  return centred_xK / (std_x1 + eps)


def continuation_probs(adv_xK, *, eta: float = ETA):
  """softmax(A / η): the probability that each candidate becomes the continuation."""
  if not eta > 0:
    raise ValueError(f'eta={eta} must be > 0 (eta=0 is the greedy choice, `choose`).')
  return jax.nn.softmax(jnp.asarray(adv_xK, jnp.float32) / eta, axis=-1)


def choose(adv_BxK, rng: jax.Array, *, eta: float = ETA) -> np.ndarray:
  """One continuation index per row, drawn from softmax(A / η); eta <= 0: the argmax."""
  adv_BxK = jnp.asarray(adv_BxK, jnp.float32)
  if eta <= 0:
    return np.asarray(jnp.argmax(adv_BxK, axis=-1))
  return np.asarray(jax.random.categorical(rng, adv_BxK / eta, axis=-1))


def slate_advantages(rewards_BxG, *, k: int, eps: float = EPS):
  """objective.advantage='slate' (rl_batch.advantages_for): G = T·k rows per prompt, A over
  each step's k rows."""
  b, g = rewards_BxG.shape
  if g % k:
    raise ValueError(f'slate advantages: G = {g} rows per prompt is not max_turns x k = {k}.')
  return step_advantages(jnp.asarray(rewards_BxG).reshape(b, g // k, k), eps=eps).reshape(b, g)


def cut_at_stop(ids: Sequence[int], stop_seqs: Sequence[Sequence[int]]) -> list[int]:
  """The step up to the end of the first stop sequence in it (as the episode loop stops)."""
  ids = list(ids)
  for end in range(1, len(ids) + 1):
    if any(len(s) and ids[max(0, end - len(s)):end] == list(s) for s in stop_seqs):
      return ids[:end]
  return ids


def context_buckets(prompt_buckets: Sequence[int], max_prefix: int) -> tuple[int, ...]:
  """Prompt widths for the step sampler: the prompt's buckets, and each plus the longest
  prefix, so a run compiles at most twice per prompt bucket."""
  return tuple(sorted(set(prompt_buckets) | {b + max_prefix for b in prompt_buckets}))


@dataclasses.dataclass
class SlateSteps:
  """Rows of one SLATE batch (prompt-major, G = max_turns * k) and per-example host data."""
  rollout: Rollout
  rewards_BxG: np.ndarray  # step rewards; 0 on steps never reached
  advantages_BxG: np.ndarray
  scores_BxGx2: np.ndarray  # (r_think, r_action) per candidate
  valid_BxT: np.ndarray  # bool: step t was sampled
  chosen_BxT: np.ndarray  # int: the continuation's index (-1 where no step)
  answer_BxG: np.ndarray  # bool: the candidate is an answer step
  episode_rewards_B: np.ndarray  # the environment's reward of the chosen trajectory
  correct_B: np.ndarray
  histories: list  # per example: the chosen steps, {'text', 'observation', 'reward'}

  def metrics(self) -> dict[str, float]:
    valid_BxG = np.repeat(self.valid_BxT, self.rewards_BxG.shape[1] // self.valid_BxT.shape[1],
                          axis=1)
    r = self.rewards_BxG.reshape(*self.valid_BxT.shape, -1)
    flat = r[self.valid_BxT]
    return {
        'slate/steps_mean': float(self.valid_BxT.sum(1).mean()),
        'slate/step_reward_mean': float(self.rewards_BxG[valid_BxG].mean()),
        'slate/r_think_mean': float(self.scores_BxGx2[valid_BxG][:, 0].mean()),
        'slate/r_action_mean': float(self.scores_BxGx2[valid_BxG][:, 1].mean()),
        'slate/answer_frac': float(self.answer_BxG[valid_BxG].mean()),
        'slate/zero_variance_step_frac': float(np.mean(flat.max(-1) == flat.min(-1))),
        'train/accuracy': float(self.correct_B.mean()),
        'train/episode_reward': float(self.episode_rewards_B.mean()),
    }


def sample_steps(params, env, renderer, tok, examples: Sequence[Any], *, judge, cfg, k: int,
                 max_turns: int, max_turn_tokens: int, max_observation_tokens: int,
                 max_total_tokens: int, rng: jax.Array, prompt_buckets: Sequence[int],
                 eta: float = ETA, lambda_bonus: float = LAMBDA_BONUS, temperature: float = 1.0,
                 top_k: int = 0, top_p: float = 1.0, pad_id: int = 0,
                 stop_seqs: Sequence[Sequence[int]] | None = None,
                 max_chunks: int = sampler.MAX_CHUNKS) -> SlateSteps:
  """Truncated step-level sampling for a batch of examples; see the module docstring."""
  need = episodes_lib.cache_slots(max_turns, max_turn_tokens, max_observation_tokens)
  if k < 1 or max_turns < 1:
    raise ValueError(f'slate: k={k} and max_turns={max_turns} must be >= 1.')
  if max_total_tokens < need:
    raise ValueError(f'slate: max_total_tokens={max_total_tokens} < {need} = max_turns x '
                     'max_turn_tokens + (max_turns - 1) x max_observation_tokens: a row is the '
                     'prefix of every earlier step plus one candidate.')
  if stop_seqs is None:
    stop_seqs = episodes_lib.stop_sequences(tok, env.format)
  eos = tuple(sorted(tok.eos_ids))
  b, g, length = len(examples), max_turns * k, max_total_tokens
  prompt_ids = [tok.encode(renderer.prompt_text(ex)) for ex in examples]
  prompts = sampler.prepare_prompts(prompt_ids, buckets=prompt_buckets, pad_id=pad_id)
  buckets = context_buckets(prompt_buckets, need - max_turn_tokens)
  # Per row: token, log-prob, behaviour log-prob, turn; flags: mask, given prefix, in loss.
  rows = {name: np.zeros((b * g, length), dtype) for name, dtype in (
      ('tokens', np.int32), ('logp', np.float32), ('blogp', np.float32), ('turn', np.int32),
      ('mask', bool), ('prefix', bool), ('loss', bool))}
  rows['tokens'][:] = pad_id
  truncated_N = np.zeros(b * g, bool)
  rewards_BxTxK = np.zeros((b, max_turns, k), np.float32)
  scores_BxTxKx2 = np.zeros((b, max_turns, k, 2), np.float32)
  answer_BxTxK = np.zeros((b, max_turns, k), bool)
  adv_BxTxK = np.zeros((b, max_turns, k), np.float32)
  valid_BxT = np.zeros((b, max_turns), bool)
  chosen_BxT = np.full((b, max_turns), -1, np.int32)
  # The chosen trajectory so far: its tokens, their log-probs (0 on observations), turns.
  traj = [{'tokens': [], 'logp': [], 'blogp': [], 'turn': []} for _ in range(b)]
  histories = [[] for _ in range(b)]
  states = [env.reset(ex) for ex in examples]
  live = np.ones(b, bool)
  for t in range(max_turns):
    if not live.any():
      break
    contexts = [prompt_ids[i] + (traj[i]['tokens'] if live[i] else []) for i in range(b)]
    out = sampler.generate(params, sampler.prepare_prompts(contexts, buckets=buckets,
                                                           pad_id=pad_id),
                           cfg=cfg, group_size=k, max_new_tokens=max_turn_tokens,
                           rng=jax.random.fold_in(rng, t), temperature=temperature, top_k=top_k,
                           top_p=top_p, stop_tokens=eos, pad_id=pad_id, max_chunks=max_chunks)
    tokens, mask, logp, blogp = (np.asarray(x) for x in jax.device_get(
        (out.tokens_NxL, out.mask_NxL, out.logprobs_NxL, out.behaviour_logprobs_NxL)))
    steps = [cut_at_stop(tokens[n][mask[n]], stop_seqs) for n in range(b * k)]
    texts = tok.decode_batch(steps, skip_special_tokens=True)
    idx = np.flatnonzero(live)
    cands = [[slate_judge.parse_step(texts[i * k + j], env.format) for j in range(k)]
             for i in idx]
    scored = judge.score([examples[i] for i in idx], [histories[i] for i in idx], cands,
                         params=params)
    for i, cs, s_Kx2 in zip(idx, cands, scored):
      scores_BxTxKx2[i, t] = s_Kx2
      answer_BxTxK[i, t] = [c.kind == 'answer' for c in cs]
      rewards_BxTxK[i, t] = [step_reward(c.kind, *s, step=t, budget=max_turns,
                                         lambda_bonus=lambda_bonus) for c, s in zip(cs, s_Kx2)]
    valid_BxT[idx, t] = True
    adv_BxTxK[idx, t] = np.asarray(step_advantages(rewards_BxTxK[idx, t]))
    choice_B = choose(adv_BxTxK[:, t], jax.random.fold_in(jax.random.fold_in(rng, t), 1), eta=eta)
    for i in idx:
      q = len(traj[i]['tokens'])
      for j in range(k):
        n, src = i * g + t * k + j, i * k + j
        step = steps[src]
        ended = len(step) < int(mask[src].sum()) or (bool(step) and step[-1] in eos)
        truncated_N[n] = not ended
        for name, key in (('tokens', 'tokens'), ('logp', 'logp'), ('blogp', 'blogp'),
                          ('turn', 'turn')):
          rows[name][n, :q] = traj[i][key]
        rows['tokens'][n, q:q + len(step)] = step
        rows['logp'][n, q:q + len(step)] = logp[src, :len(step)]
        rows['blogp'][n, q:q + len(step)] = blogp[src, :len(step)]
        rows['turn'][n, q:q + len(step)] = t
        rows['mask'][n, :q + len(step)] = True
        rows['prefix'][n, :q] = True
        rows['loss'][n, q:q + len(step)] = True
      chosen = int(choice_B[i])
      chosen_BxT[i, t] = chosen
      _extend(traj[i], steps[i * k + chosen], logp[i * k + chosen], blogp[i * k + chosen], t)
      step_out = env.step(states[i], texts[i * k + chosen])
      histories[i].append({'text': texts[i * k + chosen], 'observation': step_out.observation,
                           'reward': float(rewards_BxTxK[i, t, chosen]),
                           **{key: v for key, v in step_out.info.items() if key != 'messages'}})
      if step_out.done or t == max_turns - 1:
        live[i] = False
        continue
      ids = steps[i * k + chosen]
      # The observation fitted to its budget exactly as the episode loop fits it.
      fit = episodes_lib._fit_observation  # pylint: disable=protected-access
      obs = fit(tok, renderer, step_out.info['messages'], bool(ids) and ids[-1] in tok.eos_ids,
                max_observation_tokens)
      if not obs:
        live[i] = False
        continue
      traj[i]['tokens'] += obs
      traj[i]['logp'] += [0.0] * len(obs)
      traj[i]['blogp'] += [0.0] * len(obs)
      traj[i]['turn'] += [t] * len(obs)
  mask_NxL = jnp.asarray(rows['mask'])
  rollout = Rollout(
      prompts=prompts, tokens_NxL=jnp.asarray(rows['tokens']), mask_NxL=mask_NxL,
      prefix_mask_NxL=jnp.asarray(rows['prefix']), logprobs_NxL=jnp.asarray(rows['logp']),
      behaviour_logprobs_NxL=jnp.asarray(rows['blogp']), truncated_N=jnp.asarray(truncated_N),
      lengths_N=mask_NxL.sum(axis=1, dtype=jnp.int32), group_size=g,
      loss_mask_NxL=jnp.asarray(rows['loss']), turn_NxL=jnp.asarray(rows['turn']))
  correct_B = np.array([bool(h) and h[-1].get('status') == 'correct' for h in histories])
  return SlateSteps(
      rollout=rollout, rewards_BxG=rewards_BxTxK.reshape(b, g),
      advantages_BxG=adv_BxTxK.reshape(b, g), scores_BxGx2=scores_BxTxKx2.reshape(b, g, 2),
      valid_BxT=valid_BxT, chosen_BxT=chosen_BxT, answer_BxG=answer_BxTxK.reshape(b, g),
      episode_rewards_B=np.array([s.reward for s in states], np.float32), correct_B=correct_B,
      histories=histories)


def _extend(traj: dict, step: Sequence[int], logp, blogp, turn: int) -> None:
  traj['tokens'] += list(step)
  traj['logp'] += [float(x) for x in logp[:len(step)]]
  traj['blogp'] += [float(x) for x in blogp[:len(step)]]
  traj['turn'] += [turn] * len(step)
