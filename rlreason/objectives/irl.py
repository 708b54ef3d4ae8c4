"""rePIRL's two objectives: a process reward model learned by maximum-entropy inverse RL from
expert trajectories only, and the max-entropy policy update on its dense token rewards.

  log_q_BxM = mixture_log_proposal(policy_logprobs_BxM, demo_counts_BxM, num_policy=G, num_expert=E)
  loss, metrics = prm_loss(expert_rewards_BxE, sample_rewards_BxM, log_q_BxM)       # PRM step
  adv_NxL = maxent_advantages(token_rewards_NxL, logprobs_NxL, mask_NxL, group_size=G, alpha=α)
  loss, metrics = maxent_policy_loss(logprobs_NxL, adv_NxL, mask_NxL)              # policy step

Provenance. rePIRL (arXiv 2602.07832) is known from its abstract and a brief (algorithms.md
§21): a token-level MDP, an energy-based reward r_φ(s_t, a_t) with p(τ) ∝ exp(Σ_t r_φ), the
expert log-likelihood (1/|D|) Σ_i Σ_t r_φ(s_it, a_it) − log Z(φ) maximised with Z estimated by
importance sampling from the current policy [S], alternated with a max-entropy policy update
on r_φ as dense reward [S]. Everything below the sentence level is our formalisation [F]:

- Z is per prompt x: Z(x) = Σ_τ exp(R_φ(x, τ)), R_φ = Σ_t r_φ(s_t, a_t) over the response.
  From M samples τ_m of a proposal q, Ẑ = (1/M) Σ_m exp(R_m − log q(τ_m)), so
  log Ẑ = logsumexp_m(R_m − log q_m) − log M, whose gradient Σ_m w̃_m ∇R_m with w̃ =
  softmax_m(R_m − log q_m) is the self-normalised IS estimate of E_{p_φ}[∇R] = ∇ log Z.
  (Ẑ is unbiased; log Ẑ is biased low, by Jensen.)
- The proposal: the policy's G samples alone (q = π), or, as in guided cost learning (Finn et
  al. 2016, arXiv 1603.00448), the policy's samples and the E demonstrations pooled, weighted
  with the mixture q(τ) = (G π(τ) + E d(τ)) / (G + E), d the demonstrations' empirical
  distribution (a proper pmf over token sequences: d(τ) = count of τ among the demos / E).
  Pooling keeps the loss bounded when the policy has not yet sampled anything like the expert
  (with q = π alone, raising R on the demos is then free and the loss runs to −∞).
- The policy step maximises E_π[Σ_t r_φ(s_t, a_t) − α log π(a_t | s_t)] (max-ent RL; α = 1
  makes its optimum π ∝ exp(R_φ), the model the PRM step fits) by REINFORCE on soft
  rewards-to-go, Q̂_t = Σ_{t' ≥ t} (r_t' − α log π(a_t')), minus a leave-one-out baseline:
  the mean Q̂ at the same position over the group's other rows that reach it (independent of
  a_t, so the estimate stays unbiased).

Pure and jittable. Deliberately not here: the models that produce r_φ (methods/repirl.py applies
the reward-model head per token), sampling, optimisers.
"""

import jax
import jax.numpy as jnp

from rlreason.objectives import token_advantages

_sg = jax.lax.stop_gradient


def sequence_rewards(token_rewards_NxL, mask_NxL):
  """R_N = Σ_t mask_t r_t: a trajectory's return under the dense reward."""
  return jnp.sum(jnp.asarray(token_rewards_NxL, jnp.float32) * (jnp.asarray(mask_NxL) > 0), -1)


def demo_counts(tokens_BxMxL, mask_BxMxL, expert_tokens_BxExL, expert_mask_BxExL):
  """How many of the prompt's E demonstrations equal each of its M sequences: BxM (int32).

  Two sequences are equal when their masks agree and their tokens agree where masked (padding
  is ignored); the lengths L must match (pad both to one width).
  """
  m = jnp.asarray(mask_BxMxL) > 0
  e = jnp.asarray(expert_mask_BxExL) > 0
  same_mask = jnp.all(m[:, :, None] == e[:, None], axis=-1)
  same_tok = jnp.all((tokens_BxMxL[:, :, None] == expert_tokens_BxExL[:, None]) | ~m[:, :, None],
                     axis=-1)
  return jnp.sum(same_mask & same_tok, axis=-1).astype(jnp.int32)


def mixture_log_proposal(policy_logprobs_BxM, demo_counts_BxM, *, num_policy: int,
                         num_expert: int):
  """log q(τ) of the pooled samples: q = (G π(τ) + E d(τ)) / (G + E) = (G π + count) / (G + E).

  policy_logprobs_BxM: log π(τ_m | x) of every pooled sequence (the policy's and the demos').
  num_expert 0: q = π.
  """
  log_pi = jnp.asarray(policy_logprobs_BxM, jnp.float32)
  if num_expert == 0:
    return log_pi
  counts = jnp.asarray(demo_counts_BxM, jnp.float32)
  log_g = jnp.log(float(num_policy))
  # log(G π + c) without underflow when π is tiny: logaddexp(log G + log π, log c).
  return (jnp.logaddexp(log_g + log_pi, jnp.where(counts > 0, jnp.log(jnp.maximum(counts, 1.)),
                                                  -jnp.inf))
          - jnp.log(float(num_policy + num_expert)))


