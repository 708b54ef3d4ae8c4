"""Every registered estimator, policy loss, transform and verifier runs one RL step, or is
rejected by config.validate with a message naming what is missing.

One tiny model (d = 32, 2 layers, vocabulary 128 and one prompt bucket for every task) keeps
the sampler's compilation shared between cases, and one verifier pool serves them all; each
case builds its Run (so its own objective's train step) and runs `train.rl_step` once from a
fresh state (no warm start, evaluation or checkpoint: those are train_test.py's).
"""

import types

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rlreason import config as config_lib
from rlreason.objectives import advantage_transforms
from rlreason.objectives import advantages
from rlreason.objectives import kl
from rlreason.objectives import losses
from rlreason.rl import run_setup
from rlreason.rl import train
from rlreason.verifiers import pool as pool_lib
from rlreason.verifiers import registry

DIFFICULTY = {'arithmetic': 1, 'countdown': 2, 'group_composition': 1, 'policy_recall': 2}
TASK_VERIFIER = {'arithmetic': 'arithmetic', 'countdown': 'countdown',
                 'group_composition': 'group_composition', 'policy_recall': 'policy_recall'}


def tiny(task='arithmetic', **overrides):
  c = config_lib.default()
  c.data.task, c.data.difficulty = task, DIFFICULTY[task]
  c.data.prompt_buckets = (128,)
  c.model.arch = dict(vocab_size=128, hidden_size=32, intermediate_size=64, num_layers=2,
                      num_heads=2, num_kv_heads=1, head_dim=16, qkv_bias=False, qk_norm=False,
                      tie_embeddings=True, family='qwen2', rope_theta=10_000.0)
  c.rl.steps, c.rl.prompts_per_step, c.rl.group_size, c.rl.max_new_tokens = 1, 4, 2, 8
  c.optimizer.lr = 1e-3
  c.verifier.name, c.verifier.workers = TASK_VERIFIER[task], 1
  c.eval.num_prompts = 4
  c.mesh = dict(data=1, fsdp=-1, tensor=1)
  for path, value in overrides.items():
    section, key = path.split('.')
    c[section][key] = value
  return c


@pytest.fixture(scope='module')
def shared_pool():
  pool = pool_lib.VerifierPool(num_workers=1)
  yield pool
  pool.close()


def one_step(c, workdir, pool, monkeypatch):
  """validate, build, one rl_step from fresh params: (state, host metrics)."""
  config_lib.validate(c, num_devices=jax.device_count())
  monkeypatch.setattr(run_setup.pool_lib, 'VerifierPool', lambda **kw: pool)
  run = run_setup.build(c, workdir)
  try:
    state = run._fresh_state()
    if c.objective.kl_coef:  # run.save(0) would set it; the step-0 policy is the reference.
      run.ref_params = jax.tree.map(jnp.copy, state.params)
    with jax.set_mesh(run.mesh):
      state, metrics = train.rl_step(run, state, 1, {})
  finally:
    run.checkpointer.close()
  metrics = jax.device_get(metrics)
  assert int(state.step) + int(state.skipped) == c.rl.epochs * c.rl.minibatches
  assert int(state.skipped) == 0 and np.isfinite(metrics['loss'])
  return state, metrics


