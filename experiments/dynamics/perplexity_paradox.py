"""Study 20: the perplexity paradox: RL on a spurious (random) reward vs the true reward

Question: RL with a spurious reward (a coin flip, independent of the answer) is reported to
make a model more confident in its own answers (answer-token perplexity falls) while it models
the prompt worse (prompt-token perplexity rises). On the demo's column-addition task, a tiny
model warm-started on the flawed teacher, then trained with GRPO on the verifier's reward or on
a coin flip: does answer perplexity fall and prompt perplexity rise under the random reward,
and in which layers does the change sit?

  python -m experiments.dynamics.perplexity_paradox            # full run, colab/figures/20_*.png
  python -m experiments.dynamics.perplexity_paradox --smoke    # tiny settings
  python -m experiments.dynamics.perplexity_paradox --write_notebook  # colab/20_*.ipynb

Setup: experiments/demo.py's task at difficulty 3 (3-digit column addition; the teacher drops
the carry in 75% of the columns summing to 10-12), 2 layers, d = 64, character tokens. One
warm start (SFT 400 steps, 64 rows, lr 3e-3), then two arms of 30 GRPO steps (16 prompts x
G = 8, PPO-clip, token-mean, lr 2e-4) on the same prompt stream: 'true' is rewarded by the
verifier; 'spurious' by an independent fair coin per completion (the verifier still reports
accuracy). Held-out problems (64): greedy accuracy; the perplexity (analysis/perplexity.py) of
the policy's own greedy answers, of the gold solutions, and of the prompts; after SFT and every
10 steps. At the end, per arm: the logit lens (analysis/logit_lens.py) of the gold sequences'
answer and prompt perplexity per layer, and parameter patching (analysis/patching.py): each
component of the trained params put alone into the warm start, and the share of the
log-perplexity change on the gold answers it reproduces.

Runtime: full run 72 s CPU (+4 s system), 11 min wall at load 20-27 on the shared 2-core
machine (2026-12-02); smoke (the notebook's) 23 s CPU from the command line.

Result: (full run, seed 13, one run; 64 held-out problems)
* The true reward works: greedy accuracy 0.391 after SFT -> 1.000 by step 20. The coin flip
  does damage: 0.391 -> about 0.17 (step 10, read off the figure) -> 0.016 (step 30).
  Random-reward GRPO here is not neutral: the policy drifts away from the warm start's partly
  right answers.
* Answer perplexity does not fall under the spurious reward: the policy's own greedy answers go
  1.025 -> 1.052 (less sure, not more), the gold solutions 1.134 -> 1.768; under the true
  reward 1.025 -> 1.021 and 1.134 -> 1.021. So the paradox's first half does not show at this
  scale; the opposite does.
* Prompt perplexity is not a meaningful measurement here: the warm start never trains on prompt
  tokens (SFT masks them, RL trains completions only), so it is ~15,000 (worse than uniform over
  the character vocabulary) from the start; it moves 15355 -> 14344 (spurious) and -> 15219
  (true), i.e. it falls, not rises. The paper's setting is a pretrained LM that models prompts;
  this tiny model does not, so this half is untested rather than refuted.
* Where the change sits: the logit lens of the gold answers moves at the last residual only
  under the spurious reward (answer ppl per residual 6.80, 3.84, 1.13 -> 6.83, 3.83, 1.77),
  while the true reward also sharpens the middle one (3.84 -> 3.58). Parameter patching: block
  0 alone reproduces 54% of the spurious arm's log answer-perplexity change (block 1, head and
  norms ~0); for the true reward block 0 58%, block 1 43%, head 38% (the shares do not add up
  to 1: the components interact). So the spurious reward's damage sits mostly in the first
  block's weights, read out through the unchanged second block.
* One seed, one run, 64 problems: the direction of each effect is clear (accuracy 1.0 vs 0.016)
  but the patching shares are a single measurement.
"""

import tempfile

import jax
import jax.numpy as jnp
import matplotlib.pyplot as plt
import numpy as np

from experiments import dynamics as studies
from rlreason import config as config_lib
from rlreason.analysis import logit_lens
from rlreason.analysis import patching
from rlreason.analysis import perplexity
from rlreason.rl import prompt_schedule
from rlreason.rl import rl_batch
from rlreason.rl import run_setup
from rlreason.rl import sft
from rlreason.rl import train
from rlreason.rollout import sampler
from rlreason.tasks import data

NOTEBOOK = '20_perplexity_paradox'


