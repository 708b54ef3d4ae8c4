"""The RL loop: prompts -> sampler -> verifiers -> advantages -> updates -> eval -> log -> ckpt.

`train(config, workdir)` is the whole job; `main.py` is its command line. Everything the loop
needs is built once by `build` into a `Run`; the loop itself (`train`, one screen) is the only
impure code in the package. Device work happens in jitted pure functions (sampler.generate,
update.logprobs_step, update.train_step); the host sees token ids (to decode for the
verifiers) and scalar metrics, one step late.

Synchronous by default; with rl.async_mode the rollouts come from rl/async_rl.py's sampler,
up to rl.max_staleness steps ahead. Deliberately not here: multi-host data feeding beyond
per-process sharding of the prompt stream. The optional critic (config.critic)
is a value head on the policy's trunk, trained in the same update (update.py).
"""

import contextlib
import dataclasses
import logging
import time
from typing import Any

import jax
import ml_collections
import numpy as np

from rlreason import config as config_lib
from rlreason import multihost
from rlreason.model import sharding
from rlreason.rl import adapters
from rlreason.rl import async_rl
from rlreason.rl import cea
from rlreason.rl import checkpoint
from rlreason.rl import metrics as metrics_lib
from rlreason.rl import mixed_policy
from rlreason.rl import partial_rollouts
from rlreason.rl import monitors
from rlreason.rl import slate_steps
from rlreason.rl import soup
from rlreason.rollout import episodes as episodes_lib
from rlreason.rollout import rollback as rollback_lib
from rlreason.rollout import sampler
from rlreason.rl.rl_batch import (advantages_for, dynamic_filter, generate_rollout,
                                  make_train_batch, provenance_metrics, score, score_episodes,
                                  tag_versions, throughput, zero_variance_fraction)
from rlreason.rl.run_setup import Run, build, encode_prompts, export_policy
from rlreason.rl.sft import sft_loop


@contextlib.contextmanager
def phase(times: dict[str, float], name: str):
  start = time.perf_counter()
  yield
  times[f'time/{name}_s'] = times.get(f'time/{name}_s', 0.0) + time.perf_counter() - start


