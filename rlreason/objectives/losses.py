"""Per-token policy losses of the GRPO family and the seed methods, and their registry.

Every loss has the signature

  loss_NxL, weights_NxL, metrics = fn(logprobs_NxL, old_logprobs_NxL, advantages_NxL,
                                      mask_NxL, *, <options>)

logprobs_NxL are the current policy's log-probs of the sampled tokens (the only input that
carries a gradient), old_logprobs_NxL π_old's (the trainer's recomputation), advantages NxL
or N (broadcast over tokens; rows prompt-major, N = B·G). The result is a loss to *minimise*
per token (0 on masked tokens), the per-token weight the aggregation multiplies by (the mask,
or a reweighted mask), and a dict of scalar diagnostics. Aggregating is a separate step with a
global denominator (aggregation.py); a KL penalty is added per token (kl.py); QUATRO lives in
trust_region.py (its [I] variants in quatro_variants.py), CISPO and SAPO (no hard clip) in
soft_losses.py, the shared ratio helpers in ratios.py. `value_loss` is the critic's (PPO with
GAE), outside the policy registry.

Provenance follows algorithms.md: "paper formula", "as in the reference code of <repo>", or
"our formalisation (paper not available)" where only abstracts could be read.

Deliberately not here: advantage estimators and transforms (advantages.py), prompt sampling.
"""

from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np

from rlreason.objectives import quatro_variants
from rlreason.objectives import trust_region
from rlreason.objectives.aggregation import masked_mean
from rlreason.objectives.loss_diagnostics import ratio_metrics
from rlreason.objectives.ratios import clip_surrogate as _clip_surrogate
from rlreason.objectives.ratios import clipped_log_ratio as _clipped_log_ratio
from rlreason.objectives.ratios import dual_clipped
from rlreason.objectives.ratios import masked as _masked
from rlreason.objectives.ratios import masked_inputs as _inputs
from rlreason.objectives.ratios import sequence_log_ratio_N as _seq_log_ratio_N
from rlreason.objectives.soft_losses import cispo
from rlreason.objectives.soft_losses import sapo

_sg = jax.lax.stop_gradient


def ppo_clip(logprobs_NxL, old_logprobs_NxL, advantages_NxL, mask_NxL, *,
             eps_low: float = 0.2, eps_high: float = 0.2, dual_clip: float | None = None,
             log_ratio_clip: float = 20.0):
  """PPO's clipped surrogate with decoupled bounds and optional dual clip.

  ℓ = −min(r A, clip(r, 1 − ε_low, 1 + ε_high) A), r = exp(lp − lp_old); with dual clip c > 1,
  ℓ ← min(ℓ, −c A) for A < 0. The gradient is −A r ∇lp except exactly 0 when A > 0,
  r > 1 + ε_high or A < 0, r < 1 − ε_low (or A < 0, r > c under dual clip). GRPO (arXiv
  2402.03300) uses ε_low = ε_high; DAPO's clip-higher (arXiv 2503.14476) ε_high = 0.28.
  Provenance: paper formula (PPO arXiv 1707.06347, clip-higher 2503.14476, dual clip
  1912.09729).

  Args:
    logprobs_NxL, old_logprobs_NxL, advantages_NxL, mask_NxL: see the module docstring.
    eps_low: lower clip ε_low (ratio floor 1 − ε_low).
    eps_high: upper clip ε_high (ratio cap 1 + ε_high).
    dual_clip: c (verl's clip_ratio_c, 3.0) or None.
    log_ratio_clip: |lp − lp_old| cap before exp (verl: 20).

  Returns:
    (loss_NxL, mask_NxL, metrics).
  """
  logprobs_NxL, old_logprobs_NxL, adv_NxL = _inputs(logprobs_NxL, old_logprobs_NxL,
                                                    advantages_NxL, mask_NxL)
  log_ratio_NxL = _clipped_log_ratio(logprobs_NxL, old_logprobs_NxL, log_ratio_clip)
  loss_NxL = dual_clipped(_clip_surrogate(jnp.exp(log_ratio_NxL), adv_NxL, eps_low, eps_high),
                         adv_NxL, dual_clip)
  metrics = ratio_metrics(log_ratio_NxL, adv_NxL, mask_NxL, eps_low=eps_low, eps_high=eps_high,
                          dual_clip=dual_clip)
  return _masked(loss_NxL, mask_NxL), mask_NxL, metrics


