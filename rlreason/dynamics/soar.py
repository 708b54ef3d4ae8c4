"""SOAR: asymmetric teacher–student self-play, a bilevel RL loop on finite-group composition.

SOAR (issue #23 item 4; only the abstract is known): a teacher policy proposes synthetic
problems for a student policy and is rewarded by the student's improvement on a held-out
subset of hard problems on which the student starts at 0% success. The mechanism below is our
formalisation [F], built on the jitted toy loop of dynamics/toy_lm.py (same task, model and
update step):

  Student: toy_lm's tiny decoder on group composition. Its reward here is the CHAIN reward
    [F]: 1 iff all k written states s_1 .. s_k are right, so chance is |G|^-k, ~0 at large k
    (toy_lm's last-token reward would sit at chance 1/|G| instead, never at 0).
  Success on a problem set = the exact probability that a temperature-1 sample of the student
    solves a problem, Π_i π(s_i | prompt, s_<i) by one teacher-forced forward pass, averaged
    over the set (`success_prob_B`): no sampling noise, so the teacher reward is not drowned
    in it while success is ~0.
  Teacher: a second tiny decoder over the student's vocabulary plus K "k-digit" tokens. From
    one BOS token it writes 1 + K tokens: [k-digit, g_1, .., g_K]. `parse_proposals` reads
    them as the problem (k, g_1..g_k); entries past k are ignored. A proposal whose first
    token is not a k-digit or whose first k elements are not group elements is UNPARSABLE:
    counted (`valid_frac`), skipped by the student (no loss on it); a candidate set with no
    parsable problem leaves the student exactly unchanged (its reward is then exactly 0).
  One outer step [F]:
    1. the teacher samples D candidate problem sets of M proposals each;
    2. for each set d, a copy of the current student (params and Adam state) takes
       `inner_steps` GRPO steps on set d (G samples per problem, chain reward);
    3. r_d = mean_j P_after_d(x_j) − mean_j P_before(x_j) over the fixed held-out hard
       REWARD set {x_j} (R problems at the hard horizons): the student's measured improvement;
    4. the teacher takes one REINFORCE step with GRPO advantages over the D sets (A_d =
       (r_d − mean r) / (std r + eps), every token of every parsable proposal of set d gets
       A_d; every token of an unparsable one gets `invalid_advantage`, default −1: without it
       a calibration run's parsable share fell from 1.0 to 0.13 in 60 steps);
    5. the student is promoted to the candidate with the largest r_d (first on ties).
  Both policies thus train in one jitted run. Cost per outer step: D x inner_steps student
  updates, of which inner_steps are kept, D + 1 reward-set forwards and one teacher update. Baselines run the same loop with the same
  promotion but a fixed proposer instead of the teacher: problems drawn from a difficulty
  mixture (`weights_TxK`, one row per outer step: direct RL = only the hard horizons, a fixed
  easy-to-hard schedule = rows that move), or the teacher frozen at its initialisation.
  Progress is reported on a separate hard TEST set (different problems, same horizons), so
  the selection in step 5 does not leak into the reported number.

The teacher starts from `teacher_sft` on well-formed proposals drawn from a prior difficulty
mixture (our stand-in for the paper's pretrained LLM that can already write well-posed
questions); with `teacher_sft_steps=0` it starts random and most proposals are unparsable.
"""

import dataclasses
import functools
from collections.abc import Sequence

import flax
import jax
import jax.numpy as jnp
import numpy as np
import optax

from rlreason.dynamics import toy_lm
from rlreason.dynamics.group_problems import (
    BLANK, FIRST_ELEMENT, GroupTask, Problems, difficulty_weights_K, eval_problems,
    make_problems, per_difficulty_mean, sample_problems)
from rlreason.model import transformer
from rlreason.objectives import advantages
from rlreason.rl import update
from rlreason.structs import TrainBatch

BOS = 0  # The teacher's prompt: one PAD token.


def digit_token(task: GroupTask, k) -> jax.Array:
  """The teacher token that names horizon k (1..max_k): ids after the student's vocabulary."""
  return task.vocab_size + jnp.asarray(k) - 1


def teacher_vocab_size(task: GroupTask) -> int:
  return task.vocab_size + task.max_k


