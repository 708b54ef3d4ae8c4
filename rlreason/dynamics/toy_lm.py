"""Tiny-transformer RL on finite-group composition, jitted end to end, for the dynamics studies.

  task = toy_lm.GroupTask.make('S3', max_k=4)
  cfg = toy_lm.tiny_model(task, hidden=32)
  params_S = toy_lm.initial_params(task=task, model_cfg=cfg, seeds=(0, 1), sft_steps=300)
  hist = toy_lm.train(task=task, difficulties=(1, 2, 3, 4), estimator='grpo',
                           group_size=8, prompts_per_step=32, steps=500, eval_every=25,
                           model_cfg=cfg, params_S=params_S, seeds=(0, 1))
  hist.eval_acc_SxExK  # greedy accuracy per seed, evaluation and difficulty k

colab/01 (implicit curriculum), 03 (group size and baselines) and 04 (normalisation) train
with this loop. It is the full RL step of `train.py` with the host removed: problems are drawn
on device, the reward is an exact comparison of token ids, so one step
(sample -> reward -> advantages -> `update.train_step`) is one jitted function and
`eval_every` steps are a `lax.scan` (the purejaxrl pattern). The difficulty mixture and the
estimator are traced arguments, so a comparison compiles once per shape. On a 2-core CPU a
step takes ~10-40 ms, against seconds for `rlreason.rl.train.train`, whose verifier process
pool, text decoding and checkpoints dominate at this model size.

Task format (our formalisation of algorithms.md §24, whose exact format is unknown): the group
elements of `rlreason.tasks.group_composition` become one token each. A prompt is a register of
`max_k` slots holding g_1 .. g_k then blanks, followed by the identity element as s_0; the
policy writes s_1 .. s_K with s_i = g_i · s_{i-1} and only its first k tokens count (the
length is given by the problem, so no stop token is learned). The reward is 1 iff token k
equals s_k; intermediate states are not scored. Because g_i sits exactly `max_k` positions
before the query that writes s_i, one attention offset and one product table serve every step
of every k: the per-step skill is shared across difficulties, which is what lets easy levels
teach hard ones. Every reward is chance-level 1/|G| at initialisation, for every k.

What the policy shares with the product: `transformer.apply` (the transformer), `update.train_step`
(loss, aggregation, Adam step, non-finite skip), `update.logprobs_step` (old log-probs and
Σπ² for OTB), the estimators of `advantages`, `loss_diagnostics.otb_variance_proxies`.
Deliberately not here: `sampler.generate` (its host-side checks of the prompts cannot run inside
a scan; `decode` is its few-line core: prefill into `model`'s KV cache, then one token a step);
the paper's frozen one-step MLP (`one_step_sft` teaches the product table by SFT instead, hard
or soft with a chosen sampled accuracy, then the whole model trains); text tokenisation;
plotting (the studies use `bandit.plot_band` and `seed_stats.plot_ci`).
"""

import dataclasses
import functools
from collections.abc import Sequence

import flax
import jax
import jax.numpy as jnp
import numpy as np
import optax

# The task, its problems and rewards (dynamics/group_problems.py; toy_lm.GroupTask is the
# studies' handle on it).
from rlreason.dynamics.group_problems import (
    FIRST_ELEMENT, GroupTask, Problems, completion_rewards_N, difficulty_weights_K,
    eval_problems, make_problems, per_difficulty_mean, sample_problems)
from rlreason.model import transformer
from rlreason.objectives import advantages
from rlreason.objectives import loss_diagnostics
from rlreason.rl import update
from rlreason.structs import TrainBatch

ESTIMATORS = ('grpo', 'dr_grpo', 'global', 'otb')


