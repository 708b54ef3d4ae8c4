"""Off-policy tokens in on-policy groups: HAPO's teacher injection and older-policy prefixes.

  rollout, rewards_BxG, metrics = hapo_inject(run, rollout, rewards_BxG, examples, step=...)
  prefixes = old_policy_prefixes(run, prompts, key=...)   # then sampler.generate(prefixes=)

HAPO (arXiv 2603.11321, algorithms.md §12): where the Beta-Binomial gate opens for a prompt
(v1's default: posterior mean (1 + S)/(N + 2) < γ = 0.8, so mixed groups too), the group's
lowest-reward rollout is replaced by the prompt's reference solution, if the verifier accepts
it; its reward is the verifier's. The teacher trace's tokens are marked in
`prefix_mask_NxL` (given, not sampled) so a mixed-policy loss (`prefix_mixed_ppo`) can treat
them apart; the learner recomputes their log-probs like any row's. Their behaviour log-probs
are the learner's own (`teacher_behaviour='learner'`: ratio π_θ/π_old, recorded as NaN here
and filled in by rl_batch.make_train_batch, the convention of `structs.Prefixes`), or 0
(`'one'`: the teacher's probability is 1, LUFFY's convention [R]).

Prefix rollouts (SOUP / "Thinking Seeds", arXiv 2601.21476, algorithms.md §15): an older
parameter snapshot (the warm start, or the policy every k steps) samples up to Q tokens; the
first `rows_per_group` rows of each group keep a uniformly drawn 1..Q' of them (Q' excludes
the stop token) as a prefix, with the old policy's behaviour log-probs, and the current policy
continues. Completions are then Q + max_new_tokens long. Provenance: our formalisation.
The keep-k buffer of snapshots, its refresh and its restore on resume: methods/soup.py.

Deliberately not here: the loss-side treatment (losses.prefix_mixed_ppo), the gate's
mathematics (advantage_transforms.hapo_*), sampling itself (sampler.generate).
"""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np

from rlreason.objectives import advantage_transforms
from rlreason.rl import rl_batch
from rlreason.rollout import sampler
from rlreason.structs import VERSION_TEACHER, Prefixes, Rollout

# fold_in constants for this module's keys: far above any decode-step index the sampler
# folds into the same step key.
_PREFIX_KEY, _HAPO_KEY = 1 << 30, (1 << 30) + 1


def prefix_key(rng):
  return jax.random.fold_in(rng, _PREFIX_KEY)


def hapo_key(rng):
  return jax.random.fold_in(rng, _HAPO_KEY)


# --------------------------------------------------------------------------- HAPO injection


def teacher_completions(tok, solutions, *, length: int, pad_id: int):
  """Reference solutions + EOS as completion rows: (tokens_BxL, mask_BxL, complete_B).

  A missing solution gives an empty row; one longer than `length` is cut (complete = False:
  no stop token, so the verifier is unlikely to accept it and it is not injected).
  """
  tokens_BxL = np.full((len(solutions), length), pad_id, np.int32)
  mask_BxL = np.zeros((len(solutions), length), bool)
  complete_B = np.zeros(len(solutions), bool)
  for b, solution in enumerate(solutions):
    if not solution:
      continue
    row = tok.encode(solution) + [tok.eos_id]
    complete_B[b] = len(row) <= length
    row = row[:length]
    tokens_BxL[b, :len(row)] = row
    mask_BxL[b, :len(row)] = True
  return tokens_BxL, mask_BxL, complete_B


def teacher_rollout(prompts, tokens_BxL, mask_BxL, complete_B) -> Rollout:
  """The teacher traces as a one-sample-per-prompt Rollout (to verify them)."""
  mask = jnp.asarray(mask_BxL)
  zeros = jnp.zeros(mask.shape, jnp.float32)
  return Rollout(prompts=prompts, tokens_NxL=jnp.asarray(tokens_BxL), mask_NxL=mask,
                 prefix_mask_NxL=mask, logprobs_NxL=zeros, behaviour_logprobs_NxL=zeros,
                 truncated_N=jnp.asarray(~complete_B), lengths_N=mask.sum(1, dtype=jnp.int32),
                 group_size=1)


