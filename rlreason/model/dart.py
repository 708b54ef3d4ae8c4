"""DART (Disentangled Action-Reasoning Tuning, seed abstract): two LoRA adapters, one for
reasoning tokens and one for tool-call tokens, routed per token, unmerged.

  adapters = dart_init.init(model_cfg, lora_cfg, rng)  # {'reason': lora adapter, 'tool': ...}
  spec = route_spec(tok, 'tags')                     # the call's open / close token ids
  params = attach(base_params, adapters, spec, lora_cfg.scale)   # params['dart'] = {...}
  transformer.apply(params, tokens, cfg=cfg, mask_NxT=m)         # routes from the tokens
  transformer.apply(params, tok_Nx1, cfg=cfg, cache=c, route_NxT=r)  # with a cache: the caller's

Forward (paper: "separate low-rank adaptation modules" for reasoning and tool use; the
wiring is our formalisation): every targeted projection computes

  y = x W + s * [route ? (x A_tool) B_tool : (x A_reason) B_reason],   s = alpha / rank,

both rank-r paths in full and one selected per token (no merge: a merged W' cannot differ
per token). The adapters use lora.py's layouts and initialisation (B = 0: a fresh pair is
the base model exactly). Embedding and LM-head targets are refused (dart_init.check).

Routing (our formalisation; the abstract says only "reasoning and tool use"): a token is a
tool-call token when a call has been opened at or before it and not closed before it. With
o_t = 1 when the format's call-open token sequence ends at t and c_t = 1 when the close
sequence ends at t,

  s_t = o_t OR (s_{t-1} AND NOT c_{t-1}),   route_t = s_t,

so the open tag's last token and the close tag's tokens are tool tokens, and the token after
the close tag is a reasoning one again. Masked (padding) positions leave the state as it was.
The recurrence is causal: the episode loop runs it online over the tokens it feeds (prompt,
sampled turns, observations), carrying `RouteState` per row, and the learner's full forward
runs it over the same sequence (a lax.scan over T) and gets the same routes. Open tags per
family (`OPEN_TAGS`; the close tags are envs/formats.py's call_end): tags '<call>' ...
'</call>', qwen '<tool_call>' ... '</tool_call>'; llama3 has no open tag (a call is a bare
JSON turn) and is refused.

The adapters ride in the params tree under `KEY`, with the route spec and the scale as
arrays, so whatever receives the params (sampler, learner, evaluation) runs the routed
policy; `transformer.apply` strips the key before building the model.

Not here: the adapters' checks and initialisation (dart_init.py, which uses lora.py), the
trainer's side (rl/adapters.py), the CEA metric (methods/cea.py).
"""

from typing import Any

import flax
import jax
import jax.numpy as jnp
import numpy as np

KEY = 'dart'
ADAPTERS = ('reason', 'tool')
# The call-open text per envs/formats.py family (its call_end is the close text).
OPEN_TAGS = {'tags': '<call>', 'qwen': '<tool_call>'}
CLOSE_TAGS = {'tags': '</call>', 'qwen': '</tool_call>'}
Params = Any


@flax.struct.dataclass
class RouteState:
  """The recurrence's state per row after the tokens fed so far: the last W real tokens
  (-1 before any; W = the longer tag's length) and whether a call is open after them."""
  window_NxW: jax.Array
  inside_N: jax.Array


def route_spec(tok, family: str) -> dict[str, np.ndarray]:
  """{'open': ids, 'close': ids} of `family`'s call tags, as `tok` encodes them."""
  if family not in OPEN_TAGS:
    raise ValueError(f"DART routing: env.family={family!r} has no call-open tag (known: "
                     f"{sorted(OPEN_TAGS)}); llama3's calls are bare JSON turns, so no token "
                     'marks where a call starts.')
  spec = {k: np.asarray(tok.encode(text), np.int32)
          for k, text in (('open', OPEN_TAGS[family]), ('close', CLOSE_TAGS[family]))}
  for k, ids in spec.items():
    if ids.size == 0:
      raise ValueError(f'DART routing: the tokenizer encodes the {k} tag of {family!r} as no '
                       'tokens.')
  return spec


