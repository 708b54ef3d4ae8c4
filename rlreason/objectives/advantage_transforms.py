"""What happens to rewards and advantages around an estimator, plus the analysis behind it.

Three kinds of pure, jittable functions on `_BxG` arrays (B prompts x G samples):
  * advantage transforms, applied to an estimator's output before the loss and registered in
    `TRANSFORMS`: F-GRPO's focal scaling, A-GRAE's difficulty focus with asymmetric
    suppression, IFPO's inverse-frequency mode weights;
  * reward/data operators, applied before the estimator: DAPO's group filter for dynamic
    sampling and its overlong length shaping, HAPO's gate (v1's posterior mean, or the sampled
    and confidence forms), teacher injection and threshold schedule;
  * analysis helpers: F-GRPO's tail-miss probability and the Beta-Binomial posterior
    quantities HAPO's gate needs.

Deliberately not here: the estimators (advantages.py), losses (losses.py), the sampling loop
that refills a batch after DAPO's filter (train.py; `dapo_group_filter` only returns a mask),
and the loss-side treatment of HAPO's teacher tokens, which belongs to the host mixed-policy
objective (algorithms.md §12, §22.5): `hapo_replace` only says which rows were injected.
"""

from typing import Callable

import jax
import jax.numpy as jnp

Array = jax.Array


def success_rate(rewards_BxG: Array, *, r_correct: float = 1.0, r_wrong: float = 0.0) -> Array:
  """Per-prompt success rate µ̂ = (mean_i R_i - R_w) / (R_c - R_w) in [0, 1] (arXiv 2602.06717).

  Defined so that 0/1 and ±1 rewards give the same value (F-GRPO eq. 14); for rewards already
  in [0, 1] with r_wrong=0, r_correct=1 it is the group's mean reward.
  Provenance: paper formula.
  """
  mean_B = jnp.mean(jnp.asarray(rewards_BxG, jnp.float32), -1)
  return jnp.clip((mean_B - r_wrong) / (r_correct - r_wrong), 0.0, 1.0)


def focal_scale(advantages_BxG: Array, rewards_BxG: Array, *, gamma: float = 0.5,
                r_correct: float = 1.0, r_wrong: float = 0.0) -> Array:
  """F-GRPO focal scaling (arXiv 2602.06717, eq. 14-16).

  Â^F_i = (1 - µ̂(x))^γ Â_i, one detached weight per prompt that down-weights prompts the
  policy already solves; γ = 0 is the identity, all-correct/all-wrong groups stay 0. Apply it
  to the std-normalised GRPO (or DAPO/CISPO) advantage. Default γ = 0.5 (the value the paper
  selected most often, algorithms.md §11c).
  Provenance: paper formula.
  """
  mu_B = success_rate(rewards_BxG, r_correct=r_correct, r_wrong=r_wrong)
  weight_Bx1 = jax.lax.stop_gradient(jnp.power(1.0 - mu_B, gamma))[:, None]
  return weight_Bx1 * advantages_BxG