def parse_proposals(proposals_BxL, task: GroupTask):
  """Teacher tokens [k-digit, g_1..g_K] -> (k_B, elements_BxK, valid_B).

  valid_B is False where the first token is not a k-digit or one of the first k element
  tokens is not a group element; k and the elements of invalid rows are clamped to legal
  values so the rows still have shapes (callers mask them out).
  """
  proposals_BxL = jnp.asarray(proposals_BxL, jnp.int32)
  if proposals_BxL.ndim != 2 or proposals_BxL.shape[1] != 1 + task.max_k:
    raise ValueError(f'parse_proposals: proposals must be B x {1 + task.max_k} tokens '
                     f'([k-digit, g_1..g_{task.max_k}]), got shape {proposals_BxL.shape}.')
  k_B = proposals_BxL[:, 0] - task.vocab_size + 1
  k_ok_B = (k_B >= 1) & (k_B <= task.max_k)
  k_B = jnp.clip(k_B, 1, task.max_k)
  elements_BxK = proposals_BxL[:, 1:] - FIRST_ELEMENT
  used_BxK = jnp.arange(task.max_k)[None, :] < k_B[:, None]
  elem_ok_BxK = (elements_BxK >= 0) & (elements_BxK < task.order)
  valid_B = k_ok_B & jnp.all(elem_ok_BxK | ~used_BxK, axis=1)
  return k_B, jnp.where(elem_ok_BxK, elements_BxK, 0), valid_B


def format_proposals(task: GroupTask, k_B, elements_BxK) -> jax.Array:
  """Well-formed teacher tokens for given problems (entries past k written as BLANK)."""
  k_B = jnp.asarray(k_B, jnp.int32)
  used_BxK = jnp.arange(task.max_k)[None, :] < k_B[:, None]
  body_BxK = jnp.where(used_BxK, jnp.asarray(elements_BxK, jnp.int32) + FIRST_ELEMENT, BLANK)
  return jnp.concatenate([digit_token(task, k_B)[:, None], body_BxK], 1)


def chain_rewards_N(tokens_NxT, problems: Problems, *, task: GroupTask,
                    group_size: int) -> jax.Array:
  """1.0 where all k written states s_1..s_k are right (rows prompt-major, G per problem)."""
  k_N = jnp.repeat(problems.k_B, group_size)
  written_NxK = tokens_NxT[:, task.prompt_len:task.prompt_len + task.max_k]
  right_NxK = written_NxK == jnp.repeat(problems.states_BxK, group_size, 0) + FIRST_ELEMENT
  used_NxK = jnp.arange(task.max_k)[None, :] < k_N[:, None]
  return jnp.all(right_NxK | ~used_NxK, axis=1).astype(jnp.float32)


def success_prob_B(params, problems: Problems, *, task: GroupTask,
                   cfg: transformer.ModelConfig) -> jax.Array:
  """Exact P(a temperature-1 sample earns the chain reward) per problem: Π_{i<=k} π(s_i | ·)."""
  chain_BxK = problems.states_BxK + FIRST_ELEMENT
  tokens_BxT = jnp.concatenate([problems.tokens_BxP, chain_BxK], 1)
  logits_BxTxV = transformer.apply(params, tokens_BxT[:, :-1], cfg=cfg)[0]
  logp_BxKxV = jax.nn.log_softmax(logits_BxTxV[:, task.prompt_len - 1:].astype(jnp.float32))
  logp_BxK = jnp.take_along_axis(logp_BxKxV, chain_BxK[..., None], -1)[..., 0]
  used_BxK = jnp.arange(task.max_k)[None, :] < problems.k_B[:, None]
  return jnp.exp(jnp.sum(jnp.where(used_BxK, logp_BxK, 0.0), 1))


def teacher_rewards_D(p_before_R, p_after_DxR) -> jax.Array:
  """SOAR's grounded reward [F]: each candidate's mean success on the reward set minus before."""
  return jnp.mean(p_after_DxR, -1) - jnp.mean(p_before_R)


def hard_problems(task: GroupTask, hard_ks: Sequence[int], *, size: int, seed: int) -> Problems:
  """`size` fixed problems, horizons cycling through `hard_ks`, uniform elements from `seed`."""
  k_B = jnp.asarray([hard_ks[i % len(hard_ks)] for i in range(size)], jnp.int32)
  return make_problems(task, k_B, jax.random.randint(jax.random.key(seed), (size, task.max_k),
                                                     0, task.order))


