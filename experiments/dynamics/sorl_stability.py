"""Study 7: SORL against token-level PPO-clip in off-policy multi-turn training

Question: on real tool-using episodes (a call, the tool's result as a masked observation, an
answer), trained off-policy (many updates per sampled batch at a large learning rate), is
token-level PPO-clip unstable, and does SORL (turn-level importance ratios with
clipping-triggered normalisation, losses.sorl, our formalisation of algorithms.md §14) stay
stable? The paper's claim (arXiv 2511.20718): token-level importance sampling mismatches the
turn structure and makes off-policy multi-turn training collapse without early stopping;
turn-level ratios plus the normalisation keep it stable, with lower clipping ratios.

  python -m experiments.dynamics.sorl_stability            # full run, writes colab/figures/07_*.png
  python -m experiments.dynamics.sorl_stability --smoke    # seconds
  python -m experiments.dynamics.sorl_stability --write_notebook   # regenerates colab/07_*.ipynb

Runtime: full run ~6 min of CPU (26 min wall at load ~27 on the shared 2-core machine); smoke
~15-20 s of CPU, nearly all compilation (the notebook test: 176 s wall under that load).

Setup: the tool demo's task at 2-digit operands (experiments/demo_tools.py: 'What is 45 * 56?
Use the calculator.', the 'tags' calculator tool, exact-match reward, character tokenizer)
and a 2-layer d = 48 model SFT'd for 300 steps on the demo's teacher, which calls the
misnamed tool in 70% of its traces; the same warm start and the same prompts for every method
and seed (seeds change the sampling). Then 15 RL steps of 8 prompts x G = 8 episodes: GRPO
advantages, token-mean, Adam lr 1e-3 with global-norm clipping at 1 (2x the demo's lr), and
4 epochs x 2 minibatches = 8 updates per sampled batch (the last minibatch is trained 7
updates away from the policy that sampled it). Methods, all with ε = 0.2: PPO-clip on token
ratios; SO-GRPO (geometric turn ratio, reliability normalisation Σ ω ℓ / Σ ω); Turn-PPO (the
turn ratio alone), to separate the two parts. Logged per step: the sampled batch's mean
reward; KL(π_behaviour ‖ π_new) after the 8 updates (k3 on the sampled model tokens); the
clip fraction each loss reports, averaged over its 8 updates (tokens for PPO-clip, tokens of
clipped turns for the turn losses: not the same quantity). 3 seeds. The smoke setting (the
notebook test's) runs a 1-layer d = 32 model, 2 SFT steps and the first two methods only.

Result: The paper's claim does not show here; if anything the opposite. (Full run, 3 seeds,
15 steps; "collapsed" = the sampled reward falls to 0 and stays there: every group then has
zero advantage, nothing is updated, and the KL to behaviour decays to ~1e-6, the curves that
dive in the middle panel.)
* PPO-clip (token ratios): 1 of 3 seeds collapsed (step ~6); final reward (mean of the last 3
  steps) 0.115 / 0.193 / 0.000, median 0.115; largest drop after a seed's peak 0.30; mean KL
  to behaviour after the 8 updates 0.133 (max 0.37); clip fraction 0.025.
* SO-GRPO (turn ratios + normalisation): 3 of 3 collapsed (steps 5-10); final 0.000 in every
  seed; largest drop 0.30; mean KL 0.086 (max 0.33); clip fraction 0.031.
* Turn-PPO (turn ratio only): 2 of 3 collapsed; final 0.000 / 0.000 / 0.130; largest drop
  0.27; mean KL 0.156 (max 0.54); clip fraction 0.039.
No method learned in this regime (no seed's sampled reward passed 0.37 from ~0.1 at the
warm start), so this measures stability only, and there token-level clipping held best. The
turn losses also clipped more, not less (their clip fraction counts tokens of clipped turns,
PPO's clipped tokens: not the same quantity). A likely reason, not measured directly: in
this task the decision is one character of the call ('calculator' against the misnamed
'calculater') among ~50 copied tokens, so the geometric turn ratio averages that token's
ratio with ~50 near-1 ratios and clips it far later than a per-token ratio does: the worst
case for a turn-level ratio. The paper's agents decide over many tokens per turn (queries,
analyses). Weak evidence either way: 3 seeds, one task, one learning rate (1e-3, 8 updates
per batch), a 2-layer model; all SORL forms are our formalisation (the paper's method section
could not be read).
"""

import functools
import tempfile

import jax
import matplotlib.pyplot as plt
import numpy as np

