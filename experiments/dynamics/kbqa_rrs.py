"""Study 11: KBQA-R1's cold start by Referenced Rejection Sampling vs unfiltered traces

Question: KBQA-R1 (arXiv 2512.10999) says Referenced Rejection Sampling (RRS), which keeps
only cold-start traces whose executed actions match the ground-truth action sequence,
"resolves cold-start challenges" before GRPO on execution feedback. On kb_qa episodes with a
tiny model from scratch, does an RRS cold start beat SFT on unfiltered teacher traces (and on
traces filtered by their final answer only) in accuracy and in action-sequence validity, right
after SFT and after the same GRPO steps?

  python -m experiments.dynamics.kbqa_rrs            # full run, colab/figures/11_*.png
  python -m experiments.dynamics.kbqa_rrs --smoke    # seconds
  python -m experiments.dynamics.kbqa_rrs --write_notebook   # colab/11_kbqa_rrs.ipynb

Runtime: smoke ~20 s of CPU (its compilations); the full setting is estimated at >= 25 min of
CPU (SFT ~0.4 CPU-s a step at 32 x 489 tokens) and was not run: see Result.

Setup: experiments/kbqa_r1.py's settings (make_config pins them; tests/kbqa_r1_test.py checks
the two agree): kb_qa at difficulty 1, the kb tool in the 'tags' format, a character-level
2-layer d=64 model from scratch, one initialisation for all three arms. The teacher
(envs/kb_traces.py) follows the gold actions in 30% of its traces and otherwise a plausible
wrong procedure that is right by luck about a third of the time. Cold start: 500 SFT steps of
32 sequences on its traces, kept by 'unfiltered' (the first trace), 'answer' (the first of up
to 4 with a correct final answer) or 'rrs' (the first of up to 4 whose executed action
sequence is the gold one, no failed call, correct answer: methods/rejection_sampling.py). Then the
same GRPO for each: 30 steps of 16 prompts x 8 episodes, PPO-clip, token-mean, lr 5e-4,
reward = exact answer - 0.1 per failed call, on the same prompt stream. Evaluation on the
same 64 held-out problems x 8 episodes at T = 1 (the policy GRPO samples from), at RL steps
0 (after SFT), 10, 20, 30: accuracy (correct final answer), action validity (executed actions
= gold, no failed call) and "right answer by a wrong path" (correct, not valid).

Result: (2026-12-02; the full setting was NOT run, see the last point)
* Cold-start data (exact: 400 problems of the SFT stream, the teacher at gold_prob 0.3, 4
  tries): 'unfiltered' trains on every problem, but only 26% of its traces execute the gold
  actions and 37% are right by a wrong path (64% right in all); 'answer' keeps 346/400
  problems (722 traces sampled), of which 58% are gold and 42% right by a wrong path; 'rrs'
  keeps 291/400 problems (1032 traces sampled), all gold. Only RRS removes the procedures
  that are right by luck: the data-level half of the claim, true by construction here.
* Training, a reduced run (SFT only, the full model and data; 32 held-out problems x 8
  episodes at T = 1): on RRS data (75.9% of problems kept, 48652 traces sampled for 19200
  problems) accuracy 0.004 / 0.000 and validity 0.000 / 0.000 after 300 / 600 steps (SFT
  loss 0.186 per token); on unfiltered data accuracy 0.004 / 0.004 and validity 0.000 /
  0.000 after 150 / 300 steps (loss 0.179).
  The model had learned neither cold start's task, so the comparison is at zero.
* So whether an RRS cold start beats an unfiltered one after SFT and after GRPO is NOT
  measured at this scale. The full setting (3 x 500 SFT + 30 GRPO steps) needs >= 25 min of
  CPU, and the shared 2-core machine ran at load 20-28 during this session (one process got
  ~15% of a core: 300 SFT steps took 24 min of wall time). A from-scratch character model may
  also need far more than 500 SFT steps to copy entity names from prompt and observations
  (the calculator demo needed 800 for one copy).
"""

