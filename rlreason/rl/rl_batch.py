"""One RL step's batch: verifier scores, dynamic-sampling filter, log-probs, advantages.

The host/device boundary is here: completion tokens go to the host once (to decode for the
verifiers) and rewards come back as a BxG array. Everything else stays on device.

Deliberately not here: the loop (train.py), the estimators and losses themselves.
"""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np

from rlreason import config as config_lib
from rlreason import multihost
from rlreason import tasks
from rlreason.objectives import advantage_transforms
from rlreason.objectives import advantages
from rlreason.objectives import offpolicy
from rlreason.rl import extensions
from rlreason.rollout import judge as judge_lib
from rlreason.rollout import sampler
from rlreason.rollout import slate
from rlreason.structs import VERSION_ENV, Rollout, TrainBatch
from rlreason.tasks import example as example_lib
from rlreason.verifiers import overlong


def decode_completions(run, rollout: Rollout) -> list[str]:
  """This process's rows (all rows on one host; see multihost.py)."""
  tokens, mask = multihost.local_rows(rollout.tokens_NxL), multihost.local_rows(rollout.mask_NxL)
  return run.tok.decode_batch([row[m].tolist() for row, m in zip(tokens, mask)],
                              skip_special_tokens=True)


@dataclasses.dataclass(frozen=True)
class Scores:
  """What the verifiers (and judge, and overlong shaping) said about one batch, on the host.

  rewards_BxG: what the estimator sees: the verifier's reward, combined with the judge's when
    one is on, plus DAPO's overlong penalty when overlong.enabled.
  verifier_BxG: the verifier's own reward, DAPO's dynamic-sampling metric (a group that
    differs only through the judge or the length penalty has no outcome signal).
  modes_BxG: int behaviour mode of each response from its task's `behaviour_mode` (the
    policy-recall task's 0 = answered with ids alone, 1 = consulted the rules), -1 for tasks
    without modes; IFPO's input.
  role_rewards_BxGxR: ARTIST's per-role rewards (rollout/roles.py, NaN where a role had no
    turn) when its advantages are per role; None otherwise.
  """
  rewards_BxG: np.ndarray
  verifier_BxG: np.ndarray
  modes_BxG: np.ndarray
  metrics: dict
  role_rewards_BxGxR: np.ndarray | None = None

  def select(self, groups_K) -> 'Scores':
    pick = lambda x: np.asarray(x)[np.asarray(groups_K)]
    return Scores(pick(self.rewards_BxG), pick(self.verifier_BxG), pick(self.modes_BxG),
                  self.metrics)


def generate_rollout(rl, params, prompts, **kw) -> Rollout:
  """The trainer's rollout call: sampler.generate (rl.sampler='static', the default,
  unchanged), or continuous batching with rl.slots rows at a time (rollout/continuous.py,
  which has no decode chunks)."""
  if rl.get('sampler', 'static') != 'continuous':
    return sampler.generate(params, prompts, **kw)
  from rlreason.rollout import continuous
  kw.pop('max_chunks', None)
  return continuous.generate(params, prompts, slots=rl.slots, **kw)