def gspo(logprobs_NxL, old_logprobs_NxL, advantages_NxL, mask_NxL, *, eps_low: float = 3e-4,
         eps_high: float = 4e-4, dual_clip: float | None = None, log_ratio_clip: float = 10.0):
  """GSPO: PPO-clip on the length-normalised sequence ratio (arXiv 2507.18071).

  s_i = exp((1/|y_i|) Σ_t M (lp − lp_old)); every valid token of sequence i carries
  ℓ = −min(s_i A, clip(s_i, 1 − ε_low, 1 + ε_high) A), so seq_mean_token_mean gives the paper's
  (1/G) Σ_i. Unclipped gradient of sequence i: −s_i A (1/|y_i|) Σ_t ∇lp. log s is capped at
  `log_ratio_clip` (verl: 10). Use with seq_mean_token_mean, as verl forces.
  dual_clip c on the sequence ratio: ℓ ← min(ℓ, −c A) for A < 0, so a negative-advantage
  sequence with s_i > c gets no gradient. TRL's `delta` with importance_sampling_level=
  'sequence' (INTELLECT-2's two-sided clip, min(s, δ) in the unclipped term) is the same
  loss whenever δ ≥ 1 + ε_high, as TRL recommends.
  Provenance: paper formula (ε = 3e-4 / 4e-4 as the paper reports them, via TRL and verl);
  dual clip as ppo_clip's (arXiv 1912.09729), on s_i as TRL applies `delta`.

  Returns:
    (loss_NxL, mask_NxL, metrics).
  """
  logprobs_NxL, old_logprobs_NxL, adv_NxL = _inputs(logprobs_NxL, old_logprobs_NxL,
                                                    advantages_NxL, mask_NxL)
  log_s_N = jnp.minimum(_seq_log_ratio_N(logprobs_NxL, old_logprobs_NxL, mask_NxL),
                        log_ratio_clip)
  log_s_NxL = jnp.broadcast_to(log_s_N[:, None], logprobs_NxL.shape)
  loss_NxL = dual_clipped(_clip_surrogate(jnp.exp(log_s_NxL), adv_NxL, eps_low, eps_high),
                          adv_NxL, dual_clip)
  metrics = ratio_metrics(log_s_NxL, adv_NxL, mask_NxL, eps_low=eps_low, eps_high=eps_high,
                          dual_clip=dual_clip)
  return _masked(loss_NxL, mask_NxL), mask_NxL, metrics


def gspo_token(logprobs_NxL, old_logprobs_NxL, advantages_NxL, mask_NxL, *,
               eps_low: float = 3e-4, eps_high: float = 4e-4, dual_clip: float | None = None,
               log_ratio_clip: float = 10.0):
  """GSPO-token: s_{i,t} = sg(s_i)·exp(lp − sg(lp)), allowing per-token advantages.

  Same value as GSPO; gradient −s_i A_{i,t} ∇lp_{i,t} per unclipped token, so with
  per-sequence A it equals GSPO's (arXiv 2507.18071); dual_clip as in `gspo`.
  Provenance: paper formula (the paper's GSPO-token variant; verl implements GSPO this way).

  Returns:
    (loss_NxL, mask_NxL, metrics).
  """
  logprobs_NxL, old_logprobs_NxL, adv_NxL = _inputs(logprobs_NxL, old_logprobs_NxL,
                                                    advantages_NxL, mask_NxL)
  log_s_N = _sg(_seq_log_ratio_N(logprobs_NxL, old_logprobs_NxL, mask_NxL))
  log_s_NxL = jnp.minimum(log_s_N[:, None] + logprobs_NxL - _sg(logprobs_NxL), log_ratio_clip)
  loss_NxL = dual_clipped(_clip_surrogate(jnp.exp(log_s_NxL), adv_NxL, eps_low, eps_high),
                          adv_NxL, dual_clip)
  metrics = ratio_metrics(log_s_NxL, adv_NxL, mask_NxL, eps_low=eps_low, eps_high=eps_high,
                          dual_clip=dual_clip)
  return _masked(loss_NxL, mask_NxL), mask_NxL, metrics


