"""The start-up checks of a config tree: `validate` and what it calls.

`validate` checks the arithmetic a run depends on (batch splits, G against devices, token
budgets, registry names), and that the objective's pieces get every input they need
(`_check_objective`, `_check_verifier_items`), and raises one ValueError naming every
offending field. rlreason.config re-exports `validate`, `completion_length` and
`HEAPA_MODES`; the defaults live there.
"""

import functools

import ml_collections

from rlreason.config_checks import adapters
from rlreason.config_checks import agents
from rlreason.config_checks import distill
from rlreason.config_checks import inputs
from rlreason.config_checks import learned_rewards
from rlreason.config_checks import moe
from rlreason.config_checks.lengths import completion_length  # noqa: F401 (re-exported)
from rlreason.config_checks import monitoring
from rlreason.config_checks import objective
from rlreason.config_checks import offpolicy
from rlreason.config_checks import partial_rollouts
from rlreason.config_checks import threads


# HeaPA's boundary definitions (rl/prompt_schedule.py implements them).
HEAPA_MODES = ('medium', 'easy_medium')
# sft.filter's values: methods/rejection_sampling.py's FILTERS (tests/kbqa_r1_test.py checks).
SFT_FILTERS = ('unfiltered', 'answer', 'rrs')
# eval.diversity's values and the tasks with skeleton/paraphrase lists: methods/diversity.py's
# MODES and SKELETONS (tests/diversity_test.py checks).
DIVERSITY_MODES = ('iid', 'skeleton', 'paraphrase', 'comment')
DIVERSITY_TASKS = ('countdown',)


