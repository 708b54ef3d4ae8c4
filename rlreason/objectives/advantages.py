"""Advantage estimators: rewards in, advantages out, with no gradient flowing through them.

Group estimators take `rewards_BxG` (B prompts x G samples; a Rollout's row n = b*G + g
belongs to prompt b) and return `advantages_BxG`, one scalar per response that the caller
broadcasts over its tokens. Token-level estimators (OTB, GAE, REINFORCE++) live in
token_advantages.py and are re-exported here with the registry. Everything is a pure,
jittable function with keyword-only options, and its output is wrapped in `stop_gradient`.

Three conventions are pinned here, because libraries differ on them (algorithms.md §22.2):
  * a singleton group (G = 1) has no baseline, so A = R (verl's convention);
  * a group whose rewards are all equal gets exactly A = 0, whatever `eps` is (a float mean
    of equal numbers need not equal them, and dividing that residue by eps would not be 0);
  * a NaN reward (a verifier that abstained) is an error naming its rows (`check_rewards`),
    raised by every group estimator called on concrete arrays and by the loop before any
    estimator; under jit nothing can raise, and NaN spreads to its group. `grpo`/`dr_grpo`
    with nan_rewards='ignore' instead leave those rows out of the statistics and give them
    A = 0 (TRL's handling of unscorable completions).

Deliberately not here: token statistics (log-probs, Σπ²), policy losses, KL and loss
aggregation (losses.py); transforms applied to the output of an estimator (F-GRPO, A-GRAE,
IFPO), DAPO's and HAPO's reward/data operators and the analysis helpers
(advantage_transforms.py); computing rewards (verifiers/).
"""

from typing import Callable

import jax
import jax.numpy as jnp
import numpy as np

from rlreason.objectives.token_advantages import gae
from rlreason.objectives.token_advantages import otb
from rlreason.objectives.token_advantages import otb_token_energy  # noqa: F401 (re-exported)
from rlreason.objectives.token_advantages import outcome_token_rewards  # noqa: F401
from rlreason.objectives.token_advantages import reinforce_pp
from rlreason.objectives.token_advantages import reward_to_go  # noqa: F401
from rlreason.objectives.token_advantages import masked_whiten

Array = jax.Array
NAN_REWARDS = ('error', 'ignore')
GRPO_SCALES = ('group', 'batch', 'none')


def check_rewards(rewards_BxG, *, hint: str = "pass nan_rewards='ignore' to grpo/dr_grpo") -> None:
  """Raises ValueError naming the rows (n = b*G + g) whose reward is NaN.

  Host-side: traced values (under jit) cannot be inspected and pass unchecked.
  """
  if isinstance(rewards_BxG, jax.core.Tracer):
    return
  rewards_BxG = np.asarray(rewards_BxG, np.float32)
  bad_BxG = np.isnan(rewards_BxG)
  if not bad_BxG.any():
    return
  g = rewards_BxG.shape[-1]
  rows = [int(n) for n in np.flatnonzero(bad_BxG)]
  where = ', '.join(f'{n} (prompt {n // g}, sample {n % g})' for n in rows[:16])
  more = f' and {len(rows) - 16} more' if len(rows) > 16 else ''
  raise ValueError(f'NaN rewards (a verifier abstained?) at rows {where}{more}; their whole '
                   f'group would get NaN advantages. Fix the reward, or {hint} to give those '
                   'rows advantage 0 and leave them out of the group statistics.')


def _checked(rewards_BxG, nan_rewards: str) -> Array:
  """rewards as fp32; NaN rejected (when the values are concrete) unless nan_rewards='ignore'."""
  if nan_rewards not in NAN_REWARDS:
    raise ValueError(f'nan_rewards={nan_rewards!r}; known: {NAN_REWARDS}.')
  if nan_rewards == 'error':
    check_rewards(rewards_BxG)
  return jnp.asarray(rewards_BxG, jnp.float32)


def _constant_groups_Bx1(rewards_BxG: Array) -> Array:
  return jnp.max(rewards_BxG, -1, keepdims=True) == jnp.min(rewards_BxG, -1, keepdims=True)


def _centre_BxG(rewards_BxG: Array) -> Array:
  """R - group mean, exactly 0 in all-equal groups and R itself for singletons."""
  if rewards_BxG.shape[-1] == 1:
    return rewards_BxG
  centred_BxG = rewards_BxG - jnp.mean(rewards_BxG, -1, keepdims=True)
  return jnp.where(_constant_groups_Bx1(rewards_BxG), 0.0, centred_BxG)


