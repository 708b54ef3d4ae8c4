"""Held-out evaluation: pass@k (unbiased), mean@k and majority vote over k samples.

  python -m rlreason.rl.evaluate --workdir DIR [--config experiments/demo.py] [--step N] [--k 8]
      [--temperature 1.0] [--output FILE] [--export HF_DIR]

restores the newest (or step N's) checkpoint in DIR, samples k completions per held-out
prompt of the config, prints `pass@1=... pass@k=... mean@k=... maj@k=...`, and writes them
with the step and settings to FILE (default DIR/eval/step_<N>.json); `--export` also writes
the policy as a Hugging Face directory. `--pot [--pot_steps 6 --pot_candidates 8 --pot_rank 4
--pot_lr 3e-3]` also runs PoT (methods/pot.py: test-time GRPO on a transient LoRA adapter per
problem) on the same held-out prompts and adds greedy pass@1 with and without it
(`pot_pass_at_1=`, `base_pass_at_1=` lines; "pot" in the JSON). From Python,
`evaluate(run, params, ...)` does the sampling (the product's sampler) and scoring (the
configured verifier pool) and returns the metrics; `summarize` is the pure part.

pass@k uses the unbiased estimator of Chen et al. 2021 (arXiv 2107.03374): with n samples
of which c are correct, pass@k = 1 - C(n - c, k) / C(n, k), averaged over prompts. The
majority vote is over each sample's final answer (`answer_key`). `eval.diversity` (or the
`diversity` argument) spreads the k samples over a schedule of structural hints, paraphrases
or irrelevant comments instead of i.i.d. (methods/diversity.py). A method may sample the
evaluation itself (its `eval_verdicts`, rl/extensions.py): with threads.enabled each sample
is a fork/join episode (methods/threads.py, as training samples them) judged on its parent's
text, and the metrics add its critical path, sampled tokens and spawn rate.

Deliberately not here: the verifiers themselves, the training loop.
"""

from collections import Counter
from collections.abc import Sequence
import json
import math

import numpy as np

from rlreason import workdir_paths
from rlreason.verifiers import answer_extraction


def pass_at_k(num_samples: int, num_correct: int, k: int) -> float:
  """1 - C(n-c, k) / C(n, k), computed as a stable product (no huge binomials)."""
  n, c = num_samples, num_correct
  if k > n:
    raise ValueError(f'pass@k needs k <= samples per prompt, got k={k} with n={n}.')
  if n - c < k:
    return 1.0
  # C(n-c, k) / C(n, k) = prod_{i=n-c+1}^{n} (1 - k / i)
  return float(1.0 - np.prod(1.0 - k / np.arange(n - c + 1, n + 1)))


def summarize(correct_BxK: np.ndarray, *,
              answers_BxK: Sequence[Sequence[str | None]] | None = None,
              ks: Sequence[int] = (1,)) -> dict[str, float]:
  """pass@k for each k, mean@k (mean correctness), and majority-vote accuracy.

  Args:
    correct_BxK: whether sample k of prompt b was judged correct.
    answers_BxK: the extracted final answers (None when unparseable), for majority vote:
      the vote is correct when the most frequent parsed answer (ties: first seen) was judged
      correct, so no second comparison with gold is needed.
    ks: the k values for pass@k.
  """
  correct_BxK = np.asarray(correct_BxK, bool)
  b, n = correct_BxK.shape
  out = {f'pass@{k}': float(np.mean([pass_at_k(n, int(c), k) for c in correct_BxK.sum(1)]))
         for k in ks if k <= n}
  out[f'mean@{n}'] = float(correct_BxK.mean()) if b else math.nan
  if answers_BxK is not None:
    votes = []
    for row_answers, row_correct in zip(answers_BxK, correct_BxK):
      parsed = [a for a in row_answers if a is not None]
      if not parsed:
        votes.append(False)
        continue
      top = Counter(parsed).most_common(1)[0][0]
      votes.append(bool(row_correct[list(row_answers).index(top)]))
    out[f'maj@{n}'] = float(np.mean(votes))
  return out


def answer_key(text: str) -> str | None:
  """What a sample votes for: its extracted final answer (####, boxed, <answer>, "answer
  is"), else the whole stripped completion (tasks whose completion is the answer); None if
  empty."""
  answer, _ = answer_extraction.final_answer(text)
  key = (answer if answer is not None else text).strip()
  return key or None


