"""Reward-model losses: pointwise (labelled answers) and pairwise (Bradley–Terry preferences).

  loss, metrics = pointwise(scores_N, labels_N)          # a QA pair right (1) or wrong (0)
  loss, metrics = bradley_terry(chosen_N, rejected_N)     # the chosen answer preferred

Scores are the reward model's scalar logits, one per sequence (methods/reward_model.py reads
them from the last real token's hidden state).

- pointwise: binary cross-entropy with logits, mean over rows: the score is the log-odds
  that the answer is right, so sigmoid(score) is a calibrated correctness probability.
  The outcome-reward-model objective of Cobbe et al. 2021 (GSM8K verifiers; arXiv 2110.14168),
  here per sequence (their verifier also trains per token).
- bradley_terry: -log σ(s_chosen - s_rejected - margin), mean over pairs (InstructGPT, arXiv
  2203.02155, eq. 1). Reference code [C]: huggingface/trl `RewardTrainer.compute_loss`
  (`-logsigmoid(rewards_chosen - rewards_rejected - margin).mean()`, margin optional per pair).
  Only differences of scores are identified, so a BT model's scores have an arbitrary offset.

Pure and jittable; the metrics are the held-out numbers a user reads (accuracy: the sign of
the score agrees with the label / the chosen one scores higher).
"""

import jax
import jax.numpy as jnp


def pointwise(scores_N, labels_N, *, weights_N=None):
  """(mean BCE-with-logits, metrics) for labels in {0, 1} (floats in [0, 1] allowed)."""
  labels_N = labels_N.astype(jnp.float32)
  scores_N = scores_N.astype(jnp.float32)
  # -[y log σ(s) + (1 - y) log(1 - σ(s))] = y softplus(-s) + (1 - y) softplus(s).
  loss_N = labels_N * jax.nn.softplus(-scores_N) + (1.0 - labels_N) * jax.nn.softplus(scores_N)
  w_N = jnp.ones_like(loss_N) if weights_N is None else weights_N.astype(jnp.float32)
  loss = jnp.sum(w_N * loss_N) / jnp.maximum(jnp.sum(w_N), 1e-9)
  correct_N = (scores_N > 0) == (labels_N > 0.5)
  return loss, {'rm/loss': loss,
                'rm/accuracy': jnp.sum(w_N * correct_N) / jnp.maximum(jnp.sum(w_N), 1e-9),
                'rm/score_mean': jnp.mean(scores_N)}


def bradley_terry(chosen_N, rejected_N, *, margin_N=None):
  """(mean -log σ(chosen - rejected - margin), metrics)."""
  diff_N = chosen_N.astype(jnp.float32) - rejected_N.astype(jnp.float32)
  if margin_N is not None:
    diff_N = diff_N - margin_N.astype(jnp.float32)
  loss = jnp.mean(jax.nn.softplus(-diff_N))  # -log σ(x) = softplus(-x)
  raw_N = chosen_N.astype(jnp.float32) - rejected_N.astype(jnp.float32)
  return loss, {'rm/loss': loss, 'rm/accuracy': jnp.mean(raw_N > 0),
                'rm/margin_mean': jnp.mean(raw_N)}


LOSSES = {'pointwise': pointwise, 'pairwise': bradley_terry}