def sample_and_verify(run: Run, params, examples, rng, *, step: int, progress: float,
                      times: dict[str, float]):
  """One batch of B prompts x G samples, scored: (rollout, rl_batch.Scores).

  With prefix_rollouts, rows start from an older snapshot's prefix; the schedule records
  the policy's rewards; with hapo, teacher traces then replace some lowest-reward rows.
  """
  if run.config.slate.enabled:  # SLATE's candidate-step rows (rollout/slate.py).
    return slate_steps.sample_and_score(run, params, examples, rng, step=step, times=times)
  if run.config.get('threads') is not None and run.config.threads.enabled:  # fork/join rows
    from rlreason.rl import threads
    return threads.sample_and_score(run, params, examples, rng, step=step, times=times)
  if run.env is not None:
    return sample_episodes(run, params, examples, rng, step=step, times=times)
  if run.partial is not None:  # rl.partial_rollouts: whole groups from the carried pool.
    return partial_rollouts.sample_and_verify(run, params, examples, rng, step=step,
                                              progress=progress, times=times)
  rl, prompts = run.config.rl, encode_prompts(run, examples)
  with phase(times, 'generate'):
    prefixes = prefix_version = None
    if run.prefix_params is not None:  # From the keep-k buffer of snapshots (rl/soup.py).
      prefixes, prefix_version = soup.buffer_prefixes(run, prompts,
                                                      key=mixed_policy.prefix_key(rng))
    if run.sample_mesh is not run.mesh:  # The key too must live on the sampling mesh.
      rng = multihost.replicate_key(rng, run.sample_mesh)
    with jax.set_mesh(run.sample_mesh):  # The training mesh unless sample_mesh.kind='host'.
      rollout = jax.block_until_ready(generate_rollout(
          rl, params, prompts, cfg=run.cfg, group_size=rl.group_size,
          max_new_tokens=rl.max_new_tokens, temperature=rl.temperature, top_k=rl.top_k,
          top_p=rl.top_p, stop_tokens=tuple(run.tok.eos_ids), pad_id=run.pad_id, rng=rng,
          mesh=run.sample_mesh, prefixes=prefixes, max_chunks=rl.decode_chunks,
          sample_dtype=rl.sample_dtype or None))
    if run.sample_mesh is not run.mesh:  # Rows back to the learner's layout.
      rollout = jax.device_put(rollout, jax.tree.map(
          lambda x: sharding.data_sharding(run.mesh, x.shape), rollout))
    rollout = tag_versions(rollout, version=step - 1, prefix_version=prefix_version)
  scores = verify_rollout(run, rollout, examples, progress=progress, params=params, times=times)
  rewards_BxG, vmetrics = scores.rewards_BxG, scores.metrics
  if run.config.hapo.enabled:
    rollout, rewards_BxG, hapo_metrics = mixed_policy.hapo_inject(
        run, rollout, rewards_BxG, examples, step=step, key=mixed_policy.hapo_key(rng),
        params=params, progress=progress)
    vmetrics.update(hapo_metrics)
    vmetrics['hapo/zero_variance_frac'] = zero_variance_fraction(rewards_BxG)
    # Injected teacher rows: their reward is the teacher's, their behaviour mode unknown.
    injected_BxG = rewards_BxG != scores.rewards_BxG
    scores = dataclasses.replace(
        scores, rewards_BxG=rewards_BxG, metrics=vmetrics,
        verifier_BxG=np.where(injected_BxG, rewards_BxG, scores.verifier_BxG),
        modes_BxG=np.where(injected_BxG, -1, scores.modes_BxG))
  return rollout, scores


def verify_rollout(run: Run, rollout, examples, *, progress: float, times: dict[str, float],
                   params=None):
  """The rollout's Scores (rl_batch.score), recorded in the prompt schedule."""
  with phase(times, 'verify'):
    scores, _ = score(run, rollout, examples, progress=progress, params=params)
  tokens = int(jax.device_get(rollout.lengths_N.sum()))
  for name in ('generate', 'verify'):
    times[f'tokens/{name}'] = times.get(f'tokens/{name}', 0) + tokens
  run.data_iter.record(examples, scores.rewards_BxG)
  scores.metrics['train/zero_variance_frac'] = zero_variance_fraction(scores.rewards_BxG)
  return scores


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


def evaluate_policy(run: Run, params, rng, *, step: int = 0) -> dict[str, float]:
  """Greedy (or eval.temperature) pass@1 / pass@k / mean@k / maj@k on the held-out prompts
  (with env.enabled: episodes, whose first chunk's transcripts are written)."""
  from rlreason.rl import evaluate
  on_episodes = None
  if run.env is not None and jax.process_index() == 0:
    on_episodes = lambda ep, ex: write_transcripts(run, ep, ex, step=step, kind='eval')
  summary = evaluate.evaluate(run, params, k=run.config.eval.k,
                              temperature=run.config.eval.temperature, rng=rng,
                              on_episodes=on_episodes)
  tokens = summary.pop('generated_tokens')
  return {**{f'eval/{k}': v for k, v in summary.items()}, 'tokens/eval': tokens}


