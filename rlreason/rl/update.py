"""The learner's pure steps: init_state, logprobs_step, train_step, sft_step.

  state = init_state(cfg, optimizer, rng, shardings=...)           # or from a checkpoint
  stats = logprobs_step(params, tokens_NxT, mask_NxT, cfg=..., completion_len=L)
  state, metrics = train_step(state, batch, cfg=..., objective=..., optimizer=...)

All are jittable with no I/O; the caller jits them with explicit shardings and donates the
state. Log-probs of completion token l come from position P + l - 1 (P = T - L), computed
chunk by chunk from the final hidden states (token_stats.py), so the NxTxV logits never exist.

With a critic (Objective.value_coef > 0), the value head (transformer.init_value_head) sits on the
same final hidden states: the step adds value_coef x the clipped value loss, whose gradient
reaches the head (its own optimizer and learning rate) and the shared trunk.

A train step accumulates gradients over micro-batches with a scan. Every normaliser is a
global count computed on the whole minibatch before the split (aggregation.denominators), so
the loss and gradient do not depend on the number of micro-batches; a self-normalising loss
(SORL's reliability weights) is divided by its weights' global sum at the current θ, from a
forward-only pass over the micro-batches (`weights_denominator`) when there are several.
A non-finite loss or gradient leaves params and optimizer state untouched and increments
`state.skipped`.

Deliberately not here: sampling, rewards, advantages (the batch carries them), the loop.
"""

from collections.abc import Callable
import dataclasses
import inspect
from typing import Any

import jax
import jax.numpy as jnp
import optax

from rlreason.model import rollout_head
from rlreason.model import transformer
from rlreason.objectives import aggregation
from rlreason.objectives import kl
from rlreason.objectives import losses
from rlreason.objectives import offpolicy
from rlreason.objectives import token_stats
from rlreason.objectives import vocab_parallel
from rlreason.objectives.loss_diagnostics import policy_metrics
from rlreason.rollout import trie as trie_lib
from rlreason.structs import TrainBatch, TrainState


@dataclasses.dataclass(frozen=True)
class Objective:
  """What train_step minimises; hashable so it can be a static jit argument.

  loss_kwargs are keyword options of the policy loss as (name, value) pairs, e.g.
  (('eps_low', 0.2), ('eps_high', 0.28)); correction_kwargs likewise for the off-policy
  correction (offpolicy.CORRECTIONS, '' for none).
  """
  policy_loss: str = 'ppo_clip'
  loss_kwargs: tuple[tuple[str, Any], ...] = ()
  aggregation: str = 'token_mean'
  max_len: int | None = None  # L_max for the constant_normalizer aggregation.
  kl_coef: float = 0.0
  kl_estimator: str = 'k3'
  entropy_coef: float = 0.0
  temperature: float = 1.0
  group_size: int = 1
  value_coef: float = 0.0  # > 0: train the critic head with PPO's clipped value loss.
  value_clip: float | None = 0.5  # ε_v of the value loss (verl's cliprange_value).
  num_turns: int = 1  # Upper bound on turns per row (env.max_turns), for turn-level losses.
  correction: str = ''  # Weights by π_prox/π_behaviour: a key of offpolicy.CORRECTIONS.
  correction_kwargs: tuple[tuple[str, Any], ...] = ()

  def __post_init__(self):
    losses.get_policy_loss(self.policy_loss)  # Unknown names fail here, listing known ones.
    aggregation.get_aggregation(self.aggregation)
    kl.get_kl_estimator(self.kl_estimator)
    if self.correction:
      offpolicy.get_correction(self.correction)


def init_state(params, optimizer: optax.GradientTransformation, *, value_params=None,
               value_optimizer: optax.GradientTransformation | None = None) -> TrainState:
  """A fresh TrainState around given params (jit it with out_shardings to place it).

  With `value_params` (a critic head), `value_optimizer` holds its own optimizer state.
  """
  value_opt_state = None if value_params is None else value_optimizer.init(value_params)
  return TrainState(params=params, opt_state=optimizer.init(params),
                    step=jnp.zeros((), jnp.int32), skipped=jnp.zeros((), jnp.int32),
                    value_params=value_params, value_opt_state=value_opt_state)


