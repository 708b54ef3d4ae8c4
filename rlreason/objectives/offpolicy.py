"""Off-policy corrections from the sampler's log-probs, and the learner-vs-sampler metrics.

Three policies meet in an update (the vocabulary of verl's rollout correction and AReaL):

  learner    π_θ      logprobs_NxL: the params being trained, the only input with a gradient;
  proximal   π_prox   proximal_logprobs_NxL: the learner's params when the batch was formed
                      (TrainBatch.old_logprobs_NxL), which every policy loss takes its ratio
                      against;
  behaviour  μ        behaviour_logprobs_NxL: the distribution that sampled each token (the
                      sampler's top-k/top-p, stale params, a recorded prefix).

Every correction is a pure function of ρ = π_prox/μ per valid token,

  weights_NxL, metrics = fn(logprobs_NxL, proximal_logprobs_NxL, behaviour_logprobs_NxL,
                            mask_NxL, *, <options>)

with stop-gradient weights (0 on padding and on dropped tokens) that multiply a policy loss's
per-token loss (update.loss_fn). The learner's log-probs are in the signature for uniformity
and enter no weight; `mismatch_metrics` compares them with the behaviour's.

  tis_token      w = min(ρ_t, C)                                  truncated IS (verl)
  tis_sequence   w = min(Π_t ρ_t, C), one weight per sequence      truncated IS (verl)
  mask_token     w = ρ_t·1[a ≤ ρ_t ≤ b]  (or 1[…] alone)            IcePop / MIS
  mask_sequence  w = 1[a ≤ (Π_t ρ_t)^(1/|y|) ≤ b]  (geometric)     MIS, verl 'geometric'
  decoupled_ppo  w = ρ_t·1[ρ_t ≤ cap]  (cap optional)               AReaL

Why the loss and not the aggregation weights: aggregation.py divides by Σ_t weights per row in
seq_mean_token_mean, where a per-sequence weight would cancel; on the loss it survives every
mode. The global denominators stay those of the loss mask, so a dropped token counts as a
zero-loss token (IcePop's 1/Σ|y_i|, AReaL's loss_mask_count); verl and slime instead take
rejected tokens out of the denominator, which needs the corrected mask before micro-batching.

Decoupled PPO (Hilton et al. arXiv 2110.00641; AReaL arXiv 2505.24298) is ppo_clip — whose
ratio is π_θ/π_prox because the loop's old log-probs are the proximal policy — times the
`decoupled_ppo` weight; with π_prox = μ every weight is exactly 1 and it is plain PPO-clip.

Deliberately not here: policy versions (rollouts do not record them yet, so
`staleness_histogram` takes them as an argument and the train step cannot log it), and
removing dropped tokens from the denominators (see above).
"""

from collections.abc import Callable
import inspect
import math

import jax
import jax.numpy as jnp

from rlreason.objectives import kl
from rlreason.objectives.aggregation import masked_mean

_sg = jax.lax.stop_gradient
# |log ρ| bound before exp: verl's SAFETY_BOUND (rollout_corr_helper.py), e^20 ≈ 4.9e8.
_LOG_RATIO_BOUND = 20.0


def _log_ratio(proximal_logprobs_NxL, behaviour_logprobs_NxL, mask_NxL):
  """log ρ = lp_prox − lp_behaviour on valid tokens, 0 elsewhere, without gradient.

  Padding may hold −inf or NaN: it is replaced before the subtraction (as losses._inputs).
  """
  valid_NxL = mask_NxL > 0
  prox_NxL = jnp.where(valid_NxL, _sg(proximal_logprobs_NxL), 0.0)
  behaviour_NxL = jnp.where(valid_NxL, _sg(behaviour_logprobs_NxL), 0.0)
  return prox_NxL - behaviour_NxL


def _log(x: float) -> float:
  return math.log(x) if x > 0 else -math.inf