# What each registered name needs besides the defaults; the tests below check that these
# tables cover the registries exactly, so a new name must say here how it runs.
ESTIMATOR_CASES = {
    'grpo': {}, 'dr_grpo': {}, 'rloo': {}, 'reinforce_pp_baseline': {}, 'r2po_rarity': {},
    'otb': {}, 'gae': {'critic.enabled': True}, 'opo': {}, 'grpo_passk': {}, 'reinforce_pp': {},
}
LOSS_CASES = {
    'ppo_clip': {}, 'gspo': {'objective.aggregation': 'seq_mean_token_mean'}, 'gspo_token': {},
    'cispo': {'objective.loss_kwargs': {'cap': 'relative', 'eps_high': 0.2}},
    'quatro': {'objective.loss_kwargs': {'delta': 0.1}},
    'quatro_log_target': {'objective.loss_kwargs': {'delta': 0.1}},
    'quatro_dual_ascent': {'objective.loss_kwargs': {'delta': 0.1, 'lam_lr': 1.0}},
    'sorl': {}, 'prefix_mixed_ppo': {}, 'sapo': {'objective.aggregation': 'seq_mean_token_mean'},
}
# Options that select a different formula inside a registered name (the peer options of
# README's table), and every KL estimator, each run for one step.
OPTION_CASES = {
    'grpo_scale_batch': {'objective.advantage_kwargs': {'scale': 'batch', 'eps': 1e-4}},
    'grpo_scale_none': {'objective.advantage_kwargs': {'scale': 'none'}},
    'grpo_nan_ignore': {'objective.advantage_kwargs': {'nan_rewards': 'ignore'}},
    'dr_grpo_nan_ignore': {'objective.advantage': 'dr_grpo',
                           'objective.advantage_kwargs': {'nan_rewards': 'ignore'}},
    'grpo_passk_unscaled': {'objective.advantage': 'grpo_passk',
                            'objective.advantage_kwargs': {'scale': 'none'}},
    'reinforce_pp_baseline_tokens': {'objective.advantage': 'reinforce_pp_baseline',
                                     'objective.advantage_kwargs': {'whiten_over': 'tokens'}},
    'reinforce_pp_gamma': {'objective.advantage': 'reinforce_pp',
                           'objective.advantage_kwargs': {'gamma': 0.9}},
    'otb_zero_tail': {'objective.advantage': 'otb',
                      'objective.advantage_kwargs': {'zero_tail': True}},
    'cispo_sequence': {'objective.policy_loss': 'cispo', 'objective.loss_kwargs': {
        'cap': 'absolute', 'max_weight': 5.0, 'level': 'sequence'}},
    'sapo_sequence': {'objective.policy_loss': 'sapo',
                      'objective.aggregation': 'seq_mean_token_mean',
                      'objective.loss_kwargs': {'level': 'sequence', 'tau_pos': 2.0}},
    'gspo_dual_clip': {'objective.policy_loss': 'gspo',
                       'objective.aggregation': 'seq_mean_token_mean',
                       'objective.loss_kwargs': {'dual_clip': 3.0}},
    'gspo_token_dual_clip': {'objective.policy_loss': 'gspo_token',
                             'objective.loss_kwargs': {'dual_clip': 3.0}},
    'continuous_batching': {'rl.sampler': 'continuous', 'rl.slots': 4},  # 8 rows, 4 slots
    **{f'kl_{name}': {'objective.kl_coef': 0.01, 'objective.kl_estimator': name}
       for name in ('k1', 'k1_abs', 'k2', 'k3', 'k3_k2grad')},
}
TRANSFORM_CASES = {
    'f_grpo': ('arithmetic', {}), 'a_grae': ('arithmetic', {}),
    'ifpo': ('policy_recall', {}),
}
# Verifier -> the task whose items carry its fields, or the message validate rejects it with.
VERIFIER_CASES = {
    'arithmetic': 'arithmetic', 'countdown': 'countdown', 'exact': 'arithmetic',
    'format': 'arithmetic', 'group_composition': 'group_composition', 'math': 'arithmetic',
    'overlong': 'arithmetic', 'policy_recall': 'policy_recall', 'prolog': 'arithmetic',
    'regex': 'arithmetic',
    'python_tests': ValueError("verifier.name='python_tests' cannot score data.task="
                               "'arithmetic' items: need tests or io_cases"),
    'policy_task': ValueError("verifier.name='policy_task' cannot score data.task="
                              "'policy_recall' items"),
}
REJECTED_TASK = {'python_tests': 'arithmetic', 'policy_task': 'policy_recall'}


def test_the_case_tables_cover_the_registries():
  assert set(ESTIMATOR_CASES) == set(advantages.ESTIMATORS)
  assert set(LOSS_CASES) == set(losses.POLICY_LOSSES)
  assert {f'kl_{k}' for k in kl.KL_ESTIMATORS} <= set(OPTION_CASES)
  assert set(TRANSFORM_CASES) == set(advantage_transforms.TRANSFORMS)
  assert set(VERIFIER_CASES) == set(registry.VERIFIERS)


@pytest.mark.parametrize('name', sorted(ESTIMATOR_CASES))
def test_every_estimator_runs_a_step(name, tmp_path, shared_pool, monkeypatch):
  state, metrics = one_step(tiny(**{'objective.advantage': name, **ESTIMATOR_CASES[name]}),
                            tmp_path, shared_pool, monkeypatch)
  if name == 'gae':
    assert state.value_params is not None
    for key in ('value/loss', 'value/explained_var', 'value/clip_frac', 'value/grad_norm'):
      assert np.isfinite(metrics[key]), key


