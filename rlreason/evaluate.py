"""Held-out evaluation: pass@k (unbiased), mean@k and majority vote over k samples.

  python -m rlreason.evaluate --config experiments/demo.py --workdir DIR [--k 8]

evaluates the newest checkpoint in DIR on the config's held-out prompts. From Python,
`evaluate(...)` samples k completions per prompt with the product's sampler, scores them with
the configured verifier pool, and returns the metrics.

pass@k uses the unbiased estimator of Chen et al. 2021 (arXiv 2107.03374): with n samples
of which c are correct, pass@k = 1 - C(n - c, k) / C(n, k), averaged over prompts.

Deliberately not here: the verifiers themselves, the training loop.
"""

from collections import Counter
from collections.abc import Sequence
import math

import numpy as np


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