def a_grae(advantages_BxG: Array, rewards_BxG: Array, *, alpha: float = 1.0, eps: float = 1e-6,
           batch_accuracy: Array | float | None = None, r_correct: float = 1.0,
           r_wrong: float = 0.0) -> Array:
  """A-GRAE: difficulty focus shifted by batch accuracy, positives suppressed (arXiv 2602.05548).

  With µ_x the prompt's success rate, s = sqrt(µ_x) and µ̄ the batch accuracy:
    E_i = ½ Â_i / (1 - s + eps)  (easy focus),   H_i = ½ Â_i / (s + eps)  (hard focus),
    A_i = (1 - µ̄) E_i + µ̄ H_i,   then A_i <- A_i min(1, µ̄/α) where A_i > 0.
  Low batch accuracy early in training favours easy prompts, high accuracy later hard ones;
  positive advantages are suppressed until µ̄ reaches α (α = 1 for maths, 0.5 for geometry
  and medical per the authors' code comment).
  Provenance: as in the reference code of HKU-HealthAI/A-GRAE (`compute_grpo_outcome_advantage`,
  the copy read here is Yu7-code/A-GRAE). Two deliberate differences: the formula always applies,
  whereas the released trainer anneals `grpo_weight` from step 1 and gates the branch on
  `grpo_weight == 2.0`, so it never runs; and µ_x is the reward mean mapped to [0, 1] through
  r_wrong/r_correct (the code takes sqrt of the raw mean, NaN for ±1 rewards).

  Args:
    advantages_BxG: group-relative advantages Â (GRPO's, or Dr. GRPO's centred ones).
    rewards_BxG: the rewards Â was computed from.
    alpha: accuracy at which positive advantages stop being suppressed.
    eps: keeps the focus terms finite at µ_x ∈ {0, 1} (where Â is 0 anyway).
    batch_accuracy: µ̄; None uses the mean of µ_x over the B prompts given.
    r_correct: reward of a correct response.
    r_wrong: reward of a wrong response.
  """
  mu_Bx1 = success_rate(rewards_BxG, r_correct=r_correct, r_wrong=r_wrong)[:, None]
  mu_bar = (jnp.mean(mu_Bx1) if batch_accuracy is None
            else jnp.asarray(batch_accuracy, jnp.float32))
  root_Bx1 = jnp.sqrt(mu_Bx1)
  # Floored so that eps=0 stays NaN-free: µ_x ∈ {0, 1} only occurs where Â is exactly 0.
  tiny = jnp.finfo(jnp.float32).tiny
  easy_BxG = 0.5 * advantages_BxG / jnp.maximum(1.0 - root_Bx1 + eps, tiny)
  hard_BxG = 0.5 * advantages_BxG / jnp.maximum(root_Bx1 + eps, tiny)
  mixed_BxG = (1.0 - mu_bar) * easy_BxG + mu_bar * hard_BxG
  damping = jnp.minimum(1.0, mu_bar / alpha)
  suppressed_BxG = jnp.where(mixed_BxG > 0, mixed_BxG * damping, mixed_BxG)
  return jax.lax.stop_gradient(suppressed_BxG)


def ifpo_weights(modes_BxG: Array, *, num_modes: int, per_group: bool = True) -> Array:
  """IFPO inverse-frequency weights by behaviour mode (ASCL, arXiv 2602.13562).

  w_i = n / (K_present n_{m(i)}): n_m responses in mode m (e.g. 0 = answered directly,
  1 = consulted the rules), n of them in all, K_present modes present; every present mode
  then carries the same total weight, balanced counts give w = 1, and a group with a single
  mode gets w = 1. Counted per group, or over the batch with per_group=False (open question).
  Provenance: our formalisation (paper not available).
  """
  modes_BxG = jnp.asarray(modes_BxG)
  onehot_BxGxK = modes_BxG[..., None] == jnp.arange(num_modes)
  if per_group:
    counts_Bx1xK = jnp.sum(onehot_BxGxK, 1, keepdims=True)
    total = modes_BxG.shape[-1]
  else:
    counts_Bx1xK = jnp.sum(onehot_BxGxK, (0, 1), keepdims=True)
    total = modes_BxG.size
  present_Bx1 = jnp.sum(counts_Bx1xK > 0, -1)
  own_count_BxG = jnp.sum(onehot_BxGxK * counts_Bx1xK, -1)
  # A mode id outside [0, num_modes) has no count; it keeps weight 1 rather than dividing by 0.
  weights_BxG = jnp.where(own_count_BxG > 0,
                          total / (present_Bx1 * jnp.maximum(own_count_BxG, 1)), 1.0)
  return jax.lax.stop_gradient(weights_BxG.astype(jnp.float32))


def ifpo(advantages_BxG: Array, modes_BxG: Array, *, num_modes: int,
         per_group: bool = True) -> Array:
  """IFPO: A'_i = w_{m(i)} A_i, weights from `ifpo_weights` (ASCL, arXiv 2602.13562).

  Counteracts the drift toward the behaviour mode the group samples most often. In the loop
  the modes come from the task's `behaviour_mode` (rl_batch.Scores.modes_BxG), never the rewards.
  Provenance: our formalisation (paper not available).
  """
  return ifpo_weights(modes_BxG, num_modes=num_modes, per_group=per_group) * advantages_BxG