def effective_sample_size(weights_NxL, mask_NxL):
  """Normalised ESS = (Σ w)² / (n Σ w²) over the n valid tokens; 1 for equal weights, 0 if all
  are 0. Kish's effective sample size divided by n (verl logs 1 / mean((w / mean w)²), the
  same number)."""
  valid_NxL = mask_NxL > 0
  w_NxL = jnp.where(valid_NxL, weights_NxL, 0.0)
  n = jnp.sum(valid_NxL, dtype=jnp.float32)
  sum_sq = jnp.sum(w_NxL * w_NxL)
  return jnp.where(sum_sq > 0, jnp.sum(w_NxL)**2 / jnp.where(sum_sq > 0, n * sum_sq, 1.0), 0.0)


def _weight_metrics(weights_NxL, mask_NxL):
  return {'offpolicy/weight_mean': masked_mean(weights_NxL, mask_NxL),
          'offpolicy/ess': effective_sample_size(weights_NxL, mask_NxL)}


def tis_token(logprobs_NxL, proximal_logprobs_NxL, behaviour_logprobs_NxL, mask_NxL, *,
              cap: float = 2.0):
  """Token-level truncated importance sampling: w_t = sg(min(π_prox/μ, C)).

  Biased (it ignores the prefix's ratio) but low-variance; C = 2 is verl's default
  rollout_is_threshold. `offpolicy/capped_frac`: valid tokens with ρ > C (ρ = C is kept).
  Provenance: as in the reference code of volcengine/verl (`compute_rollout_correction_weights`
  with rollout_is='token', verl/trainer/ppo/rollout_corr_helper.py; docs/algo/rollout_corr_math.md
  §3.3.1), TIS from Yao et al., "Your efficient RL framework secretly brings you off-policy RL
  training" (2025).

  Returns:
    (weights_NxL, metrics).
  """
  del logprobs_NxL
  _raise_on_errors('tis_token', cap=cap)
  log_rho_NxL = _log_ratio(proximal_logprobs_NxL, behaviour_logprobs_NxL, mask_NxL)
  log_w_NxL = jnp.minimum(jnp.clip(log_rho_NxL, -_LOG_RATIO_BOUND, _LOG_RATIO_BOUND), _log(cap))
  weights_NxL = jnp.where(mask_NxL > 0, jnp.exp(log_w_NxL), 0.0)
  metrics = _weight_metrics(weights_NxL, mask_NxL)
  metrics['offpolicy/capped_frac'] = masked_mean(log_rho_NxL > _log(cap), mask_NxL)
  return weights_NxL, metrics


def _sequence_rows(mask_NxL):
  """1 per row with a valid token: sequence-level fractions count those rows only."""
  return (jnp.sum(mask_NxL > 0, axis=-1) > 0).astype(jnp.float32)


def tis_sequence(logprobs_NxL, proximal_logprobs_NxL, behaviour_logprobs_NxL, mask_NxL, *,
                 cap: float = 2.0):
  """Sequence-level truncated IS: w_i = sg(min(Π_t ρ_{i,t}, C)) on every valid token of row i.

  Computed in log space: min(Σ_t M log ρ, log C), then exp; Σ log ρ is bounded to ±20 before
  exp as in verl. Unbiased up to the truncation, high variance on long sequences.
  `offpolicy/capped_frac`: sequences whose product exceeds C.
  Provenance: as in the reference code of volcengine/verl (`compute_rollout_correction_weights`
  with rollout_is='sequence'; docs/algo/rollout_corr_math.md §3.3.2).

  Returns:
    (weights_NxL, metrics).
  """
  del logprobs_NxL
  _raise_on_errors('tis_sequence', cap=cap)
  log_rho_NxL = _log_ratio(proximal_logprobs_NxL, behaviour_logprobs_NxL, mask_NxL)
  log_prod_N = jnp.sum(log_rho_NxL, axis=-1)  # Padding is 0 in log ρ.
  log_w_N = jnp.minimum(jnp.clip(log_prod_N, -_LOG_RATIO_BOUND, _LOG_RATIO_BOUND), _log(cap))
  weights_NxL = jnp.where(mask_NxL > 0, jnp.exp(log_w_N)[:, None], 0.0)
  metrics = _weight_metrics(weights_NxL, mask_NxL)
  metrics['offpolicy/capped_frac'] = masked_mean(log_prod_N > _log(cap), _sequence_rows(mask_NxL))
  return weights_NxL, metrics