@dataclasses.dataclass(frozen=True)
class Setting:
  """Everything that fixes the shapes of the compiled outer step (hashable)."""
  task: GroupTask
  student_cfg: transformer.ModelConfig
  teacher_cfg: transformer.ModelConfig
  hard_ks: tuple[int, ...]
  candidates: int = 4  # D problem sets per outer step
  problems_per_set: int = 16  # M
  group_size: int = 8  # G student samples per problem
  inner_steps: int = 2
  reward_set_size: int = 64  # R
  student_lr: float = 1e-3
  teacher_lr: float = 3e-4
  invalid_advantage: float = -1.0  # the teacher's advantage on each unparsable proposal [F]
  reward_set_seed: int = 777
  test_set_seed: int = 888

  def __post_init__(self):
    if not self.hard_ks or any(not 1 <= k <= self.task.max_k for k in self.hard_ks):
      raise ValueError(f'soar.Setting.hard_ks={self.hard_ks} must be non-empty, each in '
                       f'[1, max_k={self.task.max_k}].')
    for name in ('candidates', 'problems_per_set', 'group_size', 'inner_steps',
                 'reward_set_size'):
      if getattr(self, name) < 1:
        raise ValueError(f'soar.Setting.{name}={getattr(self, name)} must be >= 1.')
    if self.candidates < 2:
      raise ValueError(f'soar.Setting.candidates={self.candidates}: the teacher advantage is '
                       'relative over the candidate sets, so at least 2 are needed.')
    if self.teacher_cfg.vocab_size != teacher_vocab_size(self.task):
      raise ValueError(f'soar.Setting.teacher_cfg.vocab_size={self.teacher_cfg.vocab_size}; '
                       f'the task needs {teacher_vocab_size(self.task)} (student vocabulary + '
                       f'max_k digit tokens).')

  @functools.cached_property
  def student_opt(self):
    return optax.chain(optax.clip_by_global_norm(1.0), optax.adam(self.student_lr))

  @functools.cached_property
  def teacher_opt(self):
    return optax.chain(optax.clip_by_global_norm(1.0), optax.adam(self.teacher_lr))

  @functools.cached_property
  def reward_set(self) -> Problems:
    with jax.ensure_compile_time_eval():  # Concrete even when first read inside a trace.
      return hard_problems(self.task, self.hard_ks, size=self.reward_set_size,
                           seed=self.reward_set_seed)


def teacher_model(task: GroupTask, *, hidden: int = 32, layers: int = 1,
                  heads: int = 2) -> transformer.ModelConfig:
  return transformer.ModelConfig(
      vocab_size=teacher_vocab_size(task), hidden_size=hidden, intermediate_size=2 * hidden,
      num_layers=layers, num_heads=heads, num_kv_heads=heads, head_dim=hidden // heads,
      max_position_embeddings=4 * (task.max_k + 2))


def teacher_sft(params, key, *, task: GroupTask, cfg: transformer.ModelConfig,
                prior_K, steps: int, batch: int = 64, lr: float = 3e-3):
  """Warm start: SFT of the teacher on well-formed proposals, k ~ prior_K, uniform elements."""
  optimizer = optax.adam(lr)
  state = update.init_state(params, optimizer)

  def body(state, key):
    problems = sample_problems(key, task, weights_K=prior_K, batch=batch)
    elements_BxK = _elements_of(task, problems)
    tokens_NxT = jnp.concatenate([jnp.full((batch, 1), BOS, jnp.int32),
                                  format_proposals(task, problems.k_B, elements_BxK)], 1)
    mask_NxT = jnp.ones(tokens_NxT.shape, bool).at[:, 0].set(False)
    state, metrics = update.sft_step(state, tokens_NxT, mask_NxT, cfg=cfg, optimizer=optimizer)
    return state, metrics['loss']

  state, _ = jax.lax.scan(body, state, jax.random.split(key, steps))
  return state.params


def _elements_of(task: GroupTask, problems: Problems) -> jax.Array:
  """Element indices g_1..g_K back from the register tokens (blanks -> 0)."""
  return jnp.maximum(problems.tokens_BxP[:, :task.max_k] - FIRST_ELEMENT, 0)


