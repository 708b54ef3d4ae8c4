"""rePIRL on the language model: a process reward model learned by inverse RL from expert
traces only, alternated with max-entropy policy updates on its dense token rewards.

  python -m rlreason.main --config experiments/repirl.py --workdir /tmp/repirl

The PRM is the reward model's architecture (methods/reward_model.py: the policy's transformer and
the critic's zero-initialised Dense D -> 1 head), read at every response token instead of the
last one: r_φ(s_t, a_t) = head(h_t), h_t the final hidden state after token a_t (the causal
model has then read the prefix s_t and a_t). Its params start as a copy of the policy's
initial ones and are trained apart from them.

One step (config.repirl; the formulas are objectives/irl.py's):
1. P prompts of the task (rl.prompts_per_step), G samples each from the policy (rl.group_size,
   at temperature 1: the IS weights need π's own density), and E expert traces each
   (repirl.expert_per_prompt answers of the repirl.expert teacher, named as sft.teacher is;
   '' = the task's reference solutions). An SFT warm start (sft.steps, on sft.teacher) runs
   first, as in the RL loop.
2. PRM: `prm_steps` Adam steps (repirl.prm_lr) on irl.prm_loss, Z of each prompt estimated
   from its G samples and E demos pooled under the mixture proposal (repirl.pool_expert;
   False: the G samples alone, q = π).
3. Policy: one Adam step (optimizer.lr, optimizer.grad_clip) on irl.maxent_policy_loss with
   irl.maxent_advantages of the PRM's token rewards (repirl.alpha: the entropy weight).
The task's verifier never enters training: its reward of the samples is logged as
'train/reward' (the true outcome, for reading only) and held-out pass@1 is evaluated every
eval.every steps and at the end. The PRM is saved as workdir/prm/ (reward_model.save's
format, mode 'repirl'), so `reward_model.path` can load it as a last-token reward.

Deliberately not here: checkpoints and resume (a run starts from its warm start), LoRA,
tool episodes, multi-host (config_checks and `train` refuse them), the tabular version
(dynamics/tabular_irl.py).
"""

import logging

import jax
import jax.numpy as jnp
import numpy as np
import optax

from rlreason.methods import reward_model as reward_model_lib
from rlreason.model import transformer
from rlreason.objectives import irl
from rlreason.rl import metrics as metrics_lib


def token_rewards(params, head, tokens_NxT, mask_NxT, *, cfg: transformer.ModelConfig):
  """r_φ at every position: the head on the final hidden state there (fp32 NxT)."""
  h_NxTxD, _ = transformer.apply(params, tokens_NxT, cfg=cfg, mask_NxT=mask_NxT,
                                 return_hidden=True)
  return transformer.values_from_hidden(head, h_NxTxD)


def token_logprobs(params, tokens_NxT, mask_NxT, *, cfg: transformer.ModelConfig):
  """log π(tokens[t] | tokens[<t]) at every position t >= 1; position 0 gets 0 (fp32 NxT)."""
  logits_NxTxV, _ = transformer.apply(params, tokens_NxT, cfg=cfg, mask_NxT=mask_NxT)
  lp_NxTxV = jax.nn.log_softmax(logits_NxTxV[:, :-1].astype(jnp.float32), -1)
  lp_NxT = jnp.take_along_axis(lp_NxTxV, tokens_NxT[:, 1:, None], -1)[..., 0]
  return jnp.pad(lp_NxT, ((0, 0), (1, 0)))


def rows(prompt_ids, responses, *, length: int, pad_id: int):
  """Right-padded prompt+response rows, the row mask, and the response mask (numpy NxT)."""
  tokens = np.full((len(responses), length), pad_id, np.int32)
  mask, response = np.zeros(tokens.shape, bool), np.zeros(tokens.shape, bool)
  for n, (p, r) in enumerate(zip(prompt_ids, responses)):
    ids = (list(p) + list(r))[:length]
    tokens[n, :len(ids)] = ids
    mask[n, :len(ids)] = True
    response[n, len(p):len(ids)] = True
  return tokens, mask, response