def mask_token(logprobs_NxL, proximal_logprobs_NxL, behaviour_logprobs_NxL, mask_NxL, *,
               low: float = 0.5, high: float = 5.0, importance_weight: bool = True):
  """Token masking (IcePop / MIS): w_t = sg(ρ_t·1[a ≤ ρ_t ≤ b]), or sg(1[a ≤ ρ_t ≤ b]).

  IcePop's M(k; α, β) = k inside [α, β] and 0 outside, with k the training engine's over the
  inference engine's probability of the token under the same (old) params — ρ here; tokens
  outside are dropped, not clipped. importance_weight=False keeps only the mask (verl's
  token-level rejection sampling, rollout_rs='token'). Bounds are inclusive and tested in log
  space; a = 0 removes the lower bound. Defaults [0.5, 5]: IcePop's (Ring-1T report).
  `offpolicy/dropped_frac`: valid tokens outside [a, b].
  Provenance: IcePop's formula and defaults (Ling Team, arXiv 2510.18855) as quoted by its ports
  (areal-project/AReaL PR #1405, rllm-org/rllm PR #741, PrimeIntellect-ai/prime-rl PR #2401);
  the paper itself was not read. The unweighted variant as in the reference code of
  volcengine/verl (`compute_rollout_rejection_mask`, rollout_rs='token').

  Returns:
    (weights_NxL, metrics).
  """
  del logprobs_NxL
  _raise_on_errors('mask_token', low=low, high=high)
  log_rho_NxL = _log_ratio(proximal_logprobs_NxL, behaviour_logprobs_NxL, mask_NxL)
  keep_NxL = (log_rho_NxL >= _log(low)) & (log_rho_NxL <= _log(high)) & (mask_NxL > 0)
  # Inside the interval log ρ ≤ log b, so the exp cannot overflow.
  rho_NxL = jnp.exp(jnp.where(keep_NxL, log_rho_NxL, 0.0)) if importance_weight else 1.0
  weights_NxL = jnp.where(keep_NxL, rho_NxL, 0.0)
  metrics = _weight_metrics(weights_NxL, mask_NxL)
  metrics['offpolicy/dropped_frac'] = masked_mean(~keep_NxL, mask_NxL)
  return weights_NxL, metrics


def mask_sequence(logprobs_NxL, proximal_logprobs_NxL, behaviour_logprobs_NxL, mask_NxL, *,
                  low: float = 1 / 1.001, high: float = 1.001):
  """Sequence masking on the geometric-mean ratio: w_i = sg(1[a ≤ exp(mean_t log ρ_it) ≤ b]).

  The geometric mean, not the product: the product's spread grows with length (ρ = 1.01 per
  token is 2.7 over 100 tokens), so one interval on it rejects long sequences for the same
  per-token mismatch; the geometric mean is length-normalised (GSPO's ratio), so [a, b] bounds
  the average per-token log-ratio whatever the length. It is a rejection test, not a
  reweighting: kept sequences get weight 1 (combine with TIS for both). Defaults: verl's
  geo_rs preset (b = 1.001, a = 1/b). `offpolicy/dropped_frac` counts valid tokens,
  `offpolicy/seq_dropped_frac` sequences.
  Provenance: as in the reference code of volcengine/verl (`compute_rollout_rejection_mask`
  with rollout_rs='geometric'; docs/algo/rollout_corr_math.md §3.3.3).

  Returns:
    (weights_NxL, metrics).
  """
  del logprobs_NxL
  _raise_on_errors('mask_sequence', low=low, high=high)
  log_rho_NxL = _log_ratio(proximal_logprobs_NxL, behaviour_logprobs_NxL, mask_NxL)
  log_geo_N = masked_mean(log_rho_NxL, mask_NxL, axis=-1)
  keep_N = (log_geo_N >= _log(low)) & (log_geo_N <= _log(high))
  keep_NxL = keep_N[:, None] & (mask_NxL > 0)
  weights_NxL = keep_NxL.astype(jnp.float32)
  metrics = _weight_metrics(weights_NxL, mask_NxL)
  metrics['offpolicy/dropped_frac'] = masked_mean(~keep_NxL, mask_NxL)
  metrics['offpolicy/seq_dropped_frac'] = masked_mean(~keep_N, _sequence_rows(mask_NxL))
  return weights_NxL, metrics