@pytest.mark.parametrize('name', sorted(LOSS_CASES))
def test_every_policy_loss_runs_a_step(name, tmp_path, shared_pool, monkeypatch):
  one_step(tiny(**{'objective.policy_loss': name, **LOSS_CASES[name]}), tmp_path, shared_pool,
           monkeypatch)


@pytest.mark.parametrize('name', sorted(OPTION_CASES))
def test_every_peer_option_runs_a_step(name, tmp_path, shared_pool, monkeypatch):
  _, metrics = one_step(tiny(**OPTION_CASES[name]), tmp_path, shared_pool, monkeypatch)
  if name.startswith('kl_'):
    assert np.isfinite(metrics['kl']), metrics['kl']


@pytest.mark.parametrize('advantage', ['grpo', 'otb'])
@pytest.mark.parametrize('name', sorted(TRANSFORM_CASES))
def test_every_transform_runs_a_step_also_after_otb(name, advantage, tmp_path, shared_pool,
                                                    monkeypatch):
  task, extra = TRANSFORM_CASES[name]
  one_step(tiny(task, **{'objective.transforms': (name,), 'objective.advantage': advantage,
                         **extra}), tmp_path, shared_pool, monkeypatch)


@pytest.mark.parametrize('name', sorted(VERIFIER_CASES))
def test_every_verifier_runs_a_step_or_is_rejected(name, tmp_path, shared_pool, monkeypatch):
  case = VERIFIER_CASES[name]
  if isinstance(case, ValueError):
    with pytest.raises(ValueError, match=str(case).replace('(', r'\(')):
      config_lib.validate(tiny(REJECTED_TASK[name], **{'verifier.name': name}), num_devices=8)
    return
  one_step(tiny(case, **{'verifier.name': name}), tmp_path, shared_pool, monkeypatch)


def test_dapo_with_overlong_shaping_runs_a_step(tmp_path, shared_pool, monkeypatch):
  _, metrics = one_step(tiny(**{'rl.dynamic_sampling': True, 'overlong.enabled': True,
                                'overlong.cache_len': 4}), tmp_path, shared_pool, monkeypatch)
  assert 'overlong/penalty_mean' in metrics and 'dynamic_sampling/filled_frac' in metrics


@pytest.mark.parametrize('field, value, match', [
    ('objective.policy_loss', 'is_grpo', 'proposal stds from an IS-GRPO prompt sampler'),
    ('objective.advantage', 'gae', 'needs the values V_t of a critic: set critic.enabled'),
    ('critic.enabled', True, "only objective.advantage='gae' reads"),
    ('objective.transforms', ('ifpo',), "data.task='arithmetic' has no behaviour_mode"),
    ('objective.loss_kwargs', {'eps': 0.2}, "loss_kwargs has 'eps', which ppo_clip does not"),
    ('objective.advantage_kwargs', {'lam': 0.9}, "advantage_kwargs has 'lam', which grpo"),
    ('overlong.cache_len', 9, r'overlong.cache_len=9 must be in \[0, 8\]'),
    ('objective.advantage_kwargs', {'scale': 'prompt'},
     r"advantage_kwargs.scale='prompt'; known: \('group', 'batch', 'none'\)"),
    ('objective.advantage_kwargs', {'nan_rewards': 'skip'},
     r"advantage_kwargs.nan_rewards='skip'; known: \('error', 'ignore'\)"),
    ('objective.kl_estimator', 'abs', "objective.kl_estimator='abs'; known:.*'k1_abs'"),
])
def test_combinations_that_cannot_run_are_rejected_at_start_up(field, value, match):
  with pytest.raises(ValueError, match=match):
    config_lib.validate(tiny(**{field: value}), num_devices=8)


