"""Toy RL loops for dynamics studies: categorical bandits trained by the real objectives.

A policy is a table of logits `logits_BxLxV`: B prompts (contexts), L positions, V answers per
position, the positions of an answer drawn independently given the prompt. L = 1 is a plain
categorical bandit (one answer per prompt); L > 1 gives every sample L tokens with their own
ratios, the cheapest sequence-like structure. `correct_BxLxV` marks the correct token(s) of each
position; a sample's reward is the fraction of its positions that are correct (0/1 for L = 1).

`make_train` builds the whole loop in the purejaxrl style, `train(key) -> (state, metrics)`,
one `lax.scan` over iterations; `run_seeds` jits it vmapped over seeds, and `run_grid` also
over configurations that differ only in numbers (learning rate, ε, γ), in one compilation.
Each iteration samples G answers per prompt from the behaviour policy (the current one, or the
one `staleness` iterations old), scores them, turns rewards into advantages with
`advantage_fn(rewards_BxG)` (e.g. `advantages.grpo`, composed with
`advantage_transforms.focal_scale` or `a_grae`), and takes `num_updates` optimiser steps on
the same batch with `loss_fn`, any policy loss with the signature of `losses.py`
(`ppo_clip`, `cispo`, `trust_region.quatro`, ...), aggregated by `aggregation.aggregate`.
Metrics are exact functions of the policy tables (success probability, entropy, KL to the
behaviour policy) plus the loss's own diagnostics. A `logits_fn` maps other parameter pytrees
to the table (e.g. shared + per-prompt logits, so that prompts interact as they do through a
network's weights).

Extra axis letters used here: C configurations, R runs (seeds), I iterations, J values of k
for pass@k.

Deliberately not here: any objective (they come from advantages.py, advantage_transforms.py,
losses.py, trust_region.py, unchanged), language models (the tiny-transformer studies use
train.py), and matplotlib itself (`plot_band` only calls methods of the axes it is given).
"""

from collections.abc import Callable
import functools
from typing import Any

import flax
import jax
import jax.numpy as jnp
import numpy as np
import optax

from rlreason.objectives import aggregation
from rlreason.objectives import kl

Array = jax.Array


@flax.struct.dataclass
class BanditState:
  """Policy parameters, optimiser state, and the last `staleness` parameters (oldest first)."""
  params: Any  # a pytree; the logits table itself for a tabular policy.
  opt_state: optax.OptState
  past_params: Any  # each leaf stacked [staleness, ...], oldest first; empty when on-policy.


def bandit_logits(*, probs_BxLxV: Array) -> Array:
  """Logits whose softmax is `probs_BxLxV` (log, with zeros floored at 1e-30)."""
  return jnp.log(jnp.maximum(jnp.asarray(probs_BxLxV, jnp.float32), 1e-30))


def sample_answers(key: Array, logits_BxLxV: Array, *, group_size: int) -> Array:
  """G answers per prompt, prompt-major: row n = b*G + g of `tokens_NxL`."""
  b, l, _ = logits_BxLxV.shape
  tokens_BxGxL = jax.random.categorical(key, logits_BxLxV[:, None], shape=(b, group_size, l))
  return tokens_BxGxL.reshape(b * group_size, l)


def _gather_NxL(table_BxLxV: Array, tokens_NxL: Array, *, group_size: int) -> Array:
  """table[b, l, token] for each sample (prompt b owns rows b*G .. b*G + G - 1)."""
  table_NxLxV = jnp.repeat(table_BxLxV, group_size, axis=0)
  return jnp.take_along_axis(table_NxLxV, tokens_NxL[..., None], -1)[..., 0]


def answer_logprobs(logits_BxLxV: Array, tokens_NxL: Array, *, group_size: int) -> Array:
  """log π(token) of each sampled token under `logits_BxLxV`."""
  return _gather_NxL(jax.nn.log_softmax(logits_BxLxV, -1), tokens_NxL, group_size=group_size)


