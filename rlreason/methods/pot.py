"""PoT, Policy of Thoughts: test-time GRPO on a transient LoRA adapter, one problem at a time.

  result = pot.solve(run, params, examples, steps=4, candidates=8, rank=4, lr=1e-2, rng=key)
  result.correct_P, result.base_correct_P, result.reward_means_PxS, result.any_candidate_P

For each problem: a fresh adapter (model/lora.py, B = 0, so the policy starts as the base),
then `steps` rounds of: sample `candidates` completions at temperature 1 from base + adapter,
score them with the task's test-time checker, one GRPO update of the adapter (group-relative
advantage A_i = (R_i - mean R) / (std R + eps), DeepSeekMath arXiv 2402.03300, through the
product's ppo_clip loss: on-policy, one update per sample, so the ratio is 1 and this is the
policy gradient). Then the final answer is decoded greedily from base + adapter and the
adapter is dropped. The base params are never written (merge keeps them under
stop_gradient and only the adapter is in the optimizer). The base model's own greedy answer
(base + the fresh adapter, which is the base exactly) is decoded too, on the same problem.
Method: the seed abstract "Policy of Thoughts" (arXiv id not given there); its repository
(Frostlinx/Policy-of-Thought) holds only a README and the paper's PDF, no code, so the
exploration here is plain temperature-1 sampling where the paper uses an MCTS, and the
optimiser, learning rate and targets are our choice.

Test-time feedback (`TEST_TIME_FEEDBACK`): PoT needs a checker that is available when the
problem is posed, without its reference answer. We score with the run's verifier only for
tasks whose check is a function of the prompt:
  countdown: the expression must use each number printed in the prompt once and evaluate to
    the target printed in the prompt; the item's `answer` is that target, nothing else.
  arithmetic: the carry chain must be the column-by-column addition of the two operands
    printed in the prompt; the checker recomputes it from them (a calculator). The item's
    `answer` (the sum) is only a guard. Honest note: this feedback is an oracle in all but
    name, since the whole solution follows from the prompt.
Every other task (math, GSM8K, ...) has no test-time checker here and is refused; so are
tool-use episodes (config.env) and judges. Problems run one after another (no batching of
independent adapters yet); the jitted pieces compile once per shape, not per problem.
"""

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np
import optax

from rlreason.model import lora
from rlreason.objectives import advantages
from rlreason.rl import rl_batch
from rlreason.rl import run_setup
from rlreason.rl import update
from rlreason.rollout import sampler
from rlreason.structs import TrainBatch

TEST_TIME_FEEDBACK = {
    'countdown': 'expression uses the prompt\'s numbers once each and hits its target',
    'arithmetic': 'carry chain recomputed from the prompt\'s two operands',
}


def check_options(*, steps: int, candidates: int, rank: int, lr: float) -> None:
  """Raises ValueError naming the bad command-line flag."""
  if not isinstance(steps, int) or steps < 0:
    raise ValueError(f'--pot_steps={steps!r} must be an integer >= 0 (GRPO updates per '
                     'problem; 0 answers with the base model).')
  if not isinstance(candidates, int) or candidates < 2:
    raise ValueError(f'--pot_candidates={candidates!r} must be an integer >= 2 (GRPO '
                     'compares candidates within the group: one has no advantage).')
  if not isinstance(rank, int) or rank <= 0:
    raise ValueError(f'--pot_rank={rank!r} must be a positive integer (the LoRA rank).')
  if not lr > 0:
    raise ValueError(f'--pot_lr={lr!r} must be > 0.')


def check_run(run, examples) -> None:
  """Refuses problems without a test-time checker (see the module docstring)."""
  if run.env is not None or run.judge is not None:
    raise ValueError('PoT scores candidates with the task\'s verifier alone: turn off env '
                     'and judge for --pot.')
  for example in examples:
    if example.task not in TEST_TIME_FEEDBACK:
      raise ValueError(
          f'PoT needs a test-time checker; task {example.task!r} (example {example.id}) has '
          f'none here: its verifier compares with the reference answer, which a solver does '
          f'not have. Tasks with one: {sorted(TEST_TIME_FEEDBACK)}.')