@pytest.mark.parametrize('loss, kwargs, match', [
    ('cispo', {}, "loss_kwargs lacks 'cap', which cispo needs"),
    ('quatro', {}, "'quatro' needs objective.loss_kwargs.delta"),
    ('quatro', {'lam_B': 1.0}, "'quatro' needs objective.loss_kwargs.delta"),
    ('quatro_log_target', {}, "'quatro_log_target' needs objective.loss_kwargs.delta"),
    ('quatro_dual_ascent', {'delta': 0.1}, "loss_kwargs lacks 'lam_lr', which quatro_dual_ascent"),
    ('quatro_dual_ascent', {'delta': 0.1, 'lam_lr': 0.0}, 'loss_kwargs.lam_lr=0.0 must be > 0'),
    ('quatro_dual_ascent', {'delta': 0.1, 'lam_lr': 1.0, 'stabilizer': 'log'},
     r"loss_kwargs.stabilizer='log'; known: \('rho_log_rho', 'kl_generator'\)"),
    ('cispo', {'cap': 'absolute', 'max_weight': 5.0, 'level': 'seq'},
     r"loss_kwargs.level='seq'; known: \('token', 'sequence'\)"),
    ('sapo', {'tau_neg': 0.0}, 'loss_kwargs.tau_neg=0.0 must be > 0'),
    ('gspo', {'dual_clip': 0.9}, 'loss_kwargs.dual_clip=0.9 must be > 1'),
    ('ppo_clip', {'level': 'sequence'}, "loss_kwargs has 'level', which ppo_clip does not take"),
])
def test_losses_missing_a_required_option_are_rejected(loss, kwargs, match):
  c = tiny(**{'objective.policy_loss': loss, 'objective.loss_kwargs': kwargs})
  with pytest.raises(ValueError, match=match):
    config_lib.validate(c, num_devices=8)


class _InProcessPool:
  """The verifier pool's interface, scoring in this process (no workers, no deadline)."""

  def score(self, items, *, verifier, deadline_s):
    del deadline_s
    return [registry.get_verifier(verifier)(item) for item in items]


def _scored(texts, examples, *, task, group_size, lengths, judge_parts=None, **overrides):
  """rl_batch.score on given completion texts, with a fake run around the real verifiers."""
  import types
  from rlreason.rl import rl_batch
  from rlreason.structs import Rollout
  c = tiny(task, **overrides)
  n = len(texts)
  rollout = Rollout(prompts=None, tokens_NxL=jnp.zeros((n, 8), jnp.int32),
                    mask_NxL=jnp.ones((n, 8), bool), prefix_mask_NxL=jnp.zeros((n, 8), bool),
                    logprobs_NxL=jnp.zeros((n, 8)), behaviour_logprobs_NxL=jnp.zeros((n, 8)),
                    truncated_N=jnp.zeros(n, bool), lengths_N=jnp.asarray(lengths, jnp.int32),
                    group_size=group_size)
  run = types.SimpleNamespace(config=c, pool=_InProcessPool(), judge=None,
                              tok=types.SimpleNamespace(decode_batch=lambda ids, **kw: texts))
  run.__dict__.update(judge_parts or {})
  scores, _ = rl_batch.score(run, rollout, examples, progress=0.0)
  return run, scores


@pytest.mark.parametrize('jit', [False, True])
def test_ifpo_weights_policy_recall_responses_by_whether_they_consulted_the_rules(jit):
  # One prompt (gold POL-14), G = 4: rows 0-1 recite the rule then cite it (consulted, right),
  # row 2 recites it but cites nothing (consulted, wrong), row 3 cites it alone (direct, right).
  # Rewards [1, 1, 0, 1]: GRPO A = [0.25, 0.25, -0.75, 0.25] / 0.5 = [0.5, 0.5, -1.5, 0.5].
  # Modes [1, 1, 1, 0]: w = G / (K n_m) = 4 / (2·3) = 2/3 for mode 1, 4 / (2·1) = 2 for mode 0,
  # so A' = [1/3, 1/3, -1, 1]. (The old wiring passed the rewards as modes: weights 2/3 on the
  # right answers and 2 on the wrong one, whatever was consulted.)
  from rlreason import tasks
  from rlreason.rl import rl_batch
  example = tasks.get_task('policy_recall').generate(0, 0, difficulty=2)
  rule = example.solution.splitlines()[0]
  texts = [f'{rule}\n<policies>POL-14</policies>'] * 2 + [f'{rule}\n<policies></policies>',
                                                          '<policies>POL-14</policies>']
  run, scores = _scored(texts, [example], task='policy_recall', group_size=4,
                        lengths=[8] * 4, **{'objective.transforms': ('ifpo',)})
  np.testing.assert_array_equal(scores.modes_BxG, [[1, 1, 1, 0]])
  np.testing.assert_array_equal(scores.rewards_BxG, [[1.0, 1.0, 0.0, 1.0]])
  mask = jnp.ones((4, 8), bool)
  batch = types_batch(mask)
  fn = lambda r, m: rl_batch.advantages_for(run, rl_batch.Scores(r, r, m, {}), None, batch,
                                             progress=0.0)[0]
  adv = (jax.jit(fn) if jit else fn)(scores.rewards_BxG, scores.modes_BxG)
  np.testing.assert_allclose(adv[:, 0], [1 / 3, 1 / 3, -1.0, 1.0], rtol=1e-5)
  np.testing.assert_allclose(adv, jnp.broadcast_to(adv[:, :1], (4, 8)))