def grpo(rewards_BxG: Array, *, scale: str = 'group', std_ddof: int = 1, eps: float = 1e-6,
         nan_rewards: str = 'error') -> Array:
  """GRPO's group-relative advantage (DeepSeekMath, arXiv 2402.03300) and TRL's scalings.

  A_i = (R_i - mean_j R_j) / (σ + eps), the mean over the prompt's G samples, and σ:
    scale='group': the std of the prompt's G rewards (the paper; verl; TRL's default);
    scale='batch': the std of all B·G rewards of the batch (TRL's scale_rewards='batch', PPO
                   Lite arXiv 2508.08221), still centred per group; under jit on a sharded
                   batch the std is over the global batch;
    scale='none':  no division (Dr. GRPO).
  `std_ddof` degrees of freedom are removed from the std (1: Bessel, verl and TRL; 0: the
  population std, x sqrt((G-1)/G)). eps is verl's 1e-6; TRL uses 1e-4, oat 1e-8.
  nan_rewards='ignore' (TRL): NaN rewards are left out of the mean, the std and the counts,
  and their rows get A = 0; a group with at most one valid reward gets A = 0 everywhere.
  Provenance: paper formula ('group'); as in the reference code of huggingface/trl
  (`GRPOTrainer._generate_and_score_completions`: nanmean/nanstd, scale_rewards, then
  nan_to_num on the advantages) for 'batch' and nan_rewards='ignore'.

  Args:
    rewards_BxG: outcome reward of each response.
    scale: 'group', 'batch' or 'none', as above.
    std_ddof: 1 for the unbiased (Bessel) std, 0 for the population std.
    eps: added to the std before dividing.
    nan_rewards: 'error' (NaN rewards raise, naming their rows) or 'ignore' (as above).

  Returns:
    advantages_BxG; 0 in all-equal groups, R for G = 1.
  """
  if scale not in GRPO_SCALES:
    raise ValueError(f'grpo: scale={scale!r}; known: {GRPO_SCALES}.')
  rewards_BxG = _checked(rewards_BxG, nan_rewards)
  g = rewards_BxG.shape[-1]
  if g > 1 and not 0 <= std_ddof < g:
    raise ValueError(f'grpo: std_ddof={std_ddof} needs 0 <= std_ddof < G={g}.')
  if nan_rewards == 'ignore':
    valid_BxG = ~jnp.isnan(rewards_BxG)
    rewards_BxG = jnp.where(valid_BxG, rewards_BxG, 0.0)
  else:
    valid_BxG = jnp.ones(rewards_BxG.shape, bool)
  if g == 1:
    return jax.lax.stop_gradient(jnp.where(valid_BxG, rewards_BxG, 0.0))
  count_Bx1 = jnp.sum(valid_BxG, -1, keepdims=True)
  mean_Bx1 = jnp.sum(rewards_BxG, -1, keepdims=True) / jnp.maximum(count_Bx1, 1)
  top_Bx1 = jnp.max(jnp.where(valid_BxG, rewards_BxG, -jnp.inf), -1, keepdims=True)
  bottom_Bx1 = jnp.min(jnp.where(valid_BxG, rewards_BxG, jnp.inf), -1, keepdims=True)
  flat_Bx1 = (top_Bx1 == bottom_Bx1) | (count_Bx1 <= 1)
  centred_BxG = jnp.where(valid_BxG & ~flat_Bx1, rewards_BxG - mean_Bx1, 0.0)
  if scale == 'group':
    sq_Bx1 = jnp.sum(centred_BxG**2, -1, keepdims=True)
    std_Bx1 = jnp.sqrt(sq_Bx1 / jnp.maximum(count_Bx1 - std_ddof, 1))
    # Flat groups are already exactly 0; dividing them by 1 keeps eps=0 NaN-free.
    centred_BxG = centred_BxG / jnp.where(flat_Bx1, 1.0, std_Bx1 + eps)
  elif scale == 'batch':
    total = jnp.sum(valid_BxG)
    batch_mean = jnp.sum(rewards_BxG) / jnp.maximum(total, 1)
    dev_BxG = jnp.where(valid_BxG, rewards_BxG - batch_mean, 0.0)
    std = jnp.sqrt(jnp.sum(dev_BxG**2) / jnp.maximum(total - std_ddof, 1))
    # A non-zero centred value implies std > 0; the guard only keeps eps=0 NaN-free.
    centred_BxG = centred_BxG / jnp.where(std + eps > 0, std + eps, 1.0)
  return jax.lax.stop_gradient(centred_BxG)