def decode(params, tokens_NxP, key, *, cfg: transformer.ModelConfig, steps: int,
           temperature: float) -> jax.Array:
  """Appends `steps` tokens to each prompt (temperature 0: greedy): tokens_NxT, T = P + steps.

  Prefill once into an explicit KV cache, then one token per step; a pure function of its
  inputs, so it scans and vmaps.
  """
  n, p = tokens_NxP.shape
  cache = transformer.init_cache(cfg, n, p + steps)

  def pick(logits_NxV, l):
    if temperature == 0:
      return jnp.argmax(logits_NxV, -1).astype(jnp.int32)
    return jax.random.categorical(jax.random.fold_in(key, l),
                                  logits_NxV / temperature).astype(jnp.int32)

  logits_NxPxV, cache = transformer.apply(params, tokens_NxP, cfg=cfg, cache=cache)
  tok_N = pick(logits_NxPxV[:, -1], 0)
  out_NxL = jnp.zeros((n, steps), jnp.int32).at[:, 0].set(tok_N)

  rope_table = transformer.rope_table(cfg, p + steps)

  def body(l, carry):
    cache, tok_N, out_NxL = carry
    logits_Nx1xV, cache = transformer.apply(params, tok_N[:, None], cfg=cfg, cache=cache,
                                      rope_table=rope_table)
    tok_N = pick(logits_Nx1xV[:, 0], l)
    return cache, tok_N, out_NxL.at[:, l].set(tok_N)

  _, _, out_NxL = jax.lax.fori_loop(1, steps, body, (cache, tok_N, out_NxL))
  return jnp.concatenate([tokens_NxP, out_NxL], 1)


def std_heterogeneity(rewards_BxG) -> dict[str, jax.Array]:
  """Within-prompt reward std σ_x (population) and how much it varies across prompts.

  `std_mean` = mean σ_x, `std_cv` = std of σ_x / mean σ_x over the prompts with σ_x > 0 (the
  heterogeneity that per-prompt normalisation equalises; 0 when every informative prompt has
  the same σ_x), `zero_std_frac` = share of prompts with σ_x = 0 (no signal under any scheme).
  """
  std_B = jnp.std(rewards_BxG, axis=-1)
  live_B = (std_B > 0).astype(jnp.float32)
  n_live = jnp.maximum(live_B.sum(), 1.0)
  mean_live = jnp.sum(std_B * live_B) / n_live
  var_live = jnp.sum(live_B * (std_B - mean_live)**2) / n_live
  return {'std_mean': std_B.mean(), 'zero_std_frac': 1.0 - live_B.mean(),
          'std_cv': jnp.where(mean_live > 0, jnp.sqrt(var_live) / jnp.maximum(mean_live, 1e-9),
                              0.0)}


def token_advantages(estimator: str, rewards_BxG, stats, mask_NxL) -> jax.Array:
  """advantages_NxL from the named estimator of rlreason.objectives.advantages (0 off the mask).

  'grpo': per-prompt std normalisation; 'dr_grpo': mean-centred only (unnormalised
  REINFORCE with the group mean as baseline); 'global': group mean subtracted, then divided by
  the std over the whole batch (REINFORCE++-baseline); 'otb': the optimal token baseline from
  the old policy's log-probs and Σπ² (`stats`, a TokenStats over the completion).
  """
  if estimator not in ESTIMATORS:
    raise ValueError(f'estimator={estimator!r}; known: {", ".join(ESTIMATORS)}.')
  return _advantage_fns(rewards_BxG.shape[-1])[ESTIMATORS.index(estimator)](
      rewards_BxG, stats, mask_NxL)


def _advantage_fns(group_size: int):
  """One function per name in ESTIMATORS, same signature, for `lax.switch`."""
  def group(fn):
    return lambda rewards_BxG, stats, mask_NxL: fn(rewards_BxG).reshape(-1)[:, None] * mask_NxL

  def otb(rewards_BxG, stats, mask_NxL):
    token_rewards_NxL = advantages.outcome_token_rewards(rewards_BxG.reshape(-1), mask_NxL)
    return advantages.otb(token_rewards_NxL, stats.logprobs_NxT, stats.sum_sq_probs_NxT,
                          mask_NxL, group_size=group_size, zero_tail=False)

  return (group(advantages.grpo), group(advantages.dr_grpo),
          group(advantages.reinforce_pp_baseline), otb)