def prm_objective(prm, tokens_PxMxT, mask_PxMxT, response_PxMxT, log_q_PxM, *, num_expert: int,
                  reward_l2: float, cfg):
  """irl.prm_loss on the pooled rows of each prompt (its last `num_expert` are the demos)."""
  p, m, t = tokens_PxMxT.shape
  r_NxT = token_rewards(prm['params'], prm['head'], tokens_PxMxT.reshape(p * m, t),
                        mask_PxMxT.reshape(p * m, t), cfg=cfg)
  resp_NxT = response_PxMxT.reshape(p * m, t)
  ret_PxM = irl.sequence_rewards(r_NxT, resp_NxT).reshape(p, m)
  sq_mean = jnp.sum(jnp.where(resp_NxT, r_NxT**2, 0.0)) / jnp.maximum(jnp.sum(resp_NxT), 1)
  return irl.prm_loss(ret_PxM[:, m - num_expert:], ret_PxM, log_q_PxM, reward_l2=reward_l2,
                      token_rewards_sq_mean=sq_mean)


def policy_objective(params, prm, tokens_NxT, mask_NxT, response_NxT, *, group_size: int,
                     alpha: float, cfg):
  """irl.maxent_policy_loss with the PRM's dense rewards on the policy's own samples."""
  lp_NxT = token_logprobs(params, tokens_NxT, mask_NxT, cfg=cfg)
  r_NxT = jax.lax.stop_gradient(token_rewards(prm['params'], prm['head'], tokens_NxT, mask_NxT,
                                              cfg=cfg))
  adv_NxT = irl.maxent_advantages(r_NxT, lp_NxT, response_NxT, group_size=group_size,
                                  alpha=alpha)
  loss, metrics = irl.maxent_policy_loss(lp_NxT, adv_NxT, response_NxT)
  denom = jnp.maximum(jnp.sum(response_NxT), 1)
  return loss, {**metrics, 'irl/token_reward_mean': jnp.sum(jnp.where(response_NxT, r_NxT, 0.))
                / denom}


def train(config, workdir):
  """rePIRL as config.repirl says: (final policy params, last evaluation metrics)."""
  from rlreason.rl import run_setup
  if jax.process_count() > 1:
    raise ValueError('repirl.enabled: the rePIRL loop runs on a single host.')
  run = run_setup.build(config, workdir)
  try:
    return _train(run, config, run.workdir)
  finally:
    run.close()


