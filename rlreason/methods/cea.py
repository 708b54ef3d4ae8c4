"""Capability Effect Attribution (DART's seed abstract): do reasoning and tool use pull the
trainable params the same way?

  c.lora.cea_every = 5     # every 5th RL step, before its update: cea/... metrics

CEA is the cosine between the gradients, w.r.t. the trainable params (the LoRA adapter, or
DART's two), of the policy loss restricted to reasoning tokens and of the same loss
restricted to tool-call tokens (paper: "misaligned gradient directions" is a negative or
small cosine; the abstract gives no formula, so this is our formalisation):

  g_reason = grad L(loss_mask AND NOT tool),  g_tool = grad L(loss_mask AND tool),
  cea/cosine = <g_reason, g_tool> / (|g_reason| |g_tool|)   (0 when either is zero).

L is the run's objective (update.loss_fn: policy loss, KL and entropy terms, no critic) on
the step's whole batch, each part normalised by its own token denominator (the cosine does
not depend on it). The token split is DART's route (model/dart.py) of the token itself, the
same for joint LoRA and DART, so the two arms' numbers compare. Under DART also the cosines
within each adapter (`cea/cosine_reason_adapter`, `cea/cosine_tool_adapter`) and the share of
each loss's squared gradient norm in the other capability's adapter (`cea/reason_loss_in_tool`,
`cea/tool_loss_in_reason`): nonzero only through hidden states that earlier tokens of the
other kind produced.

One extra jitted function (two backward passes over the batch), run on the host's schedule
(`metrics`), never inside the train step.
"""

import jax
import jax.numpy as jnp
import optax

from rlreason.model import dart
from rlreason.objectives import aggregation
from rlreason.rl import adapters
from rlreason.rl import update


def tool_mask(batch, spec):
  """NxL: the completion tokens that are tool-call tokens (DART's route of each token)."""
  route_NxT, _ = dart.route(batch.tokens_NxT, batch.mask_NxT, spec)
  return route_NxT[:, -batch.loss_mask_NxL.shape[1]:]


def _cos(a, b):
  dot = sum(jnp.vdot(x, y) for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)))
  den = optax.tree.norm(a) * optax.tree.norm(b)
  return jnp.where(den > 0, dot / jnp.where(den > 0, den, 1.0), 0.0)


def cea(trainable, batch, *, to_model, spec, cfg, objective, routed: bool):
  """The cea/... metrics of `batch` at `trainable` (see the module docstring); jittable."""
  tool_NxL = tool_mask(batch, spec)
  mask_NxL = batch.loss_mask_NxL

  def loss(params, part_NxL):
    part = batch.replace(loss_mask_NxL=part_NxL.astype(mask_NxL.dtype))
    den = jnp.maximum(aggregation.denominators(part_NxL, mode=objective.aggregation,
                                               max_len=objective.max_len), 1e-9)
    return update.loss_fn(to_model(params), part, den, cfg=cfg, objective=objective)[0]

  reason_NxL = (mask_NxL > 0) & ~tool_NxL
  tools_NxL = (mask_NxL > 0) & tool_NxL
  g_reason = jax.grad(loss)(trainable, reason_NxL)
  g_tool = jax.grad(loss)(trainable, tools_NxL)
  out = {'cea/cosine': _cos(g_reason, g_tool),
         'cea/reason_grad_norm': optax.tree.norm(g_reason),
         'cea/tool_grad_norm': optax.tree.norm(g_tool),
         'cea/tool_token_frac': tools_NxL.sum() / jnp.maximum((mask_NxL > 0).sum(), 1)}
  if routed:
    sq = lambda t: optax.tree.norm(t) ** 2
    share = lambda g, k: sq(g[k]) / jnp.maximum(sq(g), 1e-30)
    out.update({'cea/cosine_reason_adapter': _cos(g_reason['reason'], g_tool['reason']),
                'cea/cosine_tool_adapter': _cos(g_reason['tool'], g_tool['tool']),
                'cea/reason_loss_in_tool': share(g_reason, 'tool'),
                'cea/tool_loss_in_reason': share(g_tool, 'reason')})
  return out


def metrics(run, trainable, batch, step: int) -> dict:
  """The cea/... metrics when lora.cea_every divides `step` (LoRA or DART runs), else {}."""
  every = run.config.lora.get('cea_every', 0)
  if run.adapter is None or not every or step % every:
    return {}
  adapter = run.adapter
  if adapter.cea is None:
    adapter.cea = jax.jit(lambda p, base, b: cea(
        p, b, to_model=adapters.to_model(adapter, base, run.cfg), spec=adapter.spec,
        cfg=run.cfg, objective=run.objective, routed=bool(adapter.routing)))
  return adapter.cea(trainable, adapter.base, batch)


def build(run):
  """CEA's metrics under lora.cea_every (rl/extensions.py: batch metrics), or None."""
  return CeaMetrics() if run.config.lora.get('cea_every', 0) else None


class CeaMetrics:

  def batch_metrics(self, run, *, params, batch, step: int, **unused) -> dict:
    del unused
    return metrics(run, params, batch, step)
