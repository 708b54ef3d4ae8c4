"""Grouped rollouts: prefill each prompt once, share its cache with G samples, decode in chunks.

  rollout = sampler.generate(params, prompts, cfg=cfg, group_size=8, max_new_tokens=256,
                             temperature=1.0, stop_tokens=(eos,), rng=key)

The KV cache is a chain of segments (transformer.FrozenKV): the prompts' (B rows, each read by its
G samples, so the prompt's keys are read once per group rather than G times), the prefixes'
(if any), and one per decode chunk (`decode_chunks`), written by its own while_loop. A decode
step reads only the segments filled so far: on the sampler benchmark (64 prompt tokens, 128
new, G = 8, 8 chunks) that is 42% of the slots a single G-times-repeated cache reads.

Rows are prompt-major (row n = b*G + g). The behaviour policy is recorded exactly: for each
sampled token, its log-prob under the distribution actually sampled from (temperature, then
top-k, then top-p, renormalised) and under the plain tempered softmax. The learner uses the
plain tempered log-probs (`Rollout.logprobs_NxL`): it recomputes exactly that quantity with
teacher forcing, so the first-epoch ratio is 1 up to numerics and PPO-style clipping measures
policy change only. Truncation (top-k/top-p) makes sampling slightly off-policy with respect
to that; `metrics(rollout)` reports the gap (mean behaviour minus plain log-prob, >= 0).
With `sample_dtype='bfloat16'` the recorded log-probs are the bf16 policy's (fp32 numbers of
a bf16 forward), no longer the learner's fp32 recompute: an off-policy correction handles it.

Shapes are static per (bucketed prompt length, prefix length, G, max_new_tokens, top-k,
top-p, stop set, cache dtype, sample dtype), so a training run compiles once per bucket.
Temperature is traced (changing it does not recompile), except that temperature 0 selects
greedy decoding.

A call can keep its rows' cache for a later one (`return_context=True`: the last sampled token
is fed too, so the cache holds every row's prompt and tokens) and a later call can continue
from it (`context=`, no prompt and no prefill: its rows read the kept segments, G rows per kept
row, and start with their prefixes): rollout/fork_join.py's workers and join read the parent's
cache this way instead of prefilling its context again.

Deliberately not here: tokenisation and bucketing (`prepare_prompts` wraps tokenizer.pad_left),
beam search, speculative decoding, a paged cache.
"""

from collections.abc import Sequence
import functools

import flax
import jax
import jax.numpy as jnp
import numpy as np

from rlreason.model import moe_config
from rlreason.model import moe_layer
from rlreason.model import sharding
from rlreason.model import tokenizer
from rlreason.model import transformer
from rlreason.rollout import sampling
from rlreason.structs import Prefixes, Prompts, Rollout


@flax.struct.dataclass
class Context:
  """A call's rows as a later call continues them (`generate(return_context=True)`).

  segments: the read-only cache segments (the prompts', then the rows' own: prefix and sampled
  tokens); pos_N: each row's next RoPE position; tokens: the slots the segments hold per row
  (static: it sizes the next call's RoPE table)."""
  segments: tuple[transformer.FrozenKV, ...]
  pos_N: jax.Array
  tokens: int = flax.struct.field(pytree_node=False, default=0)


MAX_CHUNKS = 8  # Default while_loops per decode (see decode_chunks).
DONE_CHECK_EVERY = 8  # Steps between all-reduces of "every row done" when rows are sharded.


def prepare_prompts(token_lists: Sequence[Sequence[int]], *, buckets: Sequence[int],
                    pad_id: int = 0) -> Prompts:
  """Left-pads host token lists to the smallest bucket that fits (errors name the row)."""
  tokens_BxP, mask_BxP = tokenizer.pad_left(token_lists, buckets=buckets, pad_id=pad_id)
  return Prompts(tokens_BxP=jnp.asarray(tokens_BxP), mask_BxP=jnp.asarray(mask_BxP))