def replace_rows(rollout: Rollout, injected_BxG, tokens_BxL, mask_BxL, complete_B, *,
                 teacher_behaviour: str = 'learner') -> Rollout:
  """The rollout with row (b, g) replaced by prompt b's teacher trace where injected_BxG.

  Teacher tokens are marked in prefix_mask_NxL. Their plain log-probs are 0 (placeholders:
  the learner recomputes them); behaviour log-probs NaN ('learner') or 0 ('one').
  """
  if teacher_behaviour not in ('learner', 'one'):
    raise ValueError(f"hapo.teacher_behaviour={teacher_behaviour!r}; known: 'learner', 'one'.")
  g = rollout.group_size
  inj_N = jnp.asarray(injected_BxG).reshape(-1)
  rep = lambda x: jnp.repeat(jnp.asarray(x), g, axis=0)
  tok_NxL, mask_NxL = rep(tokens_BxL), rep(mask_BxL)
  behaviour = jnp.nan if teacher_behaviour == 'learner' else 0.0
  row = lambda new, old: jnp.where(inj_N.reshape((-1,) + (1,) * (old.ndim - 1)), new, old)
  if rollout.version_NxL is not None:  # Teacher tokens: no version of the policy sampled them.
    rollout = rollout.replace(version_NxL=row(VERSION_TEACHER, rollout.version_NxL))
  return rollout.replace(
      tokens_NxL=row(tok_NxL, rollout.tokens_NxL), mask_NxL=row(mask_NxL, rollout.mask_NxL),
      prefix_mask_NxL=row(mask_NxL, rollout.prefix_mask_NxL),
      logprobs_NxL=row(0.0, rollout.logprobs_NxL),
      behaviour_logprobs_NxL=row(jnp.where(mask_NxL, behaviour, 0.0),
                                 rollout.behaviour_logprobs_NxL),
      truncated_N=row(~rep(complete_B), rollout.truncated_N),
      lengths_N=row(mask_NxL.sum(1, dtype=jnp.int32), rollout.lengths_N))


def hapo_inject(run, rollout: Rollout, rewards_BxG, examples, *, step: int, key, params,
                progress: float):
  """HAPO's gate and Synthetic Success Injection on one sampled batch.

  Returns (rollout, rewards_BxG, metrics); the inputs unchanged where no gate opens.
  """
  h, g = run.config.hapo, rollout.group_size
  rewards_BxG = np.asarray(rewards_BxG, np.float32)
  successes_B = (rewards_BxG >= h.success_reward).sum(-1)
  threshold = advantage_transforms.hapo_threshold(step, initial=h.threshold,
                                                  anneal_steps=h.anneal_steps)
  gate_key, tie_key = jax.random.split(key)
  gate = {'thompson': dict(key=gate_key), 'confidence': dict(confidence=h.confidence)}
  open_B = np.asarray(advantage_transforms.hapo_gate(
      successes_B, g - successes_B, threshold=threshold, gate=h.gate, alpha0=h.alpha0,
      beta0=h.beta0, require_all_fail=h.require_all_fail, **gate.get(h.gate, {})))
  open_B = open_B & np.array([bool(ex.solution) for ex in examples])
  metrics = {'hapo/threshold': float(threshold), 'hapo/gate_open_frac': float(open_B.mean()),
             'hapo/injected_frac': 0.0}
  if not open_B.any():
    return rollout, rewards_BxG, metrics
  tokens_BxL, mask_BxL, complete_B = teacher_completions(
      run.tok, [ex.solution for ex in examples], length=rollout.tokens_NxL.shape[1],
      pad_id=run.pad_id)
  teacher_BxG, _ = rl_batch.verify(run, teacher_rollout(rollout.prompts, tokens_BxL, mask_BxL, complete_B),
                          examples, progress=progress, params=params)
  teacher_B = teacher_BxG[:, 0]
  verified_B = open_B & (teacher_B >= h.success_reward)
  _, injected_BxG = advantage_transforms.hapo_replace(
      tie_key, rewards_BxG, verified_B, teacher_reward=h.success_reward)
  injected_BxG = np.asarray(injected_BxG)
  rewards_BxG = np.where(injected_BxG, teacher_B[:, None], rewards_BxG).astype(np.float32)
  rollout = replace_rows(rollout, injected_BxG, tokens_BxL, mask_BxL, complete_B,
                         teacher_behaviour=h.teacher_behaviour)
  metrics['hapo/teacher_verified_frac'] = float(verified_B.sum() / open_B.sum())
  metrics['hapo/injected_frac'] = float(injected_BxG.any(-1).mean())
  return rollout, rewards_BxG, metrics