def validate(c: ml_collections.ConfigDict, *, num_devices: int) -> None:
  """Raises ValueError listing every inconsistent field; returns None when the config is sound."""
  from rlreason import tasks
  from rlreason.envs import tasks as env_tasks  # noqa: F401 (registers the tool-use tasks)
  from rlreason.model import sharding
  from rlreason.objectives import advantage_transforms
  from rlreason.objectives import advantages
  from rlreason.objectives import aggregation
  from rlreason.objectives import kl
  from rlreason.objectives import losses
  from rlreason.verifiers import registry

  errors = []

  def check(ok, message):
    if not ok:
      errors.append(message)

  rl = c.rl
  n = rl.prompts_per_step * rl.group_size
  check(rl.group_size >= 1, f'rl.group_size={rl.group_size} must be >= 1.')
  check(rl.prompts_per_step >= 1, f'rl.prompts_per_step={rl.prompts_per_step} must be >= 1.')
  check(rl.max_new_tokens > 0, f'rl.max_new_tokens={rl.max_new_tokens} must be > 0.')
  check(rl.decode_chunks >= 1, f'rl.decode_chunks={rl.decode_chunks} must be >= 1.')
  check(rl.get('sample_dtype', '') in ('', 'bfloat16'),
        f"rl.sample_dtype={rl.get('sample_dtype')!r}; known: '' (the model's), 'bfloat16'.")
  check(not (rl.get('sample_dtype', '') and c.env.enabled),
        'rl.sample_dtype applies to the single-turn sampler; env episodes sample in the '
        "model's dtype.")
  check(rl.get('sampler', 'static') in ('static', 'continuous'),
        f"rl.sampler={rl.get('sampler')!r}; known: 'static', 'continuous'.")
  if rl.get('sampler', 'static') == 'continuous':
    _check_continuous(c, check)
  partial_rollouts.check_partial_rollouts(c, check)
  check(rl.prompts_per_step % rl.minibatches == 0,
        f'rl.prompts_per_step={rl.prompts_per_step} is not divisible by '
        f'rl.minibatches={rl.minibatches} (minibatches hold whole groups).')
  per_minibatch = rl.prompts_per_step // max(rl.minibatches, 1)
  check(per_minibatch % rl.micro_batches == 0,
        f'{per_minibatch} prompts per minibatch do not split into '
        f'rl.micro_batches={rl.micro_batches} micro-batches of whole groups.')
  check(0 < rl.top_p <= 1, f'rl.top_p={rl.top_p} must be in (0, 1].')
  check(rl.temperature >= 0, f'rl.temperature={rl.temperature} must be >= 0.')
  try:
    shape = sharding.mesh_shape(dict(c.mesh), num_devices)
    rows = shape[0] * shape[1]
    check(n % rows == 0, f'rl.prompts_per_step * rl.group_size = {n} rows is not divisible '
                         f'by the data-parallel devices mesh.data * mesh.fsdp = {rows}.')
  except ValueError as e:
    errors.append(f'mesh: {e}')
  check(c.data.source in ('task', 'jsonl', 'parquet'),
        f"data.source={c.data.source!r}; known: 'task', 'jsonl', 'parquet'.")
  if c.data.source == 'task':
    check(c.data.task in tasks.TASKS, f'data.task={c.data.task!r}; known: {sorted(tasks.TASKS)}.')
  elif not c.data.path:
    errors.append(f'data.path is empty but data.source={c.data.source!r} needs a file.')
  check(max(c.data.prompt_buckets) > 0, 'data.prompt_buckets must hold a positive length.')
  check(c.model.init in ('random', 'hf'), f"model.init={c.model.init!r}; known: 'random', 'hf'.")
  if c.model.init == 'hf':
    check(bool(c.model.path), 'model.path is empty but model.init is "hf".')
  inputs.check_paths(c, check)
  inputs.check_reward(c, check)
  for field, registry_dict in (('advantage', advantages.ESTIMATORS),
                               ('policy_loss', losses.POLICY_LOSSES),
                               ('aggregation', aggregation.AGGREGATIONS),
                               ('kl_estimator', kl.KL_ESTIMATORS)):
    value = c.objective[field]
    check(value in registry_dict or (field == 'policy_loss' and value in losses.LIBRARY_ONLY)
          or (field == 'advantage' and value == 'slate'),  # SLATE's step rows (_check_slate).
          f'objective.{field}={value!r}; known: {sorted(registry_dict)}.')
  for name in c.objective.transforms:
    check(name in advantage_transforms.TRANSFORMS,
          f'objective.transforms has {name!r}; known: {sorted(advantage_transforms.TRANSFORMS)}.')
  try:
    registry.check_name(c.verifier.name)
  except ValueError as e:
    errors.append(f'verifier.name: {e}')
  check(c.verifier.deadline_s > 0, f'verifier.deadline_s={c.verifier.deadline_s} must be > 0.')
  check(c.eval.k >= 1, f'eval.k={c.eval.k} must be >= 1.')
  _check_mixed_policy(c, check)
  _check_sft_filter(c, check)
  if c.judge.enabled:
    from rlreason.rollout import judge
    for field, known in (('split', judge.SPLITTERS), ('aggregate', judge.AGGREGATES),
                         ('score', judge.SCORE_MODES), ('schedule', ('constant', 'linear'))):
      check(c.judge[field] in known, f'judge.{field}={c.judge[field]!r}; known: {sorted(known)}.')
    check(len(c.judge.labels) == 3, f'judge.labels={c.judge.labels} must be 3 strings.')
    check(bool(c.judge.model), "judge.model is empty; 'policy', an HF dir or 'random-tiny'.")
  objective.check_objective(c, check)
  objective.check_correction(c, check)
  offpolicy.check_async(c, check)
  check(c.env.enabled or not c.env.rollback.enabled,
        'env.rollback.enabled needs env.enabled (it rewrites tool-using episodes).')
  slate = c.get('slate') is not None and c.slate.enabled
  check(c.objective.advantage != 'slate' or slate,
        "objective.advantage='slate' reads SLATE's step rows: set slate.enabled.")
  if slate:
    agents.check_slate(c, check)
  if c.get('threads') is not None and c.threads.enabled:
    threads.check_threads(c, check)
  if c.get('dccot') is not None and c.dccot.enabled:
    threads.check_dccot(c, check)
  if c.env.enabled:
    agents.check_env(c, check)
  else:
    _check_verifier_items(c, check)
  _check_sandbox(c, check)
  if c.lora.enabled:
    adapters.check_lora(c, check)
  else:
    check(not c.lora.get('routing') and not c.lora.get('cea_every'),
          'lora.routing and lora.cea_every need lora.enabled=True.')
  if c.get('r2po') is not None and c.r2po.enabled:
    adapters.check_r2po(c, check)
  if c.get('reward_model') is not None:
    adapters.check_reward_model(c, check)
  if c.get('distill') is not None and c.distill.enabled:
    distill.check_distill(c, check)
  moe.check_moe_mesh(c, check)
  if c.get('repirl') is not None and c.repirl.enabled:
    learned_rewards.check_repirl(c, check)
  if c.judge.get('rubrics'):
    learned_rewards.check_scribe(c, check)
  if c.get('monitors') is not None:
    monitoring.check_monitors(c, check)
  if errors:
    raise ValueError('invalid config:\n  ' + '\n  '.join(errors))


