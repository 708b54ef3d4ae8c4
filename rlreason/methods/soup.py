"""SOUP / "Thinking Seeds": prefixes from a keep-k buffer of historical snapshots.

  prefixes, version_N = buffer_prefixes(run, prompts, key=...)  # then sampler.generate
  refresh(run, params, step)         # after each update: a snapshot every refresh_every
  restore_buffer(run, abstract_params, step, warm_start_params)   # on resume

arXiv 2601.21476 (v1 "SOUP", v2 "Thinking Seeds"; algorithms.md §15). What the abstracts give
[S]: prefixes sampled from the model's own historical checkpoints, the continuation sampled
on-policy, token-level importance ratios. What the method section would give (the buffer's
size, how a checkpoint is chosen, the prefix length law) could not be read; our formalisation
[F]:
- The buffer holds the `keep` newest snapshots, one taken every `refresh_every` updates (the
  warm start is the first, step 0); keep-k is first-in first-out.
- Each prefixed row (the first `rows_per_group` rows of each group, as mixed_policy) draws its
  own snapshot by age: P(rank r) ∝ age_decay^r, rank 0 the newest (age_decay = 1: uniform over
  the buffer; < 1 favours recent snapshots; > 1 old ones).
- The prefix keeps a uniform 1..Q' of the snapshot's sampled tokens (mixed_policy.cut_prefixes).
- Each prefix token carries the snapshot's recorded log-prob (its behaviour policy) and the
  snapshot's step as its version (Rollout.version_NxL); losses.prefix_mixed_ppo takes the
  ratio π_θ/π_h against it, continuation tokens π_θ/π_old.
With keep = 1 this is mixed_policy's single-snapshot path, unchanged (same keys and tokens).

Deliberately not here: sampling (rollout/sampler), the loss (objectives/losses).
"""

import logging

import jax
import jax.numpy as jnp
import numpy as np

from rlreason import workdir_paths
from rlreason.methods import mixed_policy
from rlreason.model import sharding
from rlreason.rl import checkpoint
from rlreason.rollout import sampler
from rlreason.structs import Prefixes, Rollout

# fold_in constant for the snapshot choice, apart from mixed_policy's sample/cut split.
_CHOICE_KEY = (1 << 30) + 2


def buffer_steps(step: int, refresh_every: int, keep: int) -> list[int]:
  """The snapshot steps in the buffer after `step` updates, newest first (at most `keep`)."""
  if keep < 1:
    raise ValueError(f'prefix_rollouts.keep={keep} must be >= 1.')
  newest = mixed_policy.snapshot_step(step, refresh_every)
  if not refresh_every:
    return [0]
  return [s for s in range(newest, -1, -refresh_every)][:keep]


def age_probs(n: int, age_decay: float) -> np.ndarray:
  """P(rank r) ∝ age_decay^r over n snapshots, rank 0 the newest [F]."""
  if n < 1 or age_decay <= 0:
    raise ValueError(f'age_probs needs n >= 1 and prefix_rollouts.age_decay > 0 '
                     f'(got n={n}, age_decay={age_decay}).')
  w = np.asarray(age_decay, np.float64) ** np.arange(n)
  return (w / w.sum()).astype(np.float32)


def choose_snapshots(key, n_rows: int, n_snapshots: int, age_decay: float) -> jax.Array:
  """Each row's snapshot rank (int32 N), drawn by age_probs; deterministic per key."""
  logits = jnp.log(jnp.asarray(age_probs(n_snapshots, age_decay)))
  return jax.random.categorical(key, logits, shape=(n_rows,)).astype(jnp.int32)


def pick_rows(rollouts: list[Rollout], choice_N) -> Rollout:
  """Row n of rollouts[choice_N[n]] (equal shapes): tokens, masks, log-probs, lengths."""
  choice_N = jnp.asarray(choice_N)
  out = rollouts[0]
  for j, other in enumerate(rollouts[1:], start=1):
    take_N = choice_N == j
    row = lambda new, old: jnp.where(take_N.reshape((-1,) + (1,) * (old.ndim - 1)), new, old)
    out = out.replace(**{name: row(getattr(other, name), getattr(out, name)) for name in (
        'tokens_NxL', 'mask_NxL', 'logprobs_NxL', 'behaviour_logprobs_NxL', 'truncated_N',
        'lengths_N')})
  return out


def snapshots(run) -> list[tuple[int, object]]:
  """(step, params) of the buffer, newest first: run.prefix_params and run.prefix_history."""
  return [(getattr(run, 'prefix_step', 0), run.prefix_params)] + list(
      getattr(run, 'prefix_history', None) or [])


def buffer_prefixes(run, prompts, *, key) -> tuple[Prefixes, jax.Array]:
  """Prefixes from the buffer's snapshots, each row from its own (choose_snapshots), and each
  row's snapshot step (int32 N: the version of its prefix tokens)."""
  rl, p = run.config.rl, run.config.prefix_rollouts
  buffer = snapshots(run)
  n = prompts.tokens_BxP.shape[0] * rl.group_size
  if len(buffer) == 1:  # mixed_policy's path, bit for bit.
    return (mixed_policy.old_policy_prefixes(run, prompts, key=key),
            jnp.full((n,), buffer[0][0], jnp.int32))
  sample_key, cut_key = jax.random.split(key)
  choice_N = choose_snapshots(jax.random.fold_in(key, _CHOICE_KEY), n, len(buffer),
                              p.get('age_decay', 1.0))
  used = set(np.asarray(jax.device_get(choice_N)).tolist())
  olds = []
  for j, (_, params) in enumerate(buffer):
    if j not in used and olds:  # Unused: any same-shape rows will do (never picked).
      olds.append(olds[0])
      continue
    olds.append(sampler.generate(
        params, prompts, cfg=run.cfg, group_size=rl.group_size, max_new_tokens=p.max_tokens,
        temperature=rl.temperature, top_k=rl.top_k, top_p=rl.top_p,
        stop_tokens=tuple(run.tok.eos_ids), pad_id=run.pad_id,
        rng=jax.random.fold_in(sample_key, j), mesh=run.mesh, max_chunks=rl.decode_chunks))
  prefixes = mixed_policy.cut_prefixes(pick_rows(olds, choice_N), key=cut_key,
                                       rows_per_group=p.rows_per_group, pad_id=run.pad_id)
  steps_J = jnp.asarray([s for s, _ in buffer], jnp.int32)
  return prefixes, steps_J[choice_N]