def make_config(smoke: bool):
  """experiments/demo.py's task and recipe, smaller (module docstring); seconds-long if
  `smoke`. Written out rather than imported: the notebook uses the public API only."""
  c = config_lib.default()
  c.seed = 13
  c.data.update(task='arithmetic', difficulty=3, prompt_buckets=(12,),
                task_options={'layout': 'columns', 'final_answer': False})
  c.model.arch = dict(vocab_size=0, hidden_size=64, intermediate_size=192, num_layers=2,
                      num_heads=4, num_kv_heads=4, head_dim=16, qkv_bias=False, qk_norm=False,
                      tie_embeddings=False, family='qwen2', rope_theta=10_000.0)
  c.tokenizer.kind = 'chars'
  c.sft.update(grad_clip=1.0, decay=False, teacher='rlreason.tasks.arithmetic:flawed_solution',
               teacher_options={'drop_carry_prob': 0.75})
  c.rl.temperature = 1.0
  c.objective.update(advantage='grpo', policy_loss='ppo_clip', aggregation='token_mean')
  c.optimizer.grad_clip = 1.0
  c.verifier.update(name='rlreason.tasks.arithmetic:verify_carry_chain', deadline_s=30.0,
                    workers=1)
  c.mesh = dict(data=1, fsdp=-1, tensor=1)
  c.sft.update(steps=400, batch_size=64, lr=3e-3, warmup_steps=20)
  c.rl.update(steps=30, prompts_per_step=16, group_size=8, max_new_tokens=12)
  c.optimizer.lr = 2e-4
  c.eval.update(every=10, num_prompts=64)
  c.checkpoint.every = 0
  if smoke:
    c.data.difficulty = 2
    c.data.prompt_buckets = (8,)
    c.model.arch.update(hidden_size=32, intermediate_size=64, num_layers=1, num_heads=2,
                        num_kv_heads=1)
    c.sft.update(steps=2, batch_size=8)
    c.rl.update(steps=1, prompts_per_step=2, group_size=4, max_new_tokens=8)
    c.eval.update(every=1, num_prompts=4)
  return c


def coin_flip_rewards(run, seed: int):
  """Wraps run.pool.score so each verdict's reward is a fair coin (its status, and so the
  logged accuracy, stay the verifier's)."""
  import dataclasses
  score, rng = run.pool.score, np.random.default_rng(seed)

  def spurious(items, **kw):
    return [dataclasses.replace(v, reward=float(rng.random() < 0.5)) for v in score(items, **kw)]
  return score, spurious


def gold_sequences(run, examples, length: int):
  """Prompt + gold solution (+ EOS) per example, the completion right-padded to `length`."""
  prompts = run_setup.encode_prompts(run, examples)
  eos = run.tok.eos_id
  rows = [run.tok.encode(ex.solution)[:length - 1] + [eos] for ex in examples]
  tokens_NxL = np.full((len(rows), length), run.pad_id, np.int32)
  for n, row in enumerate(rows):
    tokens_NxL[n, :len(row)] = row
  mask_NxL = np.arange(length)[None] < np.array([len(r) for r in rows])[:, None]
  return (jnp.concatenate([prompts.tokens_BxP, jnp.asarray(tokens_NxL)], 1),
          jnp.concatenate([prompts.mask_BxP, jnp.asarray(mask_NxL)], 1))


def evaluate(run, params, rng) -> dict:
  """Greedy accuracy and the prompt / own-answer / gold-answer perplexities on the held-out
  problems, plus the sequences they were measured on."""
  c, examples = run.config, run.eval_examples
  length = c.rl.max_new_tokens
  with jax.set_mesh(run.mesh):
    rollout = sampler.generate(
        params, run_setup.encode_prompts(run, examples), cfg=run.cfg, group_size=1,
        max_new_tokens=length, temperature=0.0, stop_tokens=tuple(run.tok.eos_ids),
        pad_id=run.pad_id, rng=rng, mesh=run.mesh, max_chunks=c.rl.decode_chunks)
    _, verdicts = rl_batch.verify(run, rollout, examples, progress=1.0, return_verdicts=True)
    own = perplexity.batch_metrics(params, *sampler.sequences(rollout), cfg=run.cfg,
                                   completion_length=length)
    gold_seq = gold_sequences(run, examples, length)
    gold = perplexity.batch_metrics(params, *gold_seq, cfg=run.cfg, completion_length=length)
  return {'accuracy': float(np.mean([v.status == 'correct' for v in verdicts])),
          'own_answer_ppl': float(own['perplexity/answer']),
          'gold_answer_ppl': float(gold['perplexity/answer']),
          'prompt_ppl': float(gold['perplexity/prompt']), 'gold_seq': gold_seq}


def layer_analysis(run, warm, trained, gold_seq) -> dict:
  """Logit lens per layer (gold answer and prompt perplexity) of both params, and each
  component of `trained` patched alone into `warm`: its share of the log answer-perplexity
  change on the gold sequences."""
  tokens_NxT, mask_NxT = gold_seq
  length = run.config.rl.max_new_tokens
  lens = {}
  for name, params in (('warm', warm), ('trained', trained)):
    lp_KxNxT = logit_lens.lens_logprobs(params, tokens_NxT, cfg=run.cfg, mask_NxT=mask_NxT)
    split = [perplexity.split_perplexity(lp, mask_NxT, completion_length=length)
             for lp in lp_KxNxT]
    lens[name] = {k: [float(s[k]) for s in split] for k in ('answer', 'prompt')}
  ppl = lambda p: perplexity.batch_metrics(p, tokens_NxT, mask_NxT, cfg=run.cfg,
                                           completion_length=length)['perplexity/answer']
  base, full = np.log(float(ppl(warm))), np.log(float(ppl(trained)))
  shares = {}
  for comp in patching.components(run.cfg):
    hybrid = patching.patch_params(warm, trained, (comp,))
    change = np.log(float(ppl(hybrid))) - base
    shares[comp] = float(change / (full - base)) if abs(full - base) > 1e-9 else 0.0
  return {'lens': lens, 'patch_share': shares}


