"""Token-level advantage estimators: per-token rewards and masks in, NxL advantages out.

Each takes `token_rewards_NxL` (an outcome reward sits on the response's last valid token:
`outcome_token_rewards`) and `mask_NxL` (1 on the tokens trained on; 0 on padding and, in
multi-turn episodes, on observation tokens), and returns advantages that are zero wherever the
mask is, wrapped in `stop_gradient`. OTB, GAE and REINFORCE++ also return the per-token returns
their reference code returns (`with_returns` for OTB).

Deliberately not here: the group estimators on `rewards_BxG` and the registry (advantages.py,
which re-exports these functions), the statistics OTB reads (token_stats.py).
"""

import jax
import jax.numpy as jnp

Array = jax.Array


def masked_whiten(x: Array, weights: Array, *, ddof: int, eps: float) -> Array:
  """(x - m) / sqrt(v + eps) with weighted mean m and variance v over all elements.

  Weights are frequency weights (counts), so the Bessel-corrected denominator is Σw - ddof;
  it is clamped at 1 because with at most one effective sample every deviation is 0 anyway.
  Zero-weight elements come back as 0.
  """
  total = jnp.sum(weights)
  mean = jnp.sum(weights * x) / jnp.maximum(total, 1e-30)
  dev = x - mean
  var = jnp.sum(weights * dev**2) / jnp.maximum(total - ddof, 1.0)
  return jnp.where(weights > 0, dev * jax.lax.rsqrt(var + eps), 0.0)


def outcome_token_rewards(rewards_N: Array, mask_NxL: Array) -> Array:
  """Puts each response's scalar reward on its last valid token (the input OTB and GAE take).

  Rows without a valid token get no reward.
  """
  mask_NxL = jnp.asarray(mask_NxL) > 0
  length = mask_NxL.shape[-1]
  last_N = length - 1 - jnp.argmax(mask_NxL[:, ::-1], axis=-1)
  last_NxL = jnp.arange(length)[None, :] == last_N[:, None]
  rewards_Nx1 = jnp.asarray(rewards_N, jnp.float32)[:, None]
  return jnp.where(last_NxL & jnp.any(mask_NxL, -1, keepdims=True), rewards_Nx1, 0.0)


def otb_token_energy(logprobs_NxL: Array, sum_pi_sq_NxL: Array) -> Array:
  """OTB's logit-gradient proxy w = 1 - 2π(a) + Σ_v π(v)^2 (arXiv 2602.07078).

  It equals ||∂ log π(a) / ∂z||^2 = ||e_a - π||^2 exactly, for logits z. π(a) =
  exp(logprobs_NxL) is the probability of the sampled token; Σπ² comes from the logits
  (losses.py). Provenance: as in the reference code of volcengine/verl.
  """
  pi_NxL = jnp.exp(jnp.asarray(logprobs_NxL, jnp.float32))
  return 1.0 - 2.0 * pi_NxL + jnp.asarray(sum_pi_sq_NxL, jnp.float32)


def reward_to_go(token_rewards_NxL: Array, mask_NxL: Array) -> Array:
  """G_t = Σ_{j≥t} M_j r_j, OTB's per-token returns, on every position (arXiv 2602.07078).

  Not masked: an observation token of a multi-turn row (mask 0) carries the return of the
  model tokens after it, and padding after the last valid token 0, exactly as verl returns
  them. Provenance: as in the reference code of volcengine/verl
  (`compute_optimal_token_baseline_advantage` and `compute_multi_turn_…`, their `returns`).
  """
  rewards_NxL = jnp.asarray(token_rewards_NxL, jnp.float32) * (jnp.asarray(mask_NxL) > 0)
  return jnp.flip(jnp.cumsum(jnp.flip(rewards_NxL, -1), -1), -1)


def _compact_NxL(x_NxL: Array, slot_NxL: Array) -> Array:
  """Moves each row's valid entries to the front, in order (slot = valid-token index, or L)."""
  rows_Nx1 = jnp.arange(x_NxL.shape[0])[:, None]
  return jnp.zeros_like(x_NxL).at[rows_Nx1, slot_NxL].set(x_NxL, mode='drop')