def answer_rewards(correct_BxLxV: Array, tokens_NxL: Array, *, group_size: int) -> Array:
  """rewards_BxG = fraction of the sample's positions whose token is correct."""
  hit_NxL = _gather_NxL(jnp.asarray(correct_BxLxV) > 0, tokens_NxL, group_size=group_size)
  return jnp.mean(hit_NxL.astype(jnp.float32), -1).reshape(-1, group_size)


def success_probability(logits_BxLxV: Array, correct_BxLxV: Array) -> Array:
  """Expected reward per prompt, exactly: mean over positions of the correct mass (B)."""
  mass_BxL = jnp.sum(jax.nn.softmax(logits_BxLxV, -1) * (correct_BxLxV > 0), -1)
  return jnp.mean(mass_BxL, -1)


def entropy(logits_BxLxV: Array) -> Array:
  """Entropy of each position's distribution, nats (BxL)."""
  logp_BxLxV = jax.nn.log_softmax(logits_BxLxV, -1)
  return -jnp.sum(jnp.exp(logp_BxLxV) * logp_BxLxV, -1)


def kl_divergence(logits_BxLxV: Array, base_logits_BxLxV: Array) -> Array:
  """KL(π ‖ π_base) per prompt, exactly; positions are independent, so their KLs add (B)."""
  logp_BxLxV = jax.nn.log_softmax(logits_BxLxV, -1)
  base_BxLxV = jax.nn.log_softmax(base_logits_BxLxV, -1)
  return jnp.sum(jnp.exp(logp_BxLxV) * (logp_BxLxV - base_BxLxV), (-1, -2))


def pass_at_k_exact(success_B: Array, *, ks: Array) -> Array:
  """pass@k = 1 - (1 - p)^k of a binary-reward prompt solved with probability p (BxJ)."""
  return 1.0 - (1.0 - success_B[..., None]) ** jnp.asarray(ks, jnp.float32)


@functools.partial(jax.jit, static_argnames=('group_sizes', 'num_groups'))
def _tail_miss_frequency(key, *, group_sizes, mu, tau, num_groups):
  # M groups of the largest size N; kind 0 = rare-correct, 1 = common-correct, 2 = wrong.
  n_max = max(group_sizes)
  kind_MxN = jax.random.choice(key, 3, shape=(num_groups, n_max),
                               p=jnp.stack([tau, mu - tau, 1.0 - mu]))
  seen_MxNx3 = jnp.cumsum(jax.nn.one_hot(kind_MxN, 3), axis=1) > 0
  seen_MxJx3 = seen_MxNx3[:, jnp.array(group_sizes) - 1]
  event_MxJ = ~seen_MxJx3[..., 0] & seen_MxJx3[..., 1] & seen_MxJx3[..., 2]
  return jnp.mean(event_MxJ, 0)


def tail_miss_monte_carlo(key: Array, *, group_sizes: tuple[int, ...], mu: float, tau: float,
                          num_groups: int) -> Array:
  """Monte-Carlo frequency of F-GRPO's tail-miss event for each group size.

  A sample is rare-correct (prob τ), common-correct (µ - τ) or wrong (1 - µ); the event is
  "≥ 1 correct and ≥ 1 wrong, no rare-correct". The groups of size N are the first N draws of
  `num_groups` iid sequences, so one draw serves every N (estimates across N are correlated;
  each one alone is an unbiased frequency). Compare with
  `advantage_transforms.tail_miss_probability`.
  """
  if not 0 <= tau <= mu <= 1 or min(group_sizes) < 1:
    raise ValueError(f'tail_miss_monte_carlo: need 0 <= tau <= mu <= 1 and group sizes >= 1, '
                     f'got mu={mu}, tau={tau}, group_sizes={group_sizes}.')
  return _tail_miss_frequency(key, group_sizes=tuple(int(n) for n in group_sizes),
                              mu=jnp.float32(mu), tau=jnp.float32(tau), num_groups=num_groups)


def _tabular(params):
  return params