def state_shardings(abstract_state: TrainState, param_shardings, mesh):
  """Shardings for a TrainState: optimizer moments follow their parameter, the rest replicate.

  An optax state holds parameter-shaped trees (Adam's mu and nu); a leaf whose tree path
  ends with a parameter's path and has its shape gets that parameter's sharding.
  """
  replicated = jax.sharding.NamedSharding(mesh, jax.P())
  params_flat = jax.tree_util.tree_flatten_with_path(abstract_state.params)[0]
  shard_flat = jax.tree.leaves(param_shardings)
  by_path = [(jax.tree_util.keystr(p), x.shape, s) for (p, x), s in zip(params_flat, shard_flat)]

  def pick(path, leaf):
    key = jax.tree_util.keystr(path)
    for suffix, shape, s in by_path:
      if key.endswith(suffix) and leaf.shape == shape:
        return s
    return replicated

  opt = jax.tree_util.tree_map_with_path(pick, abstract_state.opt_state)
  critic = lambda tree: jax.tree.map(lambda _: replicated, tree)  # D + 1 numbers: replicated.
  return TrainState(params=param_shardings, opt_state=opt, step=replicated, skipped=replicated,
                    value_params=critic(abstract_state.value_params),
                    value_opt_state=critic(abstract_state.value_opt_state))


def _output_matrix(params, cfg: transformer.ModelConfig):
  return params['embed'].T if cfg.tie_embeddings else params['lm_head']


def _completion_hidden(params, tokens_NxT, mask_NxT, *, cfg, completion_len, trie=None):
  """Hidden states NxLxD that predict completion token l (position P + l - 1); with `trie`
  (rollout/trie.Packing: threads.trie_packing), from one forward per episode's packed trie."""
  p = tokens_NxT.shape[1] - completion_len
  if trie is not None:
    return trie_lib.packed_hidden(params, tokens_NxT, mask_NxT, trie, cfg=cfg)[:, p - 1:-1]
  h_NxTxD, _ = transformer.apply(params, tokens_NxT, cfg=cfg, mask_NxT=mask_NxT, return_hidden=True)
  return h_NxTxD[:, p - 1:-1]


def completion_stats(params, tokens_NxT, mask_NxT, *, cfg: transformer.ModelConfig,
                     completion_len: int, temperature: float = 1.0, token_chunk: int = 512,
                     vocab_chunk: int = 8192, value_params=None, trie=None,
                     return_logits_inputs: bool = False):
  """Log-prob, entropy and sum of squared probs of each completion token (NxL), chunked.

  With `value_params`, (stats, values_NxL): the critic's V at the state before each completion
  token, from the same forward (verl reads values[:, P-1:-1] the same way). With
  `return_logits_inputs`, (that, (h_NxLxE, w_ExV)): the logits are h @ w (a loss term's input).
  """
  h_NxLxD = _completion_hidden(params, tokens_NxT, mask_NxT, cfg=cfg,
                               completion_len=completion_len, trie=trie)
  # Vocabulary-parallel (shard_map) under a mesh whose TRAIN_RULES shard the LM head's vocab
  # over 'tensor'; otherwise token_stats.token_stats_from_hidden itself.
  # R²PO's rollout head, when the params carry it: [h, ReLU(h W1)] @ [W_lm; W2].
  h_NxLxE, w_ExV = rollout_head.projection(params, h_NxLxD, _output_matrix(params, cfg),
                                           cfg.compute_dtype)
  stats = vocab_parallel.token_stats_from_hidden(
      h_NxLxE, w_ExV, tokens_NxT[:, -completion_len:],
      temperature=temperature, token_chunk=token_chunk, vocab_chunk=vocab_chunk)
  out = stats if value_params is None else (
      stats, transformer.values_from_hidden(value_params, h_NxLxD))
  return (out, (h_NxLxE, w_ExV)) if return_logits_inputs else out