def is_grpo_prompt_probs(std_hat_P, *, base_probs_P=None, std_floor: float = 0.05):
  """IS-GRPO's prompt-sampling distribution q(x) ∝ p(x)·max(σ̂_x, σ_floor).

  σ̂_x is a running estimate of prompt x's reward std (binary rewards: sqrt(p̂(1 − p̂))); the
  floor keeps unseen or solved prompts sampleable. arXiv 2601.23135 (revised version).
  Provenance: our formalisation (paper not available), algorithms.md §9.
  """
  p_P = jnp.ones_like(std_hat_P) if base_probs_P is None else base_probs_P
  w_P = p_P * jnp.maximum(std_hat_P, std_floor)
  return w_P / jnp.sum(w_P)


def is_grpo(logprobs_NxL, old_logprobs_NxL, advantages_NxL, mask_NxL, *, group_size: int,
            reward_std_B, proposal_std_B, eps_low: float = 0.2, eps_high: float = 0.2,
            dual_clip: float | None = None, log_ratio_clip: float = 20.0):
  """IS-GRPO, loss side: GRPO's clipped loss reweighted by σ_x / σ̂_x per prompt.

  Our reading (arXiv 2601.23135 v2 abstract; algorithms.md §9): GRPO's expected update
  Σ_x p(x) ∇J_x / σ_x is a reweighted gradient; sampling prompts from q(x) ∝ p(x) σ̂_x
  (`is_grpo_prompt_probs`) moves the weight into sampling. A library function: no prompt
  sampler of the loop draws from q yet, so it is not in POLICY_LOSSES (see LIBRARY_ONLY).
  The loss multiplies prompt x's GRPO term (advantages divided by the group's σ_x) by
  sg(σ_x / σ̂_x), so its update is ∇J_x / σ̂_x and E_q[update] = ∇J / Σ_x p σ̂ — parallel to
  the full gradient exactly, even when σ̂ is a stale estimate; with σ̂_x = σ_x the weight is 1
  and this is plain GRPO on q-sampled prompts (§9's form). The loss itself is ppo_clip's.
  Provenance: our formalisation (paper not available).

  Args:
    group_size: G.
    reward_std_B: the σ_x (+ε) the advantages were divided by.
    proposal_std_B: the σ̂_x the sampler used for q (already floored).
    Others: as in `ppo_clip`.

  Returns:
    (loss_NxL, mask_NxL, metrics).
  """
  loss_NxL, mask_NxL, metrics = ppo_clip(
      logprobs_NxL, old_logprobs_NxL, advantages_NxL, mask_NxL, eps_low=eps_low,
      eps_high=eps_high, dual_clip=dual_clip, log_ratio_clip=log_ratio_clip)
  weight_B = _sg(reward_std_B / proposal_std_B)
  weight_N = jnp.repeat(weight_B, group_size)
  metrics['is_grpo/weight_mean'] = jnp.mean(weight_B)
  return loss_NxL * weight_N[:, None], mask_NxL, metrics


SORL_TURN_RATIOS = ('geometric', 'exact', 'token')  # The first of each is sorl's default.
SORL_NORMALIZATIONS = ('reliability', 'clip_bias', 'none')