def simulate(smoke: bool) -> dict:
  """One warm start, then each arm from a copy of it on the same prompt stream."""
  c = make_config(smoke)
  run = run_setup.build(c, tempfile.mkdtemp(prefix='ppl_paradox_'))
  state, _ = run.restore_or_init()  # The workdir is empty: a fresh initialisation.
  with jax.set_mesh(run.mesh):
    state, _ = sft.sft_loop(run, state, steps=c.sft.steps)
  warm_state = jax.tree.map(jnp.copy, state)  # train_step donates its input state.
  eval_rng, results = jax.random.key(1234), {}
  warm_eval = evaluate(run, run.policy(warm_state.params), eval_rng)
  verifier_score, spurious_score = coin_flip_rewards(run, seed=c.seed)
  for arm in ('true', 'spurious'):
    run.pool.score = spurious_score if arm == 'spurious' else verifier_score
    run.data_iter = prompt_schedule.UniformSchedule(iter(data.batched(data.synthetic_stream(
        c.data.task, seed=c.seed, difficulty=c.data.difficulty,
        options=dict(c.data.task_options), held_out_fraction=c.data.held_out_fraction),
        c.rl.prompts_per_step)))
    state = jax.tree.map(jnp.copy, warm_state)
    curve = [(0, warm_eval)]
    for step in range(1, c.rl.steps + 1):
      with jax.set_mesh(run.mesh):
        state, _ = train.rl_step(run, state, step, {})
      if step % c.eval.every == 0 or step == c.rl.steps:
        curve.append((step, evaluate(run, run.policy(state.params), eval_rng)))
    with jax.set_mesh(run.mesh):
      layers = layer_analysis(run, run.policy(warm_state.params), run.policy(state.params),
                              warm_eval['gold_seq'])
    results[arm] = {'curve': [(s, {k: v for k, v in m.items() if k != 'gold_seq'})
                              for s, m in curve], 'layers': layers}
  run.pool.score = verifier_score
  run.close()
  return results


def figure(results):
  fig, axes = plt.subplots(1, 4, figsize=(15, 3.3))
  for arm, r in results.items():
    steps = [s for s, _ in r['curve']]
    for ax, key in zip(axes[:3], ('accuracy', 'own_answer_ppl', 'prompt_ppl')):
      ax.plot(steps, [m[key] for _, m in r['curve']], marker='o', label=arm)
    shares = r['layers']['patch_share']
    x = np.arange(len(shares)) + (0.2 if arm == 'spurious' else -0.2)
    axes[3].bar(x, list(shares.values()), width=0.4, label=arm)
    axes[3].set_xticks(np.arange(len(shares)), list(shares), rotation=45, fontsize=7)
  for ax, title in zip(axes, ('held-out greedy accuracy', 'own-answer perplexity',
                              'prompt perplexity', 'share of answer log-ppl change')):
    ax.set_title(title)
  for ax in axes[:3]:
    ax.set_xlabel('GRPO step (0 = after SFT)')
  axes[0].legend()
  fig.tight_layout()
  return fig


def summary(results) -> str:
  lines = []
  for arm, r in results.items():
    first, last = r['curve'][0][1], r['curve'][-1][1]
    lines.append(f'{arm:9s} accuracy {first["accuracy"]:.3f} -> {last["accuracy"]:.3f}, '
                 f'own-answer ppl {first["own_answer_ppl"]:.3f} -> {last["own_answer_ppl"]:.3f}, '
                 f'gold-answer ppl {first["gold_answer_ppl"]:.3f} -> '
                 f'{last["gold_answer_ppl"]:.3f}, prompt ppl {first["prompt_ppl"]:.2f} -> '
                 f'{last["prompt_ppl"]:.2f}')
    lens = r['layers']['lens']
    lines.append('  lens answer ppl per residual (warm -> trained): ' + ', '.join(
        f'{a:.2f}->{b:.2f}' for a, b in zip(lens['warm']['answer'], lens['trained']['answer'])))
    lines.append('  patch share of the answer log-ppl change: ' + ', '.join(
        f'{k} {v:+.2f}' for k, v in r['layers']['patch_share'].items()))
  return '\n'.join(lines)


def main():
  studies.run_study(__name__, notebook=NOTEBOOK, before=('make_config', 'coin_flip_rewards',
                                                         'gold_sequences', 'evaluate',
                                                         'layer_analysis'))


if __name__ == '__main__':
  main()
