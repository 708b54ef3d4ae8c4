"""Partial rollouts in the train loop (rl.partial_rollouts, with rl.sampler='continuous').

Each step trains on B = rl.prompts_per_step whole groups: the first B of the sampler's pool to
finish (rollout/partial.py). The rows still decoding at that moment, and the groups queued
behind them, are carried to the next step and continue under the new params; their tokens
keep the version that sampled them (Rollout.version_NxL, kept by rl_batch.tag_versions), so
provenance_metrics shows the staleness histogram and objective.correction weighs them. The
first step reads two batches of prompts (one queued ahead), every later step one.

`PartialRollouts` holds the pool between steps, with the Examples of its groups on the host,
and checkpoints both at every save: workdir/partial_rollouts/ (step-numbered as the train
state's), so a resumed run continues every row bit for bit. A checkpoint whose pool was
sampled with other shapes (rl.slots, rl.group_size, ...) is refused, naming the field.
The start-up check of rl.sample_memory_gb is rl/memory.check_sample_memory.

Deliberately not here: the device side (rollout/partial.py: whether carried caches are kept
or, with rl.partial_recompute, prefilled again under the new params).
"""

import logging
import time

import jax
import jax.numpy as jnp
import numpy as np
import orbax.checkpoint as ocp

from rlreason import workdir_paths
from rlreason.rl import checkpoint
from rlreason.rl import prompt_schedule
from rlreason.rl import rl_batch
from rlreason.rollout import partial
from rlreason.rollout import sampler
from rlreason.rollout import sampling


def _shape_fields(config) -> dict:
  rl = config.rl
  return {'rl.slots': rl.slots, 'rl.group_size': rl.group_size,
          'rl.prompts_per_step': rl.prompts_per_step, 'rl.max_new_tokens': rl.max_new_tokens,
          'max(data.prompt_buckets)': max(config.data.prompt_buckets),
          'rl.sample_dtype': rl.sample_dtype}


def _sized(pool: dict) -> dict:
  """The pool without its empty arrays (prefix log-probs without prefixes): orbax refuses
  to save zero-size arrays."""
  return {k: v for k, v in pool.items() if jax.tree.reduce(
      lambda a, x: a and x.size > 0, v, True)}


class PartialRollouts:
  """The sampler's pool carried between steps, and its examples (pool order)."""

  def __init__(self, config, cfg, *, tok, pad_id: int, sample_mesh, workdir):
    rl = config.rl
    if jax.process_count() > 1:
      raise ValueError('rl.partial_rollouts keeps its pool in one process (as rl.sampler='
                       "'continuous' samples); turn it off on several hosts.")
    self.config, self.tok, self.sample_mesh = config, tok, sample_mesh
    self.prompt_len = max(config.data.prompt_buckets)
    self.kw = dict(cfg=cfg, group_size=rl.group_size, slots=rl.slots,
                   max_new_tokens=rl.max_new_tokens, greedy=rl.temperature == 0,
                   top_k=rl.top_k, top_p=rl.top_p, stop_tokens=tuple(tok.eos_ids), pad_id=pad_id,
                   sample_dtype=rl.sample_dtype or None)
    self.recompute = bool(rl.get('partial_recompute', False))
    self.pool, self.examples = None, []
    self.checkpointer = checkpoint.Checkpointer(workdir_paths.as_path(workdir) / 'partial_rollouts',
                                                keep=config.checkpoint.keep)

  def _replicated(self, x):
    return jax.device_put(x, jax.sharding.NamedSharding(self.sample_mesh, jax.P()))

  def _batch(self, examples, rng):
    """Prompts (left-padded to the largest bucket: the pool's shape), row keys, row limits."""
    template, rl = self.config.data.prompt_template, self.config.rl
    ids = [self.tok.encode(template.format(prompt=ex.prompt)) for ex in examples]
    prompts = sampler.prepare_prompts(ids, buckets=(self.prompt_len,),
                                      pad_id=self.kw['pad_id'])
    n = len(examples) * rl.group_size
    keys = jax.random.key_data(sampling.row_keys(rng, jnp.arange(n)))
    return self._replicated((prompts, keys, jnp.full((n,), rl.max_new_tokens, jnp.int32)))

  def generate(self, params, examples, rng, *, step: int, next_batch):
    """(rollout of B released groups with per-token versions, their examples, metrics).
    `examples` join the queue; `next_batch()` gives the first step's second batch."""
    temperature, version = self.config.rl.temperature, step - 1
    with jax.set_mesh(self.sample_mesh):
      if self.pool is None:  # The first step: one batch queued (and started), one more behind.
        self.pool = partial.start(params, *self._batch(examples, jax.random.fold_in(rng, 0)),
                                  temperature=temperature, version=version, **self.kw)
        self.examples, examples = list(examples), next_batch()
      rollout, groups_B, stats, self.pool = partial.advance(
          params, self.pool, *self._batch(examples, jax.random.fold_in(rng, 1)),
          temperature=temperature, version=version, recompute=self.recompute, **self.kw)
    pool_examples = self.examples + list(examples)
    picked = set(int(i) for i in jax.device_get(groups_B))
    released = [x for i, x in enumerate(pool_examples) if i in picked]
    self.examples = [x for i, x in enumerate(pool_examples) if i not in picked]
    metrics = {'partial/decode_steps': stats.steps,
               'partial/carried_rows': jnp.sum(self.pool['live_S']),
               'partial/queued_groups': len(self.examples) - self.pool['next_b']}
    return rollout, released, metrics

  def save(self, step: int) -> None:
    if self.pool is None:  # Before the first RL step nothing is in flight.
      return
    data = {'examples': [prompt_schedule.example_to_json(x) for x in self.examples],
            'shapes': _shape_fields(self.config)}
    self.checkpointer.save(step, _sized(self.pool), data_state=data, force=True)
    self.checkpointer.wait()

  def restore(self, step: int) -> None:
    """The pool saved at `step` (none saved: a fresh pool at the next step, logged)."""
    self.pool, self.examples = None, []
    if step not in self.checkpointer.steps():
      if step > 0:
        logging.warning('no in-flight partial rollouts saved at step %d in %s: the next step '
                        'starts a new pool.', step, self.checkpointer.latest.directory)
      return
    data = dict(self.checkpointer.latest.restore(
        step, args=ocp.args.Composite(data=ocp.args.JsonRestore()))['data'])
    saved, now = data['shapes'], _shape_fields(self.config)
    wrong = [f'{k}={now[k]!r} (the pool was sampled with {k}={saved.get(k)!r})'
             for k in now if saved.get(k) != now[k]]
    if wrong:
      raise ValueError(
          f'the in-flight partial rollouts saved at step {step} in '
          f'{self.checkpointer.latest.directory} do not match this config: ' + '; '.join(wrong)
          + '. Resume with the saved values, or from a fresh workdir.')
    kw = {k: v for k, v in self.kw.items() if k in ('cfg', 'group_size', 'slots',
                                                    'max_new_tokens', 'pad_id', 'sample_dtype')}
    abstract = partial.abstract_pool(batch=self.config.rl.prompts_per_step,
                                     prompt_len=self.prompt_len, **kw)
    replicated = jax.sharding.NamedSharding(self.sample_mesh, jax.P())
    abstract = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=replicated),
                            abstract)
    _, pool, data, _ = self.checkpointer.restore(_sized(abstract), step=step)
    empty = {k: self._replicated(jnp.zeros(x.shape, x.dtype)) for k, x in abstract.items()
             if k not in pool}
    self.pool = {**pool, **empty}
    self.examples = [prompt_schedule.example_from_json(x) for x in data['examples']]

  def close(self) -> None:
    self.checkpointer.close()

  # rl/extensions.py's protocol: the rollout source and the checkpoint hooks.
  def sample_and_score(self, run, params, examples, rng, *, step: int, progress: float,
                       times: dict):
    return sample_and_verify(run, params, examples, rng, step=step, progress=progress,
                             times=times)

  def on_save(self, run, step: int, state) -> None:
    del run, state
    self.save(step)

  def on_restore(self, run, step: int, abstract) -> None:
    del run, abstract
    self.restore(step)  # The rows in flight at that step, and their examples.