def sample_verdicts(run, params, *, k: int, temperature: float, rng, on_episodes=None,
                    diversity: str | None = None):
  """k samples per held-out prompt, judged: (correct_BxK, answers_BxK or None, tokens).

  Chunks of run.eval_chunk prompts (the last one padded: one shape, one compilation), each
  sampled with the same key. Answers are None on more than one process (each host decodes
  only its rows), so majority vote is then left out. With run.env, each sample is an episode
  judged by the environment's verifier, and `on_episodes(episodes, examples)` sees the first
  chunk's. `diversity` (default eval.diversity): 'iid', or methods/diversity.py's schedules.
  """
  diversity = diversity or run.config.eval.get('diversity', 'iid')
  method = _method_verdicts(run, params, k=k, temperature=temperature, rng=rng,
                            diversity=diversity)
  if method is not None:
    return method[:3]
  if diversity != 'iid':
    raise ValueError(f'eval.diversity={diversity!r}: no method of this run samples it (the '
                     "structured-diversity method's modes need methods/diversity.py).")
  import jax
  from rlreason.rl.rl_batch import decode_completions, verify
  from rlreason.rl.run_setup import encode_prompts
  from rlreason.rollout import sampler
  examples, chunk = run.eval_examples, run.eval_chunk
  correct, answers, tokens = [], [], 0
  for start in range(0, len(examples), chunk):
    part = examples[start:start + chunk]
    padded = part + [part[-1]] * (chunk - len(part))
    if run.env is not None:
      ok_BxK, keys, n_tokens = _episode_verdicts(run, params, padded, k, temperature, rng,
                                                 on_episodes if start == 0 else None)
      correct.append(ok_BxK[:len(part)])
      answers += [keys[b * k:(b + 1) * k] for b in range(len(part))]
      tokens += n_tokens
      continue
    rollout = sampler.generate(
        params, encode_prompts(run, padded), cfg=run.cfg, group_size=k,
        max_new_tokens=run.config.rl.max_new_tokens, temperature=temperature,
        stop_tokens=tuple(run.tok.eos_ids), pad_id=run.pad_id, rng=rng, mesh=run.mesh,
        max_chunks=run.config.rl.decode_chunks)
    _, verdicts = verify(run, rollout, padded, progress=1.0, return_verdicts=True)
    ok_BxK = np.array([v.status == 'correct' for v in verdicts]).reshape(chunk, k)
    correct.append(ok_BxK[:len(part)])
    if jax.process_count() == 1:
      keys = [answer_key(t) for t in decode_completions(run, rollout)]
      answers += [keys[b * k:(b + 1) * k] for b in range(len(part))]
    tokens += int(rollout.lengths_N[:len(part) * k].sum())  # Rows are prompt-major.
  return (np.concatenate(correct), answers if jax.process_count() == 1 else None, tokens)


def _episode_verdicts(run, params, examples, k, temperature, rng, on_episodes):
  """(correct_BxK, answer keys per episode, sampled tokens) of k episodes per example."""
  from rlreason.rl.episode_sampling import run_episodes
  from rlreason.rollout import episodes as episodes_lib
  episodes = run_episodes(run, params, examples, rng, group_size=k, temperature=temperature)
  if on_episodes is not None:
    on_episodes(episodes, examples)
  ok_BxK = episodes_lib.correct_N(episodes).reshape(len(examples), k)
  keys = [answer_key(t[-1]['text']) if t else None for t in episodes.transcripts]
  rows = len(examples) * k * getattr(episodes, 'turn_rows', 1)  # typed states: a row per turn
  return ok_BxK, keys, int(np.asarray(episodes.rollout.loss_mask_NxL)[:rows].sum())


def _method_verdicts(run, params, *, k: int, temperature: float, rng, diversity: str):
  """The first method's `eval_verdicts` that samples this evaluation (threads' fork/join
  episodes, diversity's schedules): (correct_BxK, answers_BxK, tokens, stats), or None."""
  from rlreason.rl import extensions
  methods = getattr(run, 'methods', None)
  if methods is None:  # A run put together by hand (not run_setup.build): its methods now.
    methods = extensions.build_methods(run)
  for method in methods.values():
    if not hasattr(method, 'eval_verdicts'):
      continue
    out = method.eval_verdicts(run, params, k=k, temperature=temperature, rng=rng,
                               diversity=diversity)
    if out is not None:
      return out
  return None