def decoupled_ppo(logprobs_NxL, proximal_logprobs_NxL, behaviour_logprobs_NxL, mask_NxL, *,
                  cap: float | None = None):
  """Decoupled PPO's behaviour weight: w_t = sg(π_prox/μ), tokens with ρ_t > cap dropped.

  With ppo_clip (ratio π_θ/π_prox, the loop's old log-probs being the proximal policy) the
  per-token loss is −w_t·min(r A, clip(r, 1 − ε_low, 1 + ε_high) A), AReaL's decoupled
  objective; with π_prox = μ, w = 1 exactly. AReaL's cap *drops* tokens above it (weight 0);
  for truncation to C use `tis_token`. Departure: log ρ is bounded to ±20 before exp (AReaL
  does not bound it).
  Provenance: as in the reference code of inclusionAI/AReaL (`ppo_actor_loss_fn`,
  areal/utils/functional.py: behav_imp_weight = exp(proximal − old), masked where it exceeds
  behav_imp_weight_cap, which must be > 1); the AReaL paper (arXiv 2505.24298) and Hilton et
  al. (arXiv 2110.00641) were not read here, verl's rollout_corr_math.md §1.3 states the same
  objective.

  Returns:
    (weights_NxL, metrics).
  """
  del logprobs_NxL
  _raise_on_errors('decoupled_ppo', cap=cap)
  log_rho_NxL = _log_ratio(proximal_logprobs_NxL, behaviour_logprobs_NxL, mask_NxL)
  keep_NxL = mask_NxL > 0
  if cap is not None:
    keep_NxL &= log_rho_NxL <= _log(cap)
  rho_NxL = jnp.exp(jnp.clip(log_rho_NxL, -_LOG_RATIO_BOUND, _LOG_RATIO_BOUND))
  weights_NxL = jnp.where(keep_NxL, rho_NxL, 0.0)
  metrics = _weight_metrics(weights_NxL, mask_NxL)
  metrics['offpolicy/dropped_frac'] = masked_mean(~keep_NxL, mask_NxL)
  return weights_NxL, metrics


CORRECTIONS: dict[str, Callable] = {
    'tis_token': tis_token,
    'tis_sequence': tis_sequence,
    'mask_token': mask_token,
    'mask_sequence': mask_sequence,
    'decoupled_ppo': decoupled_ppo,
}


def get_correction(name: str) -> Callable:
  """The correction registered under `name`; raises listing the known names."""
  if name not in CORRECTIONS:
    raise KeyError(f'Unknown off-policy correction {name!r}; known: {sorted(CORRECTIONS)}.')
  return CORRECTIONS[name]


def option_errors(name: str, options: dict) -> list[str]:
  """What is wrong with a correction's options, as 'field=value must …' sentences.

  Caps must be > 0 (decoupled_ppo's > 1, AReaL's rule: a cap ≤ 1 drops on-policy tokens);
  intervals must satisfy 0 ≤ a < b and contain 1 (on-policy tokens have ρ = 1). Unknown names
  and options are config.validate's (`_options_of`).
  """
  errors = []
  cap = options.get('cap')
  if name in ('tis_token', 'tis_sequence') and 'cap' in options and not _positive(cap):
    errors.append(f'cap={cap!r} must be a number > 0 (the truncation C of min(ρ, C)).')
  if name == 'decoupled_ppo' and cap is not None and not (_number(cap) and cap > 1):
    errors.append(f'cap={cap!r} must be None or a number > 1 (tokens with ρ > cap are dropped, '
                  'so a cap <= 1 drops on-policy tokens).')
  if name in ('mask_token', 'mask_sequence'):
    fn = CORRECTIONS[name]
    low = options.get('low', _default(fn, 'low'))
    high = options.get('high', _default(fn, 'high'))
    if not (_number(low) and _number(high)):
      errors.append(f'low={low!r}, high={high!r} must be numbers.')
    elif not 0 <= low < high:
      errors.append(f'low={low}, high={high} must satisfy 0 <= low < high (the interval of '
                    'kept ratios).')
    elif not low <= 1 <= high:
      errors.append(f'low={low}, high={high} must contain 1 (on-policy tokens have ratio 1).')
  if name == 'mask_token' and not isinstance(options.get('importance_weight', True), bool):
    errors.append(f"importance_weight={options['importance_weight']!r} must be True or False.")
  return errors