def make_train(*, correct_BxLxV: Array, init_params, advantage_fn: Callable[[Array], Array],
               loss_fn: Callable, optimizer: optax.GradientTransformation, group_size: int,
               num_iterations: int, num_updates: int = 1, staleness: int = 0,
               agg_mode: str = 'token_mean',
               logits_fn: Callable[..., Array] = _tabular,
               record_probs: bool = False) -> Callable[[Array], tuple[BanditState, dict]]:
  """The whole toy loop as a pure function of a PRNG key (jit it, vmap it over seeds).

  Args:
    correct_BxLxV: 1 where a token is correct at that prompt and position.
    init_params: the policy's parameters at iteration 0 (a pytree; by default the logits
      table itself).
    advantage_fn: rewards_BxG -> advantages_BxG.
    loss_fn: per-token policy loss `(logprobs_NxL, old_logprobs_NxL, advantages_N, mask_NxL)
      -> (loss_NxL, weights_NxL, metrics)`, options already bound (functools.partial).
    optimizer: an optax transformation (e.g. `optax.sgd(lr)`).
    group_size: G samples per prompt and iteration.
    num_iterations: iterations (sampling rounds).
    num_updates: optimiser steps on each batch (PPO epochs; > 1 makes the later ones off-policy).
    staleness: the behaviour policy is the one from this many iterations ago.
    agg_mode: aggregation mode (aggregation.py), global denominator over the batch.
    logits_fn: params -> logits_BxLxV (identity for a tabular policy; shared parameters make
      prompts interact).
    record_probs: also return the policy's probabilities after every iteration.

  Returns:
    train(key) -> (final BanditState, metrics), metrics a dict of arrays with a leading
    iteration axis I (see `bandit_iteration`).
  """
  correct_BxLxV = jnp.asarray(correct_BxLxV, jnp.float32)
  step = functools.partial(
      bandit_iteration, correct_BxLxV=correct_BxLxV, advantage_fn=advantage_fn, loss_fn=loss_fn,
      optimizer=optimizer, group_size=group_size, num_updates=num_updates, agg_mode=agg_mode,
      logits_fn=logits_fn, record_probs=record_probs)

  def train(key):
    params = jax.tree.map(lambda x: jnp.asarray(x, jnp.float32), init_params)
    past = jax.tree.map(lambda p: jnp.repeat(p[None], staleness, 0), params)
    state = BanditState(params=params, opt_state=optimizer.init(params), past_params=past)
    keys_I = jax.random.split(key, num_iterations)
    return jax.lax.scan(step, state, keys_I)

  return train