def tiny_model(task: GroupTask, *, hidden: int = 64, layers: int = 2,
               heads: int = 4) -> transformer.ModelConfig:
  """A Qwen2-style decoder sized for the task's vocabulary (head_dim = hidden / heads)."""
  return transformer.ModelConfig(vocab_size=task.vocab_size, hidden_size=hidden,
                           intermediate_size=2 * hidden, num_layers=layers, num_heads=heads,
                           num_kv_heads=heads, head_dim=hidden // heads,
                           max_position_embeddings=4 * task.prompt_len)


@dataclasses.dataclass(frozen=True)
class Setting:
  """What fixes the shapes and the compiled step (hashable: compiled steps are cached on it).

  The difficulty mixture and the estimator are arrays passed to the step instead, so runs
  that differ only in them share one compilation.
  """
  task: GroupTask
  group_size: int
  prompts_per_step: int
  model_cfg: transformer.ModelConfig
  lr: float = 1e-3
  temperature: float = 1.0
  aggregation: str = 'seq_mean_token_mean'

  @functools.cached_property
  def optimizer(self) -> optax.GradientTransformation:
    return optax.chain(optax.clip_by_global_norm(1.0), optax.adam(self.lr))

  @functools.cached_property
  def objective(self) -> update.Objective:
    # One update per batch (on-policy): the PPO ratio is 1, so the loss is REINFORCE's.
    return update.Objective(policy_loss='ppo_clip', aggregation=self.aggregation,
                            group_size=self.group_size)


def rl_step(state, key, weights_K, estimator_id, *, s: Setting):
  """Draw problems, sample G completions each, reward, advantages, one update: (state, metrics).

  weights_K: the difficulty mixture; estimator_id: index into ESTIMATORS (traced).
  """
  task, g, K = s.task, s.group_size, s.task.max_k
  key_p, key_d = jax.random.split(key)
  problems = sample_problems(key_p, task, weights_K=weights_K, batch=s.prompts_per_step)
  tokens_NxT = decode(state.params, jnp.repeat(problems.tokens_BxP, g, 0), key_d,
                      cfg=s.model_cfg, steps=K, temperature=s.temperature)
  rewards_N = completion_rewards_N(tokens_NxT, problems, task=task, group_size=g)
  k_N = jnp.repeat(problems.k_B, g)
  mask_NxL = (jnp.arange(K)[None, :] < k_N[:, None]).astype(jnp.float32)
  mask_NxT = jnp.ones(tokens_NxT.shape, bool)
  stats = update.logprobs_step(state.params, tokens_NxT, mask_NxT, cfg=s.model_cfg,
                               completion_len=K, temperature=s.temperature)
  rewards_BxG = rewards_N.reshape(-1, g)
  adv_NxL = jax.lax.switch(estimator_id, _advantage_fns(g), rewards_BxG, stats, mask_NxL)
  batch = TrainBatch(tokens_NxT=tokens_NxT, mask_NxT=mask_NxT, loss_mask_NxL=mask_NxL,
                     advantages_NxL=adv_NxL, old_logprobs_NxL=stats.logprobs_NxT,
                     ref_logprobs_NxL=stats.logprobs_NxT,
                     behaviour_logprobs_NxL=stats.logprobs_NxT,
                     prefix_mask_NxL=jnp.zeros(mask_NxL.shape, bool))
  state, m = update.train_step(state, batch, cfg=s.model_cfg, objective=s.objective,
                               optimizer=s.optimizer)
  proxies = loss_diagnostics.otb_variance_proxies(stats.logprobs_NxT, stats.sum_sq_probs_NxT,
                                                  adv_NxL, mask_NxL, grad_norm=m['grad_norm'])
  metrics = {'reward': rewards_N.mean(), 'grad_norm': m['grad_norm'], 'entropy': m['entropy'],
             'tokens': mask_NxL.sum(), 'reward_by_k': per_difficulty_mean(rewards_N, k_N, K),
             **{name.split('/')[1]: v for name, v in proxies.items()},
             **std_heterogeneity(rewards_BxG)}
  return state, metrics


def greedy_accuracy_K(params, problems: Problems, *, s: Setting) -> jax.Array:
  """Greedy accuracy at each k = 1..max_k on `problems`."""
  tokens_NxT = decode(params, problems.tokens_BxP, jax.random.key(0), cfg=s.model_cfg,
                      steps=s.task.max_k, temperature=0.0)
  correct_N = completion_rewards_N(tokens_NxT, problems, task=s.task, group_size=1)
  return per_difficulty_mean(correct_N, problems.k_B, s.task.max_k)