def student_step(state, problems: Problems, valid_B, key, *, s: Setting):
  """One GRPO step of the student on given problems; invalid rows get no loss.

  With no valid row the state is returned unchanged (Adam's momentum would otherwise still
  move the params). Returns (state, mean chain reward over the valid rows).
  """
  task, g, K, cfg = s.task, s.group_size, s.task.max_k, s.student_cfg
  tokens_NxT = toy_lm.decode(state.params, jnp.repeat(problems.tokens_BxP, g, 0), key,
                             cfg=cfg, steps=K, temperature=1.0)
  rewards_N = chain_rewards_N(tokens_NxT, problems, task=task, group_size=g)
  valid_N = jnp.repeat(valid_B, g)
  k_N = jnp.repeat(problems.k_B, g)
  mask_NxL = ((jnp.arange(K)[None, :] < k_N[:, None]) & valid_N[:, None]).astype(jnp.float32)
  mask_NxT = jnp.ones(tokens_NxT.shape, bool)
  stats = update.logprobs_step(state.params, tokens_NxT, mask_NxT, cfg=cfg, completion_len=K,
                               temperature=1.0)
  adv_NxL = advantages.grpo(rewards_N.reshape(-1, g)).reshape(-1)[:, None] * mask_NxL
  batch = TrainBatch(tokens_NxT=tokens_NxT, mask_NxT=mask_NxT, loss_mask_NxL=mask_NxL,
                     advantages_NxL=adv_NxL, old_logprobs_NxL=stats.logprobs_NxT,
                     ref_logprobs_NxL=stats.logprobs_NxT,
                     behaviour_logprobs_NxL=stats.logprobs_NxT,
                     prefix_mask_NxL=jnp.zeros(mask_NxL.shape, bool))
  objective = update.Objective(policy_loss='ppo_clip', aggregation='seq_mean_token_mean',
                               group_size=g)
  new, _ = update.train_step(state, batch, cfg=cfg, objective=objective, optimizer=s.student_opt)
  any_valid = jnp.any(valid_B)
  state = jax.tree.map(lambda a, b: jnp.where(any_valid, a, b), new, state)
  reward = jnp.sum(rewards_N * valid_N) / jnp.maximum(valid_N.sum(), 1.0)
  return state, reward


def train_student_on(state, problems: Problems, valid_B, key, *, s: Setting):
  """`inner_steps` student steps on one problem set: (state, chain reward per step)."""
  step = functools.partial(student_step, problems=problems, valid_B=valid_B, s=s)
  return jax.lax.scan(lambda st, k: step(st, key=k), state,
                      jax.random.split(key, s.inner_steps))


def propose(teacher_params, key, *, s: Setting, n: int) -> jax.Array:
  """n teacher proposals at temperature 1: n x (1 + max_k) tokens."""
  prompt = jnp.full((n, 1), BOS, jnp.int32)
  return toy_lm.decode(teacher_params, prompt, key, cfg=s.teacher_cfg, steps=1 + s.task.max_k,
                       temperature=1.0)[:, 1:]


@flax.struct.dataclass
class Carry:
  student: update.TrainState
  teacher: update.TrainState


