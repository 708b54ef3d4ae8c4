"""Advantage estimators: rewards in, advantages out, with no gradient flowing through them.

Group estimators take `rewards_BxG` (B prompts x G samples; a Rollout's row n = b*G + g
belongs to prompt b) and return `advantages_BxG`, one scalar per response that the caller
broadcasts over its tokens. Token-level estimators (OTB, GAE) take `_NxL` arrays and return
`_NxL` advantages that are zero wherever the mask is. Everything is a pure, jittable function
with keyword-only options, and its output is wrapped in `stop_gradient`.

Two conventions are pinned here, because libraries differ on them (algorithms.md §22.2):
  * a singleton group (G = 1) has no baseline, so A = R (verl's convention);
  * a group whose rewards are all equal gets exactly A = 0, whatever `eps` is (a float mean
    of equal numbers need not equal them, and dividing that residue by eps would not be 0).

Deliberately not here: token statistics (log-probs, Σπ²), policy losses, KL and loss
aggregation (losses.py); transforms applied to the output of an estimator (F-GRPO, A-GRAE,
IFPO), DAPO's and HAPO's reward/data operators and the analysis helpers
(advantage_transforms.py); computing rewards (verifiers/).
"""

from typing import Callable

import jax
import jax.numpy as jnp

Array = jax.Array


def _constant_groups_Bx1(rewards_BxG: Array) -> Array:
  return jnp.max(rewards_BxG, -1, keepdims=True) == jnp.min(rewards_BxG, -1, keepdims=True)


def _centre_BxG(rewards_BxG: Array) -> Array:
  """R - group mean, exactly 0 in all-equal groups and R itself for singletons."""
  if rewards_BxG.shape[-1] == 1:
    return rewards_BxG
  centred_BxG = rewards_BxG - jnp.mean(rewards_BxG, -1, keepdims=True)
  return jnp.where(_constant_groups_Bx1(rewards_BxG), 0.0, centred_BxG)


def _whiten(x: Array, weights: Array, *, ddof: int, eps: float) -> Array:
  """(x - m) / sqrt(v + eps) with weighted mean m and variance v over all elements.

  Weights are frequency weights (counts), so the Bessel-corrected denominator is Σw - ddof;
  it is clamped at 1 because with at most one effective sample every deviation is 0 anyway.
  Zero-weight elements come back as 0.
  """
  total = jnp.sum(weights)
  mean = jnp.sum(weights * x) / jnp.maximum(total, 1e-30)
  dev = x - mean
  var = jnp.sum(weights * dev**2) / jnp.maximum(total - ddof, 1.0)
  return jnp.where(weights > 0, dev * jax.lax.rsqrt(var + eps), 0.0)


def grpo(rewards_BxG: Array, *, scale_by_std: bool = True, std_ddof: int = 1,
         eps: float = 1e-6) -> Array:
  """GRPO's group-relative advantage (DeepSeekMath, arXiv 2402.03300).

  A_i = (R_i - mean_j R_j) / (std_j R_j + eps), std over the G samples of the prompt with
  `std_ddof` degrees of freedom removed; with `scale_by_std=False`, A_i = R_i - mean_j R_j.
  Provenance: paper formula. The defaults (unbiased std, eps = 1e-6) are verl's; TRL uses
  eps = 1e-4 and oat 1e-8, and std_ddof=0 gives the population std (x sqrt((G-1)/G)).

  Args:
    rewards_BxG: outcome reward of each response.
    scale_by_std: divide by the group std (False is Dr. GRPO's advantage).
    std_ddof: 1 for the unbiased (Bessel) std, 0 for the population std.
    eps: added to the std before dividing.

  Returns:
    advantages_BxG; 0 in all-equal groups, R for G = 1.
  """
  rewards_BxG = jnp.asarray(rewards_BxG, jnp.float32)
  g = rewards_BxG.shape[-1]
  if g > 1 and not 0 <= std_ddof < g:
    raise ValueError(f'grpo: std_ddof={std_ddof} needs 0 <= std_ddof < G={g}.')
  centred_BxG = _centre_BxG(rewards_BxG)
  if scale_by_std and g > 1:
    std_Bx1 = jnp.sqrt(jnp.sum(centred_BxG**2, -1, keepdims=True) / (g - std_ddof))
    # All-equal groups are already exactly 0; dividing them by 1 keeps eps=0 NaN-free.
    centred_BxG = centred_BxG / jnp.where(_constant_groups_Bx1(rewards_BxG), 1.0, std_Bx1 + eps)
  return jax.lax.stop_gradient(centred_BxG)