def _train(run, config, workdir):
  from rlreason.rl import rl_batch, run_setup, sft
  from rlreason.rl.evaluate import evaluate_policy
  from rlreason.rollout import sampler
  r, rl, cfg = config.repirl, config.rl, run.cfg
  p, g, e = rl.prompts_per_step, rl.group_size, r.expert_per_prompt
  writer = metrics_lib.Writer(workdir, total_steps=rl.steps, every=config.log_every)
  state, _ = run.restore_or_init()
  with jax.set_mesh(run.mesh):
    state, _ = sft.sft_loop(run, state, steps=config.sft.steps, writer=writer)
  params = run.policy(state.params)
  prm = {'params': jax.tree.map(jnp.copy, params), 'head': transformer.init_value_head(cfg)}
  policy_opt = optax.chain(optax.clip_by_global_norm(config.optimizer.grad_clip or 1e9),
                           optax.adam(config.optimizer.lr))
  prm_opt = optax.chain(optax.clip_by_global_norm(1.0), optax.adam(r.prm_lr))
  policy_state, prm_state = policy_opt.init(params), prm_opt.init(prm)
  length = max(config.data.prompt_buckets) + rl.max_new_tokens + 1
  teacher = sft.teacher_fn(r.expert, {})
  rng = np.random.default_rng([config.seed, 2602_07832])

  def proposal(params, tokens_PxMxT, mask_PxMxT, response_PxMxT):
    """log q of the pooled rows: the mixture of π and the demos (or π alone)."""
    pp, m, t = tokens_PxMxT.shape
    lp = token_logprobs(params, tokens_PxMxT.reshape(-1, t), mask_PxMxT.reshape(-1, t), cfg=cfg)
    log_pi_PxM = irl.sequence_rewards(lp, response_PxMxT.reshape(-1, t)).reshape(pp, m)
    if not r.pool_expert:
      return log_pi_PxM
    resp = response_PxMxT
    counts = irl.demo_counts(tokens_PxMxT, resp, tokens_PxMxT[:, m - e:], resp[:, m - e:])
    return irl.mixture_log_proposal(log_pi_PxM, counts, num_policy=g, num_expert=e)

  @jax.jit  # One compiled step: the proposal, the PRM's steps, then the policy's.
  def update(params, policy_state, prm, prm_state, tokens_PxMxT, mask_PxMxT, response_PxMxT):
    batch = (tokens_PxMxT, mask_PxMxT, response_PxMxT,
             proposal(params, tokens_PxMxT, mask_PxMxT, response_PxMxT))
    for _ in range(r.prm_steps):
      (_, prm_metrics), grads = jax.value_and_grad(prm_objective, has_aux=True)(
          prm, *batch, num_expert=e, reward_l2=r.reward_l2, cfg=cfg)
      updates, prm_state = prm_opt.update(grads, prm_state, prm)
      prm = optax.apply_updates(prm, updates)
    samples = tuple(x[:, :g].reshape(p * g, -1) for x in batch[:3])
    (_, pol_metrics), grads = jax.value_and_grad(policy_objective, has_aux=True)(
        params, prm, *samples, group_size=g, alpha=r.alpha, cfg=cfg)
    updates, policy_state = policy_opt.update(grads, policy_state, params)
    return (optax.apply_updates(params, updates), policy_state, prm, prm_state,
            {**prm_metrics, **pol_metrics})

  eval_metrics = {}
  if config.eval.every:  # After the warm start: the baseline rePIRL starts from.
    writer.write(0, evaluate_policy(run, params, run.eval_rng, step=0))
  for step in range(1, rl.steps + 1):
    key = jax.random.fold_in(run.root_rng, step)
    examples = next(run.data_iter)
    prompts = run_setup.encode_prompts(run, examples)
    rollout = sampler.generate(params, prompts, cfg=cfg, group_size=g,
                               max_new_tokens=rl.max_new_tokens, temperature=1.0,
                               stop_tokens=tuple(run.tok.eos_ids), pad_id=run.pad_id, rng=key,
                               mesh=run.mesh, max_chunks=rl.decode_chunks)
    outcome_BxG, _ = rl_batch.verify(run, rollout, examples, progress=step / rl.steps)
    prompt_ids = [run.tok.encode(run_setup.prompt_text(run, ex)) for ex in examples]
    toks, msk = np.asarray(rollout.tokens_NxL), np.asarray(rollout.mask_NxL)
    samples = [toks[n][msk[n]] for n in range(p * g)]
    demos = []
    for ex in examples:
      for _ in range(e):
        demo = teacher(ex, rng)
        if demo is None:
          raise ValueError(f'repirl.expert={r.expert!r} gave no trace for problem '
                           f'{ex.id!r}: rePIRL needs an expert trace for every prompt.')
        demos.append(list(run.tok.encode(demo)) + [run.tok.eos_id])
    # Pooled rows per prompt: its G samples, then its E demos.
    pooled = [x for b in range(p) for x in samples[b * g:(b + 1) * g] + demos[b * e:(b + 1) * e]]
    pooled_ids = [prompt_ids[b] for b in range(p) for _ in range(g + e)]
    t_, m_, resp_ = (jnp.asarray(x).reshape(p, g + e, length)
                     for x in rows(pooled_ids, pooled, length=length, pad_id=run.pad_id))
    params, policy_state, prm, prm_state, step_metrics = update(
        params, policy_state, prm, prm_state, t_, m_, resp_)
    metrics = {**step_metrics, 'train/reward': float(np.mean(outcome_BxG)),
               **sampler.metrics(rollout)}
    if config.eval.every and (step % config.eval.every == 0 or step == rl.steps):
      eval_metrics = evaluate_policy(run, params, run.eval_rng, step=step)
      metrics.update(eval_metrics)
    host = writer.write(step, metrics)
    writer.progress(step, host, keys=('train/reward', 'eval/pass@1', 'irl/loss', 'irl/ess'))
  if not eval_metrics:
    eval_metrics = evaluate_policy(run, params, run.eval_rng, step=rl.steps)
    writer.write(rl.steps, eval_metrics)
  writer.close()
  scorer = reward_model_lib.RewardModel(cfg=cfg, params=prm['params'], head=prm['head'], meta={})
  reward_model_lib.save(workdir / 'prm', scorer, mode='repirl', config=config,
                        vocab_size=run.tok.vocab_size)
  logging.info('rePIRL: %s', eval_metrics)
  return params, eval_metrics


def replaces_loop(config) -> bool:
  """rl/extensions.py: with repirl.enabled, `train` runs instead of the RL loop."""
  return config.get('repirl') is not None and bool(config.repirl.enabled)