import tempfile

import jax
import jax.numpy as jnp
import matplotlib.pyplot as plt
import numpy as np

from experiments import dynamics as studies
from rlreason import config as config_lib
from rlreason.methods import rejection_sampling
from rlreason.rl import prompt_schedule
from rlreason.rl import run_setup
from rlreason.rl import sft
from rlreason.rl import train
from rlreason.rollout import episodes as episodes_lib
from rlreason.tasks import data

NOTEBOOK = '11_kbqa_rrs'


def make_config(smoke: bool):
  """experiments/kbqa_r1.py's settings ('rrs'), shrunk to seconds when `smoke`."""
  c = config_lib.default()
  c.data.update(task='kb_qa', difficulty=1, prompt_template='{prompt}\n', prompt_buckets=(88,))
  c.model.arch = dict(vocab_size=0, hidden_size=64, intermediate_size=192, num_layers=2,
                      num_heads=4, num_kv_heads=4, head_dim=16, qkv_bias=False, qk_norm=False,
                      tie_embeddings=False, family='qwen2', rope_theta=10_000.0)
  c.tokenizer.kind = 'chars'
  c.env.update(enabled=True, tools=('kb',), family='tags', verifier='exact', max_turns=4,
               max_turn_tokens=104, max_observation_tokens=60, error_penalty=0.1, workers=4)
  c.rl.update(max_new_tokens=400, steps=30, prompts_per_step=16, group_size=8,
              temperature=1.0)
  c.sft.update(steps=500, batch_size=32, lr=3e-3, grad_clip=1.0, decay=False,
               teacher='rlreason.envs.kb_traces:kb_trace',
               teacher_options={'gold_prob': 0.3, 'answer_prefix': '#### '},
               filter='rrs', filter_tries=4)
  c.objective.update(advantage='grpo', policy_loss='ppo_clip', aggregation='token_mean')
  c.optimizer.update(lr=5e-4, grad_clip=1.0)
  c.verifier.workers = 2
  c.eval.update(every=0, num_prompts=64)  # The study evaluates; the loop writes nothing.
  c.checkpoint.every = 0
  c.mesh = dict(data=1, fsdp=1, tensor=1)
  if smoke:
    c.model.arch.update(hidden_size=32, intermediate_size=64, num_layers=1, num_heads=2,
                        num_kv_heads=1, head_dim=16)
    c.env.update(max_turn_tokens=24, max_observation_tokens=12)
    c.rl.update(max_new_tokens=48, steps=1, prompts_per_step=2, group_size=2)
    c.sft.update(steps=1, batch_size=4)
    c.eval.num_prompts = 2
  return c


def evaluate(run, params, examples, rng) -> dict[str, float]:
  """Accuracy, action validity and right-by-a-wrong-path rate of G episodes at T = 1 per
  held-out problem, in batches of the training shape (no new compilation)."""
  b, g = run.config.rl.prompts_per_step, run.config.rl.group_size
  correct, valid = [], []
  for start in range(0, len(examples), b):
    part = examples[start:start + b]
    episodes = train.run_episodes(run, params, part, jax.random.fold_in(rng, start),
                                  group_size=g, temperature=1.0)
    correct.append(episodes_lib.correct_N(episodes))
    valid.append(rejection_sampling.action_match_N(
        run.env, part, rejection_sampling.episode_turns(episodes), group_size=g))
  correct, valid = np.concatenate(correct), np.concatenate(valid)
  return {'accuracy': float(correct.mean()), 'valid': float(valid.mean()),
          'lucky': float((correct & ~valid).mean())}