def values_step(params, value_params, tokens_NxT, mask_NxT, *, cfg: transformer.ModelConfig,
                completion_len: int):
  """The critic's values_NxL of the completion tokens (GAE's V), without gradients."""
  h_NxLxD = _completion_hidden(params, tokens_NxT, mask_NxT, cfg=cfg,
                               completion_len=completion_len)
  return jax.lax.stop_gradient(transformer.values_from_hidden(value_params, h_NxLxD))


def logprobs_step(params, tokens_NxT, mask_NxT, *, cfg: transformer.ModelConfig, completion_len: int,
                  temperature: float = 1.0, trie=None) -> token_stats.TokenStats:
  """Old or reference log-probs (and OTB's per-token statistics), without gradients."""
  return jax.lax.stop_gradient(completion_stats(
      params, tokens_NxT, mask_NxT, cfg=cfg, completion_len=completion_len,
      temperature=temperature, trie=trie))


def _policy_loss_kwargs(fn, batch: TrainBatch, objective: Objective) -> dict[str, Any]:
  """Options from the objective, plus the batch fields a loss asks for by name."""
  params = inspect.signature(fn).parameters
  turn_ids_NxL = batch.turn_ids_NxL
  if turn_ids_NxL is None:  # Single-turn episodes: every token is turn 0 of 1.
    turn_ids_NxL = jnp.zeros(batch.loss_mask_NxL.shape, jnp.int32)
  extra = {'group_size': objective.group_size, 'prefix_mask_NxL': batch.prefix_mask_NxL,
           'behavior_logprobs_NxL': batch.behaviour_logprobs_NxL,
           'behaviour_logprobs_NxL': batch.behaviour_logprobs_NxL,
           'turn_ids_NxL': turn_ids_NxL, 'num_turns': objective.num_turns}
  kwargs = {k: v for k, v in extra.items() if k in params}
  kwargs.update(dict(objective.loss_kwargs))
  return kwargs