def dr_grpo(rewards_BxG: Array, *, nan_rewards: str = 'error') -> Array:
  """Dr. GRPO's mean-centred advantage (arXiv 2503.20783).

  A_i = R_i - mean_j R_j: no std division, so prompts are not re-weighted by difficulty
  (the length bias is the loss side's constant normaliser, in losses.py); TRL's
  scale_rewards='none'. nan_rewards as in `grpo`.
  Provenance: paper formula.
  """
  return grpo(rewards_BxG, scale='none', nan_rewards=nan_rewards)


def rloo(rewards_BxG: Array) -> Array:
  """REINFORCE leave-one-out advantage (RLOO, arXiv 2402.14740).

  A_i = R_i - (1/(G-1)) Σ_{j≠i} R_j = G/(G-1) (R_i - mean_j R_j).
  Provenance: as in the reference code of volcengine/verl (`compute_rloo_outcome_advantage`,
  loop version: a singleton keeps A = R; verl's vectorised version returns 0 there instead).
  """
  rewards_BxG = _checked(rewards_BxG, 'error')
  g = rewards_BxG.shape[-1]
  scale = g / (g - 1) if g > 1 else 1.0
  return jax.lax.stop_gradient(scale * _centre_BxG(rewards_BxG))


def reinforce_pp_baseline(rewards_BxG: Array, *, weights_BxG: Array | None = None,
                          whiten_over: str = 'responses', lengths_BxG: Array | None = None,
                          std_ddof: int = 1, eps: float = 1e-8) -> Array:
  """REINFORCE++-baseline: group mean subtracted, then whitened over the batch (arXiv 2501.03262).

  c_i = R_i - mean_{j in group} R_j;  A_i = (c_i - m) / sqrt(v + eps) with
  m = Σ w c / Σ w and v = Σ w (c - m)^2 / (Σ w - std_ddof) over the whole batch.
  Provenance: as in the reference code of volcengine/verl
  (`compute_reinforce_plus_plus_baseline_outcome_advantage`). verl whitens over valid tokens,
  i.e. with each response weighted by its length: whiten_over='tokens' (weights = lengths_BxG,
  which the loop supplies) or `weights_BxG` = response lengths reproduce it, a 0/1 validity
  mask whitens over responses, None (and 'responses') gives equal weights.
  Under jit on a sharded batch the sums are global, so the whitening is over the global batch.

  Args:
    rewards_BxG: outcome reward of each response.
    weights_BxG: frequency weights of each response in the batch statistics; weight 0
      excludes a response (its advantage is 0).
    whiten_over: 'responses' (weights_BxG, or equal weights) or 'tokens' (verl's: weights =
      lengths_BxG; then weights_BxG must be None).
    lengths_BxG: trained tokens of each response, read with whiten_over='tokens'.
    std_ddof: Bessel correction of the batch variance (verl: 1, in units of the weights).
    eps: added to the variance inside the square root (verl's masked_whiten).
  """
  rewards_BxG = _checked(rewards_BxG, 'error')
  if whiten_over == 'tokens':
    if lengths_BxG is None or weights_BxG is not None:
      raise ValueError("reinforce_pp_baseline(whiten_over='tokens') weights by lengths_BxG; "
                       'pass lengths_BxG and no weights_BxG.')
    weights_BxG = lengths_BxG
  elif whiten_over != 'responses':
    raise ValueError(f"reinforce_pp_baseline: whiten_over={whiten_over!r}; known: 'responses', "
                     "'tokens'.")
  weights_BxG = (jnp.ones_like(rewards_BxG) if weights_BxG is None
                 else jnp.asarray(weights_BxG, jnp.float32))
  centred_BxG = _centre_BxG(rewards_BxG)
  return jax.lax.stop_gradient(masked_whiten(centred_BxG, weights_BxG, ddof=std_ddof, eps=eps))


def r2po_rarity(rewards_BxG: Array, *, std_ddof: int = 1, eps: float = 1e-6) -> Array:
  """R²PO's rarity advantage for training the rollout head (arXiv 2601.11960).

  u_i = 1 / #{j : R_j = R_i} within the group, then A_i = (u_i - mean u) / (std u + eps);
  a group whose u are all equal (all rewards equal, or every value equally frequent) and a
  singleton group get 0.
  Rare outcomes get positive advantage whether they are right or wrong.
  Provenance: as in the reference code of RRPO-ARR/Code (`reward_rarity` in
  simple_grpo_v1/rollout_head_train.py; torch's unbiased std, eps = 1e-6).
  """
  rewards_BxG = _checked(rewards_BxG, 'error')
  if rewards_BxG.shape[-1] == 1:
    return jnp.zeros_like(rewards_BxG)  # One sample is never rarer than itself.
  counts_BxG = jnp.sum(rewards_BxG[:, :, None] == rewards_BxG[:, None, :], -1)
  return grpo(1.0 / counts_BxG, std_ddof=std_ddof, eps=eps)