def simulate(smoke: bool, sources=('unfiltered', 'answer', 'rrs')) -> dict:
  """The three cold starts from one initialisation, each followed by the same GRPO."""
  config = make_config(smoke)
  run = run_setup.build(config, tempfile.mkdtemp(prefix='kbqa_rrs_'))
  state0, _ = run.restore_or_init()
  teacher = sft.teacher_fn(config.sft.teacher, config.sft.teacher_options)
  eval_rng = jax.random.key(1234)
  every = max(config.rl.steps // 3, 1)
  out = {'rl_steps': config.rl.steps, 'sources': {}}
  for source in sources:
    # The same prompt stream for every arm's GRPO (a fresh uniform schedule).
    run.data_iter = prompt_schedule.UniformSchedule(iter(data.batched(data.synthetic_stream(
        config.data.task, seed=config.seed, difficulty=config.data.difficulty,
        held_out_fraction=config.data.held_out_fraction), config.rl.prompts_per_step)))
    filtered = rejection_sampling.FilteredTeacher(run.env, teacher, rule=source,
                                                  tries=config.sft.filter_tries)
    with jax.set_mesh(run.mesh):
      state, sft_metrics = sft.sft_loop(run, jax.tree.map(jnp.copy, state0),
                                        steps=config.sft.steps, solutions=filtered)
      curve = [(0, evaluate(run, state.params, run.eval_examples, eval_rng))]
      rewards = []
      for step in range(1, config.rl.steps + 1):
        state, metrics = train.rl_step(run, state, step, {})
        rewards.append(float(metrics['train/reward']))
        if step % every == 0 or step == config.rl.steps:
          curve.append((step, evaluate(run, state.params, run.eval_examples, eval_rng)))
    out['sources'][source] = {
        'curve': curve, 'train_reward': rewards, 'counts': dict(filtered.counts),
        'sft': {**filtered.metrics(), 'loss': float(sft_metrics.get('sft/loss', np.nan))}}
  run.close()
  return out


def figure(results: dict):
  """Accuracy, action validity and right-by-a-wrong-path rate against GRPO steps."""
  fig, axes = plt.subplots(1, 3, figsize=(15, 4.2))
  titles = {'accuracy': 'accuracy (T = 1, held out)', 'valid': 'action sequence = gold',
            'lucky': 'right answer by a wrong path'}
  for ax, (key, title) in zip(axes, titles.items()):
    for source, run in results['sources'].items():
      steps = [s for s, _ in run['curve']]
      ax.plot(steps, [m[key] for _, m in run['curve']], 'o-', label=f'cold start: {source}')
    ax.set(title=title, xlabel='GRPO steps after the SFT cold start', ylim=(-0.02, 1.02))
    ax.grid(alpha=0.3)
  axes[0].legend()
  fig.tight_layout()
  return fig


def summary(results: dict) -> str:
  """Per source: its SFT data, then accuracy / validity / lucky after SFT and after GRPO."""
  lines = []
  for source, run in results['sources'].items():
    (_, first), (last_step, last) = run['curve'][0], run['curve'][-1]
    c = run['counts']
    data_line = (f"{c['problems_kept']}/{c['problems']} problems kept, "
                 f"{c['traces']} traces sampled" if source != 'unfiltered'
                 else f"{c['problems']} problems, every first trace")
    lines.append(
        f"{source}: SFT data {data_line}; after SFT accuracy {first['accuracy']:.3f}, valid "
        f"{first['valid']:.3f}, lucky {first['lucky']:.3f}; after {last_step} GRPO steps "
        f"accuracy {last['accuracy']:.3f}, valid {last['valid']:.3f}, lucky "
        f"{last['lucky']:.3f}")
  final = {s: r['curve'][-1][1]['accuracy'] for s, r in results['sources'].items()}
  lines.append(f"rrs_minus_unfiltered_final_accuracy={final['rrs'] - final['unfiltered']:+.3f}")
  return '\n'.join(lines)


def main():
  studies.run_study(__name__, notebook=NOTEBOOK, before=('make_config', 'evaluate'))


if __name__ == '__main__':
  main()
