"""The record every prompt source yields, the per-problem RNG, and the train/held-out split.

An `Example` is one problem on the host: the prompt text, the gold answer, optionally a worked
reference solution, and JSON-able task fields in `meta` that a verifier may need (the numbers
of a Countdown problem, the catalogue of the policy-recall task). Synthetic problems are drawn
from `example_rng(task, seed, index, difficulty)`, so a problem is a pure function of those
four values.

The split is by content, not by position: `split_of` hashes the task's canonical form of the
problem (a task's `problem_key`), so a problem generated twice, by any seed or index, lands in
the same split, and a held-out problem can never appear in a training stream.

Not here: tokenization, the generators themselves (one module per task), verification.
"""

import dataclasses
import hashlib
import zlib
from typing import Any

import numpy as np

TRAIN = 'train'
HELD_OUT = 'held_out'
HELD_OUT_FRACTION = 0.1
# Worked solutions with steps end in ' #### <answer>': GSM8K's convention, which
# rlreason.verifiers' answer extraction reads.
ANSWER_MARKER = ' #### '


@dataclasses.dataclass(frozen=True)
class Example:
  """One problem. `meta` holds JSON-able fields (lists, not tuples) for verifiers and logs."""
  id: str
  prompt: str
  answer: str
  solution: str | None
  task: str
  difficulty: int
  meta: dict[str, Any] = dataclasses.field(default_factory=dict)


def example_rng(task: str, seed: int, index: int, difficulty: int) -> np.random.Generator:
  """The generator one synthetic problem is drawn from.

  The task name is part of the entropy so that two tasks at the same (seed, index) are
  independent; difficulty is too, so that a mixture of difficulties does not correlate them.
  """
  if seed < 0 or index < 0 or difficulty < 0:
    raise ValueError(f'seed, index and difficulty must be >= 0; got {seed}, {index}, {difficulty}.')
  return np.random.default_rng([zlib.crc32(task.encode()), seed, index, difficulty])


def example_id(task: str, seed: int, index: int, difficulty: int) -> str:
  return f'{task}/s{seed}/d{difficulty}/{index}'


def split_of_key(task: str, problem_key: str, *,
                 held_out_fraction: float = HELD_OUT_FRACTION) -> str:
  """TRAIN or HELD_OUT, from a hash of the task name and the canonical problem.

  Fractions nest: a problem held out at fraction f is held out at every f' > f, so raising the
  fraction moves problems out of training but never the other way.
  """
  if not 0.0 <= held_out_fraction < 1.0:
    raise ValueError(f'held_out_fraction={held_out_fraction} must be in [0, 1).')
  digest = hashlib.sha256(f'{task}\0{problem_key}'.encode()).digest()
  u = int.from_bytes(digest[:8], 'big') / 2.0**64
  return HELD_OUT if u < held_out_fraction else TRAIN


def verifier_item(example: Example, completion: str, *, num_tokens: int, max_len: int,
                  cache_len: int, penalty_factor: float) -> dict:
  """The item a verifier scores: completion, gold answer and the example's meta fields, plus
  the token counts the loop knows (the `overlong` verifier reads num_tokens, max_len,
  cache_len and penalty_factor; the others ignore them)."""
  return {'completion': completion, 'answer': example.answer, **example.meta,
          'num_tokens': num_tokens, 'max_len': max_len, 'cache_len': cache_len,
          'penalty_factor': penalty_factor}