def sorl(logprobs_NxL, old_logprobs_NxL, advantages_NxL, mask_NxL, *, turn_ids_NxL,
         num_turns: int, eps_low: float = 0.2, eps_high: float = 0.2,
         turn_ratio: str = 'geometric', normalization: str = 'reliability',
         log_ratio_clip: float = 20.0):
  """SORL (SO-PPO / SO-GRPO, ex ST-PPO): turn-level ratios, clipping-triggered normalisation.

  Turn ratio of turn k of row i over its valid (model) tokens: ρ_{i,k} =
  exp(mean_{t∈k} (lp − lp_old)) ('geometric', default: algorithms.md §14 candidate (i)) or
  exp(Σ_{t∈k} …) ('exact', candidate (ii)); 'token' keeps PPO's per-token ratio (v1's S-PPO:
  the normalisation alone). Token t of turn k uses r = sg(ρ_{i,k})·exp(lp − sg(lp)) in the
  PPO-clip surrogate with [1 − ε_low, 1 + ε_high], so its gradient is −A ρ_{i,k} ∇lp_t unless
  clipped. A token is clipped when that gradient is zeroed (A > 0, r > 1 + ε_high or A < 0,
  r < 1 − ε_low); with one advantage per episode a turn clips as a whole. The returned
  weights are, detached,
    'reliability': ω_i M with ω_i = 1 − (clipped tokens of i)/(tokens of i), to be aggregated
                   as Σ_{i,t} ω_i M ℓ / Σ_{i,t} ω_i M over the whole minibatch (token_mean
                   with the weights' own global sum as denominator: update.train_step does
                   this when `self_normalising` says so). Without clipping ω = 1 and this
                   is the base loss; with clipping the unreliable rows weigh less and the
                   rest are renormalised;
    'clip_bias':   M / (1 + b_i), b_i = mean_t |r − clip(r)|·|A| (the alternative reading of
                   §14; per sample, under the ordinary denominators);
    'none':        M (Turn-PPO with 'geometric' or 'exact').
  Observation/tool tokens (mask 0) never enter a ratio; one turn makes 'geometric' GSPO-token
  (arXiv 2507.18071) with the same ε. SO-GRPO: group advantages; SO-PPO: GAE advantages, with
  a turn-level critic by advantage_kwargs turn_level=True (token_advantages.gae).
  arXiv 2511.20718. Provenance: our formalisation (paper not available; its method section
  could not be read, no code found), algorithms.md §14 (b).

  Args:
    turn_ids_NxL: int turn index in [0, num_turns) of each token (ignored where mask is 0);
      episodes' turn_NxL.
    num_turns: static upper bound on turns per row (env.max_turns).
    turn_ratio: 'geometric' | 'exact' | 'token'.
    normalization: 'reliability' | 'clip_bias' | 'none'.
    Others: as in `ppo_clip`.

  Returns:
    (loss_NxL, weights_NxL, metrics); metrics add sorl/weight_mean (mean ω_i over rows) and
    sorl/turns_mean (turns with a valid token per row).
  """
  logprobs_NxL, old_logprobs_NxL, adv_NxL = _inputs(logprobs_NxL, old_logprobs_NxL,
                                                    advantages_NxL, mask_NxL)
  valid_NxL = mask_NxL > 0
  if not any(isinstance(x, jax.core.Tracer) for x in (turn_ids_NxL, mask_NxL)):
    # Checked where the values are known: a turn past num_turns would silently get ratio 1.
    turns_NxL = np.asarray(turn_ids_NxL)
    out = (np.asarray(mask_NxL) > 0) & ((turns_NxL < 0) | (turns_NxL >= num_turns))
    if out.any():
      raise ValueError(f'sorl: turn_ids_NxL holds {turns_NxL[out].max()} on a valid token, '
                       f'outside [0, num_turns={num_turns}) (objective num_turns: env.max_turns).')
  in_turn_NxLxK = (turn_ids_NxL[..., None] == jnp.arange(num_turns)) & valid_NxL[..., None]
  in_turn_NxLxK = in_turn_NxLxK.astype(jnp.float32)
  token_lr_NxL = _sg(logprobs_NxL - old_logprobs_NxL)
  sum_NxK = jnp.einsum('nlk,nl->nk', in_turn_NxLxK, token_lr_NxL)
  count_NxK = jnp.sum(in_turn_NxLxK, axis=1)
  if turn_ratio == 'geometric':
    turn_lr_NxK = sum_NxK / jnp.maximum(count_NxK, 1.0)
  elif turn_ratio == 'exact':
    turn_lr_NxK = sum_NxK
  elif turn_ratio != 'token':
    raise ValueError(f'sorl: turn_ratio={turn_ratio!r}; known: {SORL_TURN_RATIOS}.')
  if turn_ratio == 'token':
    base_lr_NxL = token_lr_NxL
  else:
    base_lr_NxL = jnp.einsum('nlk,nk->nl', in_turn_NxLxK, turn_lr_NxK)
  log_r_NxL = jnp.clip(base_lr_NxL + logprobs_NxL - _sg(logprobs_NxL), -log_ratio_clip,
                       log_ratio_clip)
  ratio_NxL = jnp.exp(log_r_NxL)
  loss_NxL = _masked(_clip_surrogate(ratio_NxL, adv_NxL, eps_low, eps_high), mask_NxL)
  r_NxL = _sg(ratio_NxL)
  clipped_NxL = (((adv_NxL > 0) & (r_NxL > 1.0 + eps_high)) |
                 ((adv_NxL < 0) & (r_NxL < 1.0 - eps_low)))
  if normalization == 'reliability':
    scale_N = 1.0 - masked_mean(clipped_NxL, mask_NxL, axis=-1)
  elif normalization == 'clip_bias':
    bias_NxL = jnp.abs(r_NxL - jnp.clip(r_NxL, 1.0 - eps_low, 1.0 + eps_high)) * jnp.abs(adv_NxL)
    scale_N = 1.0 / (1.0 + masked_mean(bias_NxL, mask_NxL, axis=-1))
  elif normalization == 'none':
    scale_N = jnp.ones(mask_NxL.shape[:1], jnp.float32)
  else:
    raise ValueError(f'sorl: normalization={normalization!r}; known: {SORL_NORMALIZATIONS}.')
  weights_NxL = _sg(scale_N)[:, None] * mask_NxL
  metrics = ratio_metrics(log_r_NxL, adv_NxL, mask_NxL, eps_low=eps_low, eps_high=eps_high)
  metrics['sorl/weight_mean'] = jnp.mean(scale_N)
  metrics['sorl/turns_mean'] = jnp.mean(jnp.sum(count_NxK > 0, axis=-1, dtype=jnp.float32))
  return loss_NxL, weights_NxL, metrics