def test_nan_rewards_stop_the_loop_naming_the_rows_unless_ignored():
  # Rewards [[1, NaN, 0, 0]] (row 1 abstained). Default: an error naming row 1 and the field.
  # nan_rewards='ignore' (TRL): valid [1, 0, 0], mean 1/3, centred [2/3, -1/3, -1/3],
  # unbiased std sqrt((4/9 + 1/9 + 1/9)/2) = sqrt(1/3); A = [2/sqrt(3), 0, -1/sqrt(3) x2].
  from rlreason.rl import rl_batch
  rewards_BxG = np.array([[1.0, np.nan, 0.0, 0.0]], np.float32)
  modes_BxG = np.zeros((1, 4), np.int32)
  mask = jnp.ones((4, 3), bool)
  for kwargs, expected in (({}, None), ({'nan_rewards': 'ignore', 'eps': 0.0},
                                        [2 / np.sqrt(3), 0.0, -1 / np.sqrt(3), -1 / np.sqrt(3)])):
    run = types.SimpleNamespace(config=tiny(**{'objective.advantage_kwargs': kwargs}))
    scores = rl_batch.Scores(rewards_BxG, rewards_BxG, modes_BxG, {})
    if expected is None:
      with pytest.raises(ValueError, match=r"rows 1 \(prompt 0, sample 1\).*objective."
                                           r"advantage_kwargs.nan_rewards='ignore'"):
        rl_batch.advantages_for(run, scores, None, types_batch(mask), progress=0.0)
      continue
    adv, _ = rl_batch.advantages_for(run, scores, None, types_batch(mask), progress=0.0)
    np.testing.assert_allclose(adv, np.repeat(np.array(expected)[:, None], 3, 1), rtol=1e-6)


def types_batch(mask_NxL):
  from rlreason.structs import TrainBatch
  z = jnp.zeros(mask_NxL.shape)
  return TrainBatch(tokens_NxT=None, mask_NxT=None, loss_mask_NxL=mask_NxL, advantages_NxL=z,
                    old_logprobs_NxL=z, ref_logprobs_NxL=z, behaviour_logprobs_NxL=z,
                    prefix_mask_NxL=mask_NxL & False)


def test_overlong_shaping_uses_completion_lengths_and_dapo_filters_on_the_verifier_reward():
  # L_max = max_new_tokens = 8, cache 4: soft limit 4, penalty (4 - |y|) / 4 in (4, 8].
  # Lengths [8, 5 | 3, 3]: penalties [-1, -0.25 | 0, 0]. Both answers of group 0 are right
  # (verifier [1, 1]) and group 1's differ ([1, 0]).
  from rlreason import tasks
  from rlreason.rl import rl_batch
  examples = [tasks.get_task('arithmetic').generate(0, i, difficulty=1) for i in range(2)]
  texts = [examples[0].solution] * 2 + [examples[1].solution, 'no answer']
  run, scores = _scored(texts, examples, task='arithmetic', group_size=2, lengths=[8, 5, 3, 3],
                        **{'overlong.enabled': True, 'overlong.cache_len': 4})
  np.testing.assert_array_equal(scores.verifier_BxG, [[1.0, 1.0], [1.0, 0.0]])
  np.testing.assert_allclose(scores.rewards_BxG, [[0.0, 0.75], [1.0, 0.0]])
  # The shaped rewards of group 0 differ only through the length penalty: DAPO drops it.
  rollout = _rollout_of(4, 2)
  _, kept, filled = rl_batch.dynamic_filter([(rollout, scores)], 2)
  assert filled == 0.5
  np.testing.assert_array_equal(kept.verifier_BxG, [[1.0, 0.0], [1.0, 1.0]])
  # The overlong verifier itself reads the same token counts from its items.
  _, alone = _scored(texts, examples, task='arithmetic', group_size=2, lengths=[8, 5, 3, 3],
                     **{'verifier.name': 'overlong', 'overlong.cache_len': 4})
  np.testing.assert_allclose(alone.rewards_BxG, [[-1.0, -0.25], [0.0, 0.0]])


