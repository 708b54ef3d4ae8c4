"""Causal self-attention over one call's tokens, in query blocks, with a recomputing VJP.

`causal_attention` computes exactly what the dense form does,

  out[n, t] = sum_{s <= t, mask[n, s]} softmax_s(q[n, t] . k[n, s] / sqrt(Dh)) v[n, s],

but never forms the T x T score matrix. Queries are cut into blocks of `block` rows; query
block i attends to keys [0, (i + 1) * block) only, so the causal half above the diagonal is
skipped (T = 512 in blocks of 64 computes 56% of the dense scores). The backward pass keeps
q, k, v, the output and each row's log-sum-exp, and recomputes the probabilities block by
block (FlashAttention's backward, arXiv 2205.14135, without its on-chip tiling): nothing of
size T x T is saved between the passes, which is where autodiff of the dense form spends its
memory traffic.

`cache_attention` is the other half: T new tokens against cached keys held in segments
(see transformer.KVCache), some of them shared by groups of rows, combined in one softmax.

Inside, the kernel runs head-major: queries NxKxTxRxDh, keys and values NxKxTxDh, so each
(row, kv head) pair's scores q . k and outputs p . v are plain matmuls over contiguous
memory ([B*R, Dh] x [Dh, S] and [B*R, S] x [S, Dh]) with the batch axes leading. With the
projections' token-major operands (NxTxKxRxDh) XLA:CPU transposed a block of queries and
all keys seen so far for every query block, forward and backward; now one transpose per
tensor and layer does it, and `causal_attention`'s interface stays token-major.

Deliberately not here: sliding windows, and an online softmax over key blocks in the
training forward (each query block's keys are one array; that is what makes the forward a
few large matmuls on CPU).
"""

import functools

import jax
import jax.numpy as jnp

# Finite, so a query whose keys are all masked (left padding) stays finite; its output is
# never used.
NEG_INF = -1e30