def soft_targets_BxV(task: GroupTask, answers_B, *, target_accuracy: float) -> jax.Array:
  """Token distributions with `target_accuracy` on each answer element and the rest of the
  mass spread evenly over the other |G| − 1 elements (none on PAD / BLANK)."""
  right_BxG = jax.nn.one_hot(answers_B, task.order)
  return jnp.pad(right_BxG * target_accuracy + (1 - right_BxG) * (1 - target_accuracy)
                 / (task.order - 1), ((0, 0), (FIRST_ELEMENT, 0)))


def one_step_sft(params, key, *, task: GroupTask, cfg: transformer.ModelConfig, steps: int,
                 batch: int = 64, lr: float = 3e-3, target_accuracy: float | None = None):
  """Supervised warm start of the one-step skill: s_1 = g_1 · s_0 for a random s_0.

  The analogue of §24's pre-trained atomic skill: prompts hold one element g_1 in the
  register and a uniformly drawn s_0 (not only the identity) in the s_0 slot, and the loss is
  on s_1 alone, so the product table is learned but not where to find g_i when the register
  holds several elements: that fetch, the composition, is left to RL. With `target_accuracy`
  p, the target is soft instead (our formalisation of §24(d)'s noisy step): p on g_1 · s_0 and
  (1 − p)/(|G| − 1) on every other element, so a converged warm start samples the right
  product with probability p (greedy: always), the per-step accuracy of §24's
  P_L = 1/|G| + (1 − 1/|G|) p^L. Returns params.
  """
  if target_accuracy is not None and not 1 / task.order < target_accuracy <= 1:
    raise ValueError(f'target_accuracy={target_accuracy} must be in (1/|G|, 1].')
  optimizer = optax.adam(lr)
  state = update.init_state(params, optimizer)

  def body(state, key):
    key_g, key_s = jax.random.split(key)
    g_B = jax.random.randint(key_g, (batch,), 0, task.order)
    s0_B = jax.random.randint(key_s, (batch,), 0, task.order)
    problems = make_problems(task, jnp.ones(batch, jnp.int32),
                             jnp.zeros((batch, task.max_k), jnp.int32).at[:, 0].set(g_B))
    s1_B = jnp.asarray(task.table, jnp.int32)[g_B, s0_B]
    tokens_NxT = jnp.concatenate([problems.tokens_BxP[:, :-1], (s0_B + FIRST_ELEMENT)[:, None],
                                  (s1_B + FIRST_ELEMENT)[:, None]], 1)
    if target_accuracy is None:
      loss_mask_NxT = jnp.zeros(tokens_NxT.shape, bool).at[:, -1].set(True)
      state, metrics = update.sft_step(state, tokens_NxT, loss_mask_NxT, cfg=cfg,
                                       optimizer=optimizer)
      return state, metrics['loss']
    target_BxV = soft_targets_BxV(task, s1_B, target_accuracy=target_accuracy)

    def loss_fn(params):
      logits_BxV = transformer.apply(params, tokens_NxT[:, :-1], cfg=cfg)[0][:, -1]
      return -jnp.mean(jnp.sum(target_BxV * jax.nn.log_softmax(logits_BxV), -1))

    loss, grads = jax.value_and_grad(loss_fn)(state.params)
    updates, opt_state = optimizer.update(grads, state.opt_state, state.params)
    return state.replace(params=optax.apply_updates(state.params, updates),
                         opt_state=opt_state), loss

  state, _ = jax.lax.scan(body, state, jax.random.split(key, steps))
  return state.params


@flax.struct.dataclass
class History:
  """A run over S seeds: E evaluations (step 0 included), T training steps, K difficulties."""
  eval_steps_E: np.ndarray
  eval_acc_SxExK: np.ndarray
  train: dict  # name -> S x T (S x T x K for 'reward_by_k')

  def tokens_T(self) -> np.ndarray:
    """Cumulative completion tokens consumed after each step (seed 0; equal in expectation)."""
    return np.cumsum(self.train['tokens'][0])