def _rollout_of(n, g):
  from rlreason.structs import Prompts, Rollout
  return Rollout(prompts=Prompts(tokens_BxP=jnp.zeros((n // g, 2), jnp.int32),
                                 mask_BxP=jnp.ones((n // g, 2), bool)),
                 tokens_NxL=jnp.arange(n * 3).reshape(n, 3), mask_NxL=jnp.ones((n, 3), bool),
                 prefix_mask_NxL=jnp.zeros((n, 3), bool), logprobs_NxL=jnp.zeros((n, 3)),
                 behaviour_logprobs_NxL=jnp.zeros((n, 3)), truncated_N=jnp.zeros(n, bool),
                 lengths_N=jnp.full(n, 3), group_size=g)


@pytest.mark.parametrize('name', sorted(TRANSFORM_CASES))
def test_transforms_on_token_advantages_equal_the_per_response_form(name):
  # Token-level advantages that are constant along each response (as a group estimator's,
  # broadcast) must transform exactly as the per-response advantages; padding stays 0.
  from rlreason.rl import rl_batch
  rewards_BxG = jnp.array([[1.0, 0.0, 0.0], [1.0, 1.0, 0.0]])
  modes_BxG = jnp.array([[0, 1, 1], [1, 1, 0]])
  adv_BxG = advantages.grpo(rewards_BxG)
  mask_NxL = jnp.arange(4)[None] < jnp.array([4, 2, 3, 1, 4, 2])[:, None]
  adv_NxL = jnp.where(mask_NxL, adv_BxG.reshape(-1)[:, None], 0.0)
  fn = advantage_transforms.get_transform(name)
  second = modes_BxG if name == 'ifpo' else rewards_BxG
  kw = rl_batch.transform_kwargs(name, {})
  per_response = fn(adv_BxG, second, **kw).reshape(-1)
  per_token = rl_batch._transform_tokens(fn, adv_NxL, second, kw)
  np.testing.assert_allclose(per_token, jnp.where(mask_NxL, per_response[:, None], 0.0),
                             rtol=1e-6)


def test_dapo_filters_on_the_verifier_reward_when_a_judge_is_on():
  # verifier + 0.5 judge, the judge giving [0.8, 0.2 | 0.4, 0.4]: group 0's verifier rewards
  # are [1, 1] (no outcome signal) but its combined ones differ ([1.4, 1.1]); group 1's are
  # [1, 0] -> [1.2, 0.2]. DAPO keeps group 1 first and group 0 only as masked filler.
  import types
  from rlreason import tasks
  from rlreason.rl import rl_batch
  from rlreason.verifiers import composition
  examples = [tasks.get_task('arithmetic').generate(0, i, difficulty=1) for i in range(2)]
  texts = [examples[0].solution] * 2 + [examples[1].solution, 'no answer']
  judge = types.SimpleNamespace(score=lambda prompts, texts, params: types.SimpleNamespace(
      rewards_N=[0.8, 0.2, 0.4, 0.4], metrics=lambda: {}))
  mix = composition.RewardComposition(weights={'verifier': 1.0, 'judge': 0.5})
  _, scores = _scored(texts, examples, task='arithmetic', group_size=2, lengths=[3] * 4,
                      judge_parts={'judge': judge, 'reward_mix': mix})
  np.testing.assert_allclose(scores.rewards_BxG, [[1.4, 1.1], [1.2, 0.2]], rtol=1e-6)
  np.testing.assert_array_equal(scores.verifier_BxG, [[1.0, 1.0], [1.0, 0.0]])
  rollout, kept, filled = rl_batch.dynamic_filter([(_rollout_of(4, 2), scores)], 2)
  assert filled == 0.5
  np.testing.assert_allclose(kept.rewards_BxG, [[1.2, 0.2], [1.4, 1.1]], rtol=1e-6)
  np.testing.assert_array_equal(np.asarray(rollout.mask_NxL).all(-1), [True, True, False, False])