def sample_step(run: Run, policy, step: int, times: dict[str, float]):
  """The synchronous step's rollout, sampled now with `policy` (DAPO's dynamic sampling
  refills it up to rl.max_refill_rounds times): (rollout, scores, metrics)."""
  rl, progress = run.config.rl, step / max(run.config.rl.steps, 1)
  rng = jax.random.fold_in(run.root_rng, step)
  sample_params = sharding.reshard(policy, run.sample_shardings)
  groups, metrics = [], {}
  for attempt in range(1 + (rl.max_refill_rounds if rl.dynamic_sampling else 0)):
    with phase(times, 'sample'):
      examples = next(run.data_iter)
      rollout, scores = sample_and_verify(
          run, sample_params, examples, jax.random.fold_in(rng, attempt), step=step,
          progress=progress, times=times)
    if attempt == 0:
      metrics.update(scores.metrics)
    groups.append((rollout, scores))
    if not rl.dynamic_sampling or dynamic_filter(groups, rl.prompts_per_step)[2] >= 1.0:
      break
  rollout, scores, kept_frac = dynamic_filter(groups, rl.prompts_per_step,
                                              enabled=rl.dynamic_sampling)
  metrics['dynamic_sampling/filled_frac'] = kept_frac
  metrics['dynamic_sampling/rounds'] = len(groups)
  return rollout, scores, metrics


def rl_step(run: Run, state, step: int, times: dict[str, float], async_sampler=None):
  """Sample (or take the rollout sampled ahead, rl.async_mode), verify, filter, compute
  advantages, and update: (state, metrics)."""
  rl, progress = run.config.rl, step / max(run.config.rl.steps, 1)
  policy = run.rollout_policy(state.params)  # The model's params (LoRA merged; R²PO's head).
  if async_sampler is None:
    rollout, scores, metrics = sample_step(run, policy, step, times)
  else:  # Sampled by version max(0, step - 1 - rl.max_staleness) (rl/async_rl.py).
    with phase(times, 'sample'):
      examples, rollout = async_sampler.rollout(policy, step)
      scores = verify_rollout(run, rollout, examples, progress=progress, times=times)
    metrics = dict(scores.metrics)
  stage = run.stage(step)  # R²PO's stages (rl/r2po.py); one plain stage otherwise.
  with phase(times, 'update'):
    batch, stats = make_train_batch(run, stage.learner(policy), rollout,
                                    value_params=state.value_params)
    adv_NxL, returns_NxL = advantages_for(run, scores, stats, batch, progress=progress,
                                          advantage=stage.advantage)
    batch = batch.replace(advantages_NxL=adv_NxL, returns_NxL=returns_NxL)
    if getattr(run.config, 'monitors', None) is not None and run.config.monitors.perplexity:
      from rlreason.analysis import perplexity  # Prompt vs answer tokens under π_old, before
      metrics.update(perplexity.batch_metrics(  # the update donates its params.
          policy, batch.tokens_NxT, batch.mask_NxT, cfg=run.cfg,
          completion_length=rollout.tokens_NxL.shape[1]))
    metrics.update(cea.metrics(run, state.params, batch, step))  # lora.cea_every (rl/cea.py)
    perm = np.arange(rl.prompts_per_step)
    for epoch in range(rl.epochs):
      if epoch:  # Reshuffle whole groups between epochs, deterministically per step.
        perm = np.random.default_rng([run.config.seed, step, epoch]).permutation(perm)
      for mb in np.array_split(perm, rl.minibatches):
        per = len(batch.tokens_NxT) // rl.prompts_per_step  # G rows; G x turns when typed.
        rows = (mb[:, None] * per + np.arange(per)).reshape(-1)
        state, step_metrics = stage.train_step(state, jax.tree.map(lambda x: x[rows], batch))
    state = jax.block_until_ready(state)  # So time/update_s is the update's, not its dispatch.
  times['tokens/update'] = rl.epochs * batch.mask_NxT.sum()
  soup.refresh(run, state.params, step)
  metrics.update(step_metrics)
  metrics.update(provenance_metrics(batch, learner_version=step - 1))
  metrics.update(sampler.metrics(rollout))
  metrics['train/reward'] = scores.rewards_BxG.mean()
  if stage.number:
    metrics['r2po/stage'] = stage.number
  return state, metrics