def loss_fn(params, batch: TrainBatch, denominator, *, cfg: transformer.ModelConfig,
            objective: Objective, value_params=None, policy_denominator=None, term=None,
            term_args=()):
  """Aggregated loss (already divided by the global denominator) and its metrics.

  A self-normalising policy loss (losses.self_normalising: SORL's reliability weights) is
  divided by `policy_denominator`, the global sum of its weights (`weights_denominator`), or,
  when that is None, by the sum of its weights on this batch (right when the batch is the
  whole minibatch); the value loss keeps `denominator`.

  With `objective.correction`, the policy loss's per-token loss is multiplied by the
  correction's stop-gradient weights (π_prox = batch.old_logprobs_NxL, the behaviour policy
  batch.behaviour_logprobs_NxL) before the KL and entropy terms are added, as verl applies its
  rollout IS weights to the policy-gradient term only. The loss, not the aggregation weights:
  seq_mean_token_mean divides each row by its weights, where a sequence weight would cancel.
  The global denominators stay the loss mask's, so micro-batching is untouched and a dropped
  token counts as a zero-loss one (offpolicy.py). The learner-vs-sampler metrics
  (offpolicy/...) are logged with or without a correction.
  With `value_params` (a critic), adds value_coef x the aggregated clipped value loss.

  `term` is a learner schedule's per-token term (methods/distill.py):
  term(batch, h_NxLxE, w_ExV, *term_args) -> (advantages_NxL or None, loss_NxL or None,
  metrics), from the student's logit inputs (logits = h @ w) and the step's extra arguments;
  its advantages replace the batch's before the policy loss, its loss is added to the
  per-token loss (aggregated with it, logged as `loss_term` and its share `loss_term_share`).
  """
  out = completion_stats(params, batch.tokens_NxT, batch.mask_NxT, cfg=cfg,
                         completion_len=batch.loss_mask_NxL.shape[1],
                         temperature=objective.temperature, value_params=value_params,
                         trie=batch.trie, return_logits_inputs=term is not None)
  term_NxL, term_metrics = None, {}
  if term is not None:
    out, logits_inputs = out
    term_adv_NxL, term_NxL, term_metrics = term(batch, *logits_inputs, *term_args)
    if term_adv_NxL is not None:
      batch = batch.replace(advantages_NxL=term_adv_NxL)
  stats, values_NxL = out if value_params is not None else (out, None)
  logprobs_NxL, mask_NxL = stats.logprobs_NxT, batch.loss_mask_NxL
  fn = losses.get_policy_loss(objective.policy_loss)
  loss_NxL, weights_NxL, metrics = fn(logprobs_NxL, batch.old_logprobs_NxL,
                                      batch.advantages_NxL, mask_NxL,
                                      **_policy_loss_kwargs(fn, batch, objective))
  metrics.update(offpolicy.mismatch_metrics(logprobs_NxL, batch.old_logprobs_NxL,
                                            batch.behaviour_logprobs_NxL, mask_NxL))
  if objective.correction:
    correction_NxL, correction_metrics = offpolicy.get_correction(objective.correction)(
        logprobs_NxL, batch.old_logprobs_NxL, batch.behaviour_logprobs_NxL, mask_NxL,
        **dict(objective.correction_kwargs))
    loss_NxL = loss_NxL * correction_NxL
    metrics.update(correction_metrics)
  if objective.kl_coef:
    kl_NxL = kl.get_kl_estimator(objective.kl_estimator)(logprobs_NxL, batch.ref_logprobs_NxL)
    loss_NxL = loss_NxL + objective.kl_coef * kl_NxL
    metrics['kl'] = aggregation.masked_mean(kl_NxL, mask_NxL)
  if objective.entropy_coef:
    loss_NxL = loss_NxL - objective.entropy_coef * stats.entropy_NxT
  metrics.update(term_metrics)
  if term_NxL is not None:
    loss_NxL = loss_NxL + term_NxL
  policy_den = denominator
  if losses.self_normalising(objective.policy_loss, objective.loss_kwargs):
    policy_den = policy_denominator
    if policy_den is None:
      policy_den = jax.lax.stop_gradient(aggregation.denominators(weights_NxL, mode='token_mean'))
    metrics['policy_denominator_frac'] = policy_den / jnp.maximum(denominator, 1e-9)
  total = aggregation.aggregate(loss_NxL, weights_NxL, mode=objective.aggregation,
                                denominator=policy_den)
  if term_NxL is not None:
    part = aggregation.aggregate(term_NxL, weights_NxL, mode=objective.aggregation,
                                 denominator=policy_den)
    metrics['loss_term'] = part
    metrics['loss_term_share'] = jnp.abs(part) / jnp.maximum(
        jnp.abs(total - part) + jnp.abs(part), 1e-9)
  if values_NxL is not None:
    vloss_NxL, value_metrics = losses.value_loss(values_NxL, batch.old_values_NxL,
                                                 batch.returns_NxL, mask_NxL,
                                                 clip=objective.value_clip)
    vloss = aggregation.aggregate(vloss_NxL, mask_NxL, mode=objective.aggregation,
                                  denominator=denominator)
    metrics['policy_loss'] = total
    total = total + objective.value_coef * vloss
    metrics.update(value_metrics)
    metrics['value/loss'] = vloss
  metrics.update(policy_metrics(mask_NxL, entropy_NxL=stats.entropy_NxT,
                                logprobs_NxL=logprobs_NxL))
  return total, metrics