def block_size(t: int) -> int:
  """Query rows per block: 64, or T itself when short; at most 16 blocks (T = 1024)."""
  if t <= 128:
    return t
  return max(64, -(-t // 16))


def _scores(q_NxKxBxRxDh, k_NxKxSxDh, allowed_NxBxS, scale):
  s = jnp.einsum('nkbrd,nksd->nkbrs', q_NxKxBxRxDh, k_NxKxSxDh,
                 preferred_element_type=jnp.float32) * scale
  return jnp.where(allowed_NxBxS[:, None, :, None, :], s, NEG_INF)


def _allowed(mask_NxT, start: int, stop: int, end_NxT=None):
  """Which keys [0, stop) the queries [start, stop) may attend to: causal and valid (and,
  with end_NxT, only queries up to key s's end_NxT[s]: a packed trie's subtree)."""
  causal_BxS = jnp.arange(stop)[None, :] <= jnp.arange(start, stop)[:, None]
  allowed = causal_BxS[None] & mask_NxT[:, None, :stop]
  if end_NxT is None:
    return allowed
  return allowed & (jnp.arange(start, stop)[None, :, None] <= end_NxT[:, None, :stop])


def _blocks(t: int, block: int):
  return [(start, min(start + block, t)) for start in range(0, t, block)]


def _forward(q, k, v, mask_NxT, end_NxT, block):
  """Head-major: q NxKxTxRxDh, k and v NxKxTxDh -> (out NxKxTxRxDh, lse NxKxTxR)."""
  scale = q.shape[-1] ** -0.5
  outs, lses = [], []
  for start, stop in _blocks(q.shape[2], block):
    s = _scores(q[:, :, start:stop], k[:, :, :stop], _allowed(mask_NxT, start, stop, end_NxT),
                scale)
    m = jnp.max(s, axis=-1, keepdims=True)
    p = jnp.exp(s - m)
    denom_NxKxBxR = jnp.sum(p, axis=-1)
    o = jnp.einsum('nkbrs,nksd->nkbrd', p.astype(v.dtype), v[:, :, :stop],
                   preferred_element_type=jnp.float32)
    outs.append((o / denom_NxKxBxR[..., None]).astype(q.dtype))
    lses.append(m[..., 0] + jnp.log(denom_NxKxBxR))
  return jnp.concatenate(outs, axis=2), jnp.concatenate(lses, axis=2)


@functools.partial(jax.custom_vjp, nondiff_argnums=(5,))
def _attention(q, k, v, mask_NxT, end_NxT, block):
  return _forward(q, k, v, mask_NxT, end_NxT, block)[0]


def _attention_fwd(q, k, v, mask_NxT, end_NxT, block):
  out, lse = _forward(q, k, v, mask_NxT, end_NxT, block)
  return out, (q, k, v, mask_NxT, end_NxT, out, lse)


def _attention_bwd(block, res, d_out):
  q, k, v, mask_NxT, end_NxT, out, lse = res
  scale = q.shape[-1] ** -0.5
  # delta[n, t] = sum_d dO * O: the softmax Jacobian's row term, one pass over the output.
  delta_NxKxTxR = jnp.einsum('nktrd,nktrd->nktr', d_out.astype(jnp.float32),
                             out.astype(jnp.float32))
  dq_blocks = []
  dk = jnp.zeros(k.shape, jnp.float32)
  dv = jnp.zeros(v.shape, jnp.float32)
  for start, stop in _blocks(q.shape[2], block):
    allowed = _allowed(mask_NxT, start, stop, end_NxT)
    s = _scores(q[:, :, start:stop], k[:, :, :stop], allowed, scale)
    # Masked entries get probability exactly 0 (not exp(NEG_INF - lse), which is 1 on a
    # fully masked pad row).
    p = jnp.where(allowed[:, None, :, None, :], jnp.exp(s - lse[:, :, start:stop, :, None]), 0.0)
    do = d_out[:, :, start:stop]
    dp = jnp.einsum('nkbrd,nksd->nkbrs', do, v[:, :, :stop], preferred_element_type=jnp.float32)
    ds = (p * (dp - delta_NxKxTxR[:, :, start:stop, :, None]) * scale).astype(q.dtype)
    dq_blocks.append(jnp.einsum('nkbrs,nksd->nkbrd', ds, k[:, :, :stop],
                                preferred_element_type=jnp.float32))
    dk = dk.at[:, :, :stop].add(jnp.einsum('nkbrs,nkbrd->nksd', ds, q[:, :, start:stop],
                                           preferred_element_type=jnp.float32))
    dv = dv.at[:, :, :stop].add(jnp.einsum('nkbrs,nkbrd->nksd', p.astype(do.dtype), do,
                                           preferred_element_type=jnp.float32))
  dq = jnp.concatenate(dq_blocks, axis=2)
  return dq.astype(q.dtype), dk.astype(k.dtype), dv.astype(v.dtype), None, None


_attention.defvjp(_attention_fwd, _attention_bwd)


def causal_attention(q_NxTxKxRxDh, k_NxTxKxDh, v_NxTxKxDh, mask_NxT, *, block: int | None = None,
                     subtree_end_NxT=None):
  """Grouped-query causal attention of T tokens over themselves: NxTxKxRxDh.

  Args:
    q_NxTxKxRxDh: queries, the H = K * R heads grouped by the kv head they share.
    k_NxTxKxDh, v_NxTxKxDh: keys and values of the same T tokens.
    mask_NxT: True for real tokens; keys of padding are never attended to.
    block: query rows per block (default `block_size(T)`).
    subtree_end_NxT: None (plain causal), or int: key s is seen by queries s..end[s] only.
      A trie of token sequences laid out in depth-first preorder (rollout/trie.py) gives each
      node's subtree the range [s, end[s]], so each token attends to its ancestors exactly.
  """
  t = q_NxTxKxRxDh.shape[1]
  # subtree_end_NxT: a packed trie, whose limits this kernel's blocks carry (None: causal).
  out_NxKxTxRxDh = _attention(q_NxTxKxRxDh.transpose(0, 2, 1, 3, 4), k_NxTxKxDh.swapaxes(1, 2),
                              v_NxTxKxDh.swapaxes(1, 2), mask_NxT.astype(bool), subtree_end_NxT,
                              block or block_size(t))
  return out_NxKxTxRxDh.transpose(0, 2, 1, 3, 4)


def _to_segment(x_NxTxKxRxD, rows):
  """[N, T, K, R, D] as [A, K, M, D] with M = (N/A, R, T): row a's queries as one matrix."""
  n, t, k, r, d = x_NxTxKxRxD.shape
  x = x_NxTxKxRxD.reshape(rows, n // rows, t, k, r, d).transpose(0, 3, 1, 4, 2, 5)
  return x.reshape(rows, k, -1, d)


def _from_segment(x_AxKxMxD, n, t):
  """The inverse of _to_segment."""
  a, k, _, d = x_AxKxMxD.shape
  x = x_AxKxMxD.reshape(a, k, n // a, -1, t, d).transpose(0, 2, 4, 1, 3, 5)
  return x.reshape(n, t, k, -1, d)


def cache_attention(q_NxTxKxRxDh, segments, *, dtype):
  """T new tokens per row attending to cached keys held in several segments: NxTxKxRxDh.

  segments: (keys_AxKxDhxS, values_AxKxSxDh, allowed_AxTxS) triples. A segment has A rows,
    A dividing N, and row a serves rows [a * N/A, (a + 1) * N/A): a prompt's cache is stored
    once and read by its G samples (A = N/G). allowed says which of its slots each new token
    sees (validity and causality; Ax1xS when the same for all T). One softmax runs over
    every segment's slots.

  Exactly softmax(q . k / sqrt(Dh)) v over the segments' slots laid end to end (up to
  rounding): per segment, scores and their max; the global max; then exp, sums and the
  weighted values per segment, normalised once at the end. Per segment row and kv head,
  the queries that read it (N/A rows x R heads x T tokens) are one matrix, so both
  contractions are plain batched matmuls with the batch axes leading, and a shared segment's
  keys are read once per group, not G times.
  """
  n, t, k, r, dh = q_NxTxKxRxDh.shape
  scale = dh ** -0.5
  parts = []
  for keys, values, allowed_AxTxS in segments:
    rows, slots = keys.shape[0], keys.shape[-1]
    q_AxKxMxDh = _to_segment(q_NxTxKxRxDh, rows).astype(dtype)
    s_AxKxMxS = jnp.einsum('akmd,akds->akms', q_AxKxMxDh, keys.astype(dtype),
                           preferred_element_type=jnp.float32) * scale
    allowed_Ax1xMxS = jnp.broadcast_to(allowed_AxTxS[:, None, None, :, :],
                                       (rows, n // rows, r, t, slots)).reshape(rows, 1, -1, slots)
    parts.append((jnp.where(allowed_Ax1xMxS, s_AxKxMxS, NEG_INF), values))
  stat = lambda x_AxKxM: _from_segment(x_AxKxM[..., None], n, t)[..., 0]  # -> NxTxKxR
  max_NxTxKxR = functools.reduce(jnp.maximum, [stat(jnp.max(s, axis=-1)) for s, _ in parts])
  out, denom_NxTxKxR = 0.0, 0.0
  for s_AxKxMxS, values in parts:
    m_AxKxM = _to_segment(max_NxTxKxR[..., None], s_AxKxMxS.shape[0])[..., 0]
    e_AxKxMxS = jnp.exp(s_AxKxMxS - m_AxKxM[..., None])
    denom_NxTxKxR = denom_NxTxKxR + stat(jnp.sum(e_AxKxMxS, axis=-1))
    o_AxKxMxDh = jnp.einsum('akms,aksd->akmd', e_AxKxMxS.astype(dtype), values.astype(dtype),
                            preferred_element_type=jnp.float32)
    out = out + _from_segment(o_AxKxMxDh, n, t)
  return (out / denom_NxTxKxR[..., None]).astype(dtype)