def bandit_iteration(state: BanditState, key: Array, *, correct_BxLxV, advantage_fn, loss_fn,
                     optimizer, group_size, num_updates, agg_mode, logits_fn, record_probs):
  """One sampling round and its `num_updates` optimiser steps: (state, key) -> (state, metrics).

  Metrics (per prompt where the name ends in _B): `reward` (sampled mean), `success_B` (exact
  expected reward after the update), `entropy` (mean over prompts and positions),
  `kl_behaviour` (exact KL(π_new ‖ π_behaviour), mean over prompts), `kl_k3` (rlreason.objectives.kl's k3
  estimate of KL(π_behaviour ‖ π_new) on the sampled tokens), `update_norm_B` (‖Δlogits‖ per
  prompt), the loss's metrics of the last update under 'loss/', and for L = 1 the
  unsampled-correct answers' mass before / after (`unsampled_correct_mass_{before,after}`,
  summed over prompts) and their mean logit change (`unsampled_correct_logit_delta`).
  """
  staleness = jax.tree.leaves(state.past_params)[0].shape[0]
  behaviour = (state.params if staleness == 0
               else jax.tree.map(lambda p: p[0], state.past_params))
  behaviour_BxLxV = logits_fn(behaviour)
  tokens_NxL = sample_answers(key, behaviour_BxLxV, group_size=group_size)
  rewards_BxG = answer_rewards(correct_BxLxV, tokens_NxL, group_size=group_size)
  advantages_N = jax.lax.stop_gradient(advantage_fn(rewards_BxG)).reshape(-1)
  old_logprobs_NxL = answer_logprobs(behaviour_BxLxV, tokens_NxL, group_size=group_size)
  mask_NxL = jnp.ones(tokens_NxL.shape, jnp.float32)

  def objective(params):
    logprobs_NxL = answer_logprobs(logits_fn(params), tokens_NxL, group_size=group_size)
    loss_NxL, weights_NxL, metrics = loss_fn(logprobs_NxL, old_logprobs_NxL, advantages_N,
                                             mask_NxL)
    den = aggregation.denominators(weights_NxL, mode=agg_mode)
    return aggregation.aggregate(loss_NxL, weights_NxL, mode=agg_mode, denominator=den), metrics

  def update(carry, _):
    params, opt_state = carry
    (loss, metrics), grads = jax.value_and_grad(objective, has_aux=True)(params)
    updates, opt_state = optimizer.update(grads, opt_state, params)
    return (optax.apply_updates(params, updates), opt_state), (loss, metrics)

  start_BxLxV = logits_fn(state.params)
  (params, opt_state), (loss_U, metrics_U) = jax.lax.scan(
      update, (state.params, state.opt_state), None, length=num_updates)
  new_BxLxV = logits_fn(params)
  new_logprobs_NxL = answer_logprobs(new_BxLxV, tokens_NxL, group_size=group_size)
  out = {f'loss/{k}': v[-1] for k, v in metrics_U.items()}
  out.update({
      'loss/value': loss_U[-1],
      'reward': jnp.mean(rewards_BxG),
      'success_B': success_probability(new_BxLxV, correct_BxLxV),
      'entropy': jnp.mean(entropy(new_BxLxV)),
      'kl_behaviour': jnp.mean(kl_divergence(new_BxLxV, behaviour_BxLxV)),
      'kl_k3': jnp.mean(kl.k3(old_logprobs_NxL, new_logprobs_NxL)),
      'update_norm_B': jnp.sqrt(jnp.sum((new_BxLxV - start_BxLxV)**2, (-1, -2))),
  })
  if tokens_NxL.shape[1] == 1:
    out.update(_unsampled_correct(start_BxLxV, new_BxLxV, correct_BxLxV, tokens_NxL,
                                  group_size=group_size))
  if record_probs:
    out['probs_BxLxV'] = jax.nn.softmax(new_BxLxV, -1)
  past = jax.tree.map(lambda buf, p: jnp.concatenate([buf[1:], p[None]], 0),
                      state.past_params, state.params) if staleness else state.past_params
  return BanditState(params=params, opt_state=opt_state, past_params=past), out


def _unsampled_correct(start_BxLxV, new_BxLxV, correct_BxLxV, tokens_NxL, *, group_size):
  """Mass and logit change of the correct answers no sample of the group hit (L = 1)."""
  b, _, v = start_BxLxV.shape
  sampled_BxV = jnp.any(jax.nn.one_hot(tokens_NxL[:, 0], v).reshape(b, group_size, v) > 0, 1)
  unsampled_BxV = (correct_BxLxV[:, 0] > 0) & ~sampled_BxV
  delta_BxV = new_BxLxV[:, 0] - start_BxLxV[:, 0]
  return {
      'unsampled_correct_mass_before': jnp.sum(
          jnp.where(unsampled_BxV, jax.nn.softmax(start_BxLxV[:, 0], -1), 0.0)),
      'unsampled_correct_mass_after': jnp.sum(
          jnp.where(unsampled_BxV, jax.nn.softmax(new_BxLxV[:, 0], -1), 0.0)),
      'unsampled_correct_logit_delta': aggregation.masked_mean(delta_BxV, unsampled_BxV),
  }


def run_seeds(train: Callable, *, seed: int, num_seeds: int):
  """jit(vmap(train)) over `num_seeds` keys split from `seed`; metrics get a leading R axis."""
  keys_R = jax.random.split(jax.random.key(seed), num_seeds)
  return jax.jit(jax.vmap(train))(keys_R)


