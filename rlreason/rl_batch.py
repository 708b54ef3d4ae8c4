"""One RL step's batch: verifier rewards, dynamic-sampling filter, log-probs, advantages.

The host/device boundary is here: completion tokens go to the host once (to decode for the
verifiers) and rewards come back as a BxG array. Everything else stays on device.

Deliberately not here: the loop (train.py), the estimators and losses themselves.
"""

import jax
import jax.numpy as jnp
import numpy as np

from rlreason import advantage_transforms
from rlreason import advantages
from rlreason import multihost
from rlreason.structs import Rollout, TrainBatch


def decode_completions(run, rollout: Rollout) -> list[str]:
  """This process's rows (all rows on one host; see multihost.py)."""
  tokens, mask = multihost.local_rows(rollout.tokens_NxL), multihost.local_rows(rollout.mask_NxL)
  return run.tok.decode_batch([row[m].tolist() for row, m in zip(tokens, mask)],
                              skip_special_tokens=True)


def verify(run, rollout: Rollout, examples, *, progress: float, return_verdicts: bool = False,
           params=None):
  """(rewards_BxG as np.float32, metrics) from the verifier pool; optionally the verdicts.

  With a judge (run.judge), the rewards are its composition with the verifier's, weighted at
  `progress`; `params` are the policy's, for a judge that is the policy itself.
  """
  g = rollout.group_size
  texts = decode_completions(run, rollout)
  first = multihost.row_block(rollout.tokens_NxL.shape[0]).start  # Each host verifies its rows.
  items = [{'completion': text, 'answer': examples[(first + n) // g].answer,
            **examples[(first + n) // g].meta} for n, text in enumerate(texts)]
  verdicts = multihost.gather_verdicts(run.pool.score(
      items, verifier=run.config.verifier.name, deadline_s=run.config.verifier.deadline_s))
  rewards_BxG = np.array([v.reward for v in verdicts], np.float32).reshape(-1, g)
  statuses = [v.status for v in verdicts]
  metrics = {f'verifier/{s}_frac': statuses.count(s) / len(statuses) for s in set(statuses)}
  metrics['train/accuracy'] = statuses.count('correct') / len(statuses)
  metrics['verifier/latency_max_s'] = max(v.latency_s for v in verdicts)
  if run.judge is not None and not return_verdicts:  # Evaluation counts verdicts only.
    from rlreason import judge as judge_lib
    result = run.judge.score([examples[n // g].prompt for n in range(len(texts))], texts,
                             params=params)
    rewards_N, mix_metrics = judge_lib.combine(
        run.reward_mix, verifier_rewards=rewards_BxG.reshape(-1),
        judge_rewards=result.rewards_N, progress=progress)
    rewards_BxG = np.array(rewards_N, np.float32).reshape(-1, g)
    metrics.update({**result.metrics(), **mix_metrics})
  return (rewards_BxG, verdicts) if return_verdicts else (rewards_BxG, metrics)


def select_groups(rollout: Rollout, groups_K) -> Rollout:
  """The rollout restricted to prompts `groups_K` (and their G rows each)."""
  g = rollout.group_size
  rows = (np.asarray(groups_K)[:, None] * g + np.arange(g)).reshape(-1)
  prompts = jax.tree.map(lambda x: x[groups_K], rollout.prompts)
  per_row = {f.name: getattr(rollout, f.name)[rows] for f in rollout.__dataclass_fields__.values()
             if f.name not in ('prompts', 'group_size')}
  return Rollout(prompts=prompts, group_size=g, **per_row)


def dynamic_filter(rounds, num_groups: int, *, enabled: bool = True):
  """DAPO's dynamic sampling over one or more sampled rounds: (rollout, rewards_BxG, filled).

  Keeps groups whose rewards are not all equal, in order, up to `num_groups`. When fewer are
  available, the batch is completed with dropped groups whose tokens are masked out of the
  loss, so shapes (and compilations) stay fixed; `filled` is the fraction that is real.
  With enabled=False it returns the first round unchanged and filled = 1.
  """
  if not enabled:
    rollout, rewards_BxG = rounds[0]
    return rollout, rewards_BxG, 1.0
  kept, dropped = [], []
  for r, (rollout, rewards_BxG) in enumerate(rounds):
    keep_B = np.asarray(advantage_transforms.dapo_group_filter(jnp.asarray(rewards_BxG)))
    kept += [(r, b) for b in np.flatnonzero(keep_B)]
    dropped += [(r, b) for b in np.flatnonzero(~keep_B)]
  chosen = (kept + dropped)[:num_groups]
  real = min(len(kept), num_groups)
  parts = [select_groups(rounds[r][0], np.array([b])) for r, b in chosen]
  rollout = jax.tree.map(lambda *xs: jnp.concatenate(xs), *parts)
  rewards_BxG = np.stack([rounds[r][1][b] for r, b in chosen])
  real_N = np.repeat(np.arange(len(chosen)) < real, rollout.group_size)
  rollout = rollout.replace(mask_NxL=rollout.mask_NxL & jnp.asarray(real_N)[:, None])
  return rollout, rewards_BxG, real / num_groups


def make_train_batch(run, params, rollout: Rollout):
  """TrainBatch with recomputed old (and reference) log-probs; advantages filled in later."""
  from rlreason import sampler
  tokens_NxT, mask_NxT = sampler.sequences(rollout)
  length = rollout.tokens_NxL.shape[1]
  stats = run.logprobs(params, tokens_NxT, mask_NxT, length)
  ref = stats.logprobs_NxT
  if run.objective.kl_coef:
    ref = run.logprobs(run.ref_params, tokens_NxT, mask_NxT, length).logprobs_NxT
  batch = TrainBatch(
      tokens_NxT=tokens_NxT, mask_NxT=mask_NxT, loss_mask_NxL=rollout.mask_NxL,
      advantages_NxL=jnp.zeros(rollout.mask_NxL.shape, jnp.float32),
      old_logprobs_NxL=stats.logprobs_NxT, ref_logprobs_NxL=ref,
      # NaN marks tokens that count as the learner's own (HAPO teacher traces, mixed_policy.py).
      behaviour_logprobs_NxL=jnp.where(jnp.isnan(rollout.behaviour_logprobs_NxL),
                                       stats.logprobs_NxT, rollout.behaviour_logprobs_NxL),
      prefix_mask_NxL=rollout.prefix_mask_NxL)
  return batch, stats


def zero_variance_fraction(rewards_BxG) -> float:
  """Fraction of groups whose G rewards are all equal (their group advantage is 0)."""
  rewards_BxG = np.asarray(rewards_BxG)
  return float(np.mean(rewards_BxG.max(-1) == rewards_BxG.min(-1)))


def throughput(times: dict[str, float]) -> dict[str, float]:
  """tokens/s of each phase with a token count ('tokens/<phase>') and a time."""
  return {f'throughput/{k[7:]}_tokens_per_s': v / max(times[f'time/{k[7:]}_s'], 1e-9)
          for k, v in times.items() if k.startswith('tokens/') and f'time/{k[7:]}_s' in times}


def advantages_for(run, rewards_BxG, stats, mask_NxL, *, progress: float):
  """Per-token advantages from the configured estimator and transforms."""
  del progress  # Schedules (HAPO's threshold annealing) hook in here.
  o, g = run.config.objective, run.config.rl.group_size
  rewards = jnp.asarray(rewards_BxG, jnp.float32)
  if o.advantage == 'otb':
    token_rewards = advantages.outcome_token_rewards(rewards.reshape(-1), mask_NxL)
    kwargs = {'zero_tail': False, **dict(o.advantage_kwargs)}
    return advantages.otb(token_rewards, stats.logprobs_NxT, stats.sum_sq_probs_NxT, mask_NxL,
                          group_size=g, **kwargs)
  adv_BxG = advantages.get_estimator(o.advantage)(rewards, **dict(o.advantage_kwargs))
  for name in o.transforms:
    kwargs = dict(o.transform_kwargs.get(name, {}))
    adv_BxG = advantage_transforms.get_transform(name)(adv_BxG, rewards, **kwargs)
  return jnp.broadcast_to(adv_BxG.reshape(-1)[:, None], mask_NxL.shape) * mask_NxL