def initial_params(*, task: GroupTask, model_cfg: transformer.ModelConfig, seeds: Sequence[int],
                   sft_steps: int = 0, target_accuracy: float | None = None):
  """Seed-stacked parameters: random init (key fold 0), then `sft_steps` of `one_step_sft`
  (soft targets with `target_accuracy`, see there).

  Pass the result to every `train` call of a comparison, so that runs differ only in what
  they compare (and the warm start is computed once).
  """
  keys_S = jnp.stack([jax.random.key(seed) for seed in seeds])

  def init(key):
    params = transformer.init_params(model_cfg, jax.random.fold_in(key, 0))
    if sft_steps:
      params = one_step_sft(params, jax.random.fold_in(key, 2), task=task, cfg=model_cfg,
                            steps=sft_steps, target_accuracy=target_accuracy)
    return params

  return jax.jit(jax.vmap(init))(keys_S)


@functools.lru_cache(maxsize=16)
def _compiled(s: Setting, per_k: int):
  """(jitted scan of rl_step over a chunk of step keys, jitted greedy accuracy per k)."""
  problems = eval_problems(s.task, per_k=per_k)

  def chunk(state, keys_T, weights_K, estimator_id):
    step = functools.partial(rl_step, weights_K=weights_K, estimator_id=estimator_id, s=s)
    return jax.lax.scan(step, state, keys_T)

  return jax.jit(chunk), jax.jit(lambda params: greedy_accuracy_K(params, problems, s=s))


def train(*, task: GroupTask, difficulties: Sequence[int], estimator: str, group_size: int,
          prompts_per_step: int, steps: int, eval_every: int, model_cfg: transformer.ModelConfig,
          params_S, seeds: Sequence[int], lr: float = 1e-3, temperature: float = 1.0,
          aggregation: str = 'seq_mean_token_mean', eval_per_k: int = 128) -> History:
  """RL from `params_S` (from `initial_params`), `eval_every` jitted steps at a time.

  Seeds run one after the other: on the shared 2-core CPU a vmap over seeds ran ~4x slower
  per seed than a loop at these sizes (measured, not explained). Runs with the
  same shapes (task, model, G, prompts per step, lr) share one compilation. Step keys come
  from fold 1 of each seed's key.
  """
  if estimator not in ESTIMATORS:
    raise ValueError(f'estimator={estimator!r}; known: {", ".join(ESTIMATORS)}.')
  if steps % eval_every:
    raise ValueError(f'steps={steps} must be a multiple of eval_every={eval_every}.')
  s = Setting(task=task, group_size=group_size, prompts_per_step=prompts_per_step,
              model_cfg=model_cfg, lr=lr, temperature=temperature, aggregation=aggregation)
  chunk, evaluate = _compiled(s, eval_per_k)
  weights_K = difficulty_weights_K(task, difficulties)
  estimator_id = jnp.int32(ESTIMATORS.index(estimator))
  accs_S, logs_S = [], []
  for i, seed in enumerate(seeds):
    state = update.init_state(jax.tree.map(lambda x: x[i], params_S), s.optimizer)
    keys_T = jax.random.split(jax.random.fold_in(jax.random.key(seed), 1), steps)
    accs, logs = [np.asarray(evaluate(state.params))], []
    for start in range(0, steps, eval_every):
      state, metrics = chunk(state, keys_T[start:start + eval_every], weights_K, estimator_id)
      accs.append(np.asarray(evaluate(state.params)))
      logs.append(jax.device_get(metrics))
    accs_S.append(np.stack(accs))
    logs_S.append({name: np.concatenate([m[name] for m in logs]) for name in logs[0]})
  return History(eval_steps_E=np.arange(0, steps + 1, eval_every),
                 eval_acc_SxExK=np.stack(accs_S),
                 train={name: np.stack([log[name] for log in logs_S]) for name in logs_S[0]})


def rounded(x, digits: int = 2) -> list:
  """`x` as a (nested) list of floats rounded to `digits`, for printed summaries."""
  return np.round(np.asarray(x, float), digits).tolist()