def run_grid(train_for: Callable, hparams_C, *, seed: int, num_seeds: int):
  """One compiled program for C configurations x R seeds: leading axes [C, R] on the outputs.

  `train_for(hparams, key)` builds and runs a loop (e.g. `make_train(...)(key)` with a loss
  whose ε, or a transform whose γ, is read from `hparams`); numeric options are traced, so
  configurations that differ only in numbers share one compilation. Every configuration sees
  the same R seeds (common random numbers: differences between configurations are not noise
  from different draws).
  """
  keys_R = jax.random.split(jax.random.key(seed), num_seeds)
  over_seeds = jax.vmap(train_for, in_axes=(None, 0))
  return jax.jit(jax.vmap(over_seeds, in_axes=(0, None)))(hparams_C, keys_R)


def two_answer_bandit(*, num_answers: int, common_mass: float, rare_mass: float):
  """One prompt, answer 0 correct and common, answer 1 correct and rare, the rest wrong.

  The wrong answers share the remaining mass equally. Returns (logits_1x1xV, correct_1x1xV).
  """
  if not (0 < rare_mass and common_mass + rare_mass < 1 and num_answers >= 3):
    raise ValueError(f'two_answer_bandit: need 0 < rare_mass, common_mass + rare_mass < 1, '
                     f'num_answers >= 3; got {rare_mass}, {common_mass}, {num_answers}.')
  probs_V = np.full(num_answers, (1.0 - common_mass - rare_mass) / (num_answers - 2))
  probs_V[:2] = common_mass, rare_mass
  correct_V = np.zeros(num_answers, np.float32)
  correct_V[:2] = 1.0
  return bandit_logits(probs_BxLxV=probs_V[None, None]), jnp.asarray(correct_V[None, None])


def difficulty_ladder(*, success_B, num_answers: int, num_correct: int, position_count: int = 1):
  """B prompts of graded difficulty: prompt b starts with correct mass success_B[b] per position.

  Each position has `num_correct` correct answers (the first ones) sharing that mass equally,
  the wrong ones sharing the rest. Returns (logits_BxLxV, correct_BxLxV).
  """
  success_B = np.asarray(success_B, np.float64)
  if np.any((success_B <= 0) | (success_B >= 1)) or not 0 < num_correct < num_answers:
    raise ValueError(f'difficulty_ladder: success_B must lie in (0, 1) and '
                     f'0 < num_correct={num_correct} < num_answers={num_answers}.')
  wrong = num_answers - num_correct
  probs_BxV = np.concatenate([np.repeat(success_B[:, None] / num_correct, num_correct, 1),
                              np.repeat((1 - success_B[:, None]) / wrong, wrong, 1)], 1)
  probs_BxLxV = np.repeat(probs_BxV[:, None], position_count, 1)
  correct_BxLxV = np.zeros(probs_BxLxV.shape, np.float32)
  correct_BxLxV[..., :num_correct] = 1.0
  return bandit_logits(probs_BxLxV=probs_BxLxV), jnp.asarray(correct_BxLxV)


def update_share(update_norm_RxIxB) -> np.ndarray:
  """Each prompt's share of the iteration's total update size, averaged over runs (IxB).

  Iterations where nothing moved in some run (every group all-equal) count only the runs that
  moved; where no run moved, the share is NaN.
  """
  norm_RxIxB = np.asarray(update_norm_RxIxB, np.float64)
  total_RxIx1 = norm_RxIxB.sum(-1, keepdims=True)
  share_RxIxB = np.where(total_RxIx1 > 0, norm_RxIxB / np.where(total_RxIx1 > 0, total_RxIx1, 1),
                         np.nan)
  moved_IxB = np.sum(~np.isnan(share_RxIxB), 0)
  return np.where(moved_IxB > 0, np.nansum(share_RxIxB, 0) / np.maximum(moved_IxB, 1), np.nan)


def plot_band(ax, x_I, y_RxI, *, label: str, color=None, quantiles=(0.25, 0.75)):
  """Median over runs with an inter-quantile band on a matplotlib axes; returns the line."""
  y_RxI = np.asarray(y_RxI)
  lo_I, mid_I, hi_I = np.quantile(y_RxI, [quantiles[0], 0.5, quantiles[1]], axis=0)
  (line,) = ax.plot(x_I, mid_I, label=label, color=color)
  ax.fill_between(x_I, lo_I, hi_I, color=line.get_color(), alpha=0.2, linewidth=0)
  return line