def evaluate(run, params, *, k: int, temperature: float, rng, on_episodes=None,
             diversity: str | None = None) -> dict[str, float]:
  """pass@1, pass@k, mean@k, maj@k on run.eval_examples, and the tokens generated (with a
  method that samples evaluation itself, its metrics too: threads' longest_path_mean,
  total_tokens_mean, spawned_frac)."""
  diversity = diversity or run.config.eval.get('diversity', 'iid')
  out = _method_verdicts(run, params, k=k, temperature=temperature, rng=rng,
                         diversity=diversity)
  if out is not None:
    correct_BxK, answers_BxK, tokens, stats = out
  else:
    stats = {}
    correct_BxK, answers_BxK, tokens = sample_verdicts(run, params, k=k, temperature=temperature,
                                                       rng=rng, on_episodes=on_episodes,
                                                       diversity=diversity)
  out = summarize(correct_BxK, answers_BxK=answers_BxK, ks=sorted({1, k}))
  out['generated_tokens'] = float(tokens)
  return {**out, **stats}


def evaluate_policy(run, params, rng, *, step: int = 0) -> dict[str, float]:
  """Greedy (or eval.temperature) pass@1 / pass@k / mean@k / maj@k on the held-out prompts
  (with env.enabled: episodes, whose first chunk's transcripts are written)."""
  import jax
  from rlreason.rl import episode_sampling
  on_episodes = None
  if run.env is not None and jax.process_index() == 0:
    on_episodes = lambda ep, ex: episode_sampling.write_transcripts(run, ep, ex, step=step,
                                                                    kind='eval')
  summary = evaluate(run, params, k=run.config.eval.k, temperature=run.config.eval.temperature,
                     rng=rng, on_episodes=on_episodes)
  tokens = summary.pop('generated_tokens')
  return {**{f'eval/{k}': v for k, v in summary.items()}, 'tokens/eval': tokens}


def restore_params(run, *, step: int | None = None, from_best: bool = False):
  """(step, params) of the newest (or `step`'s, or the best) checkpoint of run.workdir: the
  TrainState's params (under LoRA the adapter; `run.policy` gives the model's)."""
  import jax
  abstract = jax.eval_shape(run.init_state, run.init_params)
  abstract = jax.tree.map(lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s),
                          abstract, run.state_shardings)
  restored = run.checkpointer.restore(abstract, step=step, from_best=from_best)
  if restored is None:
    raise FileNotFoundError(f'no checkpoint in {run.workdir / "checkpoints"} to evaluate.')
  return restored[0], restored[1].params


def workdir_config(workdir):
  """The config a workdir's checkpoints were made with (its config.json), as a ConfigDict;
  JSON lists become the tuples the defaults hold."""
  import ml_collections
  from rlreason import config as config_lib
  path = workdir_paths.check(workdir) / 'config.json'
  if not path.is_file():
    raise FileNotFoundError(f'{path} does not exist: pass --config (the run\'s experiment '
                            'config), or a workdir that a run has started in.')
  saved = json.loads(path.read_text())['config']
  defaults = config_lib.default().to_dict()

  def typed(value, default):
    if isinstance(value, dict):
      return {k: typed(v, default.get(k) if isinstance(default, dict) else None)
              for k, v in value.items()}
    return tuple(value) if isinstance(value, list) and isinstance(default, tuple) else value
  return ml_collections.ConfigDict(typed(saved, defaults))