def _number(x) -> bool:
  return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


def _positive(x) -> bool:
  return _number(x) and x > 0


def _default(fn, name):
  return inspect.signature(fn).parameters[name].default


def _raise_on_errors(name: str, **options) -> None:
  errors = option_errors(name, options)
  if errors:
    raise ValueError(f'{name}: ' + ' '.join(errors))


def mismatch_metrics(logprobs_NxL, proximal_logprobs_NxL, behaviour_logprobs_NxL, mask_NxL):
  """How far the sampler is from the learner, over valid tokens (no gradient).

    offpolicy/abs_logprob_diff  mean |lp_behaviour − lp_learner|
    offpolicy/kl_k3             k3 estimate of KL(μ ‖ π_θ) from μ's samples: mean of
                                e^u − u − 1, u = lp_learner − lp_behaviour (kl.k3: u bounded
                                to ±20, the value to ±10)
    offpolicy/ratio_ess         normalised ESS of the untruncated ρ = π_prox/μ (what an
                                uncorrected batch would be worth under importance sampling)

  Provenance: the k3 form as in the reference code of volcengine/verl
  (`compute_offpolicy_metrics`, which measures it between the proximal and rollout policies).
  """
  valid_NxL = mask_NxL > 0
  learner_NxL = jnp.where(valid_NxL, _sg(logprobs_NxL), 0.0)
  behaviour_NxL = jnp.where(valid_NxL, _sg(behaviour_logprobs_NxL), 0.0)
  log_rho_NxL = _log_ratio(proximal_logprobs_NxL, behaviour_logprobs_NxL, mask_NxL)
  rho_NxL = jnp.exp(jnp.clip(log_rho_NxL, -_LOG_RATIO_BOUND, _LOG_RATIO_BOUND))
  return {
      'offpolicy/abs_logprob_diff': masked_mean(jnp.abs(behaviour_NxL - learner_NxL), mask_NxL),
      'offpolicy/kl_k3': masked_mean(kl.k3(behaviour_NxL, learner_NxL), mask_NxL),
      'offpolicy/ratio_ess': effective_sample_size(rho_NxL, mask_NxL),
  }


def staleness_histogram(policy_version, *, learner_step, max_staleness: int, mask=None):
  """Counts of valid entries per staleness s = learner_step − version, s = 0..K.

  `policy_version` holds the step whose params sampled each token (NxL) or sequence (N);
  entries with s < 0 or s > K are not counted (`staleness_metrics` reports them).

  Returns:
    int32 counts of shape (K + 1,).
  """
  valid = (jnp.ones(jnp.shape(policy_version), bool) if mask is None else mask > 0)
  staleness = learner_step - policy_version
  hits = (staleness[..., None] == jnp.arange(max_staleness + 1)) & valid[..., None]
  return jnp.sum(hits.reshape(-1, max_staleness + 1), axis=0, dtype=jnp.int32)


def staleness_metrics(policy_version, *, learner_step, max_staleness: int, mask=None):
  """`offpolicy/staleness/<s>` counts for s = 0..K and `offpolicy/staleness/out_of_range`
  (versions newer than the learner, or older than K steps: a scheduling bug in async runs)."""
  counts = staleness_histogram(policy_version, learner_step=learner_step,
                               max_staleness=max_staleness, mask=mask)
  valid = (jnp.ones(jnp.shape(policy_version), bool) if mask is None else mask > 0)
  metrics = {f'offpolicy/staleness/{s}': counts[s] for s in range(max_staleness + 1)}
  metrics['offpolicy/staleness/out_of_range'] = jnp.sum(valid, dtype=jnp.int32) - counts.sum()
  return metrics
