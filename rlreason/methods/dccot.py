"""DC-CoT's multi-stage RL on threaded rollouts: per-stage reward components and their sum.

DC-CoT (Divide-and-Conquer CoT) warm-starts a director in the spawn format by SFT on a small
demonstration set (tasks/dccot_demos.py, sft.num_demos), which costs accuracy, then runs RL in
stages: first recover the accuracy, then shorten the longest path (the latency proxy). The
paper's stages differ in their data filters and reward; this is our formalisation [F]:

  per episode e (a parent and the workers it spawned, rollout/fork_join.py):
    answer_e  = the verifier's reward of the parent's final text
    correct_e = answer_e >= 1 (the verifier's full reward)
    format_e  = 1 if the spawn block is valid (each of the problem's subtasks named exactly
                once; any distinct headers where the task has no checkable subtasks) or the
                episode did not spawn (a plain chain is a valid response), else 0
    workers_e = fraction of its workers whose output is their subtask's (1 if none spawned or
                the task has no checkable subtasks)
    gain_e    = 1 - longest_path_e / total_tokens_e   (0 without a spawn: path = total)

  stage 1 (step <= stage1_steps):  r_e = answer_e - w_f (1 - format_e) - w_w (1 - workers_e)
  stage 2 (later steps):           r_e = stage 1's r_e + lambda * correct_e * gain_e

so the path term pays only for correct answers (a short wrong episode earns nothing), and the
format and worker terms are penalties that vanish for a valid, right director (defaults w_f =
w_w = 0: stage 1 is correctness only, as DC-CoT's accuracy-recovery stage). The loop's group
estimator then turns r into one advantage per episode, repeated over its 1 + K rows
(methods/threads.py). Every component and weighted term is logged per step (`dccot/...`).

Not here: sampling (rollout/fork_join.py), the demonstrations (tasks/dccot_demos.py). Not
built: DC-CoT's per-stage data filters (rl.dynamic_sampling's zero-variance filter is the
nearest; it is untested with threaded rows).
"""

import dataclasses

import numpy as np

from rlreason.rollout import fork_join
from rlreason.tasks import dccot_demos


def stage(step: int, *, stage1_steps: int) -> int:
  """1 for RL steps 1..stage1_steps (accuracy recovery), 2 after (shorter longest path)."""
  return 1 if step <= stage1_steps else 2


@dataclasses.dataclass(frozen=True)
class Components:
  """Per-episode reward components (arrays of E floats; see the module docstring)."""
  answer_E: np.ndarray
  format_E: np.ndarray
  workers_E: np.ndarray
  gain_E: np.ndarray
  spawned_E: np.ndarray


def path_gain_E(longest_E, total_E) -> np.ndarray:
  """1 - longest_path / total_tokens per episode (0 for an episode with no tokens)."""
  longest_E, total_E = np.asarray(longest_E, np.float64), np.asarray(total_E, np.float64)
  return np.where(total_E > 0, 1.0 - longest_E / np.maximum(total_E, 1.0), 0.0)


def combine(c: Components, *, stage_id: int, format_weight: float, worker_weight: float,
            path_weight: float) -> tuple[np.ndarray, dict[str, np.ndarray]]:
  """The stage's reward per episode and its weighted terms (which sum to it) [F]."""
  correct_E = (c.answer_E >= 1.0).astype(np.float64)
  terms = {
      'answer': np.asarray(c.answer_E, np.float64),
      'format': -format_weight * (1.0 - c.format_E),
      'workers': -worker_weight * (1.0 - c.workers_E),
      'path': (path_weight * correct_E * c.gain_E if stage_id == 2
               else np.zeros_like(correct_E)),
  }
  return sum(terms.values()), terms


def check_episode(headers: list[str], outputs: list[str],
                  expected: dict[str, str] | None) -> tuple[float, float]:
  """(format, workers) of one spawned episode: headers and outputs of its workers, and the
  task's header -> expected output (None: nothing checkable, headers need only be distinct)."""
  distinct = len(set(headers)) == len(headers) > 0
  if expected is None:
    return float(distinct), 1.0
  valid = distinct and sorted(headers) == sorted(expected)
  right = [expected.get(h) == o for h, o in zip(headers, outputs)]
  return float(valid), float(np.mean(right)) if right else 1.0


