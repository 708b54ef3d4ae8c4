"""The RL loop's fork/join rollout mode (config.threads): threaded rows and their scores.

`sample_and_score` reads config.threads (budgets, max_workers, the spawn markers) and calls
rollout/fork_join.py's `sample_threads`; the verifier scores each episode's parent text (spawn
block, the workers' results as joined, the ending), so an episode's final reward is one
number, rewards_BxG over the G episodes of each prompt. The loop's group estimator turns it into
one advantage per episode, which `rl_batch.advantages_for` repeats over the episode's 1 + K rows
(its parent and worker slots; an unspawned slot has no token in the loss), so the parent's and
every worker's sampled tokens are trained once each with the episode's advantage.

Metrics (fork_join.ThreadedRollout.metrics): threads/total_tokens_mean, threads/
longest_path_mean (the critical path: parent + longest worker), threads/per_episode_mean,
threads/spawned_frac. With dccot.enabled the episode's reward is DC-CoT's stage reward
(methods/dccot.py) and the verifier's stays in verifier_BxG.

The loop's evaluation (rl/evaluate.py) forks too: it samples k threaded episodes per held-out
prompt with `sample_threads` and judges their parent texts with `episode_verdicts`.

Not here: the sampling mechanism (rollout/fork_join.py).
"""

import time

import jax
import numpy as np

from rlreason.methods import dccot
from rlreason.rl import evaluate
from rlreason.rl import rl_batch
from rlreason.rl.run_setup import prompt_text
from rlreason.rollout import fork_join
from rlreason.rollout import sampler
from rlreason.rollout import trie
from rlreason.tasks import example as example_lib

DEFAULT_MARKERS = dict(spawn='<', sep=',', end='>', worker_open=':', join_open='[',
                       join_sep=',', join_close=']')  # tasks/parallel_sums.THREAD_MARKERS


def trie_packing(run, tokens_NxT, mask_NxT) -> trie.Packing:
  """threads.trie_packing: each episode's 1 + K rows (prompt and completion) as one packed trie
  (rollout/trie.py), of width T + K x (max_header_tokens + 1 + worker_tokens): the parent's row
  and each worker's branch past it. A static width per prompt bucket: one compile each."""
  t = run.config.threads
  width = tokens_NxT.shape[1] + t.max_workers * (t.max_header_tokens + 1 + t.worker_tokens)
  return trie.build(jax.device_get(tokens_NxT), jax.device_get(mask_NxT),
                    rows=1 + t.max_workers, width=width)


def spawn_format(run) -> fork_join.SpawnFormat:
  t = run.config.threads
  return fork_join.SpawnFormat.from_tokenizer(
      run.tok, **{**DEFAULT_MARKERS, **dict(t.markers)}, max_header_tokens=t.max_header_tokens)


def sample_threads(run, params, examples, rng, *, temperature: float, group_size: int = 0):
  """fork_join.sample_threads with the run's settings (group_size 0: rl.group_size)."""
  t, rl = run.config.threads, run.config.rl
  with jax.set_mesh(run.sample_mesh):
    return fork_join.sample_threads(
        params, [run.tok.encode(prompt_text(run, ex)) for ex in examples], fmt=spawn_format(run),
        cfg=run.cfg, group_size=group_size or rl.group_size, max_workers=t.max_workers,
        parent_tokens=t.parent_tokens, worker_tokens=t.worker_tokens,
        final_tokens=t.final_tokens, rng=rng, prompt_buckets=run.config.data.prompt_buckets,
        eos=tuple(run.tok.eos_ids), temperature=temperature, top_k=rl.top_k, top_p=rl.top_p,
        pad_id=run.pad_id, max_chunks=rl.decode_chunks,
        decode=lambda ids: run.tok.decode(ids, skip_special_tokens=True))