def build(run):
  """The carried pool under rl.partial_rollouts (rl/extensions.py: the run's rollout source and
  its checkpoints), or None."""
  if not run.config.rl.get('partial_rollouts'):
    return None
  return PartialRollouts(run.config, run.cfg, tok=run.tok, pad_id=run.pad_id,
                         sample_mesh=run.sample_mesh, workdir=run.workdir)


def sample_and_verify(run, params, examples, rng, *, step: int, progress: float, times: dict):
  """train.sample_and_verify under partial rollouts: (rollout, rl_batch.Scores)."""
  start = time.perf_counter()
  rollout, examples, metrics = run.methods['partial'].generate(
      params, examples, rng, step=step, next_batch=lambda: next(run.data_iter))
  rollout = jax.block_until_ready(rl_batch.tag_versions(rollout, version=step - 1,
                                                        per_token=True))
  if run.sample_mesh is not run.mesh:  # Rows back to the learner's layout.
    from rlreason.model import sharding
    rollout = jax.device_put(rollout, jax.tree.map(
        lambda x: sharding.data_sharding(run.mesh, x.shape), rollout))
  middle = time.perf_counter()
  scores, _ = rl_batch.score(run, rollout, examples, progress=progress, params=params)
  times['time/generate_s'] = times.get('time/generate_s', 0.0) + middle - start
  times['time/verify_s'] = times.get('time/verify_s', 0.0) + time.perf_counter() - middle
  tokens = int(jax.device_get(rollout.lengths_N.sum()))
  for name in ('generate', 'verify'):
    times[f'tokens/{name}'] = times.get(f'tokens/{name}', 0) + tokens
  run.data_iter.record(examples, scores.rewards_BxG)
  scores.metrics.update(metrics)
  scores.metrics.update(staleness_by_length(rollout, learner_version=step - 1))
  scores.metrics['train/zero_variance_frac'] = rl_batch.zero_variance_fraction(scores.rewards_BxG)
  return rollout, scores


def staleness_by_length(rollout, *, learner_version: int, buckets: int = 3) -> dict:
  """The length bias of releasing groups in finishing order: rows by the staleness of their
  oldest sampled token (0, 1, ..., `buckets` - 1 or more), their count and mean length
  (`partial/rows_by_staleness/<s>`, `partial/length_by_staleness/<s>`; 0 with no rows)."""
  version_NxL, mask_NxL, lengths_N = jax.device_get(
      (rollout.version_NxL, rollout.mask_NxL, rollout.lengths_N))
  sampled_NxL = mask_NxL & (version_NxL >= 0)
  oldest_N = np.where(sampled_NxL, version_NxL, learner_version).min(axis=1)
  bucket_N = np.minimum(learner_version - oldest_N, buckets - 1)
  metrics = {}
  for s in range(buckets):
    rows_N = bucket_N == s
    count = rows_N.sum()
    metrics[f'partial/rows_by_staleness/{s}'] = int(count)
    metrics[f'partial/length_by_staleness/{s}'] = (
        float(lengths_N[rows_N].mean()) if count else 0.0)
  return metrics