def dapo_group_filter(accuracy_BxG: Array) -> Array:
  """DAPO dynamic-sampling filter (arXiv 2503.14476): keep prompt x iff 0 < #correct < G.

  Pass the accuracy metric, not the shaped score: a group that differs only through the
  overlong penalty has no outcome signal and must be dropped. Generally, a group is kept iff
  its metric is not constant; a singleton group is kept, as in verl (it cannot be mixed).
  Returns keep_B (bool); refilling the batch with more prompts is the caller's loop.
  Provenance: paper formula.
  """
  accuracy_BxG = jnp.asarray(accuracy_BxG)
  if accuracy_BxG.shape[-1] == 1:
    return jnp.ones(accuracy_BxG.shape[:1], bool)
  return jnp.max(accuracy_BxG, -1) != jnp.min(accuracy_BxG, -1)


def dapo_overlong_penalty(lengths: Array, *, max_length: int, cache_length: int,
                          penalty_factor: float = 1.0) -> Array:
  """DAPO soft overlong punishment (arXiv 2503.14476), added to the correctness reward.

  R_len(|y|) = 0 if |y| <= L_max - L_cache; ((L_max - L_cache) - |y|) / L_cache up to L_max;
  -1 beyond; times `penalty_factor` (verl's knob, 1 in the paper). verl does not clip at -1
  beyond L_max, which only matters if generation is not capped at L_max.
  Provenance: paper formula.
  """
  soft_limit = max_length - cache_length
  ramp = (soft_limit - jnp.asarray(lengths, jnp.float32)) / cache_length
  return penalty_factor * jnp.clip(ramp, -1.0, 0.0)


def beta_posterior(successes: Array, failures: Array, *, alpha0: float = 1.0,
                   beta0: float = 1.0) -> tuple[Array, Array]:
  """Beta-Binomial posterior Beta(α0 + s, β0 + f) of HAPO's gate (arXiv 2603.11321).

  The posterior of a prompt's success probability after s successes and f failures under a
  Beta(α0, β0) prior (optionally with s, f accumulated over epochs by the caller).
  Provenance: our formalisation (paper not available).
  """
  return (alpha0 + jnp.asarray(successes, jnp.float32),
          beta0 + jnp.asarray(failures, jnp.float32))


def beta_mean(a: Array, b: Array) -> Array:
  """E[p] = a / (a + b) for p ~ Beta(a, b) (HAPO's posterior, arXiv 2603.11321).

  Provenance: our formalisation (paper not available).
  """
  return a / (a + b)


def beta_variance(a: Array, b: Array) -> Array:
  """Var[p] = ab / ((a + b)^2 (a + b + 1)) for p ~ Beta(a, b) (HAPO, arXiv 2603.11321).

  Provenance: our formalisation (paper not available).
  """
  return a * b / ((a + b)**2 * (a + b + 1.0))


def beta_cdf(x: Array, a: Array, b: Array) -> Array:
  """P(p <= x) = I_x(a, b), the regularised incomplete beta function (HAPO, arXiv 2603.11321).

  Provenance: our formalisation (paper not available).
  """
  return jax.scipy.special.betainc(a, b, jnp.clip(jnp.asarray(x, jnp.float32), 0.0, 1.0))


def beta_quantile(q: Array, a: Array, b: Array, *, num_iters: int = 64) -> Array:
  """The x with I_x(a, b) = q, by bisection on [0, 1] (HAPO's confidence bound, arXiv 2603.11321).

  64 halvings leave a bracket narrower than 1e-19; jittable, vectorised over q, a, b.
  Provenance: our formalisation (paper not available).
  """
  q, a, b = jnp.broadcast_arrays(*(jnp.asarray(v, jnp.float32) for v in (q, a, b)))

  def halve(_, bracket):
    lo, hi = bracket
    mid = 0.5 * (lo + hi)
    below = beta_cdf(mid, a, b) < q
    return jnp.where(below, mid, lo), jnp.where(below, hi, mid)

  lo, hi = jax.lax.fori_loop(0, num_iters, halve, (jnp.zeros_like(q), jnp.ones_like(q)))
  return 0.5 * (lo + hi)