def dr_grpo(rewards_BxG: Array) -> Array:
  """Dr. GRPO's mean-centred advantage (arXiv 2503.20783).

  A_i = R_i - mean_j R_j: no std division, so prompts are not re-weighted by difficulty
  (the length bias is the loss side's constant normaliser, in losses.py).
  Provenance: paper formula.
  """
  return grpo(rewards_BxG, scale_by_std=False)


def rloo(rewards_BxG: Array) -> Array:
  """REINFORCE leave-one-out advantage (RLOO, arXiv 2402.14740).

  A_i = R_i - (1/(G-1)) Σ_{j≠i} R_j = G/(G-1) (R_i - mean_j R_j).
  Provenance: as in the reference code of volcengine/verl (`compute_rloo_outcome_advantage`,
  loop version: a singleton keeps A = R; verl's vectorised version returns 0 there instead).
  """
  rewards_BxG = jnp.asarray(rewards_BxG, jnp.float32)
  g = rewards_BxG.shape[-1]
  scale = g / (g - 1) if g > 1 else 1.0
  return jax.lax.stop_gradient(scale * _centre_BxG(rewards_BxG))


def reinforce_pp_baseline(rewards_BxG: Array, *, weights_BxG: Array | None = None,
                          std_ddof: int = 1, eps: float = 1e-8) -> Array:
  """REINFORCE++-baseline: group mean subtracted, then whitened over the batch (arXiv 2501.03262).

  c_i = R_i - mean_{j in group} R_j;  A_i = (c_i - m) / sqrt(v + eps) with
  m = Σ w c / Σ w and v = Σ w (c - m)^2 / (Σ w - std_ddof) over the whole batch.
  Provenance: as in the reference code of volcengine/verl
  (`compute_reinforce_plus_plus_baseline_outcome_advantage`). verl whitens over valid tokens,
  i.e. with each response weighted by its length: pass `weights_BxG` = response lengths to
  reproduce it, a 0/1 validity mask to whiten over responses, or None for equal weights.
  Under jit on a sharded batch the sums are global, so the whitening is over the global batch.

  Args:
    rewards_BxG: outcome reward of each response.
    weights_BxG: frequency weights of each response in the batch statistics; weight 0
      excludes a response (its advantage is 0).
    std_ddof: Bessel correction of the batch variance (verl: 1, in units of the weights).
    eps: added to the variance inside the square root (verl's masked_whiten).
  """
  rewards_BxG = jnp.asarray(rewards_BxG, jnp.float32)
  weights_BxG = (jnp.ones_like(rewards_BxG) if weights_BxG is None
                 else jnp.asarray(weights_BxG, jnp.float32))
  centred_BxG = _centre_BxG(rewards_BxG)
  return jax.lax.stop_gradient(_whiten(centred_BxG, weights_BxG, ddof=std_ddof, eps=eps))