def push_snapshot(run, params, step: int) -> None:
  """After step `step`'s update: the new snapshot becomes the newest; the oldest beyond
  `keep` leaves (first-in first-out)."""
  keep = run.config.prefix_rollouts.get('keep', 1)
  if keep > 1 and run.prefix_params is not None:
    run.prefix_history = ([(getattr(run, 'prefix_step', 0), run.prefix_params)]
                          + list(getattr(run, 'prefix_history', None) or []))[:keep - 1]
  run.prefix_step = step
  run.prefix_params = sharding.reshard(jax.tree.map(jnp.copy, params), run.sample_shardings)


def checkpointer(workdir, *, keep: int) -> checkpoint.Checkpointer:
  return checkpoint.Checkpointer(workdir_paths.as_path(workdir) / 'prefix_policy', keep=max(2, keep + 1))


def refresh(run, params, step: int) -> None:
  """After step `step`'s update: a new snapshot when refresh_every divides it (saved, so a
  resumed run samples prefixes from the same buffer)."""
  p = run.config.prefix_rollouts
  if not (p.enabled and p.refresh_every and step % p.refresh_every == 0):
    return
  push_snapshot(run, params, step)
  ckpt = checkpointer(run.workdir, keep=p.get('keep', 1))
  ckpt.save(step, {'params': params}, force=True)
  ckpt.wait()
  ckpt.close()


def restore_buffer(run, abstract_params, step: int, warm_start_params) -> None:
  """The buffer a run resumed after `step` updates samples prefixes from (saved snapshots
  under prefix_policy/, the warm start for step 0)."""
  p = run.config.prefix_rollouts
  want = buffer_steps(step, p.refresh_every, p.get('keep', 1))
  ckpt = checkpointer(run.workdir, keep=p.get('keep', 1))
  have = set(ckpt.steps())
  loaded = []
  for s in want:
    if s == 0:
      params = warm_start_params
    elif s in have:
      params = ckpt.restore({'params': abstract_params}, step=s)[1]['params']
    else:
      logging.warning('prefix_rollouts: no snapshot of step %d in %s (have %s); the buffer '
                      'keeps the older ones only.', s, ckpt.latest.directory, sorted(have))
      continue
    if params is not None:
      loaded.append((s, sharding.reshard(params, run.sample_shardings)))
  ckpt.close()
  if not loaded:  # As mixed_policy: the warm start if nothing else.
    loaded = [(0, None if warm_start_params is None else
               sharding.reshard(warm_start_params, run.sample_shardings))]
  (run.prefix_step, run.prefix_params), run.prefix_history = loaded[0], loaded[1:]


def build(run):
  """The snapshot buffer under prefix_rollouts.enabled (rl/extensions.py), or None."""
  if not run.config.prefix_rollouts.enabled:
    return None
  if jax.process_count() > 1:  # Teacher traces are built and verified on the host, and the
    # sampler checks prefixes on the host: both assume every row is addressable here.
    raise ValueError('hapo.enabled and prefix_rollouts.enabled are single-host for now.')
  return PrefixBuffer(run)


class PrefixBuffer:
  """The snapshots prefixes are sampled from: `prefix_params` (the newest older snapshot), its
  `prefix_step`, and `prefix_history`, the older ones kept ([(step, params)] newest first,
  prefix_rollouts.keep > 1). The functions above take it where they take a run: it reads the
  run's other fields (config, cfg, tok, ...) through to the run."""

  def __init__(self, run):
    self.run, self.prefix_params, self.prefix_step, self.prefix_history = run, None, 0, None

  # The run's fields the functions above read; nothing else is forwarded (the loop asks
  # this object for its capabilities with hasattr: the run's own methods must not answer).
  _FROM_RUN = frozenset({'config', 'cfg', 'tok', 'pad_id', 'mesh', 'sample_mesh',
                         'sample_shardings', 'workdir'})

  def __getattr__(self, name):
    if name not in PrefixBuffer._FROM_RUN:
      raise AttributeError(name)
    return getattr(self.run, name)

  # rl/extensions.py's protocol.
  def prefixes(self, run, prompts, rng):
    del run
    return buffer_prefixes(self, prompts, key=mixed_policy.prefix_key(rng))

  def after_update(self, run, params, step: int) -> None:
    del run
    refresh(self, params, step)

  def on_save(self, run, step: int, state) -> None:
    if step == 0:  # The warm start is the first snapshot.
      self.prefix_params = sharding.reshard(jax.tree.map(jnp.copy, run.policy(state.params)),
                                            run.sample_shardings)

  def on_restore(self, run, step: int, abstract) -> None:
    restore_buffer(self, abstract.params, step, run.warm_start_policy(abstract))