def memory_estimate(cfg: transformer.ModelConfig, *, batch: int, group_size: int, prompt_len: int,
                    max_new_tokens: int, prefix_len: int = 0, cache_dtype=None,
                    num_devices: int = 1, max_chunks: int = MAX_CHUNKS,
                    sample_dtype: str | None = None) -> dict[str, int]:
  """Bytes per device of the sampler's large buffers (params assumed replicated per device
  except for the tensor-parallel split, which callers fold into num_devices).

  kv_cache: the prompt's slots once per group, each row's prefix and sampled slots.
  kv_merge: at most this much more while the last chunk boundary copies a row's history
  into one segment (the old history is alive next to the new one). An upper bound: the
  compiled sampler benchmark (mid, 8 chunks) needs 47 MiB of temp memory more than with the
  chunks kept apart, against 108 MiB here. max_chunks=1 makes it 0.
  sample_params (only with a sample_dtype other than cfg.param_dtype): generate's cast copy
  of the weights, alive next to the given params for the whole call.
  """
  n = batch * group_size
  slot_bytes = 2 * cfg.num_layers * cfg.num_kv_heads * cfg.head_dim * np.dtype(
      cache_dtype or sample_dtype or cfg.compute_dtype).itemsize
  param_bytes = np.dtype(cfg.param_dtype).itemsize
  cast = sample_dtype is not None and sample_dtype != cfg.param_dtype
  chunks = decode_chunks(max_new_tokens - 1, max_chunks)
  last_start = chunks[-1][0] if len(chunks) > 1 else 0
  est = {
      'params': cfg.num_params() * param_bytes,
      'kv_cache': (batch * prompt_len + n * (prefix_len + max_new_tokens)) * slot_bytes,
      'kv_merge': n * (prefix_len + last_start) * slot_bytes if len(chunks) > 1 else 0,
      # Prefill keeps one layer's activations plus its attention scores alive at a time.
      'prefill_activations': batch * prompt_len * (4 * cfg.hidden_size + 2 * cfg.intermediate_size
                                                   + cfg.num_heads * prompt_len) * 4,
      'decode_logits': 3 * n * cfg.vocab_size * 4,
      'outputs': n * (prefix_len + max_new_tokens) * 4 * 4,
  }
  if cast:
    est['sample_params'] = cfg.num_params() * np.dtype(sample_dtype).itemsize
  est = {k: -(-v // num_devices) for k, v in est.items()}
  est['total'] = sum(est.values())
  return est


def _validate(prompts, cfg, group_size, max_new_tokens, temperature, top_k, top_p,
              stop_tokens, prefixes, context=None):
  if group_size < 1:
    raise ValueError(f'group_size must be >= 1, got {group_size}.')
  if max_new_tokens <= 0:
    raise ValueError(f'max_new_tokens must be > 0, got {max_new_tokens}.')
  if not temperature >= 0:
    raise ValueError(f'temperature must be >= 0, got {temperature}.')
  if not 0 < top_p <= 1:
    raise ValueError(f'top_p must be in (0, 1], got {top_p}.')
  if not 0 <= top_k <= cfg.vocab_size:
    raise ValueError(f'top_k must be in [0, vocab_size={cfg.vocab_size}], got {top_k}.')
  bad = [t for t in stop_tokens if not 0 <= t < cfg.vocab_size]
  if bad:
    raise ValueError(f'stop_tokens {bad} are outside the vocabulary [0, {cfg.vocab_size}).')
  if context is not None:
    if prompts is not None or prefixes is None:
      raise ValueError('generate(context=...) continues kept rows: pass prompts=None and '
                       'prefixes (the rows start from their prefix, there are no prompt logits).')
    n = context.pos_N.shape[0] * group_size
    if prefixes.tokens_NxQ.shape[0] != n:
      raise ValueError(f'prefixes: {prefixes.tokens_NxQ.shape[0]} rows, expected the '
                       f"context's rows x G = {n}.")
    return
  if prompts.tokens_BxP.ndim != 2 or prompts.tokens_BxP.shape != prompts.mask_BxP.shape:
    raise ValueError(f'prompts: tokens {prompts.tokens_BxP.shape} and mask '
                     f'{prompts.mask_BxP.shape} must be equal 2-D shapes.')
  lengths = np.asarray(prompts.mask_BxP).sum(axis=1)
  if (lengths == 0).any():
    raise ValueError(f'prompts: rows {np.flatnonzero(lengths == 0).tolist()} are empty.')
  if not np.asarray(prompts.mask_BxP)[:, -1].all():
    raise ValueError('prompts must be left-padded: every row ends with a real token.')
  if prefixes is not None:
    n = prompts.tokens_BxP.shape[0] * group_size
    if prefixes.tokens_NxQ.shape[0] != n:
      raise ValueError(f'prefixes: {prefixes.tokens_NxQ.shape[0]} rows, expected B*G = {n}.')
    mask = np.asarray(prefixes.mask_NxQ)
    if (np.diff(mask.astype(int), axis=1) > 0).any():
      raise ValueError('prefixes must be right-padded: a row has a gap before a real token.')


def generate(params, prompts: Prompts, *, cfg: transformer.ModelConfig, group_size: int,
             max_new_tokens: int, rng: jax.Array, temperature: float = 1.0, top_k: int = 0,
             top_p: float = 1.0, stop_tokens: Sequence[int] = (), pad_id: int = 0,
             prefixes: Prefixes | None = None, cache_dtype: str | None = None,
             mesh: jax.sharding.Mesh | None = None,
             memory_budget_bytes: int | None = None, max_chunks: int = MAX_CHUNKS,
             sample_dtype: str | None = None, row_rng: bool = False,
             max_new_tokens_N=None, context: Context | None = None,
             return_context: bool = False, return_routes: bool = False):
  """Samples G completions for each of B prompts.

  Args:
    params: model parameters (in SAMPLE_RULES shardings when `mesh` is given).
    prompts: left-padded Prompts (see prepare_prompts).
    cfg: the model architecture.
    group_size: G, samples per prompt.
    max_new_tokens: tokens sampled per row after its prefix.
    rng: a PRNG key; the same key gives the same rollout.
    temperature: 0 for greedy decoding.
    top_k: keep the k most likely tokens (0 keeps all).
    top_p: keep the smallest set of most likely tokens with mass >= top_p.
    stop_tokens: a row finishes after sampling one of these (included in its mask).
    pad_id: written after a row finishes.
    prefixes: optional per-row continuations of the prompt, fed before sampling starts.
    cache_dtype: KV cache dtype (default: cfg.compute_dtype); 'bfloat16' halves its memory.
    mesh: shard rows over the batch axes of this mesh.
    memory_budget_bytes: fail before compiling if memory_estimate exceeds this per device.
    max_chunks: the decode loop is cut into at most this many while_loops (`decode_chunks`),
      each compiled on its own: more attend to fewer empty cache slots, fewer compile faster.
    sample_dtype: None samples with cfg's dtypes (fp32: the recorded log-probs are the
      learner's, up to rounding). 'bfloat16' casts the weights to bf16 once per call, inside
      the jitted sampler (params stay as given in memory): matmuls and the KV cache (unless
      cache_dtype says otherwise) in bf16, the vocabulary projection accumulated in fp32 and
      the log-softmax in fp32. The recorded log-probs are then the bf16 policy's, so the
      learner's fp32 recompute differs from them even before any update: correct for that
      with the off-policy API (objectives/offpolicy.py, `objective.correction`, e.g.
      'tis_token') and watch its learner-vs-sampler metrics. XLA:CPU (jax 0.10.2) computes
      bf16 dots in f32 (it converts the cast weights back to f32 once, before the loops, and
      the bf16 cache at every step), so on CPU this mode is no faster than fp32
      (experiments/bench/sampler.py); it is meant for TPUs and GPUs.
    row_rng: False draws step i of every row from one key, fold_in(rng, i) (the default,
      unchanged). True gives each row its own stream (sampling.row_keys / step_keys): token
      j of row n depends on (n, j) only, which continuous batching (continuous.py) also
      uses, so the two samplers draw the same tokens from the same rng.
    max_new_tokens_N: optional int (N,) per-row limits in [1, max_new_tokens]: row n
      finishes after that many sampled tokens (truncated_N says whether it stopped on a
      stop token); the benchmark imposes lengths with it.
    context: continue the rows of an earlier call's `return_context` instead of prompts
      (prompts=None): row n reads kept row n // G's segments, nothing is prefilled again, and
      `prefixes` (required) are fed first; Rollout.prompts is then None. Equal, up to
      rounding, to prompting each row with the kept row's prompt and tokens.
    return_context: also return a Context of the call's rows (one more forward pass feeds the
      last sampled token): (rollout, context).
    return_routes: an MoE model (cfg.moe) only: also return the expert ids every MoE layer
      chose for the prompt, prefix and sampled tokens (moe_layer.SampledRoutes, last in the
      returned tuple), for router replay (transformer.apply's forced_routes).
  """
  _validate(prompts, cfg, group_size, max_new_tokens, temperature, top_k, top_p, stop_tokens,
            prefixes, context)
  if return_routes and (cfg.moe is None or context is not None):
    raise ValueError('generate: return_routes needs an MoE model (cfg.moe) and a prompt (not '
                     f'a context); got cfg.moe={cfg.moe}, context={context is not None}.')
  b, p = ((context.pos_N.shape[0], context.tokens) if context is not None
          else prompts.tokens_BxP.shape)
  if max_new_tokens_N is not None:
    max_new_tokens_N = check_row_limits(max_new_tokens_N, b * group_size, max_new_tokens)
  if max_chunks < 1:
    raise ValueError(f'max_chunks must be >= 1, got {max_chunks}.')
  if sample_dtype not in (None, 'bfloat16'):
    raise ValueError(f"sample_dtype={sample_dtype!r}; known: None (cfg's dtypes), 'bfloat16'.")
  q = 0 if prefixes is None else prefixes.tokens_NxQ.shape[1]
  if memory_budget_bytes is not None:
    est = memory_estimate(cfg, batch=b, group_size=group_size, prompt_len=p,
                          max_new_tokens=max_new_tokens, prefix_len=q, cache_dtype=cache_dtype,
                          num_devices=1 if mesh is None else mesh.size, max_chunks=max_chunks,
                          sample_dtype=sample_dtype)
    if est['total'] > memory_budget_bytes:
      parts = ', '.join(f'{k}={v / 2**20:.1f} MiB' for k, v in est.items())
      raise ValueError(f'sampler memory estimate exceeds memory_budget_bytes='
                       f'{memory_budget_bytes / 2**20:.1f} MiB per device: {parts}. Reduce '
                       f'batch, group_size, max_new_tokens, max_chunks (kv_merge), or use '
                       f'cache_dtype="bfloat16".')
  if prefixes is not None and prefixes.logprobs_NxQ is None:
    prefixes = prefixes.replace(logprobs_NxQ=jnp.full(prefixes.tokens_NxQ.shape, jnp.nan))
  if mesh is not None:
    # Fixed input layouts: an array made under `jax.set_mesh` and one made outside it differ
    # in sharding, and would otherwise compile the sampler twice.
    rows = lambda x: jax.device_put(x, sharding.data_sharding(mesh, x.shape, sharding.SAMPLE_RULES))
    prompts, prefixes = jax.tree.map(rows, (prompts, prefixes))
    rng = jax.device_put(rng, jax.sharding.NamedSharding(mesh, jax.P()))
  fn = _generate_fn(cfg, group_size, max_new_tokens, temperature == 0, int(top_k), float(top_p),
                    tuple(int(t) for t in stop_tokens), int(pad_id), cache_dtype, mesh,
                    int(max_chunks), sample_dtype, bool(row_rng), bool(return_context),
                    bool(return_routes))
  extra = {} if context is None else dict(context=context)
  if max_new_tokens_N is None:
    return fn(params, prompts, prefixes, jnp.float32(max(temperature, 1e-6)), rng, **extra)
  return fn(params, prompts, prefixes, jnp.float32(max(temperature, 1e-6)), rng,
            limit_N=max_new_tokens_N, **extra)


def check_row_limits(max_new_tokens_N, rows: int, max_new_tokens: int) -> jax.Array:
  """max_new_tokens_N as int32 (rows,), each in [1, max_new_tokens], or a ValueError."""
  limits = np.asarray(max_new_tokens_N)
  if limits.shape != (rows,) or not np.issubdtype(limits.dtype, np.integer):
    raise ValueError(f'max_new_tokens_N: expected {rows} integer per-row limits (B*G), got '
                     f'shape {limits.shape} dtype {limits.dtype}.')
  bad = np.flatnonzero((limits < 1) | (limits > max_new_tokens))
  if bad.size:
    raise ValueError(f'max_new_tokens_N: rows {bad[:8].tolist()} are outside [1, '
                     f'max_new_tokens={max_new_tokens}].')
  return jnp.asarray(limits, jnp.int32)


@functools.lru_cache(maxsize=32)
def _generate_fn(cfg, group_size, max_new_tokens, greedy, top_k, top_p, stop_tokens, pad_id,
                 cache_dtype, mesh, max_chunks, sample_dtype=None, row_rng=False,
                 return_context=False, return_routes=False):
  return jax.jit(functools.partial(
      _generate, cfg=cfg, group_size=group_size, max_new_tokens=max_new_tokens, greedy=greedy,
      top_k=top_k, top_p=top_p, stop_tokens=stop_tokens, pad_id=pad_id, cache_dtype=cache_dtype,
      mesh=mesh, max_chunks=max_chunks, sample_dtype=sample_dtype, row_rng=row_rng,
      return_context=return_context, return_routes=return_routes))


def decode_chunks(steps: int, max_chunks: int, min_chunk: int = 16) -> list[tuple[int, int]]:
  """Cuts decode steps [0, steps) into at most max_chunks near-equal [start, stop) ranges of
  at least min_chunk steps (fewer when steps is small). Each range is one while_loop with its
  own cache segment; step i attends to the segments up to its own, so on average a step reads
  (1 + 1/chunks) / 2 of the per-row cache instead of all of it."""
  count = max(1, min(max_chunks, steps // min_chunk))
  bounds = [steps * j // count for j in range(count + 1)]
  return [(a, b) for a, b in zip(bounds[:-1], bounds[1:]) if b > a]


def _generate(params, prompts, prefixes, temperature, rng, limit_N=None, context=None, *, cfg,
              group_size, max_new_tokens, greedy, top_k, top_p, stop_tokens, pad_id, cache_dtype,
              mesh, max_chunks, sample_dtype=None, row_rng=False, return_context=False,
              return_routes=False):
  if sample_dtype is not None:
    # Cast inside the jit, once before prefill and the decode loops (which read the cast
    # copy): the caller's params stay as they are, no bf16 copy outlives the call.
    # logits_from_hidden still accumulates the vocabulary projection in fp32.
    cfg = cfg.replace(param_dtype=sample_dtype, compute_dtype=sample_dtype)
    params = jax.tree.map(lambda x: x.astype(sample_dtype), params)
  b, p = ((context.pos_N.shape[0], context.tokens) if context is not None
          else prompts.tokens_BxP.shape)
  n = b * group_size
  q = 0 if prefixes is None else prefixes.tokens_NxQ.shape[1]
  size, length = p + q + max_new_tokens, q + max_new_tokens

  row_shards = 1 if mesh is None else n // sharding.data_sharding(
      mesh, (n,), sharding.SAMPLE_RULES).shard_shape((n,))[0]

  def on_rows(x, axis=0):  # Rows (dimension `axis`) over the mesh's batch axes.
    if mesh is None or x.ndim == 0:
      return x
    axes = tuple('batch' if d == axis else None for d in range(x.ndim))
    spec = sharding.logical_to_spec(axes, sharding.SAMPLE_RULES, mesh, x.shape)
    return jax.lax.with_sharding_constraint(x, jax.sharding.NamedSharding(mesh, spec))

  # Prefill each prompt once. Its cache becomes a frozen segment that its G samples read
  # (prompt-major rows), never copied G times; each row's own tokens go to later segments.
  repeat = lambda x: on_rows(jnp.repeat(x, group_size, axis=0)) if x.ndim else x
  pack = lambda ids, mask: moe_layer.pack_routes(ids, mask, num_experts=cfg.moe.num_experts)
  if context is None:
    prompt_cache = transformer.init_cache(cfg, b, p, cache_dtype)
    h_BxPxD, prompt_cache, *routing = transformer.apply(
        params, prompts.tokens_BxP, cfg=cfg, mask_NxT=prompts.mask_BxP, cache=prompt_cache,
        return_hidden=True, return_routing=return_routes)
    if return_routes:
      prompt_routes = pack(routing[0].expert_ids_LxNxTxK, prompts.mask_BxP)
    logits_BxV = transformer.logits_from_hidden(params, h_BxPxD[:, -1:], cfg=cfg)[:, 0]
    shared, own = (jax.tree.map(on_rows, transformer.freeze(prompt_cache)),), ()
    pos_N = repeat(prompt_cache.pos_N)
    logits_NxV = repeat(logits_BxV)
  else:  # The kept rows' segments, read by G rows each; the rows start from their prefixes.
    shared, own = tuple(jax.tree.map(on_rows, seg) for seg in context.segments), ()
    pos_N = repeat(context.pos_N)
    logits_NxV = on_rows(jnp.zeros((n, cfg.vocab_size), jnp.float32))
  tempered = lambda lg: lg / temperature if not greedy else lg
  if return_routes:  # Completion tokens' routes, NO_ROUTE until a forward routes them.
    moe_layers = sum(moe_config.is_moe_layer(i, cfg.moe) for i in range(cfg.num_layers))
    routes_MxNxLxK = pack(jnp.zeros((moe_layers, n, length, cfg.moe.num_experts_per_tok),
                                    jnp.int32), jnp.zeros((n, length), bool))

  tokens_NxL = jnp.full((n, length), pad_id, jnp.int32)
  logp_NxL = jnp.zeros((n, length), jnp.float32)
  blogp_NxL = jnp.zeros((n, length), jnp.float32)
  prefix_mask_NxL = jnp.zeros((n, length), bool)
  q_N = jnp.zeros((n,), jnp.int32)
  if prefixes is not None:
    # Feed all prefixes in one call; right padding leaves masked (ignored) cache slots.
    pmask_NxQ = prefixes.mask_NxQ.astype(bool)
    q_N = pmask_NxQ.sum(axis=1, dtype=jnp.int32)
    cache = jax.tree.map(on_rows, transformer.init_cache(cfg, n, q, cache_dtype, pos_N=pos_N))
    cache = cache.replace(frozen=shared)
    h_NxQxD, cache, *routing = transformer.apply(
        params, prefixes.tokens_NxQ, cfg=cfg, mask_NxT=pmask_NxQ, cache=cache, return_hidden=True,
        return_routing=return_routes)
    if return_routes:
      prefix_routes = pack(routing[0].expert_ids_LxNxTxK, pmask_NxQ)
      routes_MxNxLxK = routes_MxNxLxK.at[:, :, :q].set(prefix_routes)
    own, pos_N = (transformer.freeze(cache),), cache.pos_N
    # Log-prob of prefix token j comes from the logits before it, one position at a time so
    # the NxQxV logits never exist at once.
    def prefix_logprob(prev_logits_NxV, xs):
      tok_N, h_NxD = xs
      nxt_NxV = transformer.logits_from_hidden(params, h_NxD[:, None], cfg=cfg)[:, 0]
      return nxt_NxV, sampling.token_logprob(tempered(prev_logits_NxV), tok_N)

    _, lp_QxN = jax.lax.scan(prefix_logprob, logits_NxV,
                             (prefixes.tokens_NxQ.T, jnp.swapaxes(h_NxQxD, 0, 1)))
    lp_NxQ = jnp.where(pmask_NxQ, lp_QxN.T, 0.0)
    recorded = jnp.where(jnp.isnan(prefixes.logprobs_NxQ), lp_NxQ, prefixes.logprobs_NxQ)
    tokens_NxL = tokens_NxL.at[:, :q].set(jnp.where(pmask_NxQ, prefixes.tokens_NxQ, pad_id))
    logp_NxL = logp_NxL.at[:, :q].set(lp_NxQ)
    blogp_NxL = blogp_NxL.at[:, :q].set(jnp.where(pmask_NxQ, recorded, 0.0))
    prefix_mask_NxL = prefix_mask_NxL.at[:, :q].set(pmask_NxQ)
    # Each row continues from the logits after its own last prefix token.
    last_N = jnp.maximum(q_N - 1, 0)
    h_last_NxD = jnp.take_along_axis(h_NxQxD, last_N[:, None, None], axis=1)[:, 0]
    logits_after_NxV = transformer.logits_from_hidden(params, h_last_NxD[:, None], cfg=cfg)[:, 0]
    logits_NxV = jnp.where((q_N > 0)[:, None], logits_after_NxV, logits_NxV)

  stop_S = jnp.asarray(stop_tokens if stop_tokens else (-1,), jnp.int32)
  rope_table = transformer.rope_table(cfg, size)  # Positions never reach `size` (slots >= tokens).
  # Sampled columns are written as rows of MxN buffers (one contiguous row per step) and moved
  # to each row's column q_N + i once, after the loop.
  outs = (jnp.full((max_new_tokens, n), pad_id, jnp.int32),
          jnp.zeros((max_new_tokens, n), jnp.float32), jnp.zeros((max_new_tokens, n), jnp.float32))
  outs = tuple(on_rows(x, axis=1) for x in outs)
  if return_routes:  # Step i's fed token's routes: a 4th buffer, MaxxMxNxK (sample writes 3).
    outs += (on_rows(jnp.moveaxis(routes_MxNxLxK[:, :, :max_new_tokens], 2, 0), axis=2),)

  if row_rng:
    keys_N = on_rows(sampling.row_keys(rng, jnp.arange(n)))

  def sample(i, logits_NxV, done_N, sampled_N, outs):
    key = (sampling.step_keys(keys_N, jnp.full((n,), i, jnp.int32)) if row_rng
           else jax.random.fold_in(rng, i))
    tok_N, lp_N, blp_N = sampling.next_token(logits_NxV, key, temperature, greedy=greedy,
                                             top_k=top_k, top_p=top_p, per_row_keys=row_rng)
    active_N = ~done_N
    tok_N = jnp.where(active_N, tok_N, pad_id)
    outs = tuple(jax.lax.dynamic_update_index_in_dim(buf_MxN, x_N, i, 0) for buf_MxN, x_N in
                 zip(outs, (tok_N, jnp.where(active_N, lp_N, 0.0),
                            jnp.where(active_N, blp_N, 0.0)))) + outs[3:]  # [3]: routes.
    done_N = done_N | jnp.any(tok_N[:, None] == stop_S, axis=-1)
    if limit_N is not None:  # A row at its own limit finishes (its truncation: see below).
      done_N = done_N | (sampled_N + active_N >= limit_N)
    return tok_N, active_N, done_N, sampled_N + active_N, outs

  def body(state):
    i, cache, done_N, logits_NxV, sampled_N, outs = state
    tok_N, active_N, done_N, sampled_N, outs = sample(i, logits_NxV, done_N, sampled_N, outs)
    # Finished rows feed a masked token: their cache slot stays invalid, positions frozen.
    logits, cache, *routing = transformer.apply(
        params, tok_N[:, None], cfg=cfg, mask_NxT=active_N[:, None], cache=cache,
        rope_table=rope_table, return_routing=return_routes)
    if return_routes:
      outs = outs[:3] + (jax.lax.dynamic_update_index_in_dim(
          outs[3], pack(routing[0].expert_ids_LxNxTxK, active_N[:, None])[:, :, 0], i, 0),)
    return i + 1, cache, done_N, on_rows(logits[:, 0]), sampled_N, outs

  # Forward passes 0 .. max_new_tokens - 2 (the last token needs none), one while_loop per
  # chunk of them, each writing its own cache segment: step i attends to the chunks so far,
  # not to slots that later steps fill.
  i, done_N, sampled_N = jnp.int32(0), jnp.zeros((n,), bool), jnp.zeros((n,), jnp.int32)
  for start, stop in decode_chunks(max_new_tokens - 1, max_chunks):
    cache = jax.tree.map(on_rows, transformer.init_cache(cfg, n, stop - start, cache_dtype,
                                                   pos_N=pos_N)).replace(frozen=shared + own)
    cond = functools.partial(_keep_decoding, stop=stop,
                             early_exit=bool(stop_tokens) or limit_N is not None,
                             check_every=1 if row_shards == 1 else DONE_CHECK_EVERY)
    i, cache, done_N, logits_NxV, sampled_N, outs = jax.lax.while_loop(
        cond, body, (i, cache, done_N, logits_NxV, sampled_N, outs))
    # The row's tokens so far as one segment, so that a step attends to three segments
    # (prompt, own history, current chunk) however many chunks ran. The copy costs a
    # transient (memory_estimate's 'kv_merge') and saves a step 5-10% over keeping the
    # chunks apart (mid sampler benchmark, 8 chunks, interleaved runs).
    own = (transformer.freeze(cache, after=own[0] if own else None),)
    pos_N = cache.pos_N
  # The last token needs no forward pass after it (a no-op if every row already stopped).
  last_N, last_active_N, done_N, sampled_N, outs = sample(i, logits_NxV, done_N, sampled_N, outs)
  kept = None
  if return_context:  # ... except to keep it in the cache: every row's tokens, one segment.
    cache = jax.tree.map(on_rows, transformer.init_cache(cfg, n, 1, cache_dtype, pos_N=pos_N))
    _, cache = transformer.apply(params, last_N[:, None], cfg=cfg,
                                 mask_NxT=last_active_N[:, None],
                                 cache=cache.replace(frozen=shared + own), rope_table=rope_table)
    kept = Context(segments=shared + (transformer.freeze(cache, after=own[0] if own else None),),
                   pos_N=cache.pos_N, tokens=size)

  if return_routes:
    decoded_MxNxMaxxK = jnp.moveaxis(outs[3], 0, 2)
    outs = outs[:3]
  if prefixes is None:
    tokens_NxL, logp_NxL, blogp_NxL = (x.T for x in outs)
    if return_routes:
      routes_MxNxLxK = decoded_MxNxMaxxK
  else:  # Sampled token j of row n goes to column q_N[n] + j, after the row's prefix.
    j_NxL = jnp.arange(length)[None, :] - q_N[:, None]
    from_sample_NxL = (j_NxL >= 0) & (j_NxL < max_new_tokens)
    pick = lambda x_MxN: jnp.take_along_axis(x_MxN.T, jnp.clip(j_NxL, 0, max_new_tokens - 1), 1)
    tokens_NxL, logp_NxL, blogp_NxL = (
        jnp.where(from_sample_NxL, pick(x_MxN), base_NxL)
        for x_MxN, base_NxL in zip(outs, (tokens_NxL, logp_NxL, blogp_NxL)))
    if return_routes:
      picked = jnp.take_along_axis(
          decoded_MxNxMaxxK, jnp.clip(j_NxL, 0, max_new_tokens - 1)[None, :, :, None], axis=2)
      routes_MxNxLxK = jnp.where(from_sample_NxL[None, :, :, None], picked, routes_MxNxLxK)

  # Prefix tokens, then sampled tokens up to and including the stop token.
  mask_NxL = jnp.arange(length) < (q_N + sampled_N)[:, None]
  truncated_N = ~done_N
  if limit_N is not None:  # Truncated: no stop token among the row's sampled tokens.
    sampled_NxL = mask_NxL & ~prefix_mask_NxL
    truncated_N = ~jnp.any(sampled_NxL & jnp.isin(tokens_NxL, stop_S), axis=1)
  rollout = Rollout(
      prompts=prompts, tokens_NxL=tokens_NxL, mask_NxL=mask_NxL,
      prefix_mask_NxL=prefix_mask_NxL, logprobs_NxL=jnp.where(mask_NxL, logp_NxL, 0.0),
      behaviour_logprobs_NxL=jnp.where(mask_NxL, blogp_NxL, 0.0), truncated_N=truncated_N,
      lengths_N=mask_NxL.sum(axis=1, dtype=jnp.int32), group_size=group_size)
  extras = (() if kept is None else (kept,)) + (
      (moe_layer.SampledRoutes(prompt_routes, routes_MxNxLxK),) if return_routes else ())
  return (rollout, *extras) if extras else rollout


def _keep_decoding(state, *, stop: int, early_exit: bool, check_every: int) -> jax.Array:
  """The decode while_loop's condition: steps left in the chunk and, if rows can stop, one
  that has not.

  With rows on several devices, `all(done_N)` is an all-reduce that makes every device wait
  for the slowest at every step (on a 2-device CPU host, the small config's sampler ran 5-20%
  slower with it, in noisy runs). There it is asked every `check_every` steps only: after the
  last row stops, at most check_every - 1 steps run with every row masked, which change
  nothing.
  """
  i, done_N = state[0], state[2]
  if not early_exit:
    return i < stop
  if check_every == 1:
    return (i < stop) & ~jnp.all(done_N)
  all_done = jax.lax.cond(i % check_every == 0, lambda: jnp.all(done_N), lambda: False)
  return (i < stop) & ~all_done


def metrics(rollout: Rollout) -> dict[str, jax.Array]:
  """Lengths, truncation and the behaviour-vs-plain log-prob gap over sampled tokens."""
  sampled = rollout.mask_NxL & ~rollout.prefix_mask_NxL
  if rollout.loss_mask_NxL is not None:  # Episodes: observations are real but not sampled.
    sampled = rollout.loss_mask_NxL
  count = jnp.maximum(sampled.sum(), 1)
  gap = jnp.where(sampled, rollout.behaviour_logprobs_NxL - rollout.logprobs_NxL, 0.0)
  return {
      'sampler/length_mean': rollout.lengths_N.mean(),
      'sampler/length_max': rollout.lengths_N.max(),
      'sampler/truncated_frac': rollout.truncated_N.mean(),
      'sampler/behaviour_minus_plain_logprob': gap.sum() / count,
      'sampler/plain_logprob_mean': jnp.where(sampled, rollout.logprobs_NxL, 0).sum() / count,
  }


def sequences(rollout: Rollout):
  """Prompt + completion per row (prompt-major) with its mask, for teacher-forced scoring."""
  g = rollout.group_size
  tokens = jnp.concatenate([jnp.repeat(rollout.prompts.tokens_BxP, g, 0), rollout.tokens_NxL], 1)
  mask = jnp.concatenate([jnp.repeat(rollout.prompts.mask_BxP, g, 0), rollout.mask_NxL], 1)
  return tokens, mask