def r2po_rarity(rewards_BxG: Array, *, std_ddof: int = 1, eps: float = 1e-6) -> Array:
  """R²PO's rarity advantage for training the rollout head (arXiv 2601.11960).

  u_i = 1 / #{j : R_j = R_i} within the group, then A_i = (u_i - mean u) / (std u + eps);
  a group whose u are all equal (all rewards equal, or every value equally frequent) and a
  singleton group get 0.
  Rare outcomes get positive advantage whether they are right or wrong.
  Provenance: as in the reference code of RRPO-ARR/Code (`reward_rarity` in
  simple_grpo_v1/rollout_head_train.py; torch's unbiased std, eps = 1e-6).
  """
  rewards_BxG = jnp.asarray(rewards_BxG, jnp.float32)
  if rewards_BxG.shape[-1] == 1:
    return jnp.zeros_like(rewards_BxG)  # One sample is never rarer than itself.
  counts_BxG = jnp.sum(rewards_BxG[:, :, None] == rewards_BxG[:, None, :], -1)
  return grpo(1.0 / counts_BxG, std_ddof=std_ddof, eps=eps)


def outcome_token_rewards(rewards_N: Array, mask_NxL: Array) -> Array:
  """Puts each response's scalar reward on its last valid token (the input OTB and GAE take).

  Rows without a valid token get no reward.
  """
  mask_NxL = jnp.asarray(mask_NxL) > 0
  length = mask_NxL.shape[-1]
  last_N = length - 1 - jnp.argmax(mask_NxL[:, ::-1], axis=-1)
  last_NxL = jnp.arange(length)[None, :] == last_N[:, None]
  rewards_Nx1 = jnp.asarray(rewards_N, jnp.float32)[:, None]
  return jnp.where(last_NxL & jnp.any(mask_NxL, -1, keepdims=True), rewards_Nx1, 0.0)


def otb_token_energy(logprobs_NxL: Array, sum_pi_sq_NxL: Array) -> Array:
  """OTB's logit-gradient proxy w = 1 - 2π(a) + Σ_v π(v)^2 (arXiv 2602.07078).

  It equals ||∂ log π(a) / ∂z||^2 = ||e_a - π||^2 exactly, for logits z. π(a) =
  exp(logprobs_NxL) is the probability of the sampled token; Σπ² comes from the logits
  (losses.py). Provenance: as in the reference code of volcengine/verl.
  """
  pi_NxL = jnp.exp(jnp.asarray(logprobs_NxL, jnp.float32))
  return 1.0 - 2.0 * pi_NxL + jnp.asarray(sum_pi_sq_NxL, jnp.float32)


def _compact_NxL(x_NxL: Array, slot_NxL: Array) -> Array:
  """Moves each row's valid entries to the front, in order (slot = valid-token index, or L)."""
  rows_Nx1 = jnp.arange(x_NxL.shape[0])[:, None]
  return jnp.zeros_like(x_NxL).at[rows_Nx1, slot_NxL].set(x_NxL, mode='drop')


