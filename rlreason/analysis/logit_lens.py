"""Logit lens: the residual stream after each layer, read out as if it were the last.

  resid = residual_stream(params, tokens_NxT, cfg=cfg, mask_NxT=m)   # L + 1 arrays NxTxD
  logprobs_KxNxT = lens_logprobs(params, tokens_NxT, cfg=cfg, mask_NxT=m)

residual k is the stream entering block k (k = 0: the embeddings; k = L: the last block's
output, before the final norm). The lens of residual k is unembed(final_norm(resid_k)), so
the lens of k = L is the model's own logits (tests/analysis_test.py checks equality with
transformer.apply). nostalgebraist's logit lens (2020) [C: the idea; this code is ours].

The forward walks transformer.module's blocks one at a time with no KV cache, the same ops as
transformer.apply's full forward; `patch` replaces one residual at chosen positions
(patching.py builds on it). Deliberately not here: tuned lenses (a learned map per layer),
DART-routed params (transformer.module refuses them).
"""

import functools

import jax
import jax.numpy as jnp

from rlreason.model import transformer


def embedded(params, tokens_NxT, *, cfg: transformer.ModelConfig, mask_NxT=None):
  """What the blocks start from, as transformer.apply builds it: (the nnx model, the bool
  mask (all True when None), RoPE's cos/sin of the default positions, the embeddings)."""
  if mask_NxT is None:
    mask_NxT = jnp.ones(tokens_NxT.shape, bool)
  mask_NxT = mask_NxT.astype(bool)
  model = transformer.module(params, cfg)
  rope = transformer.rope_cos_sin(transformer.default_positions(mask_NxT),
                                  transformer.rope_inv_freq(cfg))
  x_NxTxD = jnp.take(model.embed[...], tokens_NxT, axis=0).astype(cfg.compute_dtype)
  return model, mask_NxT, rope, x_NxTxD


def residual_stream(params, tokens_NxT, *, cfg: transformer.ModelConfig, mask_NxT=None,
                    patch=None) -> list[jax.Array]:
  """[resid_0, ..., resid_L], each NxTxD in compute dtype.

  patch: (k, resid_NxTxD, where_NxT) or None: before block k runs (k = L: before the final
  norm), the stream takes resid_NxTxD's values where where_NxT is True.
  """
  model, mask_NxT, rope, x_NxTxD = embedded(params, tokens_NxT, cfg=cfg, mask_NxT=mask_NxT)

  def patched(k, x_NxTxD):
    if patch is None or patch[0] != k:
      return x_NxTxD
    _, other_NxTxD, where_NxT = patch
    return jnp.where(where_NxT[..., None], other_NxTxD.astype(x_NxTxD.dtype), x_NxTxD)

  x_NxTxD = patched(0, x_NxTxD)
  stream = [x_NxTxD]
  for i in range(cfg.num_layers):
    x_NxTxD, _, _ = model.layers[str(i)](x_NxTxD, rope, mask_NxT, None)  # (x, kv, routes)
    x_NxTxD = patched(i + 1, x_NxTxD)
    stream.append(x_NxTxD)
  return stream


def readout(params, resid_NxTxD, *, cfg: transformer.ModelConfig):
  """fp32 logits NxTxV of a residual: the final norm, then the unembedding."""
  model = transformer.module(params, cfg)
  return transformer.logits_from_hidden(params, model.final_norm(resid_NxTxD), cfg=cfg)


@functools.partial(jax.jit, static_argnames='cfg')
def lens_logits(params, tokens_NxT, *, cfg: transformer.ModelConfig, mask_NxT=None):
  """Logit lens of every residual: (L + 1)xNxTxV fp32 (mind V: small vocabularies only)."""
  stream = residual_stream(params, tokens_NxT, cfg=cfg, mask_NxT=mask_NxT)
  return jnp.stack([readout(params, r, cfg=cfg) for r in stream])


@functools.partial(jax.jit, static_argnames='cfg')
def lens_logprobs(params, tokens_NxT, *, cfg: transformer.ModelConfig, mask_NxT=None):
  """(L + 1)xNxT: log p_k(token t | tokens < t) read from residual k at position t - 1; column
  0 (no prefix) is 0."""
  stream = residual_stream(params, tokens_NxT, cfg=cfg, mask_NxT=mask_NxT)
  return jnp.stack([next_token_logprobs(readout(params, r, cfg=cfg), tokens_NxT)
                    for r in stream])


def next_token_logprobs(logits_NxTxV, tokens_NxT):
  """log softmax(logits at t - 1)[token t], NxT, with 0 in column 0."""
  logp_NxTxV = jax.nn.log_softmax(logits_NxTxV[:, :-1].astype(jnp.float32), axis=-1)
  picked_NxT = jnp.take_along_axis(logp_NxTxV, tokens_NxT[:, 1:, None], axis=-1)[..., 0]
  return jnp.pad(picked_NxT, ((0, 0), (1, 0)))