def weights_denominator(params, batch: TrainBatch, *, cfg: transformer.ModelConfig,
                        objective: Objective, micro_batches: int):
  """Σ of the policy loss's weights over the whole minibatch at `params`, forward only, one
  micro-batch at a time: the normaliser of a self-normalising loss (losses.self_normalising)
  that keeps the loss and gradient independent of the micro-batch split."""
  fn = losses.get_policy_loss(objective.policy_loss)

  def body(total, micro):
    stats = completion_stats(params, micro.tokens_NxT, micro.mask_NxT, cfg=cfg,
                             completion_len=micro.loss_mask_NxL.shape[1],
                             temperature=objective.temperature, trie=micro.trie)
    _, weights_NxL, _ = fn(stats.logprobs_NxT, micro.old_logprobs_NxL, micro.advantages_NxL,
                           micro.loss_mask_NxL, **_policy_loss_kwargs(fn, micro, objective))
    return total + aggregation.denominators(weights_NxL, mode='token_mean'), None

  total, _ = jax.lax.scan(body, jnp.zeros((), jnp.float32), _split(batch, micro_batches))
  return jax.lax.stop_gradient(total)


def _split(tree, num: int):
  """Leading axis N -> (num, N / num): consecutive rows stay together (whole groups)."""
  return jax.tree.map(lambda x: x.reshape(num, x.shape[0] // num, *x.shape[1:]), tree)


def _apply_if_finite(state: TrainState, grads, loss, optimizer, *, value_grads=None,
                     value_optimizer=None):
  """One optimizer update (and the critic head's, with its own optimizer), or none at all."""
  grad_norm = optax.tree.norm(grads)
  finite = jnp.isfinite(loss) & jnp.isfinite(grad_norm)
  metrics = {'loss': loss, 'grad_norm': grad_norm}
  if value_grads is not None:
    metrics['value/grad_norm'] = optax.tree.norm(value_grads)
    finite &= jnp.isfinite(metrics['value/grad_norm'])

  def apply(parts):
    params, opt_state, grads, value_params, value_opt_state, value_grads = parts
    updates, opt_state = optimizer.update(grads, opt_state, params)
    params = optax.apply_updates(params, updates)
    if value_grads is not None:
      v_updates, value_opt_state = value_optimizer.update(value_grads, value_opt_state,
                                                          value_params)
      value_params = optax.apply_updates(value_params, v_updates)
    return params, opt_state, value_params, value_opt_state

  def skip(parts):
    params, opt_state, _, value_params, value_opt_state, _ = parts
    return params, opt_state, value_params, value_opt_state

  # A conditional, not a select between new and old: XLA then never holds both the updated
  # and the previous params and optimizer state (a select kept ~2 extra copies of them).
  params, opt_state, value_params, value_opt_state = jax.lax.cond(
      finite, apply, skip, (state.params, state.opt_state, grads, state.value_params,
                            state.value_opt_state, value_grads))
  new_state = state.replace(params=params, opt_state=opt_state, value_params=value_params,
                            value_opt_state=value_opt_state,
                            step=state.step + finite.astype(jnp.int32),
                            skipped=state.skipped + (~finite).astype(jnp.int32))
  return new_state, {**metrics, 'skipped_nonfinite': (~finite).astype(jnp.float32)}


def accumulate_gradients(per_micro_loss, params, micro_batches, num: int):
  """Sum over micro-batches of (loss, grad, metrics) with a scan; metrics are averaged."""
  grad_fn = jax.value_and_grad(per_micro_loss, has_aux=True)

  def body(carry, micro):
    loss_sum, grad_sum = carry
    (loss, metrics), grads = grad_fn(params, micro)
    return (loss_sum + loss, jax.tree.map(jnp.add, grad_sum, grads)), metrics

  zeros = jax.tree.map(jnp.zeros_like, params)
  (loss, grads), metrics = jax.lax.scan(body, (jnp.zeros((), jnp.float32), zeros),
                                        _split(micro_batches, num))
  return loss, grads, jax.tree.map(lambda m: m.mean(0), metrics)


def train_step(state: TrainState, batch: TrainBatch, *, cfg: transformer.ModelConfig,
               objective: Objective, optimizer: optax.GradientTransformation,
               micro_batches: int = 1,
               value_optimizer: optax.GradientTransformation | None = None,
               to_model: Callable[[Any], Any] | None = None, term=None, term_args=()):
  """One optimizer update on a minibatch: (state, metrics).

  With a critic (objective.value_coef > 0 and state.value_params), `value_optimizer` updates
  the value head; the batch must carry old_values_NxL and returns_NxL. `to_model` maps the
  trainable params to the model's (a LoRA adapter merged into its frozen base, rl/adapters.py);
  the gradient is taken through it, so only the trainable params get updates. `term` and
  `term_args` as in loss_fn (a learner schedule's: methods/distill.py).
  """
  to_model = to_model or (lambda p: p)
  n = batch.tokens_NxT.shape[0]
  if n % micro_batches or (n // micro_batches) % objective.group_size:
    raise ValueError(f'train_step: {n} rows do not split into {micro_batches} micro-batches '
                     f'of whole groups of {objective.group_size}.')
  denominator = aggregation.denominators(batch.loss_mask_NxL, mode=objective.aggregation,
                                         max_len=objective.max_len)
  policy_den = None  # Self-normalising losses: their weights' sum, from the whole minibatch.
  if losses.self_normalising(objective.policy_loss, objective.loss_kwargs):
    if objective.aggregation != 'token_mean':
      raise ValueError(f'train_step: policy loss {objective.policy_loss!r} normalises by its '
                       "weights' sum (Σ w ℓ / Σ w), which needs aggregation 'token_mean', not "
                       f'{objective.aggregation!r}.')
    if micro_batches > 1:  # One micro-batch computes it in loss_fn, without a second forward.
      policy_den = weights_denominator(to_model(state.params), batch, cfg=cfg,
                                       objective=objective, micro_batches=micro_batches)
  critic = objective.value_coef > 0
  if critic and (state.value_params is None or value_optimizer is None
                 or batch.returns_NxL is None):
    raise ValueError('train_step: value_coef > 0 needs state.value_params, value_optimizer '
                     'and a batch with old_values_NxL and returns_NxL.')
  trainable = (state.params, state.value_params if critic else None)
  per_micro = lambda pv, micro: loss_fn(to_model(pv[0]), micro, denominator, cfg=cfg,
                                        objective=objective, value_params=pv[1],
                                        policy_denominator=policy_den, term=term,
                                        term_args=term_args)
  loss, (grads, value_grads), metrics = accumulate_gradients(per_micro, trainable, batch,
                                                             micro_batches)
  for part in ('policy_loss', 'value/loss', 'loss_term'):  # Parts of the loss: they add over
    # micro-batches.
    if part in metrics:
      metrics[part] = metrics[part] * micro_batches
  state, step_metrics = _apply_if_finite(state, grads, loss, optimizer, value_grads=value_grads,
                                         value_optimizer=value_optimizer)
  return state, {**metrics, **step_metrics}


def sft_step(state: TrainState, tokens_NxT, loss_mask_NxT, *, cfg: transformer.ModelConfig,
             optimizer: optax.GradientTransformation, micro_batches: int = 1,
             to_model: Callable[[Any], Any] | None = None):
  """Next-token cross-entropy on the tokens where loss_mask is set (the solution part);
  `to_model` as in train_step."""
  to_model = to_model or (lambda p: p)
  denominator = jnp.maximum(loss_mask_NxT[:, 1:].sum(dtype=jnp.float32), 1.0)

  def per_micro(params, micro):
    tokens, loss_mask = micro
    # Right padding: causal, harmless.
    # The model's own logits: R²PO's rollout head (if any) is not what SFT trains.
    logits = transformer.apply(rollout_head.detach(to_model(params)), tokens[:, :-1], cfg=cfg)[0]
    logp = jnp.take_along_axis(jax.nn.log_softmax(logits, -1), tokens[:, 1:, None], -1)[..., 0]
    return -jnp.sum(jnp.where(loss_mask[:, 1:], logp, 0.0)) / denominator, {}

  loss, grads, metrics = accumulate_gradients(per_micro, state.params,
                                              (tokens_NxT, loss_mask_NxT), micro_batches)
  state, step_metrics = _apply_if_finite(state, grads, loss, optimizer)
  return state, {**metrics, **step_metrics}
