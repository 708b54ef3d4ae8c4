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

The loop names no method: a method's rollout source, batch hooks, metrics and learner
schedule come from rl/extensions.py, built once with the run (`run.methods`).
"""

import contextlib
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
from rlreason.rl import checkpoint
from rlreason.rl import episode_sampling
from rlreason.rl import evaluate
from rlreason.rl import extensions
from rlreason.rl import metrics as metrics_lib
from rlreason.rl.rl_batch import (advantages_for, dynamic_filter, generate_rollout,
                                  make_train_batch, provenance_metrics, score, tag_versions,
                                  throughput, zero_variance_fraction)
from rlreason.rl.run_setup import Run, build, encode_prompts, export_policy
from rlreason.rl.sft import sft_loop
from rlreason.rl.timing import phase
from rlreason.rollout import sampler

# Re-exported: callers name them train.X (they moved to episode_sampling.py and evaluate.py).
run_episodes = episode_sampling.run_episodes
sample_episodes = episode_sampling.sample_episodes
write_transcripts = episode_sampling.write_transcripts
evaluate_policy = evaluate.evaluate_policy


def sample_and_verify(run: Run, params, examples, rng, *, step: int, progress: float,
                      times: dict[str, float]):
  """One batch of B prompts x G samples, scored: (rollout, rl_batch.Scores).

  From the run's rollout source (a method's, rl/extensions.py), else its environment's
  episodes, else the static sampler; then the methods' batch hooks (HAPO's injection).
  """
  source = extensions.rollout_source(run)
  if source is not None:
    rollout, scores = source.sample_and_score(run, params, examples, rng, step=step,
                                              progress=progress, times=times)
  elif run.env is not None:
    rollout, scores = episode_sampling.sample_episodes(run, params, examples, rng, step=step,
                                                       times=times)
  else:
    rollout, scores = sample_static(run, params, examples, rng, step=step, progress=progress,
                                    times=times)
  for hook in extensions.hooks(run, 'after_score'):
    rollout, scores = hook(run, rollout, scores, examples, rng=rng, step=step, params=params,
                           progress=progress)
  return rollout, scores


def sample_static(run: Run, params, examples, rng, *, step: int, progress: float,
                  times: dict[str, float]):
  """The sampler's rows for B prompts x G samples (rl.sampler 'static' or 'continuous'),
  scored; a method's `prefixes` (SOUP's older snapshots) start the rows."""
  rl, prompts = run.config.rl, encode_prompts(run, examples)
  with phase(times, 'generate'):
    prefixes = prefix_version = None
    for hook in extensions.hooks(run, 'prefixes'):
      prefixes, prefix_version = hook(run, prompts, rng)
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
  stage = run.schedule.stage(step)  # The learner schedule's (rl/extensions.py): one stage
  # unless a method brings several (R²PO's, methods/r2po.py).
  with phase(times, 'update'):
    batch, stats = make_train_batch(run, stage.learner(policy), rollout,
                                    value_params=state.value_params)
    adv_NxL, returns_NxL = advantages_for(run, scores, stats, batch, progress=progress,
                                          advantage=stage.advantage)
    batch = batch.replace(advantages_NxL=adv_NxL, returns_NxL=returns_NxL)
    for hook in extensions.hooks(run, 'batch_metrics'):  # Before the update donates its
      metrics.update(hook(run, policy=policy, params=state.params, batch=batch,  # params.
                          rollout=rollout, step=step))
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
  for hook in extensions.hooks(run, 'after_update'):
    hook(run, state.params, step)
  metrics.update(step_metrics)
  metrics.update(provenance_metrics(batch, learner_version=step - 1))
  metrics.update(sampler.metrics(rollout))
  metrics['train/reward'] = scores.rewards_BxG.mean()
  if stage.number:
    metrics[stage.metric] = stage.number
  return state, metrics


# The progress line's metrics (a key missing from a step's summary is left out).
PROGRESS_KEYS = ('train/reward', 'eval/pass@1', 'loss', 'verifier/crash_frac',
                 'verifier/parse_failure_frac', 'monitors/audit', 'monitors/disagreement',
                 'monitors/alarms', 'perplexity/answer', 'perplexity/prompt')


def train(config: ml_collections.ConfigDict, workdir: str) -> tuple[Any, dict[str, float]]:
  """Runs (or resumes) the job in `workdir`: (final TrainState, last evaluation metrics)."""
  config_lib.validate(config, num_devices=jax.device_count())
  replacement = extensions.loop_replacement(config)  # rePIRL: its own loop, PRM + policy.
  if replacement is not None:
    return replacement.train(config, workdir)
  with contextlib.ExitStack() as cleanup:
    # Whatever raises (a mismatched checkpoint, a crashing reward, Ctrl-C), the run's processes
    # (verifier pool, sampler), files and signal handlers are closed on the way out.
    run = build(config, workdir)
    cleanup.callback(run.close)
    writer = metrics_lib.Writer(workdir, total_steps=config.rl.steps, every=config.log_every)
    cleanup.callback(writer.close)
    preempt = checkpoint.PreemptionFlag()
    cleanup.callback(preempt.restore_handlers)
    # The TrainState takes over the loaded params' buffers: later code reads only their shapes.
    state, start = run.restore_or_init(release_init_params=True)
    async_sampler = async_rl.start(run, start)  # None unless rl.async_mode (rl/async_rl.py).
    if async_sampler is not None:
      cleanup.callback(async_sampler.close)
    if not run.restored:  # A restored step 0 already holds the warm start.
      with jax.set_mesh(run.mesh):
        state, sft_metrics = sft_loop(run, state, steps=config.sft.steps, writer=writer)
      eval_metrics = evaluate_policy(run, run.policy(state.params), run.eval_rng, step=0)
      writer.write(0, {**sft_metrics, **eval_metrics})
      logging.info('after SFT warm start: %s', eval_metrics)
      run.save(0, state, metrics=eval_metrics)
    eval_metrics, pending = {}, None
    for step in range(start + 1, config.rl.steps + 1):
      times, t0, cpu0 = {}, time.perf_counter(), time.process_time()
      with jax.set_mesh(run.mesh):
        state, metrics = rl_step(run, state, step, times, async_sampler)
      if pending is not None:  # Step t-1's device scalars, read while step t ran.
        summary = writer.write(*pending)
        writer.progress(pending[0], summary, keys=PROGRESS_KEYS)
      stop = [a for watch in extensions.hooks(run, 'watch')  # Monitors' alarms that end the run.
              for a in watch(run, step, metrics, writer)]
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
        for report in extensions.hooks(run, 'report_stop'):
          report(run, stop, step=step, writer=writer)
      if last:
        break
    if pending is not None:
      writer.progress(pending[0], writer.write(*pending), keys=PROGRESS_KEYS)
    if config.export.path:
      export_policy(run, state.params, config.export.path, dtype=config.export.dtype)
    elif config.export.peft_path and run.adapter is not None and run.adapter.routing:
      adapters.export_dart(config, run.cfg, run.adapter, state.params)  # no merged model
    return state, eval_metrics

