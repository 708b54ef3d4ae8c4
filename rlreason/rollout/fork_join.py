"""Fork/join rollouts: a parent row spawns K worker threads that share its context, then joins.

  out = fork_join.sample_threads(params, prompt_ids, fmt=fmt, cfg=cfg, group_size=4,
                                 max_workers=4, parent_tokens=16, worker_tokens=12,
                                 final_tokens=16, rng=key, prompt_buckets=(32,), eos=(1,))
  out.rollout     # B prompts x G episodes x (1 + K) rows, row (b*G + g)*(1 + K) + thread
  out.thread_N    # 0 for the parent, k = 1..K for its k-th worker
  out.parent_N    # the parent's row for a worker, -1 for a parent

An episode, in three static-shape phases (ThreadWeaver arXiv 2512.07843 and DC-CoT's
director/worker split: the parent writes a spawn block naming its subtasks, the workers solve
them in parallel, the parent reads their results and finishes):

  1. parent   sampler.generate(prompts, G, parent_tokens, return_context=True), stopping on
              EOS or `fmt.end`; the call keeps its cache (the prompts' segment and each
              parent's own tokens). A row that wrote  `spawn h_1 sep h_2 ... sep h_k end`  forks
              k <= K workers.
  2. fork     sampler.generate(context=kept, group_size=K, prefixes=headers): each parent's
              context (prompt + its phase-1 tokens) is the kept cache, which its K worker rows
              read (frozen segments: no copy per worker, nothing prefilled again); worker k's
              prefix is `h_k worker_open`, given, not sampled; it decodes worker_tokens until EOS.
  3. join     sampler.generate(context=kept, group_size=1, prefixes=join blocks, final_tokens):
              the workers' outputs, `join_open out_1 join_sep out_2 ... join_close` (each output
              without its EOS), are fed after the parent's kept cache (prefilled once, like an
              episode's observation), and the parent decodes on until EOS.
Prefilled positions: each prompt once (B x P, shared by its G parents), then only the workers'
headers (B G K (max_header_tokens + 1)) and the join blocks (B G join_width); re-prefilling
each parent's context for phases 2 and 3 cost 2 B G (P + parent_tokens) more.
A row that ends (EOS) or runs out in phase 1 without a spawn block is a plain single-thread
episode. Depth 1: a worker's own spawn marker is text, and the parent forks once per episode.

Static shapes: every phase runs all B*G parents (rows that did not fork are computed and
dropped), K worker slots per parent (empty slots decode a throwaway header, dropped), and
the kept cache's width follows the prompt bucket, so a run compiles each phase at most once per
prompt bucket. Training rows (`ThreadedRollout.rollout`, completion columns after
the original prompt):
  parent    phase-1 tokens (loss) | join block (not in the loss) | phase-3 tokens (loss)
  worker k  parent's phase-1 tokens and `h_k worker_open` (prefix, not in the loss) | its own
            tokens (loss)
so every sampled token is in the loss exactly once: the spawn block is the parent's, a
worker's output is the worker's, and its copy in the join block is context.
The critical path of an episode (`longest_path_E`, the latency proxy both papers report) is
its parent's sampled tokens plus the longest worker's; `total_tokens_E` counts them all.

Deliberately not here: nested spawns, several fork blocks per episode, a shared prefix trie
across episodes (ThreadWeaver's trie training), the rewards (the caller's verifier scores the
parent's text, `final_texts`).
"""

import dataclasses
from typing import Sequence

import jax
import jax.numpy as jnp
import numpy as np

from rlreason.model import transformer
from rlreason.rollout import sampler
from rlreason.structs import Prefixes, Rollout


@dataclasses.dataclass(frozen=True)
class SpawnFormat:
  """Token ids of the spawn and join markers (single tokens in the tokenizer's vocabulary).

  spawn, sep, end: the parent writes `spawn h_1 sep ... sep h_k end`; `end` stops phase 1.
  worker_open: follows a worker's header in its prefix (`h_k worker_open`).
  join_open, join_sep, join_close: frame the workers' outputs in the parent's context.
  max_header_tokens: a header longer than this is cut to it.
  """
  spawn: int
  sep: int
  end: int
  worker_open: int
  join_open: int
  join_sep: int
  join_close: int
  max_header_tokens: int = 4

  @classmethod
  def from_tokenizer(cls, tok, *, spawn: str, sep: str, end: str, worker_open: str,
                     join_open: str, join_sep: str, join_close: str,
                     max_header_tokens: int = 4) -> 'SpawnFormat':
    """Marker strings that must each encode to one token (the error names the one that does not)."""
    ids = {}
    for name, text in (('spawn', spawn), ('sep', sep), ('end', end),
                       ('worker_open', worker_open), ('join_open', join_open),
                       ('join_sep', join_sep), ('join_close', join_close)):
      enc = tok.encode(text)
      if len(enc) != 1 or enc[0] == tok.token_to_id('<unk>'):
        raise ValueError(f'fork_join: marker {name}={text!r} encodes to {enc}, not one token '
                         'of this tokenizer.')
      ids[name] = enc[0]
    return cls(**ids, max_header_tokens=max_header_tokens)