def prefix_mixed_ppo(logprobs_NxL, old_logprobs_NxL, advantages_NxL, mask_NxL, *,
                     prefix_mask_NxL, behavior_logprobs_NxL, eps_low: float = 0.2,
                     eps_high: float = 0.2, prefix_eps_low: float | None = None,
                     prefix_eps_high: float | None = None, train_prefix: bool = True,
                     log_ratio_clip: float = 20.0):
  """Mixed-policy rows: off-policy prefix tokens use their own behaviour log-probs.

  Prefix tokens (prefix_mask = 1), sampled from a historical policy π_h, use
  r = π_θ/π_h with π_h's log-probs recorded at generation time (`behavior_logprobs_NxL`);
  continuation tokens use r = π_θ/π_old; both in the PPO-clip surrogate, the prefix with its
  own (e.g. tighter) clip range. `train_prefix=False` drops prefix tokens from the loss
  (PrefixRL, arXiv 2601.18795). SOUP / "Thinking Seeds": arXiv 2601.21476.
  Provenance: our formalisation (paper not available), algorithms.md §15.

  Args:
    prefix_mask_NxL: 1 on prefix tokens from the historical policy.
    behavior_logprobs_NxL: log-probs under the policy that sampled each token (read where
      prefix_mask is 1).
    prefix_eps_low, prefix_eps_high: clip range of prefix tokens (default: eps_low/eps_high).
    train_prefix: whether prefix tokens are in the loss.
    Others: as in `ppo_clip`.

  Returns:
    (loss_NxL, weights_NxL, metrics).
  """
  logprobs_NxL, old_logprobs_NxL, adv_NxL = _inputs(logprobs_NxL, old_logprobs_NxL,
                                                    advantages_NxL, mask_NxL)
  prefix_NxL = prefix_mask_NxL > 0
  base_NxL = jnp.where(prefix_NxL & (mask_NxL > 0), behavior_logprobs_NxL, old_logprobs_NxL)
  low_NxL = jnp.where(prefix_NxL, eps_low if prefix_eps_low is None else prefix_eps_low, eps_low)
  high_NxL = jnp.where(prefix_NxL, eps_high if prefix_eps_high is None else prefix_eps_high,
                       eps_high)
  log_ratio_NxL = _clipped_log_ratio(logprobs_NxL, base_NxL, log_ratio_clip)
  loss_NxL = _clip_surrogate(jnp.exp(log_ratio_NxL), adv_NxL, low_NxL, high_NxL)
  weights_NxL = mask_NxL if train_prefix else jnp.where(prefix_NxL, 0, mask_NxL)
  cont_NxL = jnp.where(prefix_NxL, 0, mask_NxL)
  metrics = ratio_metrics(log_ratio_NxL, adv_NxL, cont_NxL, eps_low=eps_low, eps_high=eps_high)
  on_prefix = ratio_metrics(log_ratio_NxL, adv_NxL, jnp.where(prefix_NxL, mask_NxL, 0),
                            eps_low=low_NxL, eps_high=high_NxL)
  metrics.update({f'prefix/{k}': v for k, v in on_prefix.items()})
  metrics['prefix/token_frac'] = masked_mean(prefix_NxL, mask_NxL)
  return _masked(loss_NxL, weights_NxL), weights_NxL, metrics