@dataclasses.dataclass(frozen=True)
class PotResult:
  """Per problem (P) and per PoT step (S), on the host.

  correct_P: the final greedy answer from base + adapter was right.
  base_correct_P: the base model's greedy answer was right (same problem, same decoding).
  any_candidate_P: some candidate of some step was right.
  reward_means_PxS: the mean checker reward of each step's candidates.
  adapter_b_norm_P: |B| (all targets) of the final adapter: 0 means no update happened.
  answers, base_answers: the decoded final answers.
  """
  correct_P: np.ndarray
  base_correct_P: np.ndarray
  any_candidate_P: np.ndarray
  reward_means_PxS: np.ndarray
  adapter_b_norm_P: np.ndarray
  answers: list
  base_answers: list

  def metrics(self) -> dict[str, float]:
    out = {'pot/pass@1': float(np.mean(self.correct_P)),
           'pot/base_pass@1': float(np.mean(self.base_correct_P)),
           'pot/any_candidate': float(np.mean(self.any_candidate_P))}
    for s, mean in enumerate(self.reward_means_PxS.mean(0) if len(self.correct_P) else []):
      out[f'pot/reward_mean_step{s}'] = float(mean)
    return out


@dataclasses.dataclass(frozen=True)
class Steps:
  """The jitted pieces; see `jitted`."""
  init: object  # key -> TrainState around a fresh adapter (replicated on the mesh)
  merge: object  # (base, adapter) -> model params
  train: object  # (state, batch, base) -> (state, metrics); donates the state
  b_norm: object  # adapter -> |B|


@functools.lru_cache(maxsize=8)
def jitted(cfg, lora_cfg: lora.LoraConfig, *, lr: float, candidates: int, mesh) -> Steps:
  """Built once per setting: every problem reuses the same compiled functions."""
  # Clipped Adam without warmup or decay: a handful of steps, each must count.
  optimizer = optax.chain(optax.clip_by_global_norm(1.0), optax.adam(lr))
  objective = update.Objective(policy_loss='ppo_clip', aggregation='token_mean',
                               group_size=candidates, temperature=1.0)
  replicated = jax.sharding.NamedSharding(mesh, jax.P())
  init = jax.jit(lambda key: update.init_state(lora.init(cfg, lora_cfg, key), optimizer),
                 out_shardings=replicated)
  to_model = lambda base: lambda adapter: lora.merge(base, adapter, cfg, lora_cfg)
  train = jax.jit(  # The base is an argument, never a baked-in constant.
      lambda state, batch, base: update.train_step(state, batch, cfg=cfg, objective=objective,
                                                   optimizer=optimizer,
                                                   to_model=to_model(base)),
      out_shardings=(replicated, None), donate_argnums=0)
  merge = jax.jit(lambda base, adapter: to_model(base)(adapter))
  b_norm = jax.jit(lambda adapter: optax.tree.norm(
      [leaf for path, leaf in jax.tree_util.tree_flatten_with_path(adapter)[0]
       if jax.tree_util.keystr(path).endswith("['b']")]))
  return Steps(init=init, merge=merge, train=train, b_norm=b_norm)


def checker_scores(run, rollout, examples):
  """(rewards_BxG, correct_BxG) from the run's verifier (test-time tasks only)."""
  _, verdicts = rl_batch.verify(run, rollout, examples, progress=1.0, return_verdicts=True)
  g = rollout.group_size
  rewards = np.array([v.reward for v in verdicts], np.float32).reshape(-1, g)
  correct = np.array([v.status == 'correct' for v in verdicts]).reshape(-1, g)
  return rewards, correct