def hapo_gate_probability(successes_B: Array, failures_B: Array, *, threshold: Array | float,
                          alpha0: float = 1.0, beta0: float = 1.0) -> Array:
  """Probability that HAPO's Thompson gate opens (arXiv 2603.11321).

  P(open) = P(p̃ < τ) = I_τ(α0 + s, β0 + f) for a group with at least one failure, else 0.
  With α0 = β0 = 1 and an all-fail group of G it is 1 - (1 - τ)^{G+1}.
  Provenance: our formalisation (paper not available).
  """
  a_B, b_B = beta_posterior(successes_B, failures_B, alpha0=alpha0, beta0=beta0)
  return jnp.where(jnp.asarray(failures_B) > 0, beta_cdf(threshold, a_B, b_B), 0.0)


HAPO_GATES = ('posterior_mean', 'thompson', 'confidence')


def hapo_gate(successes_B: Array, failures_B: Array, *, threshold: Array | float,
              gate: str = 'posterior_mean', key: Array | None = None,
              confidence: float | None = None, alpha0: float = 1.0, beta0: float = 1.0,
              require_all_fail: bool = False) -> Array:
  """HAPO's Beta-Binomial confidence gate for teacher injection (arXiv 2603.11321).

  gate='posterior_mean' (v1, the default): open iff the posterior mean of the group's success
    probability is below γ = `threshold`: (α0 + s) / (α0 + β0 + s + f) < γ, i.e. with the
    Beta(1, 1) prior (1 + S) / (N + 2) < γ. With γ = 0.8 and N = 8 it opens for S <= 6, so
    mixed groups get a teacher too, not only all-fail ones. Deterministic: no key.
  gate='thompson' [I, v2]: draw p̃ ~ Beta(α0 + s, β0 + f) per prompt (pass `key`), open iff
    p̃ < τ. Sampled by inversion, p̃ = F⁻¹(u) with u ~ U(0, 1), so the event p̃ < τ is
    u < F(τ): the same decision in distribution, without a gamma sampler or a quantile.
  gate='confidence' [I]: open iff P(p < τ | s, f) >= `confidence`, i.e. iff the
    `confidence`-quantile of the posterior is below τ.
  Every form stays shut for a group without a failure (there is nothing to replace: our
  rule, which v1's gate only needs for N <= 2, e.g. N = 2, S = 2 gives 3/4 < 0.8), and with
  `require_all_fail` only all-fail groups open. τ may come from `hapo_threshold`.
  Provenance: 'posterior_mean' as v1 is described by a third-party reading of
  2603.11321v1 §3.2 (algorithms.md §12); 'thompson' and 'confidence' are our formalisation
  of v2's abstract (paper not available).

  Returns:
    open_B (bool).
  """
  if gate not in HAPO_GATES:
    raise ValueError(f'hapo_gate: gate={gate!r}; known: {HAPO_GATES}.')
  if (key is not None) != (gate == 'thompson'):
    raise ValueError(f"hapo_gate: gate='thompson' needs key, and only it takes one "
                     f'(gate={gate!r}).')
  if (confidence is not None) != (gate == 'confidence'):
    raise ValueError(f"hapo_gate: gate='confidence' needs confidence, and only it takes one "
                     f'(gate={gate!r}).')
  a_B, b_B = beta_posterior(successes_B, failures_B, alpha0=alpha0, beta0=beta0)
  if gate == 'posterior_mean':
    open_B = beta_mean(a_B, b_B) < threshold
  else:
    cdf_B = beta_cdf(threshold, a_B, b_B)
    if gate == 'thompson':
      open_B = jax.random.uniform(key, cdf_B.shape) < cdf_B
    else:
      open_B = cdf_B >= confidence
  open_B &= jnp.asarray(failures_B) > 0
  if require_all_fail:
    open_B &= jnp.asarray(successes_B) == 0
  return open_B