def overlong_limits(config) -> dict:
  """L_max (the completion length), L_cache and the factor of DAPO's overlong penalty."""
  o, max_len = config.overlong, config_lib.completion_length(config)
  return dict(max_len=max_len, cache_len=o.cache_len or max(1, max_len // 4),
              penalty_factor=o.penalty_factor)


def _modes_N(texts, examples, first: int, g: int) -> np.ndarray:
  fns = {ex.task: tasks.behaviour_mode_fn(ex.task) for ex in examples}
  return np.array([-1 if fns[ex.task] is None else fns[ex.task](text) for ex, text in
                   ((examples[(first + n) // g], text) for n, text in enumerate(texts))], np.int32)


class RewardCrashError(RuntimeError):
  """The verifier crashed on too many of a step's items (a broken reward)."""


def check_crashes(verdicts, *, name: str, max_frac: float) -> None:
  """Raises RewardCrashError with the first crash's error when more than `max_frac` of the
  items crashed: a reward that raises would otherwise train on reward 0, silently."""
  crashed = [v for v in verdicts if v.status == 'crash']
  if verdicts and len(crashed) / len(verdicts) > max_frac:
    raise RewardCrashError(
        f'verifier {name!r} crashed on {len(crashed)} of {len(verdicts)} items (more than '
        f'verifier.max_crash_frac={max_frac}); the first: {crashed[0].detail}')


def score(run, rollout: Rollout, examples, *, progress: float, params=None,
          judge: bool = True) -> tuple[Scores, list]:
  """(Scores, verdicts) of a rollout: the verifier pool, then the judge and overlong shaping.

  With a judge (run.judge and `judge`), the rewards are its composition with the verifier's,
  weighted at `progress`; `params` are the policy's, for a judge that is the policy itself.
  """
  g = rollout.group_size
  texts = decode_completions(run, rollout)
  first = multihost.row_block(rollout.tokens_NxL.shape[0]).start  # Each host verifies its rows.
  lengths_N = multihost.local_rows(rollout.lengths_N)
  limits = overlong_limits(run.config)
  items = [example_lib.verifier_item(examples[(first + n) // g], text,
                                     num_tokens=int(lengths_N[n]), **limits)
           for n, text in enumerate(texts)]
  verdicts = multihost.gather_verdicts(run.pool.score(
      items, verifier=run.config.verifier.name, deadline_s=run.config.verifier.deadline_s))
  verifier_BxG = np.array([v.reward for v in verdicts], np.float32).reshape(-1, g)
  modes_BxG = multihost.gather_rows(_modes_N(texts, examples, first, g)).reshape(-1, g)
  statuses = [v.status for v in verdicts]
  metrics = {f'verifier/{s}_frac': statuses.count(s) / len(statuses) for s in set(statuses)}
  metrics['train/accuracy'] = statuses.count('correct') / len(statuses)
  metrics['verifier/latency_max_s'] = max(v.latency_s for v in verdicts)
  check_crashes(verdicts, name=run.config.verifier.name,
                max_frac=run.config.verifier.get('max_crash_frac', 1.0))
  rewards_BxG, judge_N = verifier_BxG, None
  if run.judge is not None and judge:
    result = run.judge.score([examples[n // g].prompt for n in range(len(texts))], texts,
                             params=params)
    rewards_N, mix_metrics = judge_lib.combine(
        run.reward_mix, verifier_rewards=verifier_BxG.reshape(-1),
        judge_rewards=result.rewards_N, progress=progress)
    rewards_BxG, judge_N = np.array(rewards_N, np.float32).reshape(-1, g), result.rewards_N
    metrics.update({**result.metrics(), **mix_metrics})
  for mix in (extensions.hooks(run, 'mix_rewards') if judge else ()):  # Training rewards
    rewards_BxG, mix_metrics = mix(run, rollout, rewards_BxG)  # only (a reward model's):
    metrics.update(mix_metrics)  # evaluation counts verdicts.
  if run.config.overlong.enabled:
    all_lengths_N = multihost.gather_rows(lengths_N)
    penalty_BxG = np.array([overlong.overlong_penalty(int(n), **limits) for n in all_lengths_N],
                           np.float32).reshape(-1, g)
    rewards_BxG = rewards_BxG + penalty_BxG
    metrics['overlong/penalty_mean'] = float(penalty_BxG.mean())
    metrics['overlong/penalised_frac'] = float((penalty_BxG < 0).mean())
  for hook in (extensions.hooks(run, 'score_metrics') if judge else ()):  # Monitors.
    metrics.update(hook(
        run, texts=texts, items=items, examples=examples, rewards_BxG=rewards_BxG,
        verifier_BxG=verifier_BxG, lengths_N=multihost.gather_rows(lengths_N), judge_N=judge_N,
        params=params, progress=progress))
  scores = Scores(rewards_BxG=rewards_BxG, verifier_BxG=verifier_BxG, modes_BxG=modes_BxG,
                  metrics=metrics)
  return scores, verdicts


def verify(run, rollout: Rollout, examples, *, progress: float, return_verdicts: bool = False,
           params=None):
  """(rewards_BxG as np.float32, metrics), or (rewards_BxG, verdicts); see `score`.

  Evaluation (return_verdicts=True) counts verdicts only, so the judge is not asked.
  """
  scores, verdicts = score(run, rollout, examples, progress=progress, params=params,
                           judge=not return_verdicts)
  return scores.rewards_BxG, (verdicts if return_verdicts else scores.metrics)


def score_episodes(run, episodes) -> Scores:
  """Scores of a batch of episodes: the environment's rewards (its verifier scored each final
  answer), and the episode metrics."""
  from rlreason.rollout import episodes as episodes_lib
  rewards_BxG = np.asarray(episodes.rewards_BxG, np.float32)
  metrics = episodes_lib.metrics(episodes)
  metrics['train/accuracy'] = float(np.mean(episodes_lib.correct_N(episodes)))
  if any('info_gain' in t for turns in episodes.transcripts for t in turns):  # envs/patient.py
    metrics['episodes/info_gain_mean'] = float(np.mean(
        [sum(t.get('info_gain', 0.0) for t in turns) for turns in episodes.transcripts]))
  if hasattr(episodes, 'role_metrics'):  # ARTIST's roles (rollout/roles.py)
    metrics.update(episodes.role_metrics())
  return Scores(rewards_BxG=rewards_BxG, verifier_BxG=rewards_BxG,
                modes_BxG=np.full(rewards_BxG.shape, -1, np.int32), metrics=metrics,
                role_rewards_BxGxR=getattr(episodes, 'credit_BxGxR', None))


def select_groups(rollout: Rollout, groups_K) -> Rollout:
  """The rollout restricted to prompts `groups_K` (and their G rows each)."""
  g = rollout.group_size
  rows = (np.asarray(groups_K)[:, None] * g + np.arange(g)).reshape(-1)
  prompts = jax.tree.map(lambda x: x[groups_K], rollout.prompts)
  per_row = {f.name: getattr(rollout, f.name)[rows] for f in rollout.__dataclass_fields__.values()
             if f.name not in ('prompts', 'group_size') and getattr(rollout, f.name) is not None}
  return Rollout(prompts=prompts, group_size=g, **per_row)


def dynamic_filter(rounds, num_groups: int, *, enabled: bool = True):
  """DAPO's dynamic sampling over one or more sampled rounds: (rollout, scores, filled).

  `rounds` holds (rollout, Scores) pairs. Keeps groups whose *verifier* rewards are not all
  equal (DAPO filters on the accuracy metric, not the shaped or judge-combined score), in
  order, up to `num_groups`. When fewer are available, the batch is completed with dropped
  groups whose tokens are masked out of the loss, so shapes (and compilations) stay fixed;
  `filled` is the fraction that is real. With enabled=False it returns the first round
  unchanged and filled = 1.
  """
  if not enabled:
    rollout, scores = rounds[0]
    return rollout, scores, 1.0
  kept, dropped = [], []
  for r, (rollout, scores) in enumerate(rounds):
    keep_B = np.asarray(advantage_transforms.dapo_group_filter(jnp.asarray(scores.verifier_BxG)))
    kept += [(r, b) for b in np.flatnonzero(keep_B)]
    dropped += [(r, b) for b in np.flatnonzero(~keep_B)]
  chosen = (kept + dropped)[:num_groups]
  real = min(len(kept), num_groups)
  parts = [select_groups(rounds[r][0], np.array([b])) for r, b in chosen]
  rollout = jax.tree.map(lambda *xs: jnp.concatenate(xs), *parts)
  picked = [rounds[r][1].select([b]) for r, b in chosen]
  scores = Scores(*(np.concatenate([getattr(p, f) for p in picked])
                    for f in ('rewards_BxG', 'verifier_BxG', 'modes_BxG')),
                  metrics=rounds[0][1].metrics)
  real_N = np.repeat(np.arange(len(chosen)) < real, rollout.group_size)
  real_Nx1 = jnp.asarray(real_N)[:, None]
  rollout = rollout.replace(mask_NxL=rollout.mask_NxL & real_Nx1)
  if rollout.loss_mask_NxL is not None:
    rollout = rollout.replace(loss_mask_NxL=rollout.loss_mask_NxL & real_Nx1)
  return rollout, scores, real / num_groups


def make_train_batch(run, params, rollout: Rollout, *, value_params=None):
  """TrainBatch with recomputed old (and reference) log-probs, and the critic's values when
  `value_params` is given; advantages (and GAE returns) are filled in later."""
  tokens_NxT, mask_NxT = sampler.sequences(rollout)
  length = rollout.tokens_NxL.shape[1]
  trie = ()  # A method's packing of rows as one trie (rollout/trie.py; fork/join threads).
  for pack in extensions.hooks(run, 'trie'):
    trie = (pack(run, tokens_NxT, mask_NxT),)
  stats = run.logprobs(params, tokens_NxT, mask_NxT, length, *trie)
  ref = stats.logprobs_NxT
  if run.objective.kl_coef:
    ref = run.logprobs(run.ref_params, tokens_NxT, mask_NxT, length, *trie).logprobs_NxT
  old_values = None
  if value_params is not None:
    old_values = run.values(params, value_params, tokens_NxT, mask_NxT, length)
  episodes = rollout.loss_mask_NxL is not None  # Multi-turn: observations are not trained.
  batch = TrainBatch(
      tokens_NxT=tokens_NxT, mask_NxT=mask_NxT,
      loss_mask_NxL=rollout.loss_mask_NxL if episodes else rollout.mask_NxL,
      advantages_NxL=jnp.zeros(rollout.mask_NxL.shape, jnp.float32),
      old_logprobs_NxL=stats.logprobs_NxT, ref_logprobs_NxL=ref,
      # NaN marks tokens that count as the learner's own (HAPO teacher traces, mixed_policy.py).
      behaviour_logprobs_NxL=jnp.where(jnp.isnan(rollout.behaviour_logprobs_NxL),
                                       stats.logprobs_NxT, rollout.behaviour_logprobs_NxL),
      prefix_mask_NxL=rollout.prefix_mask_NxL,
      # Single-turn: one turn, id 0; episodes record each token's turn.
      turn_ids_NxL=(rollout.turn_NxL if episodes and rollout.turn_NxL is not None
                    else jnp.zeros(rollout.mask_NxL.shape, jnp.int32)),
      old_values_NxL=old_values, version_NxL=rollout.version_NxL, trie=(trie or (None,))[0])
  return batch, stats


def tag_versions(rollout: Rollout, *, version: int, prefix_version=None,
                 per_token: bool = False) -> Rollout:
  """The rollout with its provenance: sampled tokens `version`, prefix tokens (an older
  snapshot's) `prefix_version` (one for all rows, or each row's: int N, methods/soup.py), episode
  observations VERSION_ENV (structs.py); negative marks the collector set already (a
  rollback's corrected calls, rollout/rollback.py) are kept, and with per_token all its marks
  (partial rollouts' sampling versions, rollout/partial.py)."""
  version_NxL = jnp.full(rollout.tokens_NxL.shape, version, jnp.int32)
  if rollout.version_NxL is not None:
    keep = True if per_token else rollout.version_NxL < 0
    version_NxL = jnp.where(keep, rollout.version_NxL, version_NxL)
  if prefix_version is not None:
    prefix_version = jnp.asarray(prefix_version, jnp.int32)
    prefix_version = prefix_version[:, None] if prefix_version.ndim else prefix_version
    version_NxL = jnp.where(rollout.prefix_mask_NxL, prefix_version, version_NxL)
  if rollout.loss_mask_NxL is not None:
    version_NxL = jnp.where(rollout.mask_NxL & ~rollout.loss_mask_NxL, VERSION_ENV, version_NxL)
  return rollout.replace(version_NxL=version_NxL)


def provenance_metrics(batch: TrainBatch, *, learner_version: int,
                       max_staleness: int = 4) -> dict:
  """Who produced the trained tokens: the staleness histogram of policy tokens (learner
  version minus the token's; offpolicy.staleness_metrics) and the teacher and environment
  fractions of the real tokens."""
  if batch.version_NxL is None:
    return {}
  v, real = batch.version_NxL, batch.loss_mask_NxL
  metrics = offpolicy.staleness_metrics(v, learner_step=learner_version,
                                        max_staleness=max_staleness, mask=real & (v >= 0))
  count = jnp.maximum(real.sum(), 1)
  metrics['provenance/teacher_token_frac'] = (real & (v == -1)).sum() / count
  metrics['provenance/policy_token_frac'] = (real & (v >= 0)).sum() / count
  # CLEANER's corrected calls (structs.VERSION_ROLLBACK = -3): their share, and how
  # far the behaviour log-probs (error in context) are from π_old on the purified sequence.
  rolled = real & (v == -3)
  metrics['provenance/rollback_token_frac'] = rolled.sum() / count
  if batch.behaviour_logprobs_NxL is not None and batch.old_logprobs_NxL is not None:
    metrics['rollback/abs_logprob_diff_learner'] = jnp.where(rolled, jnp.abs(
        batch.behaviour_logprobs_NxL - batch.old_logprobs_NxL), 0.0).sum() / jnp.maximum(
            rolled.sum(), 1)
  return metrics


def zero_variance_fraction(rewards_BxG) -> float:
  """Fraction of groups whose G rewards are all equal (their group advantage is 0)."""
  rewards_BxG = np.asarray(rewards_BxG)
  return float(np.mean(rewards_BxG.max(-1) == rewards_BxG.min(-1)))


def throughput(times: dict[str, float]) -> dict[str, float]:
  """tokens/s of each phase with a token count ('tokens/<phase>') and a time."""
  return {f'throughput/{k[7:]}_tokens_per_s': v / max(times[f'time/{k[7:]}_s'], 1e-9)
          for k, v in times.items() if k.startswith('tokens/') and f'time/{k[7:]}_s' in times}


def transform_kwargs(name: str, options) -> dict:
  """A transform's options from objective.transform_kwargs, with the loop's defaults (IFPO:
  two modes, answered directly / consulted the rules)."""
  defaults = {'ifpo': {'num_modes': 2}}.get(name, {})
  return {**defaults, **dict(options.get(name, {}))}


def _transform_tokens(fn, adv_NxL, second_BxG, kwargs):
  """A BxG transform applied to token-level advantages, column by column: token l of each
  response is transformed as if A_{i,l} were the response's advantage. Every registered
  transform is a per-prompt or per-response scaling of A (A-GRAE's also depends on A's sign),
  so padding (A = 0) stays 0. Provenance: our formalisation (neither transform's paper uses a
  token-level estimator)."""
  b, g = second_BxG.shape
  adv_BxGxL = adv_NxL.reshape(b, g, -1)
  out_BxGxL = jax.vmap(lambda a_BxG: fn(a_BxG, second_BxG, **kwargs), in_axes=2,
                       out_axes=2)(adv_BxGxL)
  return out_BxGxL.reshape(adv_NxL.shape)


def advantages_for(run, scores: Scores, stats, batch: TrainBatch, *, progress: float,
                   advantage: str = ''):
  """(advantages_NxL, GAE returns_NxL or None) from the configured estimator and transforms.

  Group estimators give one advantage per response; OTB, GAE and REINFORCE++ one per token,
  and the transforms then apply per token (`_transform_tokens`). IFPO reads the behaviour
  modes, the other transforms the rewards. NaN rewards stop here, naming their rows, unless
  the estimator was told to ignore them (advantage_kwargs.nan_rewards='ignore').
  `advantage` overrides objective.advantage (R²PO's head stage: 'r2po_rarity').
  """
  del progress  # Schedules (HAPO's threshold annealing) hook in here.
  o, g = run.config.objective, run.config.rl.group_size
  mask_NxL = batch.loss_mask_NxL
  name = advantage or o.advantage
  kwargs = dict(o.advantage_kwargs) if name == o.advantage else {}
  if kwargs.get('nan_rewards', 'error') != 'ignore':
    advantages.check_rewards(scores.rewards_BxG, hint="set objective.advantage_kwargs."
                             "nan_rewards='ignore' (objective.advantage 'grpo' or 'dr_grpo')")
  rewards = jnp.asarray(scores.rewards_BxG, jnp.float32)
  if scores.role_rewards_BxGxR is not None:  # ARTIST: a group per role, episode-major rows.
    from rlreason.rollout import roles
    adv_BxGxR = roles.role_advantages(jnp.asarray(scores.role_rewards_BxGxR), **kwargs)
    return jnp.broadcast_to(adv_BxGxR.reshape(-1)[:, None], mask_NxL.shape) * mask_NxL, None
  adv, returns_NxL = None, None
  token_level = name in advantages.TOKEN_LEVEL
  if token_level:
    token_rewards = advantages.outcome_token_rewards(rewards.reshape(-1), mask_NxL)
  if name == 'otb':
    adv = advantages.otb(token_rewards, stats.logprobs_NxT, stats.sum_sq_probs_NxT, mask_NxL,
                         group_size=g, **{'zero_tail': False, **kwargs})
  elif name == 'gae':
    adv, returns_NxL = advantages.gae(token_rewards, batch.old_values_NxL, mask_NxL, **kwargs)
  elif name == 'reinforce_pp':  # Its returns feed no critic: only the advantages.
    adv, _ = advantages.reinforce_pp(token_rewards, mask_NxL, **kwargs)
  elif name in ('opo', 'reinforce_pp_baseline'):  # Both may weigh by response length.
    lengths_BxG = jnp.sum(mask_NxL, -1, dtype=jnp.float32).reshape(rewards.shape)
    adv = advantages.get_estimator(name)(rewards, lengths_BxG=lengths_BxG, **kwargs)
  elif name == 'slate':  # Each step's k candidate rows on their own (rollout/slate.py).
    adv = slate.slate_advantages(rewards, k=run.config.slate.k, **kwargs)
  else:
    adv = advantages.get_estimator(name)(rewards, **kwargs)
  for transform in o.transforms:
    fn = advantage_transforms.get_transform(transform)
    second = jnp.asarray(scores.modes_BxG) if transform == 'ifpo' else rewards
    kw = transform_kwargs(transform, o.transform_kwargs)
    adv = _transform_tokens(fn, adv, second, kw) if token_level else fn(adv, second, **kw)
  if not token_level:  # Typed-state episodes have a row per turn (rollout/typed_episodes.py):
    per_episode = jnp.repeat(adv.reshape(-1), mask_NxL.shape[0] // adv.size)  # each gets A.
    adv = jnp.broadcast_to(per_episode[:, None], mask_NxL.shape)
  return adv * mask_NxL, returns_NxL