def _check_sft_filter(c, check) -> None:
  """sft.filter 'answer' / 'rrs' execute a teacher's traces in the run's environment."""
  s = c.sft
  check(s.filter in SFT_FILTERS, f'sft.filter={s.filter!r}; known: {list(SFT_FILTERS)}.')
  n = s.get('num_demos', 0)
  check(isinstance(n, int) and n >= 0, f'sft.num_demos={n!r} must be an integer >= 0.')
  if s.filter != 'unfiltered' and s.steps > 0:
    check(c.env.enabled, f'sft.filter={s.filter!r} executes the teacher\'s traces in the '
                         'environment: set env.enabled and env.tools.')
    check(bool(s.teacher), f'sft.filter={s.filter!r} filters a teacher\'s traces: set '
                           'sft.teacher (e.g. rlreason.envs.kb_traces:kb_trace).')
    check(s.filter_tries >= 1, f'sft.filter_tries={s.filter_tries} must be >= 1.')


def _check_continuous(c, check) -> None:
  """rl.slots for continuous batching (rollout/continuous.py): whole groups, at most a step."""
  rl = c.rl
  n = rl.prompts_per_step * rl.group_size
  check(rl.slots >= rl.group_size and rl.slots % rl.group_size == 0,
        f'rl.slots={rl.slots} must be a positive multiple of rl.group_size={rl.group_size} '
        "(rl.sampler='continuous' admits a group into G slots at once).")
  check(rl.slots <= n, f'rl.slots={rl.slots} exceeds the rl.prompts_per_step * rl.group_size '
                       f'= {n} rows of a step.')
  if c.env.enabled:  # One tool-using episode per slot (rollout/continuous_episodes.py).
    for field, on in [('env.kind', c.env.get('kind', 'tools') != 'tools'),
                      ('env.state', c.env.get('state', 'raw') != 'raw'),
                      ('env.rollback.enabled', c.env.rollback.enabled),
                      ('lora.routing', c.lora.enabled and bool(c.lora.get('routing')))]:
      check(not on, f"rl.sampler='continuous' runs plain tool episodes (one per slot): "
                    f"{field} is not supported with it (set rl.sampler='static').")


def _check_sandbox(c, check) -> None:
  """A verifier that runs model-written code needs strong isolation, or an explicit yes."""
  from rlreason.verifiers import registry
  from rlreason.verifiers import sandbox
  if c.verifier.name not in registry.RUNS_CODE:
    return
  try:
    sandbox.check_isolation(allow_weak=c.verifier.get('allow_weak_sandbox', False),
                            what=f'verifier {c.verifier.name!r}')
  except RuntimeError as e:
    check(False, f'verifier.allow_weak_sandbox=False: {e}')