def _otb_baseline(returns_NxL, energy_cum_NxL, mask_NxL, members_N, *, group_size, zero_tail,
                  eps):
  n, length = returns_NxL.shape
  shape = (n // group_size, group_size, length)
  ret_BxGxL, w_BxGxL, m_BxGxL = (a.reshape(shape) for a in (returns_NxL, energy_cum_NxL, mask_NxL))
  num_BxL = jnp.sum(ret_BxGxL * w_BxGxL * m_BxGxL, 1)
  den_BxL = jnp.sum(w_BxGxL * m_BxGxL, 1) + eps
  base_BxGxL = jnp.broadcast_to((num_BxL / den_BxL)[:, None, :], shape)
  if zero_tail and group_size > 1:
    # Where only the (strictly) longest response is still active, the baseline would be its
    # own return and its advantage 0; the flag zeroes the baseline there instead.
    len_BxG = jnp.sum(m_BxGxL, -1)
    top2_Bx2 = jax.lax.top_k(len_BxG, 2)[0]
    longest_Bx1, second_Bx1 = top2_Bx2[:, :1], top2_Bx2[:, 1:]
    tail_BxGxL = ((len_BxG == longest_Bx1) & (longest_Bx1 > second_Bx1))[..., None] & (
        jnp.arange(length)[None, None, :] >= second_Bx1[..., None])
    base_BxGxL = jnp.where(tail_BxGxL, 0.0, base_BxGxL)
  # A lone member of its group has no baseline (verl: "advantage = return").
  lone_Bx1x1 = (jnp.sum(members_N.reshape(shape[:2]), -1) == 1)[:, None, None]
  base_BxGxL = jnp.where(lone_Bx1x1, 0.0, base_BxGxL)
  return ((ret_BxGxL - base_BxGxL) * m_BxGxL).reshape(n, length)


def otb(token_rewards_NxL: Array, logprobs_NxL: Array, sum_pi_sq_NxL: Array, mask_NxL: Array, *,
        group_size: int, zero_tail: bool, multi_turn: bool = False,
        is_weights_NxL: Array | None = None, eps: float = 1e-8,
        with_returns: bool = False) -> Array | tuple[Array, Array]:
  """Optimal Token Baseline (OTB, arXiv 2602.07078): a per-token, energy-weighted baseline.

  With w_{i,t} = (1 - 2π_{i,t} + Σπ²_{i,t}) ρ_{i,t}^2 (ρ = truncated IS weight, 1 if absent),
  realised energy W_{i,t} = Σ_{j≤t} M_{i,j} w_{i,j} and reward-to-go G_{i,t} = Σ_{j≥t} M r,
  per group and position:  B_t = Σ_i M_{i,t} G_{i,t} W_{i,t} / (Σ_i M_{i,t} W_{i,t} + eps),
  A_{i,t} = (G_{i,t} - B_t) M_{i,t}. No std normalisation; a group of one gets A = G.
  Provenance: as in the reference code of volcengine/verl
  (`compute_optimal_token_baseline_advantage` and its multi-turn twin). The paper's possible
  extra 1/W weighting of the update (algorithms.md §8, reading 2) is not applied.

  Args:
    token_rewards_NxL: per-token rewards (outcome rewards: `outcome_token_rewards`).
    logprobs_NxL: log-prob of each sampled token under the behaviour policy (lp_old).
    sum_pi_sq_NxL: Σ_v π(v)^2 at each position, from the same logits.
    mask_NxL: 1 on the tokens trained on (model tokens), 0 on padding and tool output.
    group_size: G; rows are prompt-major, N = B*G.
    zero_tail: where only the strictly longest response of a group is still active, set the
      baseline to 0 (A = its return) instead of its own return (A = 0). verl's default has
      varied between versions, hence no default here.
    multi_turn: align responses by valid-token index (each row's valid tokens compacted to
      the front, as verl's multi-turn/TIR variant) instead of by absolute position; responses
      with no valid token then do not count as group members.
    is_weights_NxL: truncated rollout importance weights ρ̄, which enter squared.
    eps: added to the baseline's denominator.
    with_returns: also return verl's per-token returns (`reward_to_go`), unmasked.

  Returns:
    advantages_NxL, zero where mask_NxL is; with `with_returns`, (advantages_NxL, returns_NxL).
  """
  mask_NxL = (jnp.asarray(mask_NxL) > 0).astype(jnp.float32)
  returns_NxL = reward_to_go(token_rewards_NxL, mask_NxL)
  energy_NxL = otb_token_energy(logprobs_NxL, jnp.asarray(sum_pi_sq_NxL, jnp.float32))
  if is_weights_NxL is not None:
    energy_NxL = energy_NxL * jnp.asarray(is_weights_NxL, jnp.float32)**2
  energy_cum_NxL = jnp.cumsum(energy_NxL * mask_NxL, -1)
  n, length = mask_NxL.shape
  if n % group_size:
    raise ValueError(f'otb: N={n} rows is not a multiple of group_size={group_size}.')
  kw = dict(group_size=group_size, zero_tail=zero_tail, eps=eps)
  if not multi_turn:
    advantages_NxL = _otb_baseline(returns_NxL, energy_cum_NxL, mask_NxL, jnp.ones(n, bool), **kw)
  else:
    index_NxL = jnp.cumsum(mask_NxL, -1).astype(jnp.int32) - 1
    slot_NxL = jnp.where(mask_NxL > 0, index_NxL, length)
    len_N = jnp.sum(mask_NxL, -1)
    compact_mask_NxL = (jnp.arange(length)[None, :] < len_N[:, None]).astype(jnp.float32)
    compact_adv_NxL = _otb_baseline(_compact_NxL(returns_NxL, slot_NxL),
                                    _compact_NxL(energy_cum_NxL, slot_NxL), compact_mask_NxL,
                                    len_N > 0, **kw)
    advantages_NxL = jnp.take_along_axis(compact_adv_NxL, jnp.maximum(index_NxL, 0), -1) * mask_NxL
  if with_returns:
    return jax.lax.stop_gradient(advantages_NxL), jax.lax.stop_gradient(returns_NxL)
  return jax.lax.stop_gradient(advantages_NxL)


def turn_starts(mask_NxL: Array) -> Array:
  """Bool NxL: the first token of each maximal run of valid tokens. In an episode the model's
  turns are exactly these runs (observation tokens, mask 0, separate them), so these are the
  turns' first tokens, whose value is V(history up to the turn)."""
  valid_NxL = jnp.asarray(mask_NxL) > 0
  before_NxL = jnp.pad(valid_NxL[:, :-1], ((0, 0), (1, 0)))
  return valid_NxL & ~before_NxL


def gae(token_rewards_NxL: Array, values_NxL: Array, mask_NxL: Array, *, gamma: float = 1.0,
        lam: float = 1.0, whiten: bool = True, std_ddof: int = 1, eps: float = 1e-8,
        turn_level: bool = False) -> tuple[Array, Array]:
  """Generalised advantage estimation for a value head (GAE, arXiv 1506.02438).

  δ_t = r_t + γ V_{t'} - V_t and A_t = δ_t + γλ A_{t'}, where t' is the next valid position
  (masked positions, e.g. tool output, are skipped: V and A carry over them); returns
  R_t = A_t + V_t; A is then whitened over the valid tokens of the whole batch.
  Provenance: as in the reference code of volcengine/verl (`compute_gae_advantage_return`,
  masked_whiten with unbiased variance and eps inside the square root; defaults γ = λ = 1).

  turn_level=True is SO-PPO's turn-level critic (SORL, arXiv 2511.20718), our formalisation
  (the paper's method section could not be read): one step per turn (a maximal run of valid
  tokens, `turn_starts`), V_k the value at turn k's first token, r_k the rewards summed over
  the turn, δ_k = r_k + γ V_{k+1} − V_k (V after the last turn 0), A_k = δ_k + γλ A_{k+1};
  every token of turn k gets A_k and the return R_k = A_k + V_k, so the critic is regressed
  onto one target per turn.

  Args:
    token_rewards_NxL: per-token rewards (outcome reward on the last valid token, optionally
      a KL penalty on every token).
    values_NxL: value-head predictions V_t.
    mask_NxL: 1 on the tokens trained on, 0 on padding and tool output.
    gamma: discount γ.
    lam: GAE λ.
    whiten: whiten the advantages over the valid tokens of the batch.
    std_ddof: Bessel correction of the whitening variance.
    eps: added to that variance inside the square root.
    turn_level: one GAE step per turn instead of per token (above).

  Returns:
    (advantages_NxL, returns_NxL), both zero where mask_NxL is; returns are not whitened.
  """
  mask_NxL = (jnp.asarray(mask_NxL) > 0).astype(jnp.float32)
  rewards_NxL = jnp.asarray(token_rewards_NxL, jnp.float32)
  values_NxL = jnp.asarray(values_NxL, jnp.float32)
  if turn_level:
    return _turn_gae(rewards_NxL, values_NxL, mask_NxL, gamma=gamma, lam=lam, whiten=whiten,
                     std_ddof=std_ddof, eps=eps)

  def step(carry, xs):
    next_value_N, next_adv_N = carry
    r_N, v_N, m_N = xs
    adv_N = r_N + gamma * next_value_N - v_N + gamma * lam * next_adv_N
    valid_N = m_N > 0
    carry = (jnp.where(valid_N, v_N, next_value_N), jnp.where(valid_N, adv_N, next_adv_N))
    return carry, carry[1]

  zeros_N = jnp.zeros(mask_NxL.shape[0], jnp.float32)
  _, adv_LxN = jax.lax.scan(step, (zeros_N, zeros_N), (rewards_NxL.T, values_NxL.T, mask_NxL.T),
                            reverse=True)
  adv_NxL = adv_LxN.T * mask_NxL
  returns_NxL = (adv_NxL + values_NxL) * mask_NxL
  if whiten:
    adv_NxL = masked_whiten(adv_NxL, mask_NxL, ddof=std_ddof, eps=eps)
  return jax.lax.stop_gradient(adv_NxL), jax.lax.stop_gradient(returns_NxL)



def _turn_gae(rewards_NxL, values_NxL, mask_NxL, *, gamma, lam, whiten, std_ddof, eps):
  """`gae(turn_level=True)`: turns as GAE's steps, values read at each turn's first token.

  Per-turn sums are segment sums into K = L slots per row (a turn holds at least one token),
  so memory stays O(N·L)."""
  n, length = mask_NxL.shape
  valid_NxL = mask_NxL > 0
  starts_NxL = turn_starts(mask_NxL)
  k_NxL = jnp.maximum(jnp.cumsum(starts_NxL, -1) - 1, 0)  # Turn index of each valid token.
  seg_NxL = jnp.where(valid_NxL, jnp.arange(n)[:, None] * length + k_NxL, n * length)
  per_turn = lambda x_NxL: jax.ops.segment_sum(x_NxL.reshape(-1), seg_NxL.reshape(-1),
                                               n * length + 1)[:-1].reshape(n, length)
  r_NxK = per_turn(rewards_NxL * mask_NxL)
  v_NxK = per_turn(jnp.where(starts_NxL, values_NxL, 0.0))
  live_NxK = per_turn(mask_NxL) > 0

  def step(carry, xs):
    next_value_N, next_adv_N = carry
    r_N, v_N, live_N = xs
    adv_N = jnp.where(live_N, r_N + gamma * next_value_N - v_N + gamma * lam * next_adv_N, 0.0)
    return (jnp.where(live_N, v_N, 0.0), adv_N), adv_N

  zeros_N = jnp.zeros(n, jnp.float32)
  _, adv_KxN = jax.lax.scan(step, (zeros_N, zeros_N), (r_NxK.T, v_NxK.T, live_NxK.T),
                            reverse=True)
  per_token = lambda x_NxK: jnp.take_along_axis(x_NxK, k_NxL, -1) * mask_NxL
  adv_NxL, returns_NxL = per_token(adv_KxN.T), per_token(adv_KxN.T + v_NxK)
  if whiten:
    adv_NxL = masked_whiten(adv_NxL, mask_NxL, ddof=std_ddof, eps=eps)
  return jax.lax.stop_gradient(adv_NxL), jax.lax.stop_gradient(returns_NxL)


def reinforce_pp(token_rewards_NxL: Array, mask_NxL: Array, *, gamma: float = 1.0,
                 std_ddof: int = 1, eps: float = 1e-8) -> tuple[Array, Array]:
  """REINFORCE++ without a baseline: discounted returns whitened over the batch (arXiv 2501.03262).

  G_t = r_t + γ G_{t'} over valid positions (t' the next valid one: observation tokens are
  skipped and carry the running return), 0 where the mask is; A = (G - m) / sqrt(v + eps) with
  the mean m and variance v (Bessel: `std_ddof`) over the valid tokens of the whole batch, so
  each response weighs by its length. No group baseline: that is `reinforce_pp_baseline`.
  Provenance: as in the reference code of volcengine/verl
  (`compute_reinforce_plus_plus_outcome_advantage`, masked_whiten; γ = algorithm.gamma = 1).

  Returns:
    (advantages_NxL, returns_NxL), both zero where mask_NxL is.
  """
  mask_NxL = (jnp.asarray(mask_NxL) > 0).astype(jnp.float32)
  rewards_NxL = jnp.asarray(token_rewards_NxL, jnp.float32)

  def step(running_N, xs):
    r_N, m_N = xs
    new_N = r_N + gamma * running_N
    return jnp.where(m_N > 0, new_N, running_N), new_N * m_N

  zeros_N = jnp.zeros(mask_NxL.shape[0], jnp.float32)
  _, returns_LxN = jax.lax.scan(step, zeros_N, (rewards_NxL.T, mask_NxL.T), reverse=True)
  returns_NxL = returns_LxN.T
  adv_NxL = masked_whiten(returns_NxL, mask_NxL, ddof=std_ddof, eps=eps)
  return jax.lax.stop_gradient(adv_NxL), jax.lax.stop_gradient(returns_NxL)
