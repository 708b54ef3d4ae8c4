"""A tabular token-level MDP for rePIRL (objectives/irl.py): known reward, optimal expert, and
the alternating PRM / max-ent policy loop, or outcome-reward REINFORCE, as one jitted scan.

  mdp = random_mdp(seed, states=4, actions=3, horizon=4)
  expert_A = expert_actions(mdp)                      # the optimal policy's action sequence
  out = run(mdp, expert_A, seed, iterations=200, mode='repirl')   # or mode='outcome'

The MDP is deterministic, like a language model's: H steps, at step t in state s the action a
moves to next_SxA[s, a] (state 0 at t = 0), and pays reward_SxA[s, a] (the known reward).
States are (t, s), so the tables the loop learns are HxSxA: the PRM r_φ[t, s, a] and the
policy's logits. The expert is the optimal deterministic policy (dynamic programming on the
known reward); its demonstrations are `num_expert` copies of its one trajectory.

Each iteration of mode 'repirl' samples G trajectories from the policy, takes `prm_steps` Adam
steps on irl.prm_loss (pooled proposal: the samples and the demos, irl.mixture_log_proposal)
and one on irl.maxent_policy_loss with the PRM's dense rewards (irl.maxent_advantages). Mode
'outcome' is the comparison for a sparse task: REINFORCE on a 0/1 outcome (1 iff the whole
trajectory is the expert's) with a leave-one-out baseline, and no PRM; `mode='true_dense'`
trains on the known per-step reward with the max-ent update (an oracle dense reward).

Metrics per iteration: the policy's probability of the expert trajectory (exact, from the
tables), the mean true return of its samples, and the fraction of expert-visited states where
r_φ ranks the expert's action strictly first.

Deliberately not here: language models (methods/repirl.py), matplotlib.
"""

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np
import optax

from rlreason.objectives import irl

MODES = ('repirl', 'outcome', 'true_dense')


@dataclasses.dataclass(frozen=True)
class MDP:
  next_SxA: np.ndarray  # int: the state an action leads to.
  reward_SxA: np.ndarray  # float: the known reward.
  horizon: int


def random_mdp(seed: int, *, states: int, actions: int, horizon: int) -> MDP:
  rng = np.random.default_rng(seed)
  return MDP(next_SxA=rng.integers(0, states, (states, actions)),
             reward_SxA=rng.normal(size=(states, actions)).astype(np.float32), horizon=horizon)


def expert_actions(mdp: MDP) -> np.ndarray:
  """The optimal action sequence from state 0 (backward induction; ties to the lowest action)."""
  s_count = mdp.next_SxA.shape[0]
  v_S = np.zeros(s_count)
  policy_HxS = np.zeros((mdp.horizon, s_count), np.int64)
  for t in reversed(range(mdp.horizon)):
    q_SxA = mdp.reward_SxA + v_S[mdp.next_SxA]
    policy_HxS[t] = np.argmax(q_SxA, axis=1)
    v_S = q_SxA.max(axis=1)
  out, s = [], 0
  for t in range(mdp.horizon):
    out.append(policy_HxS[t, s])
    s = mdp.next_SxA[s, out[-1]]
  return np.asarray(out)


def states_of(next_SxA, actions_NxH):
  """The state before each action: NxH (jnp)."""
  next_SxA = jnp.asarray(next_SxA)

  def step(s_N, a_N):
    return next_SxA[s_N, a_N], s_N

  _, s_HxN = jax.lax.scan(step, jnp.zeros(actions_NxH.shape[0], jnp.int32), actions_NxH.T)
  return s_HxN.T


def _gather(table_HxSxA, states_NxH, actions_NxH):
  t_NxH = jnp.broadcast_to(jnp.arange(states_NxH.shape[1]), states_NxH.shape)
  return table_HxSxA[t_NxH, states_NxH, actions_NxH]


def _logprobs(logits_HxSxA, states_NxH, actions_NxH):
  return _gather(jax.nn.log_softmax(logits_HxSxA, -1), states_NxH, actions_NxH)


def _sample(next_SxA, logits_HxSxA, key, n: int):
  horizon = logits_HxSxA.shape[0]

  def step(s_N, xs):
    t, k = xs
    a_N = jax.random.categorical(k, logits_HxSxA[t, s_N])
    return next_SxA[s_N, a_N], a_N

  keys = jax.random.split(key, horizon)
  _, a_HxN = jax.lax.scan(step, jnp.zeros(n, jnp.int32), (jnp.arange(horizon), keys))
  return a_HxN.T


@functools.partial(jax.jit, static_argnames=('horizon', 'iterations', 'mode', 'group_size',
                                             'num_expert', 'prm_steps'))
