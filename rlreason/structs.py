"""Frozen pytrees passed between the stages of an RL step, and the axis glossary.

Axis letters, used as suffixes of array names (`logits_NxTxV`, `rewards_BxG`):
  B prompts            G samples per prompt     N = B*G sequences, prompt-major (n = b*G + g)
  P prompt length (bucketed)   Q prefix length   L completion length   T = P + L
  S cache length       V vocab      D model dim      H query heads     K kv heads
  Dh head dim          F mlp dim

Static fields (shapes of the experiment, never traced) are `pytree_node=False`.
"""

from typing import Any

import flax
import jax

# Provenance of completion tokens (Rollout.version_NxL): the policy version that sampled a
# token is the number of RL steps applied to its params (step t samples with the params after
# t - 1 steps: version t - 1; the warm start is 0; an older snapshot's prefix carries the
# snapshot's version). Tokens no version of the policy sampled carry a negative mark:
VERSION_TEACHER = -1  # a reference solution injected as a rollout (HAPO)
VERSION_ENV = -2  # an observation a tool or environment returned (episodes)
VERSION_ROLLBACK = -3  # a corrected tool call sampled with the error in context (CLEANER)


@flax.struct.dataclass
class Prompts:
  """Left-padded prompt tokens; every row has at least one real token."""
  tokens_BxP: jax.Array  # int32
  mask_BxP: jax.Array  # bool, False on left padding


@flax.struct.dataclass
class Prefixes:
  """Per-row tokens that continue the prompt before sampling starts (row n = b*G + g).

  Right-padded: row n's prefix is tokens_NxQ[n, :sum(mask_NxQ[n])]. `logprobs_NxQ`, if given,
  are the log-probs recorded by the policy that produced the prefix (an older checkpoint, a
  teacher); without them the prefix counts as produced by the sampling policy itself.
  """
  tokens_NxQ: jax.Array
  mask_NxQ: jax.Array
  logprobs_NxQ: jax.Array | None = None


@flax.struct.dataclass
class Rollout:
  """G completions per prompt, prompt-major.

  Completion columns hold the row's prefix (if any) then the sampled tokens, then padding.

  tokens_NxL: completion tokens.
  mask_NxL: real completion tokens, prefix included, up to and including the stop token.
  prefix_mask_NxL: tokens that were given as a prefix rather than sampled.
  logprobs_NxL: log-prob under the plain tempered softmax of the sampling parameters, the
    quantity the learner recomputes (so the first-epoch ratio is 1 up to numerics).
  behaviour_logprobs_NxL: log-prob under the distribution that actually produced the token:
    the temperature/top-k/top-p distribution for sampled tokens, the recorded log-probs for
    prefix tokens that came with them.
  truncated_N: the row hit max_new_tokens without a stop token.
  lengths_N: number of real completion tokens (sum of mask_NxL).
  loss_mask_NxL: multi-turn episodes only (rollout/episodes.py): the tokens the policy sampled,
    a subset of mask_NxL (observations are real tokens, never trained); None: mask_NxL.
  turn_NxL: multi-turn episodes only: each token's turn index (int32); None: all turn 0.
  version_NxL: each token's provenance (int32, VERSION_* above), set by the loop that knows
    the step (rl/train.py); None where no one tagged it.
  """
  prompts: Prompts
  tokens_NxL: jax.Array
  mask_NxL: jax.Array
  prefix_mask_NxL: jax.Array
  logprobs_NxL: jax.Array
  behaviour_logprobs_NxL: jax.Array
  truncated_N: jax.Array
  lengths_N: jax.Array
  group_size: int = flax.struct.field(pytree_node=False, default=1)
  loss_mask_NxL: jax.Array | None = None
  turn_NxL: jax.Array | None = None
  version_NxL: jax.Array | None = None


@flax.struct.dataclass
class TrainState:
  """Policy params and optimizer state; with a critic, the value head's and its optimizer's."""
  params: Any
  opt_state: Any
  step: jax.Array  # int32: optimizer updates applied.
  skipped: jax.Array  # int32: updates skipped for a non-finite loss or gradient.
  value_params: Any = None  # transformer.init_value_head, only when config.critic.enabled.
  value_opt_state: Any = None


@flax.struct.dataclass
class TrainBatch:
  """N = B*G rows, prompt-major; completion arrays are NxL, aligned with tokens_NxT[:, P:]."""
  tokens_NxT: jax.Array
  mask_NxT: jax.Array  # real tokens (prompt and completion)
  loss_mask_NxL: jax.Array  # completion tokens in the loss
  advantages_NxL: jax.Array
  old_logprobs_NxL: jax.Array
  ref_logprobs_NxL: jax.Array
  behaviour_logprobs_NxL: jax.Array
  prefix_mask_NxL: jax.Array
  turn_ids_NxL: jax.Array | None = None  # int32 turn index per token (single-turn: all 0)
  old_values_NxL: jax.Array | None = None  # value head at sampling time (critic runs only)
  returns_NxL: jax.Array | None = None  # GAE returns, the value head's targets
  version_NxL: jax.Array | None = None  # int32 provenance of each token (structs.VERSION_*)
  trie: Any = None  # rollout/trie.Packing: threaded rows' forward, one packed trie per episode