def components(out: fork_join.ThreadedRollout, examples, answer_E, *, group_size: int,
               decode, worker_open: int) -> Components:
  """The components of each episode of a threaded rollout; `decode(ids) -> str`.

  A worker row's prefix is its parent's phase-1 tokens, its header and `worker_open`; its
  loss tokens are its output (ending in EOS, which decode drops)."""
  tokens = np.asarray(out.rollout.tokens_NxL)
  mask, prefix = np.asarray(out.rollout.mask_NxL), np.asarray(out.rollout.prefix_mask_NxL)
  loss = np.asarray(out.rollout.loss_mask_NxL)
  per = 1 + out.max_workers
  n_e = len(out.spawned_E)
  format_E, workers_E = np.ones(n_e), np.ones(n_e)
  for e in np.flatnonzero(out.spawned_E):
    p = e * per
    joined = mask[p] & ~loss[p]  # The join block: phase 1 ends where it starts.
    first = int(np.argmax(joined)) if joined.any() else int(loss[p].sum())
    headers, outputs = [], []
    for row in range(p + 1, p + per):
      if not out.active_N[row]:
        continue
      head = tokens[row][prefix[row]][first:]
      headers.append(decode(head[:-1].tolist() if len(head) and head[-1] == worker_open
                            else head.tolist()))
      outputs.append(decode(tokens[row][loss[row]].tolist()))
    format_E[e], workers_E[e] = check_episode(
        headers, outputs, dccot_demos.subtasks(examples[e // group_size]))
  tokens_N = loss.sum(axis=1)
  gain_E = path_gain_E(fork_join.longest_path_E(tokens_N, out.parent_N),
                       fork_join.total_tokens_E(tokens_N, out.parent_N))
  return Components(answer_E=np.asarray(answer_E, np.float64).reshape(-1), format_E=format_E,
                    workers_E=workers_E, gain_E=gain_E, spawned_E=np.asarray(out.spawned_E))


def metrics(c: Components, terms: dict, reward_E, *, stage_id: int, threads_E) -> dict:
  """The step's per-component means (worker correctness over spawned episodes only)."""
  spawned = c.spawned_E.astype(bool)
  m = {'dccot/stage': float(stage_id), 'dccot/reward_mean': float(np.mean(reward_E)),
       'dccot/correct_frac': float(np.mean(c.answer_E >= 1.0)),
       'dccot/format_valid_frac': float(np.mean(c.format_E)),
       'dccot/path_gain_mean': float(np.mean(c.gain_E)),
       'dccot/workers_per_episode': float(np.mean(np.asarray(threads_E) - 1))}
  if spawned.any():
    m['dccot/worker_correct_frac'] = float(np.mean(c.workers_E[spawned]))
  m.update({f'dccot/term_{k}': float(np.mean(v)) for k, v in terms.items()})
  return m


def stage_rewards(run, out: fork_join.ThreadedRollout, examples, verifier_BxG, *, step: int,
                  fmt: fork_join.SpawnFormat) -> tuple[np.ndarray, dict]:
  """methods/threads.py's hook: the stage's rewards_BxG from the verifier's, and the metrics."""
  d = run.config.dccot
  comps = components(out, examples, verifier_BxG, group_size=verifier_BxG.shape[1],
                     decode=lambda ids: run.tok.decode(ids, skip_special_tokens=True),
                     worker_open=fmt.worker_open)
  s = stage(step, stage1_steps=d.stage1_steps)
  reward_E, terms = combine(comps, stage_id=s, format_weight=d.format_weight,
                            worker_weight=d.worker_weight, path_weight=d.path_weight)
  return (reward_E.reshape(verifier_BxG.shape).astype(np.float32),
          metrics(comps, terms, reward_E, stage_id=s, threads_E=out.threads_E))