from experiments import dynamics as studies
from rlreason import config as config_lib
from rlreason.objectives import offpolicy
from rlreason.rl import run_setup
from rlreason.rl import sft
from rlreason.rl import train
from rlreason.rl import update
from rlreason.rl.rl_batch import advantages_for, make_train_batch


def simulate(smoke: bool, *, lr: float = 1e-3, epochs: int = 4, minibatches: int = 2,
             steps: int = 15, seeds: int = 3, sft_steps: int = 300, difficulty: int = 2,
             hidden: int = 48) -> dict:
  """Every method from one warm start, on the same prompts, seeds change the sampling."""
  eps = (('eps_high', 0.2), ('eps_low', 0.2))
  methods = {
      'PPO-clip (token ratios)': ('ppo_clip', eps),
      'SO-GRPO (turn ratios + normalisation)': (
          'sorl', eps + (('normalization', 'reliability'), ('turn_ratio', 'geometric'))),
      'Turn-PPO (turn ratios only)': (
          'sorl', eps + (('normalization', 'none'), ('turn_ratio', 'geometric'))),
  }

  def study_config(smoke: bool):
    """The tool demo's task and teacher (experiments/demo_tools.py), a smaller model."""
    c = config_lib.default()
    # n-digit operands: '<call>calculator: {"expression": "12 * 34"}</call>' is 46 + 2n
    # tokens, the answer turn 14; prompts 33 + 2n characters.
    digits = 2 if smoke else difficulty
    c.data.task, c.data.difficulty = 'calc_multiply', digits
    c.data.prompt_template = '{prompt}\n'
    c.data.prompt_buckets = (33 + 2 * digits,)
    width = 32 if smoke else hidden
    c.model.arch = dict(vocab_size=0, hidden_size=width, intermediate_size=3 * width,
                        num_layers=1 if smoke else 2, num_heads=2 if smoke else 4,
                        num_kv_heads=1 if smoke else 4, head_dim=16 if smoke else width // 4,
                        qkv_bias=False, qk_norm=False, tie_embeddings=False, family='qwen2',
                        rope_theta=10_000.0)
    c.env.update(enabled=True, tools=('calculator',), family='tags', verifier='exact',
                 max_turns=2, max_turn_tokens=48 + 2 * digits, max_observation_tokens=72,
                 transcripts=0, workers=2)
    c.rl.max_new_tokens = 124 + 2 * digits
    c.sft.update(steps=2 if smoke else sft_steps, batch_size=8 if smoke else 32, lr=3e-3,
                 grad_clip=1.0, decay=False, warmup_steps=0,
                 teacher='rlreason.envs.tasks:calculator_trace',
                 teacher_options={'call_prob': 0.3, 'answer_prefix': '#### ', 'spaced': True,
                                  'right_align': True, 'wrong_tool': 'calculater'})
    c.rl.prompts_per_step, c.rl.group_size = (2, 4) if smoke else (8, 8)
    c.rl.epochs, c.rl.minibatches = (2, 1) if smoke else (epochs, minibatches)
    c.optimizer.update(lr=lr, grad_clip=1.0, warmup_steps=0)  # Adam, global-norm clipping
    c.objective.update(advantage='grpo', aggregation='token_mean')
    c.verifier.workers = 2
    c.eval.every, c.eval.num_prompts = 0, 16  # no evaluation: the sampled reward is the curve
    c.checkpoint.every = 0
    c.mesh = dict(data=1, fsdp=1, tensor=1)
    return c

  def rl_curve(run, warm_params, step_fn, prompts, *, seed: int) -> dict:
    """One RL run from the warm start: per step reward, KL to behaviour, clip fraction."""
    rl = run.config.rl
    with jax.set_mesh(run.mesh):  # Laid out as the step's output: one compilation per loss.
      state = jax.jit(run.init_state, out_shardings=run.state_shardings)(warm_params)
    curve = {'reward': [], 'kl_behaviour': [], 'clip_frac': [], 'grad_norm': []}
    for step, examples in enumerate(prompts, start=1):
      with jax.set_mesh(run.mesh):
        rollout, scores = train.sample_episodes(
            run, state.params, examples, jax.random.fold_in(jax.random.key(seed), step),
            step=step, times={})
        batch, stats = make_train_batch(run, state.params, rollout)
        adv_NxL, _ = advantages_for(run, scores, stats, batch, progress=0.0)
        batch = batch.replace(advantages_NxL=adv_NxL)
        clip, norm = [], []
        perm = np.arange(rl.prompts_per_step)
        for epoch in range(rl.epochs):
          perm = np.random.default_rng([seed, step, epoch]).permutation(perm)
          for mb in np.array_split(perm, rl.minibatches):
            rows = (mb[:, None] * rl.group_size + np.arange(rl.group_size)).reshape(-1)
            state, m = step_fn(state, jax.tree.map(lambda x: x[rows], batch))
            clip.append(m['clip_frac'])
            norm.append(m['grad_norm'])
        new_lp = run.logprobs(state.params, batch.tokens_NxT, batch.mask_NxT,
                              batch.loss_mask_NxL.shape[1]).logprobs_NxT
        kl = offpolicy.mismatch_metrics(new_lp, batch.old_logprobs_NxL,
                                        batch.behaviour_logprobs_NxL,
                                        batch.loss_mask_NxL)['offpolicy/kl_k3']
      curve['reward'].append(float(scores.rewards_BxG.mean()))
      curve['kl_behaviour'].append(float(kl))
      curve['clip_frac'].append(float(np.mean(jax.device_get(clip))))
      curve['grad_norm'].append(float(np.max(jax.device_get(norm))))
    return curve

  steps, seeds = (2, 1) if smoke else (steps, seeds)
  c = study_config(smoke)
  rl = c.rl
  config_lib.validate(c, num_devices=jax.device_count())
  run = run_setup.build(c, tempfile.mkdtemp(prefix='sorl_stability_'))
  try:
    with jax.set_mesh(run.mesh):
      warm, _ = sft.sft_loop(run, run.init_state(run.init_params), steps=c.sft.steps)
    warm_params = run.policy(warm.params)
    prompts = [next(run.data_iter) for _ in range(steps)]  # the same for every run
    out = {'methods': {}, 'steps': steps}
    if smoke:  # Each loss is one compilation: the notebook test runs the first two.
      methods = dict(list(methods.items())[:2])
    for name, (loss, kwargs) in methods.items():
      objective = update.Objective(policy_loss=loss, loss_kwargs=kwargs,
                                   aggregation='token_mean', group_size=rl.group_size,
                                   num_turns=c.env.max_turns)
      step_fn = jax.jit(functools.partial(update.train_step, cfg=run.cfg, objective=objective,
                                          optimizer=run.optimizer),
                        out_shardings=(run.state_shardings, None))
      curves = [rl_curve(run, warm_params, step_fn, prompts, seed=s)
                for s in range(seeds)]
      out['methods'][name] = {k: np.array([cv[k] for cv in curves]) for k in curves[0]}
  finally:
    run.close()
  return out


