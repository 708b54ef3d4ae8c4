"""R²PO's residual rollout head (arXiv 2601.11960): logits that explore, beside the ones that answer.

  head = init(cfg, rng)                      # w1: DxD, w2: DxV, both ~N(0, init_std²)
  params = attach(model_params, head)         # params['rollout_head'] = head
  transformer.apply(params, tokens, cfg=cfg)  # rollout logits: W_lm h + W2 ReLU(W1 h)
  transformer.apply(detach(params), ...)      # inference logits: W_lm h

The head is a leaf of the params tree under `KEY`, so whatever receives params that carry
it (the sampler, the episode loop, the learner's chunked log-probs) uses the rollout
logits, and whatever receives `detach(params)` uses the model's own. Reference code [C]:
RRPO-ARR/Code `simple_grpo_v1/qwen_with_adaptor.py` (z_roll = lm_head(h) + W2 ReLU(W1 h),
init N(0, 1e-6) so that the head starts as the base policy; h is the final-norm hidden
state). There std 1e-6; here `init_std` (default 1e-6).

The learner projects to the vocabulary chunk by chunk (token_stats.py) and never holds NxTxV
logits, so `projection` gives it one matrix for both terms: [h, ReLU(W1 h)] @ [W_lm; W2].

Not here: the two-stage schedule, which params train when, and the rarity reward
(methods/r2po.py, objectives/advantages.r2po_rarity).
"""

from typing import Any

import jax
import jax.numpy as jnp

KEY = 'rollout_head'
Params = Any


def init(cfg, rng: jax.Array, *, init_std: float = 1e-6) -> Params:
  """{'w1': DxD, 'w2': DxV} in the model's param dtype, normal(0, init_std)."""
  k1, k2 = jax.random.split(rng)
  d, v = cfg.hidden_size, cfg.vocab_size
  dtype = jnp.dtype(cfg.param_dtype)
  return {'w1': (init_std * jax.random.normal(k1, (d, d), jnp.float32)).astype(dtype),
          'w2': (init_std * jax.random.normal(k2, (d, v), jnp.float32)).astype(dtype)}


def axes() -> Params:
  """Logical axes of the head's leaves (model/sharding.py rules): w2 like the LM head."""
  return {'w1': ('embed', 'mlp'), 'w2': ('embed', 'vocab')}


def has_head(params: Params) -> bool:
  return isinstance(params, dict) and KEY in params


def attach(params: Params, head: Params) -> Params:
  return {**params, KEY: head}


def detach(params: Params) -> Params:
  """The model's own params (the inference policy): the tree without the head."""
  if not has_head(params):
    return params
  return {k: v for k, v in params.items() if k != KEY}


def features(head: Params, h_NxTxD, compute_dtype):
  """ReLU(h W1): the head's hidden features, NxTxD."""
  return jax.nn.relu(jnp.einsum('ntd,de->nte', h_NxTxD, head['w1'].astype(compute_dtype)))


def projection(params: Params, h_NxTxD, w_DxV, compute_dtype):
  """(h', W') with h' W' = h W + ReLU(h W1) W2 when params carry the head, else (h, W)."""
  if not has_head(params):
    return h_NxTxD, w_DxV
  head = params[KEY]
  h2 = jnp.concatenate([h_NxTxD, features(head, h_NxTxD, compute_dtype).astype(h_NxTxD.dtype)],
                       axis=-1)
  return h2, jnp.concatenate([w_DxV, head['w2'].astype(w_DxV.dtype)], axis=0)