# The progress line's metrics (a key missing from a step's summary is left out).
PROGRESS_KEYS = ('train/reward', 'eval/pass@1', 'loss', 'monitors/audit', 'monitors/disagreement',
                 'monitors/alarms', 'perplexity/answer', 'perplexity/prompt')


def train(config: ml_collections.ConfigDict, workdir: str) -> tuple[Any, dict[str, float]]:
  """Runs (or resumes) the job in `workdir`: (final TrainState, last evaluation metrics)."""
  config_lib.validate(config, num_devices=jax.device_count())
  if config.get('repirl') is not None and config.repirl.enabled:  # Its own loop: PRM + policy.
    from rlreason.rl import repirl
    return repirl.train(config, workdir)
  run = build(config, workdir)
  writer = metrics_lib.Writer(workdir, total_steps=config.rl.steps, every=config.log_every)
  preempt = checkpoint.PreemptionFlag()
  # The TrainState takes over the loaded params' buffers: later code reads only their shapes.
  state, start = run.restore_or_init(release_init_params=True)
  async_sampler = async_rl.start(run, start)  # None unless rl.async_mode (rl/async_rl.py).
  if not run.restored:  # A restored step 0 already holds the warm start.
    with jax.set_mesh(run.mesh):
      state, sft_metrics = sft_loop(run, state, steps=config.sft.steps, writer=writer)
    eval_metrics = evaluate_policy(run, run.policy(state.params), run.eval_rng, step=0)
    writer.write(0, {**sft_metrics, **eval_metrics})
    logging.info('after SFT warm start: %s', eval_metrics)
    run.save(0, state, metrics=eval_metrics)
  eval_metrics, pending = {}, None
  tracker = monitors.Tracker.from_config(config.monitors) if config.monitors.enabled else None
  for step in range(start + 1, config.rl.steps + 1):
    times, t0, cpu0 = {}, time.perf_counter(), time.process_time()
    with jax.set_mesh(run.mesh):
      state, metrics = rl_step(run, state, step, times, async_sampler)
    if pending is not None:  # Step t-1's device scalars, read while step t ran.
      summary = writer.write(*pending)
      writer.progress(pending[0], summary, keys=PROGRESS_KEYS)
    stop = [] if tracker is None else monitors.watch(config.monitors, tracker, step, metrics,
                                                     writer)
    metrics.update(times)
    metrics['time/step_s'] = time.perf_counter() - t0
    metrics['time/step_cpu_s'] = time.process_time() - cpu0  # This process's CPU time.
    if config.eval.every and (step % config.eval.every == 0 or step == config.rl.steps):
      with phase(metrics, 'eval'):
        eval_metrics = evaluate_policy(run, run.policy(state.params), run.eval_rng, step=step)
      metrics.update(eval_metrics)
    metrics.update(throughput(metrics))
    pending = (step, metrics)
    last = (step == config.rl.steps or bool(stop)
            or preempt.should_stop(step, run.checkpointer.latest))
    if last or (config.checkpoint.every and step % config.checkpoint.every == 0):
      if async_sampler is not None:  # The rollouts in flight, beside the checkpoint.
        async_sampler.save(step)
      run.save(step, state, metrics=eval_metrics if 'eval/pass@1' in metrics else None)
    if stop:  # Saved above: the stopped run loses nothing and resumes from here.
      monitors.report_stop(stop, step=step, workdir=run.workdir, writer=writer)
    if last:
      break
  if pending is not None:
    writer.progress(pending[0], writer.write(*pending), keys=PROGRESS_KEYS)
  if config.export.path:
    export_policy(run, state.params, config.export.path, dtype=config.export.dtype)
  elif config.export.peft_path and run.adapter is not None and run.adapter.routing:
    adapters.export_dart(config, run.cfg, run.adapter, state.params)  # no merged model
  if async_sampler is not None:
    async_sampler.close()
  run.close()
  writer.close()
  preempt.restore_handlers()
  return state, eval_metrics