@dataclasses.dataclass
class ThreadedRollout:
  """Rows of one batch of threaded episodes and their thread structure (host arrays).

  rollout: B*G*(1+K) rows; rollout.group_size = G*(1+K) rows per prompt.
  thread_N: 0 parent, k = 1..K worker; parent_N: the parent's row (-1 for parents);
  active_N: the row holds a thread (a parent always; a worker if its parent spawned it).
  final_texts: per episode, the parent's text (phase 1, join block, phase 3) for the verifier.
  """
  rollout: Rollout
  thread_N: np.ndarray
  parent_N: np.ndarray
  active_N: np.ndarray
  spawned_E: np.ndarray  # bool per episode
  final_texts: list
  max_workers: int

  @property
  def threads_E(self) -> np.ndarray:
    return self.active_N.reshape(-1, 1 + self.max_workers).sum(axis=1)

  def metrics(self) -> dict[str, float]:
    loss = np.asarray(self.rollout.loss_mask_NxL)
    tokens_N = loss.sum(axis=1)
    path_E = longest_path_E(tokens_N, self.parent_N)
    return {
        'threads/total_tokens_mean': float(total_tokens_E(tokens_N, self.parent_N).mean()),
        'threads/longest_path_mean': float(path_E.mean()),
        'threads/longest_path_max': float(path_E.max()),
        'threads/per_episode_mean': float(self.threads_E.mean()),
        'threads/spawned_frac': float(self.spawned_E.mean()),
    }


def total_tokens_E(tokens_N, parent_N) -> np.ndarray:
  """Sampled tokens per episode: its parent's and every worker's (one episode per parent row)."""
  tokens_N, parent_N = np.asarray(tokens_N), np.asarray(parent_N)
  roots = np.flatnonzero(parent_N < 0)
  owner_N = np.where(parent_N < 0, np.arange(len(parent_N)), parent_N)
  return np.array([tokens_N[owner_N == r].sum() for r in roots])


def longest_path_E(tokens_N, parent_N) -> np.ndarray:
  """Tokens on each episode's critical path: its parent's plus its longest worker's (0 if it
  forked none). Depth 1: a worker's parent is a root."""
  tokens_N, parent_N = np.asarray(tokens_N), np.asarray(parent_N)
  if (parent_N >= 0).any() and (parent_N[parent_N[parent_N >= 0]] >= 0).any():
    raise ValueError('longest_path_E: a worker whose parent is a worker (depth > 1).')
  roots = np.flatnonzero(parent_N < 0)
  return np.array([tokens_N[r] + max([0, *tokens_N[parent_N == r]]) for r in roots])


def parse_spawn(ids: Sequence[int], fmt: SpawnFormat) -> list[list[int]] | None:
  """Headers of the spawn block that ends `ids` (after its last `spawn`), or None if `ids`
  does not end with `end` after a `spawn`. Empty headers are dropped."""
  ids = list(ids)
  if not ids or ids[-1] != fmt.end or fmt.spawn not in ids:
    return None
  start = len(ids) - 1 - ids[::-1].index(fmt.spawn)
  headers, cur = [], []
  for t in ids[start + 1:-1]:
    if t == fmt.sep:
      headers.append(cur)
      cur = []
    else:
      cur.append(t)
  headers.append(cur)
  return [h[:fmt.max_header_tokens] for h in headers if h]


def join_block(outputs: Sequence[Sequence[int]], fmt: SpawnFormat) -> list[int]:
  """`join_open out_1 join_sep ... out_k join_close` (outputs without their stop token)."""
  ids = [fmt.join_open]
  for k, out in enumerate(outputs):
    ids += ([fmt.join_sep] if k else []) + list(out)
  return ids + [fmt.join_close]


def join_width(max_workers: int, worker_tokens: int) -> int:
  """Longest join block: the frame, K outputs of worker_tokens and K - 1 separators."""
  return 2 + max_workers * worker_tokens + max_workers - 1