def initial_state(n: int, spec) -> RouteState:
  width = max(len(spec['open']), len(spec['close']))
  return RouteState(window_NxW=jnp.full((n, width), -1, jnp.int32),
                    inside_N=jnp.zeros((n,), bool))


def _ends_with(window_NxW, seq_S):
  s = seq_S.shape[0]
  return jnp.all(window_NxW[:, -s:] == seq_S[None, :].astype(window_NxW.dtype), axis=-1)


def route(tokens_NxT, mask_NxT, spec, state: RouteState | None = None):
  """(route_NxT bool, RouteState after the T tokens): the recurrence of the module docstring,
  from `state` (default: nothing seen). Masked positions: state unchanged, route False."""
  n = tokens_NxT.shape[0]
  state = initial_state(n, spec) if state is None else state
  open_O, close_C = jnp.asarray(spec['open']), jnp.asarray(spec['close'])

  def step(st: RouteState, x):
    tok_N, m_N = x
    window = jnp.concatenate([st.window_NxW[:, 1:], tok_N[:, None].astype(jnp.int32)], axis=1)
    s_N = _ends_with(window, open_O) | st.inside_N
    inside = s_N & ~_ends_with(window, close_C)
    new = RouteState(window_NxW=jnp.where(m_N[:, None], window, st.window_NxW),
                     inside_N=jnp.where(m_N, inside, st.inside_N))
    return new, s_N & m_N

  mask_NxT = jnp.ones(tokens_NxT.shape, bool) if mask_NxT is None else mask_NxT.astype(bool)
  state, route_TxN = jax.lax.scan(step, state, (tokens_NxT.T, mask_NxT.T))
  return route_TxN.T, state


# ----------------------------------------------------------------------------- params


def has(params: Params) -> bool:
  return isinstance(params, dict) and KEY in params


def attach(params: Params, adapters: Params, spec, scale: float) -> Params:
  """The model's params with the routed adapters, route spec and scale under `KEY`."""
  return {**params, KEY: {**adapters, 'open': jnp.asarray(spec['open'], jnp.int32),
                          'close': jnp.asarray(spec['close'], jnp.int32),
                          'scale': jnp.asarray(scale, jnp.float32)}}


def detach(params: Params) -> Params:
  """The params without the adapters (the base model)."""
  return {k: v for k, v in params.items() if k != KEY} if has(params) else params


def adapters_of(params: Params) -> Params:
  return {k: params[KEY][k] for k in ADAPTERS}


def feed(params: Params, tokens_NxT, mask_NxT, state: RouteState | None):
  """For loops that feed tokens through a cache: (route_NxT, new state), or (None, state)
  when the params carry no DART adapters."""
  if not has(params):
    return None, state
  return route(tokens_NxT, mask_NxT, params[KEY], state)


def layer(params: Params, route_NxT, index: int):
  """What block `index` needs: (its reason and tool adapters, route_NxT, scale), or None."""
  if not has(params):
    return None
  d = params[KEY]
  pair = {k: d[k].get('layers', {}).get(str(index), {}) for k in ADAPTERS}
  return pair, route_NxT, d['scale']


def lowrank(dart_layer, group: str, name: str, x, n_in: int, dtype):
  """s (x A_route) B_route for projection `group.name` of this layer (0 when untargeted):
  x's last n_in axes are the weight's input axes; the result has its output axes."""
  if dart_layer is None:
    return 0
  pair, route_NxT, scale = dart_layer
  if name not in pair['reason'].get(group, {}):
    return 0
  outs = []
  for k in ADAPTERS:
    ab = pair[k][group][name]
    u = jnp.tensordot(x, ab['a'].astype(dtype), axes=n_in)
    outs.append(jnp.tensordot(u, ab['b'].astype(dtype), axes=1))
  r = route_NxT.reshape(route_NxT.shape + (1,) * (outs[0].ndim - 2))
  return (scale.astype(dtype) * jnp.where(r, outs[1], outs[0])).astype(dtype)