def _run(next_SxA, true_SxA, expert_H, key, *, horizon, iterations, mode, group_size, num_expert,
         prm_steps, prm_lr, policy_lr, alpha, reward_l2):
  h, (s_count, a_count) = horizon, true_SxA.shape
  expert_ExH = jnp.broadcast_to(expert_H, (num_expert, h)).astype(jnp.int32)
  expert_states_ExH = states_of(next_SxA, expert_ExH)
  prm_opt, pol_opt = optax.adam(prm_lr), optax.adam(policy_lr)
  params = {'prm': jnp.zeros((h, s_count, a_count)), 'policy': jnp.zeros((h, s_count, a_count))}
  state = (params, prm_opt.init(params['prm']), pol_opt.init(params['policy']))
  ones_NxH = jnp.ones((group_size, h), bool)

  def prm_objective(prm, samples_NxH, states_NxH, log_q_1xM):
    pooled_a = jnp.concatenate([samples_NxH, expert_ExH])
    pooled_s = jnp.concatenate([states_NxH, expert_states_ExH])
    r_MxH = _gather(prm, pooled_s, pooled_a)
    expert_R = irl.sequence_rewards(_gather(prm, expert_states_ExH, expert_ExH), 1)[None]
    return irl.prm_loss(expert_R, irl.sequence_rewards(r_MxH, 1)[None], log_q_1xM,
                        reward_l2=reward_l2, token_rewards_sq_mean=jnp.mean(r_MxH**2))

  def policy_objective(logits, samples_NxH, states_NxH, token_rewards_NxH, alpha):
    lp_NxH = _logprobs(logits, states_NxH, samples_NxH)
    adv = irl.maxent_advantages(token_rewards_NxH, lp_NxH, ones_NxH, group_size=group_size,
                                alpha=alpha)
    return irl.maxent_policy_loss(lp_NxH, adv, ones_NxH)

  def iteration(state, key):
    params, prm_state, pol_state = state
    samples_NxH = _sample(next_SxA, params['policy'], key, group_size)
    states_NxH = states_of(next_SxA, samples_NxH)
    metrics = {}
    if mode == 'repirl':
      pooled_a = jnp.concatenate([samples_NxH, expert_ExH])
      pooled_s = jnp.concatenate([states_NxH, expert_states_ExH])
      log_pi_M = irl.sequence_rewards(_logprobs(params['policy'], pooled_s, pooled_a), 1)
      counts_1xM = irl.demo_counts(pooled_a[None], jnp.ones_like(pooled_a, bool)[None],
                                   expert_ExH[None], jnp.ones_like(expert_ExH, bool)[None])
      log_q_1xM = irl.mixture_log_proposal(log_pi_M[None], counts_1xM, num_policy=group_size,
                                           num_expert=num_expert)
      prm = params['prm']
      for _ in range(prm_steps):
        (_, metrics), g = jax.value_and_grad(prm_objective, has_aux=True)(
            prm, samples_NxH, states_NxH, log_q_1xM)
        updates, prm_state = prm_opt.update(g, prm_state)
        prm = optax.apply_updates(prm, updates)
      params = {**params, 'prm': prm}
      token_rewards, a = _gather(prm, states_NxH, samples_NxH), alpha
    elif mode == 'true_dense':
      token_rewards, a = true_SxA[states_NxH, samples_NxH], alpha
    else:  # 'outcome': 1 on the last step iff the whole trajectory is the expert's.
      success_N = jnp.all(samples_NxH == expert_H[None], -1).astype(jnp.float32)
      token_rewards = jnp.zeros((group_size, h)).at[:, -1].set(success_N)
      a = 0.0
    (_, pol_metrics), g = jax.value_and_grad(policy_objective, has_aux=True)(
        params['policy'], samples_NxH, states_NxH, token_rewards, a)
    updates, pol_state = pol_opt.update(g, pol_state)
    params = {**params, 'policy': optax.apply_updates(params['policy'], updates)}
    expert_lp = jnp.sum(_logprobs(params['policy'], expert_states_ExH[:1], expert_ExH[:1]))
    r_at_expert_HxA = params['prm'][jnp.arange(h), expert_states_ExH[0]]
    chosen_H = r_at_expert_HxA[jnp.arange(h), expert_H]
    others_H = jnp.max(jnp.where(jax.nn.one_hot(expert_H, a_count) > 0, -jnp.inf,
                                 r_at_expert_HxA), -1)
    out = {'expert_prob': jnp.exp(expert_lp),
           'true_return': jnp.mean(jnp.sum(true_SxA[states_NxH, samples_NxH], -1)),
           'success': jnp.mean(jnp.all(samples_NxH == expert_H[None], -1)),
           'prm_ranks_expert_first': jnp.mean(chosen_H > others_H),
           **{k: v for k, v in metrics.items() if k in ('irl/loss', 'irl/ess')},
           **pol_metrics}
    return (params, prm_state, pol_state), out

  state, metrics_I = jax.lax.scan(iteration, state, jax.random.split(key, iterations))
  return state[0], metrics_I


def run(mdp: MDP, expert_H, seed: int, *, iterations: int, mode: str = 'repirl',
        group_size: int = 16, num_expert: int = 4, prm_steps: int = 2, prm_lr: float = 0.05,
        policy_lr: float = 0.05, alpha: float = 1.0, reward_l2: float = 0.0):
  """(final tables {'prm', 'policy'}, per-iteration metrics as numpy arrays)."""
  if mode not in MODES:
    raise ValueError(f'mode={mode!r}; known: {MODES}.')
  params, metrics = _run(jnp.asarray(mdp.next_SxA, jnp.int32), jnp.asarray(mdp.reward_SxA),
                         jnp.asarray(expert_H, jnp.int32), jax.random.key(seed),
                         horizon=mdp.horizon, iterations=iterations, mode=mode,
                         group_size=group_size, num_expert=num_expert, prm_steps=prm_steps,
                         prm_lr=prm_lr, policy_lr=policy_lr, alpha=alpha, reward_l2=reward_l2)
  return (jax.tree.map(np.asarray, params), jax.tree.map(np.asarray, metrics))