def log_partition(sample_rewards_BxM, log_proposal_BxM, valid_BxM=None):
  """log Ẑ_B = logsumexp_m(R_m − log q_m) − log M (IS from M proposal samples; see module).

  log q is held fixed (stop_gradient): the PRM step does not move the proposal.
  valid_BxM: samples to use (others are dropped and M counts only the valid ones).
  """
  x_BxM = jnp.asarray(sample_rewards_BxM, jnp.float32) - _sg(jnp.asarray(log_proposal_BxM,
                                                                         jnp.float32))
  if valid_BxM is None:
    valid_BxM = jnp.ones_like(x_BxM, bool)
  x_BxM = jnp.where(valid_BxM, x_BxM, -jnp.inf)
  count_B = jnp.maximum(jnp.sum(valid_BxM, -1), 1)
  return jax.nn.logsumexp(x_BxM, axis=-1) - jnp.log(count_B.astype(jnp.float32))


def importance_weights(sample_rewards_BxM, log_proposal_BxM):
  """Self-normalised weights w̃ = softmax_m(R_m − log q_m): the gradient weights of log Ẑ."""
  return jax.nn.softmax(jnp.asarray(sample_rewards_BxM, jnp.float32)
                        - jnp.asarray(log_proposal_BxM, jnp.float32), axis=-1)


def prm_loss(expert_rewards_BxE, sample_rewards_BxM, log_proposal_BxM, *, reward_l2: float = 0.0,
             token_rewards_sq_mean=None):
  """−(expert log-likelihood): mean_B[log Ẑ_B − mean_E R_φ(τ_E)], and metrics.

  With token_rewards_sq_mean (the caller's mean r_φ² over the tokens it scored), adds
  reward_l2 times it, an [F] regulariser that pins r_φ's free offset; reward_l2 = 0 or None
  is the plain objective.
  Metrics: irl/loss, irl/expert_return, irl/sample_return (means), irl/log_z, irl/ess: the
  effective sample size of the IS weights, 1 / Σ w̃², as a fraction of M.
  """
  log_z_B = log_partition(sample_rewards_BxM, log_proposal_BxM)
  expert_B = jnp.mean(jnp.asarray(expert_rewards_BxE, jnp.float32), -1)
  loss = jnp.mean(log_z_B - expert_B)
  if token_rewards_sq_mean is not None:
    loss = loss + reward_l2 * token_rewards_sq_mean
  w_BxM = importance_weights(sample_rewards_BxM, _sg(log_proposal_BxM))
  ess = jnp.mean(1.0 / jnp.sum(w_BxM**2, -1)) / w_BxM.shape[-1]
  return loss, {'irl/loss': loss, 'irl/expert_return': jnp.mean(expert_B),
                'irl/sample_return': jnp.mean(sample_rewards_BxM), 'irl/log_z': jnp.mean(log_z_B),
                'irl/ess': ess}


def maxent_advantages(token_rewards_NxL, logprobs_NxL, mask_NxL, *, group_size: int,
                      alpha: float):
  """Soft rewards-to-go minus the leave-one-out group mean at the same position (see module).

  Rows are grouped in consecutive blocks of `group_size` (one prompt's samples). A position
  that no other row of the group reaches gets baseline 0. Zero where the mask is; no gradient.
  """
  mask_NxL = jnp.asarray(mask_NxL) > 0
  soft_NxL = (jnp.asarray(token_rewards_NxL, jnp.float32)
              - alpha * _sg(jnp.asarray(logprobs_NxL, jnp.float32)))
  q_NxL = token_advantages.reward_to_go(soft_NxL, mask_NxL)
  n, length = q_NxL.shape
  q_BxGxL = jnp.where(mask_NxL, q_NxL, 0.0).reshape(n // group_size, group_size, length)
  m_BxGxL = mask_NxL.reshape(q_BxGxL.shape).astype(jnp.float32)
  others_sum = jnp.sum(q_BxGxL, 1, keepdims=True) - q_BxGxL
  others_n = jnp.sum(m_BxGxL, 1, keepdims=True) - m_BxGxL
  base_BxGxL = jnp.where(others_n > 0, others_sum / jnp.maximum(others_n, 1.0), 0.0)
  adv_NxL = (q_BxGxL - base_BxGxL).reshape(n, length)
  return _sg(jnp.where(mask_NxL, adv_NxL, 0.0))


def maxent_policy_loss(logprobs_NxL, advantages_NxL, mask_NxL):
  """−Σ A_t log π(a_t) / Σ mask (token mean), and metrics (irl/entropy_proxy: −E log π)."""
  m = (jnp.asarray(mask_NxL) > 0).astype(jnp.float32)
  denom = jnp.maximum(jnp.sum(m), 1.0)
  loss = -jnp.sum(_sg(advantages_NxL) * logprobs_NxL * m) / denom
  return loss, {'irl/policy_loss': loss,
                'irl/entropy_proxy': -jnp.sum(_sg(logprobs_NxL) * m) / denom}