def memory_estimate(cfg: transformer.ModelConfig, *, batch: int, group_size: int,
                    prompt_len: int, max_workers: int, parent_tokens: int, worker_tokens: int,
                    final_tokens: int, max_header_tokens: int, cache_dtype=None,
                    num_devices: int = 1) -> dict[str, int]:
  """Bytes per device: each phase's sampler estimate (the phases run one after the other, so
  the peak is the largest), the worker slots included, plus the threaded rows' host-bound
  outputs (tokens, two log-probs and three masks per slot). Phases 2 and 3 are estimated as
  if each parent's context were prefilled for its rows: an upper bound on the kept cache they
  read (the prompts once, each parent's tokens once)."""
  n = batch * group_size
  kw = dict(cache_dtype=cache_dtype, num_devices=num_devices)
  ctx = prompt_len + parent_tokens
  phases = {
      'parent': sampler.memory_estimate(cfg, batch=batch, group_size=group_size,
                                        prompt_len=prompt_len, max_new_tokens=parent_tokens,
                                        **kw)['total'],
      'workers': sampler.memory_estimate(cfg, batch=n, group_size=max_workers, prompt_len=ctx,
                                         max_new_tokens=worker_tokens,
                                         prefix_len=max_header_tokens + 1, **kw)['total'],
      'join': sampler.memory_estimate(cfg, batch=n, group_size=1,
                                      prompt_len=ctx + join_width(max_workers, worker_tokens),
                                      max_new_tokens=final_tokens, **kw)['total'],
  }
  width = parent_tokens + join_width(max_workers, worker_tokens) + final_tokens
  est = {f'phase_{k}': v for k, v in phases.items()}
  est['rows'] = -(-n * (1 + max_workers) * width * (3 * 4 + 3) // num_devices)
  est['total'] = max(phases.values()) + est['rows']
  return est


def _row(out, n):
  """Row n's sampled tokens (prefix excluded) and their log-probs, as host lists."""
  tokens, mask, prefix, logp, blogp = out
  keep = mask[n] & ~prefix[n]
  return tokens[n][keep].tolist(), logp[n][keep].tolist(), blogp[n][keep].tolist()


def _host(out: Rollout):
  return tuple(np.asarray(x) for x in jax.device_get(
      (out.tokens_NxL, out.mask_NxL, out.prefix_mask_NxL, out.logprobs_NxL,
       out.behaviour_logprobs_NxL)))


def sample_threads(params, prompt_ids: Sequence[Sequence[int]], *, fmt: SpawnFormat, cfg,
                   group_size: int, max_workers: int, parent_tokens: int, worker_tokens: int,
                   final_tokens: int, rng: jax.Array, prompt_buckets: Sequence[int],
                   eos: Sequence[int], temperature: float = 1.0, top_k: int = 0,
                   top_p: float = 1.0, pad_id: int = 0, max_chunks: int = sampler.MAX_CHUNKS,
                   decode=None) -> ThreadedRollout:
  """Threaded episodes for B prompts x G samples; see the module docstring.

  `decode(ids) -> str`, if given, fills final_texts (the parent's whole text per episode).
  """
  if max_workers < 1 or min(parent_tokens, worker_tokens, final_tokens) < 1:
    raise ValueError(f'fork_join: max_workers={max_workers}, parent_tokens={parent_tokens}, '
                     f'worker_tokens={worker_tokens}, final_tokens={final_tokens} must be >= 1.')
  eos = tuple(int(t) for t in eos)
  if fmt.end in eos:
    raise ValueError(f'fork_join: the spawn block end token {fmt.end} is also an EOS token.')
  b, g, k = len(prompt_ids), group_size, max_workers
  n, per = b * g, 1 + max_workers
  keys = jax.random.split(rng, 3)
  common = dict(cfg=cfg, temperature=temperature, top_k=top_k, top_p=top_p, pad_id=pad_id,
                max_chunks=max_chunks, row_rng=True)
  prompts = sampler.prepare_prompts(prompt_ids, buckets=prompt_buckets, pad_id=pad_id)

  # Phase 1: the parents, until EOS or the end of a spawn block.
  out1, kept = sampler.generate(params, prompts, group_size=g, max_new_tokens=parent_tokens,
                                stop_tokens=eos + (fmt.end,), rng=keys[0], return_context=True,
                                **common)
  out1 = _host(out1)
  first = [_row(out1, r) for r in range(n)]
  headers = [parse_spawn(toks, fmt) for toks, _, _ in first]
  spawned_E = np.array([bool(h) for h in headers])

  # Phase 2: K worker slots per parent; the parent's context is the call's shared prompt.
  workers = [[None] * k for _ in range(n)]
  if spawned_E.any():
    q = fmt.max_header_tokens + 1
    pre_tokens = np.full((n * k, q), pad_id, np.int32)
    pre_mask = np.zeros((n * k, q), bool)
    for r in range(n):
      for j in range(k):
        h = headers[r][j] if headers[r] and j < len(headers[r]) else [fmt.sep]  # throwaway
        pre_tokens[r * k + j, :len(h) + 1] = h + [fmt.worker_open]
        pre_mask[r * k + j, :len(h) + 1] = True
    out2 = _host(sampler.generate(
        params, None, context=kept, group_size=k, max_new_tokens=worker_tokens,
        stop_tokens=eos, rng=keys[1],
        prefixes=Prefixes(tokens_NxQ=jnp.asarray(pre_tokens), mask_NxQ=jnp.asarray(pre_mask)),
        **common))
    for r in np.flatnonzero(spawned_E):
      for j in range(min(k, len(headers[r]))):
        toks, lp, blp = _row(out2, r * k + j)
        workers[r][j] = (pre_tokens[r * k + j][pre_mask[r * k + j]].tolist(), toks, lp, blp)

  # Phase 3: the join block is fed after the parent's kept cache, the parent decodes on.
  joins = [join_block([w[1][:-1] if w[1] and w[1][-1] in eos else w[1]
                       for w in workers[r] if w is not None], fmt) if spawned_E[r] else []
           for r in range(n)]
  third = [([], [], [])] * n
  if spawned_E.any():
    j = join_width(k, worker_tokens)
    join_tokens = np.full((n, j), pad_id, np.int32)
    join_mask = np.zeros((n, j), bool)
    for r in range(n):
      join_tokens[r, :len(joins[r])] = joins[r]
      join_mask[r, :len(joins[r])] = True
    out3 = _host(sampler.generate(
        params, None, context=kept, group_size=1, max_new_tokens=final_tokens, stop_tokens=eos,
        rng=keys[2], prefixes=Prefixes(tokens_NxQ=jnp.asarray(join_tokens),
                                       mask_NxQ=jnp.asarray(join_mask)), **common))
    third = [_row(out3, r) if spawned_E[r] else ([], [], []) for r in range(n)]

  # The training rows.
  width = parent_tokens + join_width(k, worker_tokens) + final_tokens
  rows = {name: np.zeros((n * per, width), dtype) for name, dtype in (
      ('tokens', np.int32), ('logp', np.float32), ('blogp', np.float32), ('mask', bool),
      ('prefix', bool), ('loss', bool))}
  rows['tokens'][:] = pad_id
  truncated = np.zeros(n * per, bool)
  thread_N = np.tile(np.arange(per), n)
  parent_N = np.where(thread_N == 0, -1, np.repeat(np.arange(n) * per, per))
  active_N = thread_N == 0
  texts = []
  for r in range(n):
    p = r * per
    segs = [(first[r], True), ((joins[r], [0.0] * len(joins[r]), [0.0] * len(joins[r])), False),
            (third[r], True)]
    col = 0
    for (toks, lp, blp), trained in segs:
      rows['tokens'][p, col:col + len(toks)] = toks
      rows['logp'][p, col:col + len(toks)] = lp if trained else 0.0
      rows['blogp'][p, col:col + len(toks)] = blp if trained else 0.0
      rows['mask'][p, col:col + len(toks)] = True
      rows['loss'][p, col:col + len(toks)] = trained
      col += len(toks)
    last = third[r][0] if spawned_E[r] else first[r][0]
    truncated[p] = not (last and last[-1] in eos)
    if decode is not None:
      texts.append(decode(first[r][0] + joins[r] + third[r][0]))
    for j, w in enumerate(workers[r]):
      if w is None:
        continue
      head, toks, lp, blp = w
      row = p + 1 + j
      ctx = first[r][0] + head
      active_N[row] = True
      rows['tokens'][row, :len(ctx)] = ctx
      rows['mask'][row, :len(ctx) + len(toks)] = True
      rows['prefix'][row, :len(ctx)] = True
      rows['tokens'][row, len(ctx):len(ctx) + len(toks)] = toks
      rows['logp'][row, len(ctx):len(ctx) + len(toks)] = lp
      rows['blogp'][row, len(ctx):len(ctx) + len(toks)] = blp
      rows['loss'][row, len(ctx):len(ctx) + len(toks)] = True
      truncated[row] = not (toks and toks[-1] in eos)
  mask = jnp.asarray(rows['mask'])
  rollout = Rollout(
      prompts=prompts, tokens_NxL=jnp.asarray(rows['tokens']), mask_NxL=mask,
      prefix_mask_NxL=jnp.asarray(rows['prefix']), logprobs_NxL=jnp.asarray(rows['logp']),
      behaviour_logprobs_NxL=jnp.asarray(rows['blogp']), truncated_N=jnp.asarray(truncated),
      lengths_N=mask.sum(axis=1, dtype=jnp.int32), group_size=g * per,
      loss_mask_NxL=jnp.asarray(rows['loss']))
  return ThreadedRollout(rollout=rollout, thread_N=thread_N, parent_N=parent_N,
                         active_N=active_N, spawned_E=spawned_E, final_texts=texts,
                         max_workers=k)
