"""Activation patching and parameter patching between two runs' params (A and B).

  logits = activation_patch(params_a, params_b, tokens_NxT, cfg=cfg, layer=k, where_NxT=w)
  hybrid = patch_params(params_a, params_b, ('layers.2', 'lm_head'))

Activation patching [C: Meng et al. 2022's causal tracing, Wang et al. 2022's patching; this
code is ours]: run B on the tokens, run A on the same tokens with residual k (the stream
entering block k; k = L before the final norm, logit_lens.residual_stream) replaced by B's at
the positions where_NxT; A's blocks from k on, and A's norm and unembedding, compute the rest.
Patching residual 0 at every position with B = A except for the embeddings, or residual L with
B sharing A's final norm and unembedding, reproduces B's logits (tests/analysis_test.py).

Parameter patching: A's params with the named components (top-level keys 'embed', 'final_norm',
'lm_head', or 'layers.i' / 'layers.i.attn' / 'layers.i.mlp') taken from B; all of them make B.
Swapping one layer of an RL-trained B into its start A and measuring what moves says where in
the layers the change sits (the perplexity-paradox study does that).

Path patching [C: Wang et al. 2022; Goldowsky-Dill et al. 2023; this code is ours]: A's
forward in which only the named receivers ('layers.j.attn', 'layers.j.mlp') read the input
they would get in B's run (at where_NxT), while the residual stream and every other sublayer
stay A's: the effect of B's stream on the output along the paths through those receivers only.
"""

import functools

import jax
import jax.numpy as jnp

from rlreason.analysis import logit_lens
from rlreason.model import transformer


@functools.partial(jax.jit, static_argnames=('cfg', 'layer'))
def activation_patch(params_a, params_b, tokens_NxT, *, cfg: transformer.ModelConfig,
                     layer: int, where_NxT, mask_NxT=None):
  """A's fp32 logits NxTxV with residual `layer` taken from B's run where where_NxT."""
  if not 0 <= layer <= cfg.num_layers:
    raise ValueError(f'activation_patch: layer={layer} outside [0, {cfg.num_layers}].')
  resid_b = logit_lens.residual_stream(params_b, tokens_NxT, cfg=cfg, mask_NxT=mask_NxT)[layer]
  stream = logit_lens.residual_stream(params_a, tokens_NxT, cfg=cfg, mask_NxT=mask_NxT,
                                      patch=(layer, resid_b, where_NxT))
  return logit_lens.readout(params_a, stream[-1], cfg=cfg)


def components(cfg: transformer.ModelConfig) -> tuple[str, ...]:
  """Every patchable component, coarse: embeddings, each layer, the final norm, the head."""
  head = () if cfg.tie_embeddings else ('lm_head',)
  return ('embed', *(f'layers.{i}' for i in range(cfg.num_layers)), 'final_norm', *head)


def patch_params(params_a, params_b, names):
  """A copy of params_a with the subtrees at `names` ('layers.3', 'layers.3.mlp', 'embed')
  taken from params_b (shapes must agree)."""
  out = jax.tree.map(lambda x: x, params_a)  # New dicts; the arrays are shared, not copied.
  for name in names:
    *path, leaf = name.split('.')
    src, dst = params_b, out
    try:
      for key in path:
        src, dst = src[key], dst[key]
      value = src[leaf]
      dst[leaf]  # noqa: B018 (the key must exist in A too)
    except (KeyError, TypeError):
      raise ValueError(f'patch_params: no component {name!r} in both parameter trees; '
                       f"e.g. 'embed', 'layers.0', 'layers.0.attn', 'final_norm'.") from None
    if jax.tree.map(lambda x: x.shape, value) != jax.tree.map(lambda x: x.shape, dst[leaf]):
      raise ValueError(f'patch_params: component {name!r} has different shapes in A and B.')
    dst[leaf] = value
  return out


def sublayer_inputs(params, tokens_NxT, *, cfg: transformer.ModelConfig, mask_NxT=None,
                    receivers=(), other=None, where_NxT=None):
  """({'layers.j.attn' / 'layers.j.mlp': the residual that sublayer reads}, final residual).

  With `other` (another run's sublayer inputs), the sublayers named in `receivers` read
  other's input instead of their own where where_NxT; their outputs still add to this run's
  stream.
  """
  model, mask_NxT, rope, x_NxTxD = logit_lens.embedded(params, tokens_NxT, cfg=cfg,
                                                      mask_NxT=mask_NxT)
  inputs = {}

  def read(name, x_NxTxD):
    inputs[name] = x_NxTxD
    if name not in receivers:
      return x_NxTxD
    return jnp.where(where_NxT[..., None], other[name].astype(x_NxTxD.dtype), x_NxTxD)

  for i in range(cfg.num_layers):
    block = model.layers[str(i)]
    y_NxTxD, _ = block.attn(block.attn_norm(read(f'layers.{i}.attn', x_NxTxD)), rope,
                            mask_NxT, None)
    x_NxTxD = x_NxTxD + y_NxTxD
    x_NxTxD = x_NxTxD + block.mlp(block.mlp_norm(read(f'layers.{i}.mlp', x_NxTxD)))
  return inputs, x_NxTxD


@functools.partial(jax.jit, static_argnames=('cfg', 'receivers'))
def path_patch(params_a, params_b, tokens_NxT, *, cfg: transformer.ModelConfig,
               receivers: tuple[str, ...], where_NxT, mask_NxT=None):
  """A's fp32 logits NxTxV where only `receivers` read B's run's inputs (module docstring)."""
  known = {f'layers.{i}.{s}' for i in range(cfg.num_layers) for s in ('attn', 'mlp')}
  if set(receivers) - known:
    raise ValueError(f'path_patch: receivers {sorted(set(receivers) - known)} unknown; '
                     "e.g. 'layers.0.attn', 'layers.0.mlp'.")
  inputs_b, _ = sublayer_inputs(params_b, tokens_NxT, cfg=cfg, mask_NxT=mask_NxT)
  _, final_NxTxD = sublayer_inputs(params_a, tokens_NxT, cfg=cfg, mask_NxT=mask_NxT,
                                   receivers=receivers, other=inputs_b, where_NxT=where_NxT)
  return logit_lens.readout(params_a, final_NxTxD, cfg=cfg)
