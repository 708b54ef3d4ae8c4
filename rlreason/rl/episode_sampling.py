"""The core's episode rollout source: G episodes per prompt in the run's environment
(config.env: tools, MIND's typed state, ARTIST's roles, continuous batching), scored by the
environment, and their transcripts.

Deliberately not here: the episode loops themselves (rollout/episodes*.py, rollout/roles.py).
"""

import jax

from rlreason.rl.rl_batch import score_episodes, tag_versions, zero_variance_fraction
from rlreason.rl.run_setup import Run
from rlreason.rl.timing import phase
from rlreason.rollout import episodes as episodes_lib
from rlreason.rollout import rollback as rollback_lib


def run_episodes(run: Run, params, examples, rng, *, group_size: int, temperature: float,
                 rollback=None, slots: int = 0):
  """G episodes per example with the run's environment (config.env), on the sampling mesh;
  `rollback` (rollout/rollback.Settings) for training episodes only; `slots` > 0: continuous
  batching, one episode per slot (rollout/continuous_episodes.py, rl.sampler='continuous')."""
  e, rl = run.config.env, run.config.rl
  if e.get('kind', 'tools') == 'artist':  # ARTIST: a controller row and a reasoner row each.
    from rlreason.rollout import roles
    with jax.set_mesh(run.sample_mesh):
      return roles.run_role_episodes(
          params, run.env, run.tok, examples, cfg=run.cfg, group_size=group_size,
          max_turn_tokens=e.max_turn_tokens, prompt_tokens=max(run.config.data.prompt_buckets),
          rng=rng, temperature=temperature, top_k=rl.top_k, top_p=rl.top_p, pad_id=run.pad_id,
          max_chunks=rl.decode_chunks)
  if e.get('state', 'raw') == 'typed':  # MIND: a row per turn, prompted with the state alone.
    from rlreason.rollout import typed_episodes
    with jax.set_mesh(run.sample_mesh):
      return typed_episodes.run_typed_episodes(
          params, run.env, run.renderer, run.tok, examples, cfg=run.cfg, group_size=group_size,
          max_turns=e.max_turns, max_turn_tokens=e.max_turn_tokens,
          state_tokens=max(run.config.data.prompt_buckets), rng=rng, temperature=temperature,
          top_k=rl.top_k, top_p=rl.top_p, pad_id=run.pad_id, max_chunks=rl.decode_chunks)
  if slots:
    from rlreason.rollout import continuous_episodes
    with jax.set_mesh(run.sample_mesh):
      return continuous_episodes.run_episodes(
          params, run.env, run.renderer, run.tok, examples, cfg=run.cfg, group_size=group_size,
          slots=slots, max_turns=e.max_turns, max_turn_tokens=e.max_turn_tokens,
          max_observation_tokens=e.max_observation_tokens, max_total_tokens=rl.max_new_tokens,
          rng=rng, prompt_buckets=run.config.data.prompt_buckets, temperature=temperature,
          top_k=rl.top_k, top_p=rl.top_p, pad_id=run.pad_id, max_workers=e.workers)
  with jax.set_mesh(run.sample_mesh):
    return episodes_lib.run_episodes(
        params, run.env, run.renderer, run.tok, examples, cfg=run.cfg, group_size=group_size,
        max_turns=e.max_turns, max_turn_tokens=e.max_turn_tokens,
        max_observation_tokens=e.max_observation_tokens, max_total_tokens=rl.max_new_tokens,
        rng=rng, prompt_buckets=run.config.data.prompt_buckets, temperature=temperature,
        top_k=rl.top_k, top_p=rl.top_p, pad_id=run.pad_id, max_workers=e.workers,
        rollback=rollback)


def sample_episodes(run: Run, params, examples, rng, *, step: int, times: dict[str, float]):
  """One batch of B prompts x G episodes, rewarded by the environment: (rollout, Scores).
  At evaluation steps, the first env.transcripts episodes are written (rlreason.episodes)."""
  with phase(times, 'generate'):
    episodes = run_episodes(run, params, examples, rng, group_size=run.config.rl.group_size,
                            temperature=run.config.rl.temperature,
                            rollback=rollback_lib.from_config(run.config.env),
                            slots=run.config.rl.slots
                            if run.config.rl.get('sampler', 'static') == 'continuous' else 0)
  scores = score_episodes(run, episodes)
  rollout = tag_versions(episodes.rollout, version=step - 1)
  sampled = int(jax.device_get(episodes.rollout.loss_mask_NxL.sum()))
  times['tokens/generate'] = times.get('tokens/generate', 0) + sampled
  run.data_iter.record(examples, scores.rewards_BxG)
  scores.metrics['train/zero_variance_frac'] = zero_variance_fraction(scores.rewards_BxG)
  every = run.config.eval.every
  if every and step % every == 0 and jax.process_index() == 0:
    write_transcripts(run, episodes, examples, step=step, kind='train')
  return rollout, scores


def write_transcripts(run: Run, episodes, examples, *, step: int, kind: str) -> None:
  from rlreason.envs import transcripts
  # Typed-state episodes (rollout/typed_episodes.py) train on rows per turn; the transcript
  # shows their conversation.
  g, r = episodes.rewards_BxG.shape[1], getattr(episodes, 'conversation', episodes.rollout)
  prompts = [run.renderer.prompt_text(examples[n // g]) for n in range(len(episodes.rewards_N))]
  records = transcripts.records(
      run.tok, prompts=prompts, tokens_NxL=jax.device_get(r.tokens_NxL),
      loss_mask_NxL=jax.device_get(r.loss_mask_NxL), lengths_N=jax.device_get(r.lengths_N),
      rewards_N=episodes.rewards_N, turns=episodes.transcripts, truncated_N=episodes.truncated_N,
      tool_calls_N=episodes.tool_calls_N, errors_N=episodes.errors_N, step=step, kind=kind,
      limit=run.config.env.transcripts)
  transcripts.write(transcripts.path_for(run.workdir, step, kind), records)