def value_loss(values_NxL, old_values_NxL, returns_NxL, mask_NxL, *, clip: float | None = 0.5):
  """PPO's clipped value loss for a critic head, per token.

  ℓ_V = ½ max((V − R)², (clip(V, V_old − ε_v, V_old + ε_v) − R)²), R the GAE returns; clip=None
  is the plain ½ (V − R)². Aggregate it like the policy loss (verl: agg_loss with the same
  loss_agg_mode). Metrics: value/clip_frac (tokens where the clipped term is the larger),
  value/explained_var = 1 − Var(R − V) / Var(R) over valid tokens, value/mean.
  Provenance: as in the reference code of volcengine/verl (`compute_value_loss` in
  verl/trainer/ppo/core_algos.py, itself from TRL's PPO trainer; cliprange_value 0.5).

  Returns:
    (loss_NxL, metrics).
  """
  valid_NxL = mask_NxL > 0
  v_NxL = jnp.where(valid_NxL, values_NxL, 0.0)
  old_NxL = jnp.where(valid_NxL, old_values_NxL, 0.0)
  ret_NxL = jnp.where(valid_NxL, returns_NxL, 0.0)
  plain_NxL = (v_NxL - ret_NxL)**2
  if clip is None:
    loss_NxL, clipped_NxL = plain_NxL, jnp.zeros_like(valid_NxL)
  else:
    clipped_v_NxL = jnp.clip(v_NxL, old_NxL - clip, old_NxL + clip)
    clip_sq_NxL = (clipped_v_NxL - ret_NxL)**2
    loss_NxL, clipped_NxL = jnp.maximum(plain_NxL, clip_sq_NxL), clip_sq_NxL > plain_NxL
  v_sg_NxL, ret_mean = _sg(v_NxL), masked_mean(ret_NxL, mask_NxL)
  err_NxL = ret_NxL - v_sg_NxL
  var_err = masked_mean((err_NxL - masked_mean(err_NxL, mask_NxL))**2, mask_NxL)
  var_ret = masked_mean((ret_NxL - ret_mean)**2, mask_NxL)
  metrics = {'value/clip_frac': masked_mean(clipped_NxL, mask_NxL),
             'value/explained_var': 1.0 - var_err / jnp.maximum(var_ret, 1e-8),
             'value/mean': masked_mean(v_sg_NxL, mask_NxL)}
  return _masked(0.5 * loss_NxL, mask_NxL), metrics


# What the loop can run: its TrainBatch supplies every input these ask for (update.py).
# `is_grpo` is a library function only: its loss weight σ_x/σ̂_x needs the proposal std σ̂ of
# a prompt sampler q ∝ p σ̂ (`is_grpo_prompt_probs`), which the data pipeline does not have.
POLICY_LOSSES: dict[str, Callable] = {
    'ppo_clip': ppo_clip,
    'cispo': cispo,
    'sapo': sapo,
    'gspo': gspo,
    'gspo_token': gspo_token,
    'quatro': trust_region.quatro,
    'quatro_log_target': quatro_variants.quatro_log_target,
    'quatro_dual_ascent': quatro_variants.quatro_dual_ascent,
    'sorl': sorl,
    'prefix_mixed_ppo': prefix_mixed_ppo,
}
LIBRARY_ONLY = {
    'is_grpo': 'needs per-prompt proposal stds from an IS-GRPO prompt sampler (q(x) ∝ p(x) σ̂_x, '
               'losses.is_grpo_prompt_probs), which the data pipeline does not have yet; '
               'losses.is_grpo is a library function until then',
}


def self_normalising(name: str, loss_kwargs=()) -> bool:
  """Whether loss `name` with `loss_kwargs` (pairs or a dict) wants its weights as their own
  normaliser, Σ w ℓ / Σ w over the whole minibatch (SORL's 'reliability' weights): then
  update.train_step divides by the weights' global sum at the current θ, not the mask's."""
  return name == 'sorl' and dict(loss_kwargs).get('normalization', 'reliability') == 'reliability'


def get_policy_loss(name: str) -> Callable:
  """The policy loss registered under `name`; raises listing the known names."""
  if name not in POLICY_LOSSES:
    raise KeyError(f'Unknown policy loss {name!r}; known: {sorted(POLICY_LOSSES)}.')
  return POLICY_LOSSES[name]
