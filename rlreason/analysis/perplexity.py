"""Prompt-token vs answer-token perplexity of a batch: the perplexity paradox's measurement.

The paradox (spurious-reward RL; issue #23 item 6): a policy trained on a random reward can grow
more confident in its answers (answer perplexity falls) while modelling the prompt worse
(prompt perplexity rises). Sequences are a left-padded prompt of T - L tokens then L completion
tokens (sampler.sequences' layout). A token is scored when it and its predecessor are real
(the first real token has no prefix to predict it from); perplexity is exp of the mean
negative log-prob over a region's scored tokens, pooled over rows [F].

Deliberately not here: per-layer readouts (logit_lens.lens_logprobs gives the same split per
layer), the training-time hook (rl/train.py calls `batch_metrics` under monitors.perplexity).
"""

import functools

import jax
import jax.numpy as jnp

from rlreason.analysis import logit_lens
from rlreason.model import transformer


def scored_mask(mask_NxT):
  """Tokens with a real predecessor: mask[t] and mask[t - 1]."""
  mask_NxT = mask_NxT.astype(bool)
  return mask_NxT & jnp.pad(mask_NxT[:, :-1], ((0, 0), (1, 0)))


def split_perplexity(logprobs_NxT, mask_NxT, *, completion_length: int) -> dict:
  """{'prompt', 'answer'}: exp(-mean log-prob) over the scored tokens of the first T - L
  columns and of the last L; a region with no scored token gives 1."""
  scored_NxT = scored_mask(mask_NxT)
  t = logprobs_NxT.shape[1]
  answer_T = jnp.arange(t) >= t - completion_length
  out = {}
  for name, region_T in (('prompt', ~answer_T), ('answer', answer_T)):
    w_NxT = scored_NxT & region_T[None]
    nll = -(jnp.where(w_NxT, logprobs_NxT, 0.0).sum()) / jnp.maximum(w_NxT.sum(), 1)
    out[name] = jnp.exp(nll)
  return out


@functools.partial(jax.jit, static_argnames=('cfg', 'completion_length'))
def batch_metrics(params, tokens_NxT, mask_NxT, *, completion_length: int,
                  cfg: transformer.ModelConfig) -> dict:
  """{'perplexity/prompt', 'perplexity/answer'} of a batch under `params` (device scalars)."""
  logits_NxTxV, _ = transformer.apply(params, tokens_NxT, cfg=cfg, mask_NxT=mask_NxT)
  logprobs_NxT = logit_lens.next_token_logprobs(logits_NxTxV, tokens_NxT)
  split = split_perplexity(logprobs_NxT, mask_NxT, completion_length=completion_length)
  return {f'perplexity/{k}': v for k, v in split.items()}