# --------------------------------------------------------------------------- prefix rollouts


def cut_prefixes(old: Rollout, *, key, rows_per_group: int, pad_id: int) -> Prefixes:
  """Prefixes from an older policy's rollout: rows g < rows_per_group of each group keep a
  uniform 1..Q' of their tokens (Q' = sampled length without the stop token), with their
  behaviour log-probs; other rows (and rows with Q' = 0) get no prefix."""
  n, q = old.tokens_NxL.shape
  usable_N = old.lengths_N - (~old.truncated_N).astype(jnp.int32)  # Never end on the stop.
  u_N = jax.random.uniform(key, (n,))
  keep_N = jnp.minimum(jnp.floor(u_N * usable_N).astype(jnp.int32) + 1, usable_N)
  chosen_N = (jnp.arange(n) % old.group_size) < rows_per_group
  keep_N = jnp.where(chosen_N & (usable_N > 0), keep_N, 0)
  mask_NxQ = jnp.arange(q)[None, :] < keep_N[:, None]
  return Prefixes(tokens_NxQ=jnp.where(mask_NxQ, old.tokens_NxL, pad_id), mask_NxQ=mask_NxQ,
                  logprobs_NxQ=jnp.where(mask_NxQ, old.behaviour_logprobs_NxL, 0.0))


def old_policy_prefixes(run, prompts, *, key) -> Prefixes:
  """Samples the prefix tokens from run.prefix_params (the older snapshot) and cuts them."""
  rl, p = run.config.rl, run.config.prefix_rollouts
  sample_key, cut_key = jax.random.split(key)
  old = sampler.generate(
      run.prefix_params, prompts, cfg=run.cfg, group_size=rl.group_size,
      max_new_tokens=p.max_tokens, temperature=rl.temperature, top_k=rl.top_k, top_p=rl.top_p,
      stop_tokens=tuple(run.tok.eos_ids), pad_id=run.pad_id, rng=sample_key, mesh=run.mesh,
      max_chunks=rl.decode_chunks)
  return cut_prefixes(old, key=cut_key, rows_per_group=p.rows_per_group, pad_id=run.pad_id)


def snapshot_step(step: int, refresh_every: int) -> int:
  """The step whose parameters sample the prefixes after `step` updates (0: the warm start)."""
  return step // refresh_every * refresh_every if refresh_every else 0


def build(run):
  """HAPO's injection under hapo.enabled (rl/extensions.py: a batch hook), or None."""
  if not run.config.hapo.enabled:
    return None
  if jax.process_count() > 1:  # Teacher traces are built and verified on the host, and the
    # sampler checks prefixes on the host: both assume every row is addressable here.
    raise ValueError('hapo.enabled and prefix_rollouts.enabled are single-host for now.')
  return HapoInjection()


class HapoInjection:
  """The batch hook: teacher traces replace some lowest-reward rows (`hapo_inject`)."""

  def after_score(self, run, rollout, scores, examples, *, rng, step: int, params,
                  progress: float):
    rewards_BxG, vmetrics = scores.rewards_BxG, scores.metrics
    rollout, rewards_BxG, hapo_metrics = hapo_inject(
        run, rollout, rewards_BxG, examples, step=step, key=hapo_key(rng), params=params,
        progress=progress)
    vmetrics.update(hapo_metrics)
    vmetrics['hapo/zero_variance_frac'] = rl_batch.zero_variance_fraction(rewards_BxG)
    # Injected teacher rows: their reward is the teacher's, their behaviour mode unknown.
    injected_BxG = rewards_BxG != scores.rewards_BxG
    return rollout, dataclasses.replace(
        scores, rewards_BxG=rewards_BxG, metrics=vmetrics,
        verifier_BxG=np.where(injected_BxG, rewards_BxG, scores.verifier_BxG),
        modes_BxG=np.where(injected_BxG, -1, scores.modes_BxG))