def evaluate_checkpoint(config, workdir, *, step: int | None = None, from_best: bool = False,
                        k: int = 0, temperature: float | None = None, output: str = '',
                        export: str = '', pot_options: dict | None = None) -> dict:
  """The command line's work: restore, evaluate, write the JSON (and export); returns it.

  pot_options (steps, candidates, rank, lr): also PoT on the same prompts (methods/pot.py)."""
  import jax
  from rlreason import config as config_lib
  from rlreason.rl import extensions
  from rlreason.rl import run_setup
  pot = extensions.module('pot')  # The command line's --pot (methods/pot.py).
  if pot_options is not None:
    pot.check_options(**pot_options)  # Before the (slow) build: bad flags fail at once.
  workdir = workdir_paths.check(workdir)
  config_lib.validate(config, num_devices=jax.device_count())
  k = k or config.eval.k
  temperature = config.eval.temperature if temperature is None else temperature
  run = run_setup.build(config, workdir)
  try:
    step, params = restore_params(run, step=step, from_best=from_best)
    with jax.set_mesh(run.mesh):  # The params as the loop evaluates them (train shardings).
      metrics = evaluate(run, run.policy(params), k=k, temperature=temperature,
                         rng=run.eval_rng)
    pot_metrics = None
    if pot_options is not None:
      pot_metrics = pot.solve(run, run.policy(params), run.eval_examples,
                              rng=jax.random.fold_in(run.eval_rng, 1), **pot_options).metrics()
    if export:
      run_setup.export_policy(run, params, export, dtype=config.export.dtype)
  finally:
    run.close()
  result = {'step': step, 'k': k, 'temperature': temperature,
            'num_prompts': len(run.eval_examples), 'metrics': metrics}
  if pot_metrics is not None:
    result['pot'] = {**pot_options, 'metrics': pot_metrics}
  output = workdir_paths.as_path(output or workdir / 'eval' / f'step_{step}.json')
  if jax.process_index() == 0:
    workdir_paths.write_atomic(output, json.dumps(result, indent=2) + '\n')
  print(f'step={step} ' + ' '.join(f'{name}={v:.4f}' for name, v in metrics.items()))
  if pot_metrics is not None:  # Greedy, both on the same prompts: PoT's answer and the base's.
    print(f'pot_pass_at_1={pot_metrics["pot/pass@1"]:.4f}')
    print(f'base_pass_at_1={pot_metrics["pot/base_pass@1"]:.4f}')
    print(f'pot_any_candidate={pot_metrics["pot/any_candidate"]:.4f}')
  print(f'wrote {output}')
  return result


if __name__ == '__main__':
  from absl import app
  from absl import flags
  from absl import logging as absl_logging
  from ml_collections import config_flags
  from rlreason import platforms
  platforms.default_to_cpu()
  _CONFIG = config_flags.DEFINE_config_file(
      'config', None, 'The run\'s experiment config (default: the workdir\'s config.json).')
  _WORKDIR = flags.DEFINE_string('workdir', None, 'The run\'s workdir (its checkpoints).')
  _STEP = flags.DEFINE_integer('step', None, 'Checkpoint step (default: the newest).')
  _BEST = flags.DEFINE_bool('best', False, 'Evaluate the best checkpoint instead.')
  _K = flags.DEFINE_integer('k', 0, 'Samples per prompt (default: config.eval.k).')
  _TEMPERATURE = flags.DEFINE_float('temperature', None, 'Default: config.eval.temperature.')
  _OUTPUT = flags.DEFINE_string('output', '', 'JSON file (default: WORKDIR/eval/step_N.json).')
  _EXPORT = flags.DEFINE_string('export', '', 'Also write the policy as a HF directory here.')
  _POT = flags.DEFINE_bool('pot', False, 'Also PoT (test-time GRPO on a LoRA adapter).')
  _POT_STEPS = flags.DEFINE_integer('pot_steps', 6, 'PoT: GRPO updates per problem.')
  _POT_CANDIDATES = flags.DEFINE_integer('pot_candidates', 8, 'PoT: samples per update.')
  _POT_RANK = flags.DEFINE_integer('pot_rank', 4, 'PoT: the transient adapter\'s rank.')
  _POT_LR = flags.DEFINE_float('pot_lr', 3e-3, 'PoT: Adam\'s lr (see experiments/pot_study.py).')
  flags.mark_flags_as_required(['workdir'])

  def _main(argv):
    del argv
    absl_logging.set_verbosity(absl_logging.WARNING)  # orbax logs every file at INFO.
    config = _CONFIG.value or workdir_config(_WORKDIR.value)
    evaluate_checkpoint(config, _WORKDIR.value, step=_STEP.value, from_best=_BEST.value,
                        k=_K.value, temperature=_TEMPERATURE.value, output=_OUTPUT.value,
                        export=_EXPORT.value,
                        pot_options=dict(steps=_POT_STEPS.value, candidates=_POT_CANDIDATES.value,
                                         rank=_POT_RANK.value, lr=_POT_LR.value)
                        if _POT.value else None)

  app.run(_main)
