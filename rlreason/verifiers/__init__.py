"""Host-side rewards: verifiers, the worker pool that runs them, the sandbox, composition.

  from rlreason import verifiers
  with verifiers.VerifierPool(num_workers=2) as pool:
    verdicts = pool.score(items, verifier='math', deadline_s=30.0)
  rewards_B, metrics = mix.combine([{'math': v.reward} for v in verdicts], progress=0.3)

Modules: verdict (result type, statuses), registry (names -> verifiers), pool, sandbox
(+ sandbox_init), composition, pool_processes, and one module per verifier family: math_answer,
text_answer (exact/regex/format), countdown, policy_recall, overlong, prolog,
python_tests, synthetic_tasks. faults holds misbehaving verifiers for tests.
`python -m rlreason.verifiers score ...` scores a JSONL file offline.

This package never imports JAX (a test checks): verifiers see Python strings only, and
the pool's workers must start without touching an accelerator.
"""

from rlreason.verifiers.composition import constant
from rlreason.verifiers.composition import linear
from rlreason.verifiers.composition import PROLOG_CURRICULUM
from rlreason.verifiers.composition import RewardComposition
from rlreason.verifiers.composition import sigmoid
from rlreason.verifiers.composition import step
from rlreason.verifiers.overlong import overlong_penalty
from rlreason.verifiers.pool import PoolStats
from rlreason.verifiers.pool import VerifierPool
from rlreason.verifiers.registry import get_verifier
from rlreason.verifiers.registry import VERIFIERS
from rlreason.verifiers.verdict import FAILURES
from rlreason.verifiers.verdict import STATUSES
from rlreason.verifiers.verdict import Verdict

__all__ = [
    'FAILURES', 'PROLOG_CURRICULUM', 'PoolStats', 'RewardComposition', 'STATUSES', 'VERIFIERS',
    'Verdict', 'VerifierPool', 'constant', 'get_verifier', 'linear', 'overlong_penalty',
    'sigmoid', 'step',
]
