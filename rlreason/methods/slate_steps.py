"""The RL loop's SLATE rollout mode (config.slate): step rows and their scores for train.py.

`sample_and_score` reads the config (env budgets, slate.k / eta / lambda_bonus / judge) and
calls rollout/slate.py's `sample_steps`; the rows' step rewards become the Scores the loop's
`slate` advantage reads (rl_batch.advantages_for). The judge is search_qa's rule judge
(envs/slate_rules.py) or the `judge` block's model (rollout/slate_judge.ModelStepJudge).
Not here: the sampling loop, the rewards and advantages themselves (rollout/slate.py).
"""

import time

import jax
import numpy as np

from rlreason.envs import slate_rules
from rlreason.rl import rl_batch
from rlreason.rollout import slate
from rlreason.rollout import slate_judge


def make_judge(run):
  """The run's step judge: config.slate.judge 'rule' (search_qa) or 'model' (config.judge)."""
  if run.config.slate.judge == 'rule':
    return slate_rules.SearchRuleJudge(verify=run.env.verify)
  return slate_judge.ModelStepJudge(run.judge)


def sample_and_score(run, params, examples, rng, *, step: int, times: dict):
  """rl/train.py's SLATE rollout mode: (rollout, rl_batch.Scores) with the step rewards."""
  e, rl, s = run.config.env, run.config.rl, run.config.slate
  t0 = time.perf_counter()
  with jax.set_mesh(run.sample_mesh):
    out = slate.sample_steps(
        params, run.env, run.renderer, run.tok, examples, judge=make_judge(run), cfg=run.cfg,
        k=s.k, max_turns=e.max_turns, max_turn_tokens=e.max_turn_tokens,
        max_observation_tokens=e.max_observation_tokens, max_total_tokens=rl.max_new_tokens,
        rng=rng, prompt_buckets=run.config.data.prompt_buckets, eta=s.eta,
        lambda_bonus=s.lambda_bonus, temperature=rl.temperature, top_k=rl.top_k, top_p=rl.top_p,
        pad_id=run.pad_id, max_chunks=rl.decode_chunks)
  times['time/generate_s'] = times.get('time/generate_s', 0.0) + time.perf_counter() - t0
  times['tokens/generate'] = times.get('tokens/generate', 0) + int(
      out.rollout.loss_mask_NxL.sum())
  rollout = rl_batch.tag_versions(out.rollout, version=step - 1)
  run.data_iter.record(examples, np.repeat(out.episode_rewards_B[:, None],
                                           out.rewards_BxG.shape[1], axis=1))
  metrics = out.metrics()
  metrics['train/zero_variance_frac'] = metrics['slate/zero_variance_step_frac']
  scores = rl_batch.Scores(rewards_BxG=out.rewards_BxG, verifier_BxG=out.rewards_BxG,
                           modes_BxG=np.full(out.rewards_BxG.shape, -1, np.int32),
                           metrics=metrics)
  return rollout, scores


def build(run):
  """SLATE's step rows under slate.enabled (rl/extensions.py: the rollout source), or None."""
  return SlateSource() if run.config.slate.enabled else None


class SlateSource:

  def sample_and_score(self, run, params, examples, rng, *, step: int, progress: float,
                       times: dict):
    del progress
    return sample_and_score(run, params, examples, rng, step=step, times=times)