def figure(results: dict):
  """Reward, KL to the behaviour policy and clip fraction per step; one line per seed."""
  fig, axes = plt.subplots(1, 3, figsize=(15, 4))
  colors = plt.get_cmap('tab10')(np.arange(len(results['methods'])))
  x = np.arange(1, results['steps'] + 1)
  for color, (name, run) in zip(colors, results['methods'].items()):
    for s in range(run['reward'].shape[0]):
      label = name if s == 0 else None
      axes[0].plot(x, run['reward'][s], color=color, alpha=0.8, label=label)
      axes[1].plot(x, np.maximum(run['kl_behaviour'][s], 1e-6), color=color, alpha=0.8)
      axes[2].plot(x, run['clip_frac'][s], color=color, alpha=0.8)
  axes[0].set(title='mean episode reward of the sampled batch', xlabel='RL step', ylim=(0, 1.02))
  axes[1].set(title='KL(π_behaviour ‖ π after 8 updates)', xlabel='RL step', yscale='log')
  axes[2].set(title="clip fraction (each loss's own)", xlabel='RL step')
  axes[0].legend(fontsize=8)
  fig.tight_layout()
  return fig


def summary(results: dict) -> str:
  """Per method: final and minimum-after-peak reward over seeds, KL and clip fraction."""
  lines = []
  for name, run in results['methods'].items():
    r = run['reward']
    final = r[:, -3:].mean(-1)
    peak = np.argmax(r, -1)
    drop = np.array([r[s, p] - r[s, p:].min() for s, p in enumerate(peak)])
    lines.append(
        f'{name:40s} final reward {np.median(final):.3f} (seeds {np.round(final, 3).tolist()}),'
        f' largest drop after the peak {drop.max():.3f}, KL to behaviour mean '
        f'{run["kl_behaviour"].mean():.4f} max {run["kl_behaviour"].max():.4f}, clip frac '
        f'{run["clip_frac"].mean():.3f}, max grad norm {run["grad_norm"].max():.2f}')
  return '\n'.join(lines)


def main():
  studies.run_study(__name__, notebook='07_sorl_stability')


if __name__ == '__main__':
  main()