def episode_verdicts(run, texts, examples, *, group_size: int, lengths_E) -> list:
  """The verifier's verdict on each episode's parent text (episode e answers e // group_size)."""
  limits = rl_batch.overlong_limits(run.config)
  items = [example_lib.verifier_item(examples[e // group_size], text,
                                     num_tokens=int(lengths_E[e]), **limits)
           for e, text in enumerate(texts)]
  return run.pool.score(items, verifier=run.config.verifier.name,
                        deadline_s=run.config.verifier.deadline_s)


def score_texts(run, texts, examples, *, group_size: int, lengths_E) -> tuple[np.ndarray, dict]:
  """Verifier rewards_BxG of the episodes' parent texts, and the verdict metrics."""
  verdicts = episode_verdicts(run, texts, examples, group_size=group_size, lengths_E=lengths_E)
  rewards_BxG = np.array([v.reward for v in verdicts], np.float32).reshape(-1, group_size)
  statuses = [v.status for v in verdicts]
  metrics = {f'verifier/{s}_frac': statuses.count(s) / len(statuses) for s in set(statuses)}
  metrics['train/accuracy'] = statuses.count('correct') / len(statuses)
  return rewards_BxG, metrics


def sample_and_score(run, params, examples, rng, *, step: int, times: dict):
  """rl/train.py's threaded rollout mode: (rollout, rl_batch.Scores), one reward per episode."""
  if jax.process_count() > 1:
    raise ValueError(f'threads.enabled=True samples fork/join rows in one process; this run has '
                     f'{jax.process_count()} (multi-host threaded rollouts are not supported: '
                     'set threads.enabled=False or run on one host).')
  g = run.config.rl.group_size
  t0 = time.perf_counter()
  out = sample_threads(run, params, examples, rng, temperature=run.config.rl.temperature)
  times['time/generate_s'] = times.get('time/generate_s', 0.0) + time.perf_counter() - t0
  loss_N = np.asarray(out.rollout.loss_mask_NxL).sum(axis=1)
  times['tokens/generate'] = times.get('tokens/generate', 0) + int(loss_N.sum())
  t0 = time.perf_counter()
  rewards_BxG, metrics = score_texts(run, out.final_texts, examples, group_size=g,
                                     lengths_E=fork_join.total_tokens_E(loss_N, out.parent_N))
  times['time/verify_s'] = times.get('time/verify_s', 0.0) + time.perf_counter() - t0
  metrics.update(out.metrics())
  if run.config.threads.get('trie_packing'):  # The learner's forward positions (rollout/trie.py).
    tokens_NxT, mask_NxT = sampler.sequences(out.rollout)
    cost = trie.positions(trie_packing(run, tokens_NxT, mask_NxT), mask_NxT)
    metrics.update({f'threads/positions_{k}': float(v) for k, v in cost.items()})
  verifier_BxG = rewards_BxG
  if run.config.get('dccot') is not None and run.config.dccot.enabled:  # DC-CoT's stages
    rewards_BxG, stage_metrics = dccot.stage_rewards(run, out, examples, verifier_BxG,
                                                     step=step, fmt=spawn_format(run))
    metrics.update(stage_metrics)
  metrics['train/zero_variance_frac'] = rl_batch.zero_variance_fraction(rewards_BxG)
  run.data_iter.record(examples, verifier_BxG)
  rollout = rl_batch.tag_versions(out.rollout, version=step - 1)
  return rollout, rl_batch.Scores(rewards_BxG=rewards_BxG, verifier_BxG=verifier_BxG,
                                  modes_BxG=np.full(rewards_BxG.shape, -1, np.int32),
                                  metrics=metrics)


def thread_verdicts(run, params, *, k: int, temperature: float, rng):
  """k fork/join episodes per held-out prompt (this module's sampling, as in training),
  each judged on its parent's text: (correct_BxK, answers_BxK, sampled tokens, the threaded
  metrics: longest_path_mean, total_tokens_mean, spawned_frac over the episodes).

  Chunks of run.eval_chunk prompts (the last one padded), each sampled with the same key."""
  if jax.process_count() > 1:
    raise ValueError(f'threads.enabled evaluates fork/join episodes in one process; this run '
                     f'has {jax.process_count()} (set threads.enabled=False or run on one host).')
  examples, chunk = run.eval_examples, run.eval_chunk
  correct, answers, path, total, spawned = [], [], [], [], []
  for start in range(0, len(examples), chunk):
    part = examples[start:start + chunk]
    padded = part + [part[-1]] * (chunk - len(part))
    out = sample_threads(run, params, padded, rng, temperature=temperature,
                                 group_size=k)
    e = len(part) * k  # Episodes are prompt-major: the padding's come last.
    tokens_N = np.asarray(out.rollout.loss_mask_NxL).sum(axis=1)
    total_E = fork_join.total_tokens_E(tokens_N, out.parent_N)[:e]
    verdicts = episode_verdicts(run, out.final_texts[:e], part, group_size=k,
                                        lengths_E=total_E)
    correct.append(np.array([v.status == 'correct' for v in verdicts]).reshape(len(part), k))
    keys = [evaluate.answer_key(t) for t in out.final_texts[:e]]
    answers += [keys[b * k:(b + 1) * k] for b in range(len(part))]
    path += fork_join.longest_path_E(tokens_N, out.parent_N)[:e].tolist()
    total += total_E.tolist()
    spawned += out.spawned_E[:e].tolist()
  stats = {'longest_path_mean': float(np.mean(path)), 'total_tokens_mean': float(np.mean(total)),
           'spawned_frac': float(np.mean(spawned))}
  return np.concatenate(correct), answers, int(np.sum(total)), stats


def build(run):
  """Fork/join threads under threads.enabled (rl/extensions.py: the rollout source and the
  evaluation), their trie packing under threads.trie_packing; or None."""
  t = run.config.get('threads')
  if t is None or not (t.enabled or t.get('trie_packing')):
    return None
  if not t.enabled:
    return TriePacking()
  return PackedThreads() if t.get('trie_packing') else Threads()


class Threads:

  def sample_and_score(self, run, params, examples, rng, *, step: int, progress: float,
                       times: dict):
    del progress
    return sample_and_score(run, params, examples, rng, step=step, times=times)

  def eval_verdicts(self, run, params, *, k: int, temperature: float, rng, diversity: str):
    if diversity != 'iid':
      raise ValueError(f"eval.diversity={diversity!r} samples single threads; threads.enabled "
                       "evaluates fork/join episodes: set eval.diversity='iid'.")
    return thread_verdicts(run, params, k=k, temperature=temperature, rng=rng)


class TriePacking:

  def trie(self, run, tokens_NxT, mask_NxT):
    return trie_packing(run, tokens_NxT, mask_NxT)


class PackedThreads(Threads, TriePacking):
  pass