def _check_mixed_policy(c, check) -> None:
  """Prompt schedule, HAPO, prefix rollouts and export fields."""
  import inspect
  from rlreason.objectives import losses
  d, h, p = c.data, c.hapo, c.prefix_rollouts
  check(d.schedule in ('uniform', 'heapa'),
        f"data.schedule={d.schedule!r}; known: 'uniform', 'heapa'.")
  if d.schedule == 'heapa':
    check(d.heapa.pool_size >= c.rl.prompts_per_step,
          f'data.heapa.pool_size={d.heapa.pool_size} must be >= rl.prompts_per_step='
          f'{c.rl.prompts_per_step} (a batch is drawn from the pool).')
    check(0 < d.heapa.low_fraction < 1,
          f'data.heapa.low_fraction={d.heapa.low_fraction} must be in (0, 1).')
    check(d.heapa.mode in HEAPA_MODES,
          f'data.heapa.mode={d.heapa.mode!r}; known: {HEAPA_MODES}.')
    check(d.heapa.fresh_per_step >= 0,
          f'data.heapa.fresh_per_step={d.heapa.fresh_per_step} must be >= 0.')
  if h.enabled:
    from rlreason.objectives import advantage_transforms
    gates = advantage_transforms.HAPO_GATES
    check(h.gate in gates, f'hapo.gate={h.gate!r}; known: {gates}.')
    check(h.anneal_steps >= 0, f'hapo.anneal_steps={h.anneal_steps} must be >= 0 (0: fixed).')
    check(0 <= h.threshold <= 1, f'hapo.threshold={h.threshold} must be in [0, 1].')
    if h.gate == 'confidence':
      check(0 < h.confidence < 1, f"hapo.confidence={h.confidence} must be in (0, 1) with "
                                  "hapo.gate='confidence'.")
    else:
      check(not h.confidence, f"hapo.confidence={h.confidence} is read only by "
                              f"hapo.gate='confidence' (hapo.gate={h.gate!r}).")
    check(h.teacher_behaviour in ('learner', 'one'),
          f"hapo.teacher_behaviour={h.teacher_behaviour!r}; known: 'learner', 'one'.")
  if c.eval.get('diversity', 'iid') != 'iid':
    check(c.eval.diversity in DIVERSITY_MODES,
          f'eval.diversity={c.eval.diversity!r}; known: {DIVERSITY_MODES}.')
    check(c.eval.diversity == 'comment' or c.data.task in DIVERSITY_TASKS,
          f'eval.diversity={c.eval.diversity!r} has no schedule for data.task={c.data.task!r} '
          f'(tasks with one: {DIVERSITY_TASKS}).')
    check(not c.env.enabled, f'eval.diversity={c.eval.diversity!r} samples plain completions; '
          'env.enabled episodes are not supported.')
  if p.enabled:
    check(p.max_tokens >= 1, f'prefix_rollouts.max_tokens={p.max_tokens} must be >= 1.')
    check(0 <= p.rows_per_group <= c.rl.group_size,
          f'prefix_rollouts.rows_per_group={p.rows_per_group} must be in [0, rl.group_size].')
    check(p.refresh_every >= 0, f'prefix_rollouts.refresh_every={p.refresh_every} must be >= 0.')
    check(p.keep >= 1, f'prefix_rollouts.keep={p.keep} must be >= 1.')
    check(p.keep == 1 or p.refresh_every, f'prefix_rollouts.keep={p.keep} keeps older '
          'snapshots, but refresh_every=0 never takes one after the warm start.')
    check(p.age_decay > 0, f'prefix_rollouts.age_decay={p.age_decay} must be > 0.')
    loss = losses.POLICY_LOSSES.get(c.objective.policy_loss)
    check(loss is None or 'prefix_mask_NxL' in inspect.signature(loss).parameters,
          f'prefix_rollouts.enabled needs a policy loss that treats prefix tokens apart; '
          f'objective.policy_loss={c.objective.policy_loss!r} ignores them (use '
          "'prefix_mixed_ppo').")
  check(c.export.dtype in ('', 'float32', 'bfloat16', 'float16'),
        f"export.dtype={c.export.dtype!r}; known: '', 'float32', 'bfloat16', 'float16'.")


def _check_verifier_items(c, check) -> None:
  """A registered verifier must be able to read the synthetic task's items.

  Probed once per (verifier, task) on the task's first 8 examples with their reference
  solutions: a verifier that answers invalid_input to all of them (a missing field, e.g.
  python_tests' `tests`) would give every row the default reward. Files (jsonl/parquet) and
  custom verifiers are not probed.
  """
  from rlreason.verifiers import registry
  if c.data.source != 'task' or c.verifier.name not in registry.VERIFIERS:
    return
  import json
  from rlreason import tasks
  if c.data.task not in tasks.TASKS:
    return
  status, detail = _probe_verifier(c.verifier.name, c.data.task, c.data.difficulty,
                                   json.dumps(dict(c.data.task_options), sort_keys=True))
  check(status != 'invalid_input',
        f'verifier.name={c.verifier.name!r} cannot score data.task={c.data.task!r} items: '
        f'{detail} (pick a verifier whose fields the task supplies).')


@functools.lru_cache(maxsize=64)
def _probe_verifier(name: str, task: str, difficulty: int, options_json: str):
  import json
  from rlreason import tasks
  from rlreason.tasks.example import verifier_item
  from rlreason.verifiers import registry
  details = []
  for index in range(8):
    example = tasks.get_task(task).generate(0, index, difficulty=difficulty,
                                            **json.loads(options_json))
    item = verifier_item(example, example.solution, num_tokens=1, max_len=2, cache_len=1,
                         penalty_factor=1.0)
    verdict = registry.get_verifier(name)(item)
    if verdict.status != 'invalid_input':
      return verdict.status, verdict.detail
    details.append(verdict.detail)
  return 'invalid_input', details[0]