def outer_step(carry: Carry, xs, *, s: Setting, use_teacher, learn_teacher):
  """One bilevel step (module docstring, steps 1-5): (carry, metrics).

  xs = (key, weights_K): the mixture the fixed proposer draws from when use_teacher is 0.
  use_teacher / learn_teacher are traced 0/1 flags (so every arm shares one compilation).
  """
  key, weights_K = xs
  task, D, M = s.task, s.candidates, s.problems_per_set
  key_t, key_f, key_s = jax.random.split(key, 3)
  proposals_NxL = propose(carry.teacher.params, key_t, s=s, n=D * M)
  k_N, elements_NxK, valid_N = parse_proposals(proposals_NxL, task)
  fixed = sample_problems(key_f, task, weights_K=weights_K, batch=D * M)
  k_N = jnp.where(use_teacher, k_N, fixed.k_B)
  elements_NxK = jnp.where(use_teacher, elements_NxK, _elements_of(task, fixed))
  valid_N = jnp.where(use_teacher, valid_N, True)
  problems = make_problems(task, k_N, elements_NxK)
  sets = jax.tree.map(lambda x: x.reshape(D, M, *x.shape[1:]), (problems, valid_N))

  measure = functools.partial(success_prob_B, problems=s.reward_set, task=task,
                              cfg=s.student_cfg)
  p_before_R = measure(carry.student.params)

  def candidate(args):
    problems_d, valid_d, key_d = args
    state, rewards = train_student_on(carry.student, problems_d, valid_d, key_d, s=s)
    return state, measure(state.params), rewards.mean()

  students_D, p_after_DxR, student_reward_D = jax.lax.map(
      candidate, (*sets, jax.random.split(key_s, D)))
  rewards_D = teacher_rewards_D(p_before_R, p_after_DxR)
  best = jnp.argmax(rewards_D)
  student = jax.tree.map(lambda x: x[best], students_D)

  # Teacher: REINFORCE with GRPO advantages over the D sets, on every proposal token; an
  # unparsable proposal gets `invalid_advantage` instead (its set's reward cannot credit it).
  adv_N = jnp.where(valid_N, jnp.repeat(advantages.grpo(rewards_D[None, :])[0], M),
                    s.invalid_advantage) * learn_teacher
  tokens_NxT = jnp.concatenate([jnp.full((D * M, 1), BOS, jnp.int32), proposals_NxL], 1)
  mask_NxT = jnp.ones(tokens_NxT.shape, bool)
  L = 1 + task.max_k
  loss_mask_NxL = jnp.ones((D * M, L), jnp.float32)
  stats = update.logprobs_step(carry.teacher.params, tokens_NxT, mask_NxT, cfg=s.teacher_cfg,
                               completion_len=L, temperature=1.0)
  batch = TrainBatch(tokens_NxT=tokens_NxT, mask_NxT=mask_NxT, loss_mask_NxL=loss_mask_NxL,
                     advantages_NxL=adv_N[:, None] * loss_mask_NxL,
                     old_logprobs_NxL=stats.logprobs_NxT, ref_logprobs_NxL=stats.logprobs_NxT,
                     behaviour_logprobs_NxL=stats.logprobs_NxT,
                     prefix_mask_NxL=jnp.zeros(loss_mask_NxL.shape, bool))
  objective = update.Objective(policy_loss='ppo_clip', aggregation='seq_mean_token_mean',
                               group_size=1)
  new_teacher, _ = update.train_step(carry.teacher, batch, cfg=s.teacher_cfg,
                                     objective=objective, optimizer=s.teacher_opt)
  teacher = jax.tree.map(lambda a, b: jnp.where(learn_teacher > 0, a, b), new_teacher,
                         carry.teacher)
  validf_N = valid_N.astype(jnp.float32)
  metrics = {
      'hard_p_before': p_before_R.mean(), 'rewards_D': rewards_D, 'best_reward': rewards_D[best],
      'valid_frac': validf_N.mean(), 'student_reward': student_reward_D[best],
      # Share of the parsable proposals at each k = 1..K (the curriculum actually proposed).
      'proposed_k_K': jnp.sum(validf_N[:, None] * (k_N[:, None] == jnp.arange(
          1, task.max_k + 1)[None, :]), 0) / jnp.maximum(validf_N.sum(), 1.0),
  }
  return Carry(student=student, teacher=teacher), metrics


@functools.lru_cache(maxsize=8)
def _compiled(s: Setting, eval_per_k: int, test_size: int):
  """(jitted scan of outer steps, jitted evaluation: success prob per k and on the test set)."""
  per_k = eval_problems(s.task, per_k=eval_per_k)
  test = hard_problems(s.task, s.hard_ks, size=test_size, seed=s.test_set_seed)

  def chunk(carry, keys_T, weights_TxK, use_teacher, learn_teacher):
    step = functools.partial(outer_step, s=s, use_teacher=use_teacher,
                             learn_teacher=learn_teacher)
    return jax.lax.scan(step, carry, (keys_T, weights_TxK))

  def evaluate(params):
    p_B = success_prob_B(params, per_k, task=s.task, cfg=s.student_cfg)
    return (per_difficulty_mean(p_B, per_k.k_B, s.task.max_k),
            success_prob_B(params, test, task=s.task, cfg=s.student_cfg).mean())

  return jax.jit(chunk), jax.jit(evaluate)