def opo(rewards_BxG: Array, *, lengths_BxG: Array) -> Array:
  """OPO's length-weighted optimal reward baseline (arXiv 2505.23585).

  A_i = R_i - b with b = Σ_j L_j R_j / Σ_j L_j over the prompt's G responses (L = response
  length in tokens); a singleton group has b = 0 (A = R). No std division. A group whose
  responses are all empty (Σ L = 0) uses the plain mean, where verl would divide 0 by 0 (ours).
  Provenance: as in the reference code of volcengine/verl (`compute_opo_outcome_advantage`).

  Args:
    rewards_BxG: outcome reward of each response.
    lengths_BxG: number of trained tokens of each response (the loop passes Σ_t loss_mask).
  """
  rewards_BxG = _checked(rewards_BxG, 'error')
  if rewards_BxG.shape[-1] == 1:
    return jax.lax.stop_gradient(rewards_BxG)
  lengths_BxG = jnp.asarray(lengths_BxG, jnp.float32)
  lengths_BxG = jnp.where(jnp.sum(lengths_BxG, -1, keepdims=True) > 0, lengths_BxG, 1.0)
  base_Bx1 = (jnp.sum(lengths_BxG * rewards_BxG, -1, keepdims=True)
              / jnp.sum(lengths_BxG, -1, keepdims=True))
  adv_BxG = jnp.where(_constant_groups_Bx1(rewards_BxG), 0.0, rewards_BxG - base_Bx1)
  return jax.lax.stop_gradient(adv_BxG)


def grpo_passk(rewards_BxG: Array, *, scale: str = 'group', std_ddof: int = 1,
               eps: float = 1e-6) -> Array:
  """Pass@k advantage: only each group's best response learns, by its margin (arXiv 2503.19595).

  The argmax-reward response gets A = (r_max - r_second) / (std_j R_j + eps) (scale='group',
  unbiased std) or r_max - r_second (scale='none', verl's norm_adv_by_std_in_grpo=False);
  every other response A = 0. Ties at the top give 0; among tied maxima the first index would
  be the one (its margin is 0 anyway). Needs G >= 2.
  Provenance: as in the reference code of volcengine/verl (`compute_grpo_passk_outcome_advantage`).
  """
  if scale not in ('group', 'none'):
    raise ValueError(f"grpo_passk: scale={scale!r}; known: ('group', 'none').")
  rewards_BxG = _checked(rewards_BxG, 'error')
  g = rewards_BxG.shape[-1]
  if g < 2:
    raise ValueError(f'grpo_passk needs at least 2 samples per group; got G={g}.')
  top2_Bx2, index_Bx2 = jax.lax.top_k(rewards_BxG, 2)
  margin_Bx1 = top2_Bx2[:, :1] - top2_Bx2[:, 1:]
  if scale == 'group':
    centred_BxG = rewards_BxG - jnp.mean(rewards_BxG, -1, keepdims=True)
    std_Bx1 = jnp.sqrt(jnp.sum(centred_BxG**2, -1, keepdims=True) / (g - std_ddof))
    margin_Bx1 = jnp.where(margin_Bx1 > 0, margin_Bx1 / (std_Bx1 + eps), 0.0)
  best_BxG = jnp.arange(g)[None, :] == index_Bx2[:, :1]
  return jax.lax.stop_gradient(jnp.where(best_BxG, margin_Bx1, 0.0))


ESTIMATORS: dict[str, Callable[..., Array]] = {
    'grpo': grpo,
    'dr_grpo': dr_grpo,
    'rloo': rloo,
    'reinforce_pp': reinforce_pp,
    'reinforce_pp_baseline': reinforce_pp_baseline,
    'r2po_rarity': r2po_rarity,
    'opo': opo,
    'grpo_passk': grpo_passk,
    'otb': otb,
    'gae': gae,
}
# Estimators on per-token rewards (token_advantages.py): the loop gives them NxL inputs.
TOKEN_LEVEL = ('otb', 'gae', 'reinforce_pp')


def get_estimator(name: str) -> Callable[..., Array]:
  """The estimator registered under `name`; a ValueError lists the known names otherwise."""
  if name not in ESTIMATORS:
    known = ', '.join(sorted(ESTIMATORS))
    raise ValueError(f'Unknown advantage estimator {name!r}; known: {known}.')
  return ESTIMATORS[name]