def hapo_threshold(step: Array | int, *, initial: float, anneal_steps: int) -> Array:
  """HAPO's gate threshold: fixed (v1, anneal_steps = 0) or annealed to zero [I, v2].

  anneal_steps = 0: τ_t = τ_0 (v1's fixed γ). anneal_steps = T_a > 0:
  τ_t = τ_0 max(0, 1 - t / T_a), so from step T_a on the gate never opens and training is
  purely on-policy. Linear is our choice; v2's "adaptive threshold annealing" is not known.
  Provenance: v1's fixed γ per algorithms.md §12; the annealed form is our formalisation.
  """
  if not anneal_steps:
    return jnp.asarray(initial, jnp.float32)
  return initial * jnp.clip(1.0 - jnp.asarray(step, jnp.float32) / anneal_steps, 0.0, 1.0)


def hapo_replace(key: Array, rewards_BxG: Array, open_B: Array, *,
                 teacher_reward: float = 1.0) -> tuple[Array, Array]:
  """HAPO's Synthetic Success Injection of a teacher trajectory (arXiv 2603.11321).

  In each group whose gate is open and whose lowest reward is below `teacher_reward`, the
  argmin-reward rollout (ties broken uniformly at random with `key`) is replaced by the
  verified teacher trajectory, whose reward is `teacher_reward`; advantages are then computed
  as usual. The caller swaps the tokens and must route the injected rows to the host
  method's off-policy treatment (their lp_old is not a behaviour log-prob).
  Provenance: our formalisation (paper not available).

  Returns:
    (rewards_BxG with the teacher's reward in the injected slots, injected_BxG (bool)).
  """
  rewards_BxG = jnp.asarray(rewards_BxG, jnp.float32)
  lowest_Bx1 = jnp.min(rewards_BxG, -1, keepdims=True)
  tiebreak_BxG = jax.random.uniform(key, rewards_BxG.shape)
  pick_B = jnp.argmax(jnp.where(rewards_BxG == lowest_Bx1, tiebreak_BxG, -1.0), -1)
  injectable_Bx1 = (jnp.asarray(open_B) & (lowest_Bx1[:, 0] < teacher_reward))[:, None]
  injected_BxG = (jnp.arange(rewards_BxG.shape[-1]) == pick_B[:, None]) & injectable_Bx1
  return jnp.where(injected_BxG, teacher_reward, rewards_BxG), injected_BxG


def tail_miss_probability(group_size: Array | int, *, mu: Array | float,
                          tau: Array | float) -> Array:
  """F-GRPO's tail-miss probability for a group of N samples (arXiv 2602.06717, eq. 11).

  With total correct mass µ and rare-correct mass τ <= µ, the probability that the group has
  at least one correct and one wrong sample but no rare-correct one:
  Pr(B_τ) = (1 - τ)^N - (µ - τ)^N - (1 - µ)^N; 0 at N = 1, non-monotonic in N.
  Provenance: paper formula.
  """
  n = jnp.asarray(group_size, jnp.float32)
  mu, tau = jnp.asarray(mu, jnp.float32), jnp.asarray(tau, jnp.float32)
  return (1.0 - tau)**n - (mu - tau)**n - (1.0 - mu)**n


TRANSFORMS: dict[str, Callable[..., Array]] = {
    'f_grpo': focal_scale,
    'a_grae': a_grae,
    'ifpo': ifpo,
}


def get_transform(name: str) -> Callable[..., Array]:
  """The advantage transform registered under `name`; a ValueError lists the known names."""
  if name not in TRANSFORMS:
    known = ', '.join(sorted(TRANSFORMS))
    raise ValueError(f'Unknown advantage transform {name!r}; known: {known}.')
  return TRANSFORMS[name]
