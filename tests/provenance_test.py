"""Per-token provenance (#19 item 1): sampled, prefix, teacher and environment tokens carry
their policy version or mark through the batch and the update, and the staleness metrics
read them."""

import jax.numpy as jnp
import numpy as np

from rlreason import structs
from rlreason.methods import mixed_policy
from rlreason.rl import metrics
from rlreason.rl import rl_batch
from rlreason.rl import train
from rlreason.structs import Prompts, Rollout

import train_test  # tests/ is on sys.path under pytest (rootdir-relative imports)


def _rollout(n=4, length=5, **kw):
  mask = jnp.asarray(np.arange(length)[None, :] < np.array([5, 3, 4, 2])[:n, None])
  zeros = jnp.zeros((n, length))
  args = dict(prompts=Prompts(jnp.ones((n // 2, 2), jnp.int32), jnp.ones((n // 2, 2), bool)),
              tokens_NxL=jnp.ones((n, length), jnp.int32), mask_NxL=mask,
              prefix_mask_NxL=jnp.zeros((n, length), bool), logprobs_NxL=zeros,
              behaviour_logprobs_NxL=zeros, truncated_N=jnp.zeros(n, bool),
              lengths_N=mask.sum(1), group_size=2)
  args.update(kw)
  return Rollout(**args)


def test_tag_versions_marks_prefixes_and_observations():
  prefix = jnp.zeros((4, 5), bool).at[0, :2].set(True)
  r = rl_batch.tag_versions(_rollout(prefix_mask_NxL=prefix), version=7, prefix_version=4)
  v = np.asarray(r.version_NxL)
  assert (v[0, :2] == 4).all() and (v[0, 2:] == 7).all() and (v[1:] == 7).all()
  loss = jnp.asarray(np.arange(5)[None, :] % 2 == 0).repeat(4, 0) & _rollout().mask_NxL
  ep = rl_batch.tag_versions(_rollout(loss_mask_NxL=loss), version=3)
  v, real = np.asarray(ep.version_NxL), np.asarray(_rollout().mask_NxL)
  assert (v[real & ~np.asarray(loss)] == structs.VERSION_ENV).all()
  assert (v[np.asarray(loss)] == 3).all()


def test_teacher_rows_are_marked():
  r = rl_batch.tag_versions(_rollout(), version=2)
  injected = np.array([[False, True], [False, False]])
  out = mixed_policy.replace_rows(r, injected, np.full((2, 5), 9), np.ones((2, 5), bool),
                                  np.ones(2, bool))
  v = np.asarray(out.version_NxL)
  assert (v[1] == structs.VERSION_TEACHER).all() and (v[[0, 2, 3]] == 2).all()


def test_staleness_metrics_of_a_batch():
  r = rl_batch.tag_versions(_rollout(prefix_mask_NxL=jnp.zeros((4, 5), bool).at[:, 0].set(True)),
                            version=5, prefix_version=3)
  batch = structs.TrainBatch(
      tokens_NxT=None, mask_NxT=None, loss_mask_NxL=r.mask_NxL, advantages_NxL=None,
      old_logprobs_NxL=None, ref_logprobs_NxL=None, behaviour_logprobs_NxL=None,
      prefix_mask_NxL=None, version_NxL=r.version_NxL)
  m = rl_batch.provenance_metrics(batch, learner_version=5, max_staleness=3)
  assert int(m['offpolicy/staleness/0']) == 14 - 4 and int(m['offpolicy/staleness/2']) == 4
  assert int(m['offpolicy/staleness/out_of_range']) == 0
  assert float(m['provenance/policy_token_frac']) == 1.0


def test_versions_survive_the_loop(tmp_path):
  """Prefixes from the warm start (version 0) at step 2 are one step stale; after the
  snapshot refreshed at step 2, step 3's prefixes are fresh; HAPO's teacher rows count."""
  train.train(train_test.mixed_config(steps=3), str(tmp_path))
  log = {r['step']: r for r in metrics.read_jsonl(tmp_path / 'metrics.jsonl') if r['step'] > 0}
  assert log[1]['offpolicy/staleness/0'] > 0 and log[1]['offpolicy/staleness/1'] == 0
  assert log[2]['offpolicy/staleness/1'] > 0  # the warm start's prefixes, at learner version 1
  assert log[3]['offpolicy/staleness/1'] == 0  # refreshed at step 2
  assert all(log[s]['offpolicy/staleness/out_of_range'] == 0 for s in (1, 2, 3))
  assert max(log[s]['provenance/teacher_token_frac'] for s in (1, 2, 3)) > 0  # injected