@flax.struct.dataclass
class History:
  """A run over S seeds with E evaluations (step 0 included) and T outer steps."""
  eval_steps_E: np.ndarray
  success_SxExK: np.ndarray  # exact sampled-success probability per k (fixed eval set)
  hard_test_SxE: np.ndarray  # the same on the held-out hard TEST set
  train: dict  # name -> S x T (x D or x K)


def initial_teacher(*, s: Setting, seeds: Sequence[int], prior_K, sft_steps: int):
  """Seed-stacked teacher params: random init (key fold 3), then `sft_steps` of `teacher_sft`."""
  def init(key):
    params = transformer.init_params(s.teacher_cfg, jax.random.fold_in(key, 3))
    if sft_steps:
      params = teacher_sft(params, jax.random.fold_in(key, 4), task=s.task, cfg=s.teacher_cfg,
                           prior_K=prior_K, steps=sft_steps)
    return params
  return jax.jit(jax.vmap(init))(jnp.stack([jax.random.key(seed) for seed in seeds]))


def train(*, s: Setting, student_S, teacher_S, seeds: Sequence[int], steps: int,
          eval_every: int, proposer: str = 'teacher', weights_TxK=None,
          eval_per_k: int = 64, test_size: int = 128) -> History:
  """The bilevel loop from seed-stacked student and teacher params, `eval_every` steps a chunk.

  proposer: 'teacher' (SOAR: the teacher proposes and learns), 'frozen_teacher' (proposes,
  never updated), 'fixed' (problems drawn from weights_TxK, one mixture per outer step; a
  K-vector is used at every step). Step keys come from fold 5 of each seed's key.
  """
  proposers = ('teacher', 'frozen_teacher', 'fixed')
  if proposer not in proposers:
    raise ValueError(f'soar.train: proposer={proposer!r}; known: {", ".join(proposers)}.')
  if steps % eval_every:
    raise ValueError(f'soar.train: steps={steps} must be a multiple of eval_every={eval_every}.')
  K = s.task.max_k
  if weights_TxK is None:
    if proposer == 'fixed':
      raise ValueError("soar.train: proposer='fixed' needs weights_TxK.")
    weights_TxK = difficulty_weights_K(s.task, range(1, K + 1))
  weights_TxK = jnp.asarray(weights_TxK, jnp.float32)
  if weights_TxK.ndim == 1:
    weights_TxK = jnp.broadcast_to(weights_TxK, (steps, K))
  if weights_TxK.shape != (steps, K):
    raise ValueError(f'soar.train: weights_TxK has shape {weights_TxK.shape}, expected '
                     f'({steps}, {K}) or ({K},).')
  chunk, evaluate = _compiled(s, eval_per_k, test_size)
  use = jnp.float32(proposer != 'fixed')
  learn = jnp.float32(proposer == 'teacher')
  succ_S, test_S, logs_S = [], [], []
  for i, seed in enumerate(seeds):
    carry = Carry(student=update.init_state(jax.tree.map(lambda x: x[i], student_S),
                                            s.student_opt),
                  teacher=update.init_state(jax.tree.map(lambda x: x[i], teacher_S),
                                            s.teacher_opt))
    keys_T = jax.random.split(jax.random.fold_in(jax.random.key(seed), 5), steps)
    evals, logs = [jax.device_get(evaluate(carry.student.params))], []
    for start in range(0, steps, eval_every):
      stop = start + eval_every
      carry, metrics = chunk(carry, keys_T[start:stop], weights_TxK[start:stop], use, learn)
      evals.append(jax.device_get(evaluate(carry.student.params)))
      logs.append(jax.device_get(metrics))
    succ_S.append(np.stack([e[0] for e in evals]))
    test_S.append(np.array([e[1] for e in evals]))
    logs_S.append({name: np.concatenate([m[name] for m in logs]) for name in logs[0]})
  return History(eval_steps_E=np.arange(0, steps + 1, eval_every),
                 success_SxExK=np.stack(succ_S), hard_test_SxE=np.stack(test_S),
                 train={name: np.stack([log[name] for log in logs_S]) for name in logs_S[0]})