def grpo_batch(rollout, rewards_BxG) -> TrainBatch:
  """One on-policy GRPO batch: the sampler's log-probs are the old and behaviour ones."""
  tokens_NxT, mask_NxT = sampler.sequences(rollout)
  adv_N = advantages.grpo(jnp.asarray(rewards_BxG, jnp.float32)).reshape(-1)
  mask_NxL = rollout.mask_NxL
  logp_NxL = jnp.where(mask_NxL, rollout.logprobs_NxL, 0.0)
  return TrainBatch(tokens_NxT=tokens_NxT, mask_NxT=mask_NxT, loss_mask_NxL=mask_NxL,
                    advantages_NxL=adv_N[:, None] * mask_NxL, old_logprobs_NxL=logp_NxL,
                    ref_logprobs_NxL=logp_NxL, behaviour_logprobs_NxL=logp_NxL,
                    prefix_mask_NxL=rollout.prefix_mask_NxL,
                    turn_ids_NxL=jnp.zeros(mask_NxL.shape, jnp.int32))


def solve(run, params, examples, *, steps: int, candidates: int, rank: int, lr: float,
          rng: jax.Array, alpha: float | None = None,
          targets: tuple[str, ...] = ('q', 'k', 'v', 'o', 'gate', 'up', 'down'),
          max_new_tokens: int | None = None, score=checker_scores) -> PotResult:
  """PoT on each example in turn (see the module docstring); `params` are the model's
  (run.policy(...) of a checkpoint) and are not modified.

  alpha defaults to 2 * rank. `score(run, rollout, examples) -> (rewards_BxG, correct_BxG)`
  is the test-time checker (tests swap in a constant one).
  """
  check_options(steps=steps, candidates=candidates, rank=rank, lr=lr)
  check_run(run, examples)
  lora_cfg = lora.LoraConfig(rank=rank, alpha=float(alpha or 2 * rank), targets=targets)
  lora.check(run.cfg, lora_cfg)
  fns = jitted(run.cfg, lora_cfg, lr=float(lr), candidates=candidates, mesh=run.mesh)
  new_tokens = max_new_tokens or run.config.rl.max_new_tokens
  generate = functools.partial(
      sampler.generate, cfg=run.cfg, max_new_tokens=new_tokens, pad_id=run.pad_id,
      stop_tokens=tuple(run.tok.eos_ids), mesh=run.mesh, max_chunks=run.config.rl.decode_chunks)
  rows = {k: [] for k in ('correct', 'base', 'any', 'means', 'b', 'answers', 'base_answers')}
  with jax.set_mesh(run.mesh):
    for i, example in enumerate(examples):
      key = jax.random.fold_in(rng, i)
      init_key, answer_key = jax.random.fold_in(key, 0), jax.random.fold_in(key, 1)
      prompts = run_setup.encode_prompts(run, [example])
      state = fns.init(init_key)  # B = 0: base + adapter is the base model exactly.
      greedy = lambda p: generate(p, prompts, group_size=1, temperature=0.0, rng=answer_key)
      base_answer = greedy(fns.merge(params, state.params))
      base_ok = score(run, base_answer, [example])[1]
      means, any_ok = [], False
      for s in range(steps):
        rollout = generate(fns.merge(params, state.params), prompts, group_size=candidates,
                           temperature=1.0, rng=jax.random.fold_in(key, 2 + s))
        rewards_1xG, ok_1xG = score(run, rollout, [example])
        means.append(float(rewards_1xG.mean()))
        any_ok |= bool(ok_1xG.any())
        state, _ = fns.train(state, grpo_batch(rollout, rewards_1xG), params)
      answer = greedy(fns.merge(params, state.params))
      ok = score(run, answer, [example])[1]
      rows['correct'].append(bool(ok[0, 0]))
      rows['base'].append(bool(base_ok[0, 0]))
      rows['any'].append(any_ok)
      rows['means'].append(means)
      rows['b'].append(float(fns.b_norm(state.params)))
      rows['answers'] += rl_batch.decode_completions(run, answer)
      rows['base_answers'] += rl_batch.decode_completions(run, base_answer)
      del state  # The transient adapter goes here; nothing of it outlives the problem.
  return PotResult(correct_P=np.array(rows['correct'], bool),
                   base_correct_P=np.array(rows['base'], bool),
                   any_candidate_P=np.array(rows['any'], bool),
                   reward_means_PxS=np.array(rows['means'], np.float32).reshape(-1, steps),
                   adapter_b_norm_P=np.array(rows['b'], np.float32),
                   answers=rows['answers'], base_answers=rows['base_answers'])
