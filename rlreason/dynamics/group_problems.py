"""Finite-group composition problems for the toy RL loop (dynamics/toy_lm.py): the task's
product table, problems drawn on device, and their exact-match rewards.

Our formalisation of algorithms.md §24 (toy_lm.py's docstring gives the format): a prompt is a
register of `max_k` slots holding g_1 .. g_k then blanks, followed by the identity as s_0; the
policy writes s_1 .. s_K with s_i = g_i · s_{i-1}, and the reward is 1 iff token k equals s_k.
"""

from collections.abc import Sequence
import dataclasses

import flax
import jax
import jax.numpy as jnp
import numpy as np

from rlreason.tasks import group_composition

PAD, BLANK, FIRST_ELEMENT = 0, 1, 2  # Token ids; element e is token FIRST_ELEMENT + e.


@dataclasses.dataclass(frozen=True)
class GroupTask:
  """A finite group as a product table over element indices, and the longest horizon K."""
  group: str
  max_k: int
  table: tuple[tuple[int, ...], ...]  # table[g][s] = index of g · s (s applied first in S_n).
  identity: int

  @classmethod
  def make(cls, group: str, *, max_k: int) -> 'GroupTask':
    """The table of `group` ('S3', 'Z5', ...) built from rlreason.tasks.group_composition."""
    if max_k < 1:
      raise ValueError(f'GroupTask.max_k must be >= 1, got {max_k}.')
    names = group_composition.elements(group)
    index = {name: i for i, name in enumerate(names)}
    table = tuple(tuple(index[group_composition.multiply(group, g, s)] for s in names)
                  for g in names)
    identity = next(e for e in range(len(names))
                    if all(table[e][s] == s and table[s][e] == s for s in range(len(names))))
    return cls(group=group, max_k=max_k, table=table, identity=identity)

  @property
  def order(self) -> int:
    return len(self.table)

  @property
  def vocab_size(self) -> int:
    return FIRST_ELEMENT + self.order

  @property
  def prompt_len(self) -> int:
    return self.max_k + 1


@flax.struct.dataclass
class Problems:
  """B composition problems: prompt tokens, horizon k, and the chain of partial products."""
  tokens_BxP: jax.Array  # int32, P = max_k + 1
  k_B: jax.Array  # int32 in [1, max_k]
  states_BxK: jax.Array  # int32 element indices s_1 .. s_K (entries past k are filler)


def _check_difficulties(task: GroupTask, difficulties: Sequence[int]) -> tuple[int, ...]:
  difficulties = tuple(int(k) for k in difficulties)
  if not difficulties or any(not 1 <= k <= task.max_k for k in difficulties):
    raise ValueError(f'difficulties={difficulties} must be non-empty, each in [1, '
                     f'max_k={task.max_k}].')
  return difficulties


def make_problems(task: GroupTask, k_B, elements_BxK) -> Problems:
  """Problems from given horizons and elements (entries past each row's k are ignored)."""
  k_B = jnp.asarray(k_B, jnp.int32)
  elements_BxK = jnp.asarray(elements_BxK, jnp.int32)
  table_GxG = jnp.asarray(task.table, jnp.int32)

  def step(s_B, g_B):
    s_B = table_GxG[g_B, s_B]
    return s_B, s_B

  start_B = jnp.full(k_B.shape, task.identity, jnp.int32)
  _, states_KxB = jax.lax.scan(step, start_B, elements_BxK.T)
  used_BxK = jnp.arange(task.max_k)[None, :] < k_B[:, None]
  register_BxK = jnp.where(used_BxK, elements_BxK + FIRST_ELEMENT, BLANK)
  s0_Bx1 = jnp.full((k_B.shape[0], 1), task.identity + FIRST_ELEMENT, jnp.int32)
  return Problems(tokens_BxP=jnp.concatenate([register_BxK, s0_Bx1], 1), k_B=k_B,
                  states_BxK=states_KxB.T)


def difficulty_weights_K(task: GroupTask, difficulties: Sequence[int]) -> jax.Array:
  """Uniform probabilities over `difficulties` as a K-vector over k = 1..max_k."""
  difficulties = _check_difficulties(task, difficulties)
  w_K = np.zeros(task.max_k, np.float32)
  for k in difficulties:
    w_K[k - 1] = 1.0
  return jnp.asarray(w_K / w_K.sum())


def sample_problems(key, task: GroupTask, *, weights_K, batch: int) -> Problems:
  """`batch` problems, k drawn from weights_K over 1..max_k, elements uniform over the group.

  The mixture is an array, not a static argument, so one compilation serves every spectrum.
  """
  key_k, key_g = jax.random.split(key)
  k_B = 1 + jax.random.categorical(key_k, jnp.log(jnp.asarray(weights_K)), shape=(batch,))
  return make_problems(task, k_B, jax.random.randint(key_g, (batch, task.max_k), 0, task.order))


def answers_B(problems: Problems) -> jax.Array:
  """s_k of each problem, as an element index."""
  return jnp.take_along_axis(problems.states_BxK, problems.k_B[:, None] - 1, 1)[:, 0]


def completion_rewards_N(tokens_NxT, problems: Problems, *, task: GroupTask,
                         group_size: int) -> jax.Array:
  """1.0 where the k-th completion token is s_k (rows prompt-major, G per problem)."""
  k_N = jnp.repeat(problems.k_B, group_size)
  written_N = jnp.take_along_axis(tokens_NxT, (task.prompt_len + k_N - 1)[:, None], 1)[:, 0]
  return (written_N == jnp.repeat(answers_B(problems), group_size) + FIRST_ELEMENT).astype(
      jnp.float32)


def per_difficulty_mean(values_N, k_N, max_k: int) -> jax.Array:
  """Mean of values_N over the rows of each k = 1..max_k (NaN where k has no row): K."""
  onehot_NxK = (k_N[:, None] == jnp.arange(1, max_k + 1)[None, :]).astype(jnp.float32)
  count_K = onehot_NxK.sum(0)
  return jnp.where(count_K > 0, values_N @ onehot_NxK / jnp.maximum(count_K, 1.0), jnp.nan)


def eval_problems(task: GroupTask, *, per_k: int, seed: int = 12345) -> Problems:
  """A fixed evaluation set: `per_k` problems at each k = 1..max_k, k-major."""
  key = jax.random.key(seed)
  k_B = jnp.repeat(jnp.arange(1, task.max_k + 1, dtype=jnp.int32), per_k)
  return make_problems(task, k_B, jax.random.randint(key, (k_B.shape[0], task.max_k), 0,
                                                     task.order))
