"""DAPO's overlong reward shaping (arXiv 2503.14476; verl workers/reward_manager/dapo.py).

With L_max the hard cap on response tokens and L_cache the soft buffer before it:

  R_len(|y|) = 0                                 if |y| <= L_max - L_cache
             = ((L_max - L_cache) - |y|) / L_cache  if L_max - L_cache < |y| <= L_max
             = -1                                if |y| > L_max

times `penalty_factor`, added to the correctness reward by the caller (reward composition).
Lengths are token counts from the trainer: this module never tokenises. Not here: DAPO's
overlong *filtering* (masking truncated samples out of the loss), which is the trainer's.
"""

from typing import Any, Mapping

from rlreason.verifiers import verdict as V


def overlong_penalty(num_tokens: int, *, max_len: int, cache_len: int,
                     penalty_factor: float = 1.0) -> float:
  if not 0 < cache_len <= max_len:
    raise ValueError(f'need 0 < cache_len <= max_len, got {cache_len}, {max_len}.')
  expected = max_len - cache_len
  if num_tokens <= expected:
    return 0.0
  if num_tokens <= max_len:
    return penalty_factor * (expected - num_tokens) / cache_len
  return -penalty_factor


@V.verifier
def verify_overlong(item: Mapping[str, Any]) -> V.Verdict:
  """Item: num_tokens, max_len, cache_len; optional penalty_factor. No completion needed."""
  try:
    penalty = overlong_penalty(int(item['num_tokens']), max_len=int(item['max_len']),
                               cache_len=int(item['cache_len']),
                               penalty_factor=V.option(item, 'penalty_factor', 1.0, float))
  except KeyError as e:
    return V.failure(V.INVALID_INPUT, f'missing field: {e.args[0]}')
  except (TypeError, ValueError) as e:
    return V.failure(V.INVALID_INPUT, str(e))
  return V.judged(penalty == 0.0, reward=penalty, components={'overlong': penalty})