def _otb_baseline(returns_NxL, energy_cum_NxL, mask_NxL, members_N, *, group_size, zero_tail,
                  eps):
  n, length = returns_NxL.shape
  shape = (n // group_size, group_size, length)
  ret_BxGxL, w_BxGxL, m_BxGxL = (a.reshape(shape) for a in (returns_NxL, energy_cum_NxL, mask_NxL))
  num_BxL = jnp.sum(ret_BxGxL * w_BxGxL * m_BxGxL, 1)
  den_BxL = jnp.sum(w_BxGxL * m_BxGxL, 1) + eps
  base_BxGxL = jnp.broadcast_to((num_BxL / den_BxL)[:, None, :], shape)
  if zero_tail and group_size > 1:
    # Where only the (strictly) longest response is still active, the baseline would be its
    # own return and its advantage 0; the flag zeroes the baseline there instead.
    len_BxG = jnp.sum(m_BxGxL, -1)
    top2_Bx2 = jax.lax.top_k(len_BxG, 2)[0]
    longest_Bx1, second_Bx1 = top2_Bx2[:, :1], top2_Bx2[:, 1:]
    tail_BxGxL = ((len_BxG == longest_Bx1) & (longest_Bx1 > second_Bx1))[..., None] & (
        jnp.arange(length)[None, None, :] >= second_Bx1[..., None])
    base_BxGxL = jnp.where(tail_BxGxL, 0.0, base_BxGxL)
  # A lone member of its group has no baseline (verl: "advantage = return").
  lone_Bx1x1 = (jnp.sum(members_N.reshape(shape[:2]), -1) == 1)[:, None, None]
  base_BxGxL = jnp.where(lone_Bx1x1, 0.0, base_BxGxL)
  return ((ret_BxGxL - base_BxGxL) * m_BxGxL).reshape(n, length)


def otb(token_rewards_NxL: Array, logprobs_NxL: Array, sum_pi_sq_NxL: Array, mask_NxL: Array, *,
        group_size: int, zero_tail: bool, multi_turn: bool = False,
        is_weights_NxL: Array | None = None, eps: float = 1e-8) -> Array:
  """Optimal Token Baseline (OTB, arXiv 2602.07078): a per-token, energy-weighted baseline.

  With w_{i,t} = (1 - 2π_{i,t} + Σπ²_{i,t}) ρ_{i,t}^2 (ρ = truncated IS weight, 1 if absent),
  realised energy W_{i,t} = Σ_{j≤t} M_{i,j} w_{i,j} and reward-to-go G_{i,t} = Σ_{j≥t} M r,
  per group and position:  B_t = Σ_i M_{i,t} G_{i,t} W_{i,t} / (Σ_i M_{i,t} W_{i,t} + eps),
  A_{i,t} = (G_{i,t} - B_t) M_{i,t}. No std normalisation; a group of one gets A = G.
  Provenance: as in the reference code of volcengine/verl
  (`compute_optimal_token_baseline_advantage` and its multi-turn twin). The paper's possible
  extra 1/W weighting of the update (algorithms.md §8, reading 2) is not applied.

  Args:
    token_rewards_NxL: per-token rewards (outcome rewards: `outcome_token_rewards`).
    logprobs_NxL: log-prob of each sampled token under the behaviour policy (lp_old).
    sum_pi_sq_NxL: Σ_v π(v)^2 at each position, from the same logits.
    mask_NxL: 1 on the tokens trained on (model tokens), 0 on padding and tool output.
    group_size: G; rows are prompt-major, N = B*G.
    zero_tail: where only the strictly longest response of a group is still active, set the
      baseline to 0 (A = its return) instead of its own return (A = 0). verl's default has
      varied between versions, hence no default here.
    multi_turn: align responses by valid-token index (each row's valid tokens compacted to
      the front, as verl's multi-turn/TIR variant) instead of by absolute position; responses
      with no valid token then do not count as group members.
    is_weights_NxL: truncated rollout importance weights ρ̄, which enter squared.
    eps: added to the baseline's denominator.

  Returns:
    advantages_NxL, zero where mask_NxL is.
  """
  mask_NxL = (jnp.asarray(mask_NxL) > 0).astype(jnp.float32)
  rewards_NxL = jnp.asarray(token_rewards_NxL, jnp.float32) * mask_NxL
  returns_NxL = jnp.flip(jnp.cumsum(jnp.flip(rewards_NxL, -1), -1), -1)
  energy_NxL = otb_token_energy(logprobs_NxL, jnp.asarray(sum_pi_sq_NxL, jnp.float32))
  if is_weights_NxL is not None:
    energy_NxL = energy_NxL * jnp.asarray(is_weights_NxL, jnp.float32)**2
  energy_cum_NxL = jnp.cumsum(energy_NxL * mask_NxL, -1)
  n, length = mask_NxL.shape
  if n % group_size:
    raise ValueError(f'otb: N={n} rows is not a multiple of group_size={group_size}.')
  kw = dict(group_size=group_size, zero_tail=zero_tail, eps=eps)
  if not multi_turn:
    advantages_NxL = _otb_baseline(returns_NxL, energy_cum_NxL, mask_NxL, jnp.ones(n, bool), **kw)
  else:
    index_NxL = jnp.cumsum(mask_NxL, -1).astype(jnp.int32) - 1
    slot_NxL = jnp.where(mask_NxL > 0, index_NxL, length)
    len_N = jnp.sum(mask_NxL, -1)
    compact_mask_NxL = (jnp.arange(length)[None, :] < len_N[:, None]).astype(jnp.float32)
    compact_adv_NxL = _otb_baseline(_compact_NxL(returns_NxL, slot_NxL),
                                    _compact_NxL(energy_cum_NxL, slot_NxL), compact_mask_NxL,
                                    len_N > 0, **kw)
    advantages_NxL = jnp.take_along_axis(compact_adv_NxL, jnp.maximum(index_NxL, 0), -1) * mask_NxL
  return jax.lax.stop_gradient(advantages_NxL)


def gae(token_rewards_NxL: Array, values_NxL: Array, mask_NxL: Array, *, gamma: float = 1.0,
        lam: float = 1.0, whiten: bool = True, std_ddof: int = 1,
        eps: float = 1e-8) -> tuple[Array, Array]:
  """Generalised advantage estimation for a value head (GAE, arXiv 1506.02438).

  δ_t = r_t + γ V_{t'} - V_t and A_t = δ_t + γλ A_{t'}, where t' is the next valid position
  (masked positions, e.g. tool output, are skipped: V and A carry over them); returns
  R_t = A_t + V_t; A is then whitened over the valid tokens of the whole batch.
  Provenance: as in the reference code of volcengine/verl (`compute_gae_advantage_return`,
  masked_whiten with unbiased variance and eps inside the square root; defaults γ = λ = 1).

  Args:
    token_rewards_NxL: per-token rewards (outcome reward on the last valid token, optionally
      a KL penalty on every token).
    values_NxL: value-head predictions V_t.
    mask_NxL: 1 on the tokens trained on, 0 on padding and tool output.
    gamma: discount γ.
    lam: GAE λ.
    whiten: whiten the advantages over the valid tokens of the batch.
    std_ddof: Bessel correction of the whitening variance.
    eps: added to that variance inside the square root.

  Returns:
    (advantages_NxL, returns_NxL), both zero where mask_NxL is; returns are not whitened.
  """
  mask_NxL = (jnp.asarray(mask_NxL) > 0).astype(jnp.float32)
  rewards_NxL = jnp.asarray(token_rewards_NxL, jnp.float32)
  values_NxL = jnp.asarray(values_NxL, jnp.float32)

  def step(carry, xs):
    next_value_N, next_adv_N = carry
    r_N, v_N, m_N = xs
    adv_N = r_N + gamma * next_value_N - v_N + gamma * lam * next_adv_N
    valid_N = m_N > 0
    carry = (jnp.where(valid_N, v_N, next_value_N), jnp.where(valid_N, adv_N, next_adv_N))
    return carry, carry[1]

  zeros_N = jnp.zeros(mask_NxL.shape[0], jnp.float32)
  _, adv_LxN = jax.lax.scan(step, (zeros_N, zeros_N), (rewards_NxL.T, values_NxL.T, mask_NxL.T),
                            reverse=True)
  adv_NxL = adv_LxN.T * mask_NxL
  returns_NxL = (adv_NxL + values_NxL) * mask_NxL
  if whiten:
    adv_NxL = _whiten(adv_NxL, mask_NxL, ddof=std_ddof, eps=eps)
  return jax.lax.stop_gradient(adv_NxL), jax.lax.stop_gradient(returns_NxL)


ESTIMATORS: dict[str, Callable[..., Array]] = {
    'grpo': grpo,
    'dr_grpo': dr_grpo,
    'rloo': rloo,
    'reinforce_pp_baseline': reinforce_pp_baseline,
    'r2po_rarity': r2po_rarity,
    'otb': otb,
    'gae': gae,
}


def get_estimator(name: str) -> Callable[..., Array]:
  """The estimator registered under `name`; a ValueError lists the known names otherwise."""
  if name not in ESTIMATORS:
    known = ', '.join(sorted(ESTIMATORS))
    raise ValueError(f'Unknown advantage estimator {name!r}; known: {known}.')
  return ESTIMATORS[name]
