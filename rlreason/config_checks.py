"""The start-up checks of a config tree: `validate` and what it calls.

`validate` checks the arithmetic a run depends on (batch splits, G against devices, token
budgets, registry names), and that the objective's pieces get every input they need
(`_check_objective`, `_check_verifier_items`), and raises one ValueError naming every
offending field. rlreason.config re-exports `validate`, `completion_length` and
`HEAPA_MODES`; the defaults live there.
"""

import functools

import ml_collections


# HeaPA's boundary definitions (rl/prompt_schedule.py implements them).
HEAPA_MODES = ('medium', 'easy_medium')
# sft.filter's values: rl/rejection_sampling.py's FILTERS (tests/kbqa_r1_test.py checks).
SFT_FILTERS = ('unfiltered', 'answer', 'rrs')


def completion_length(config) -> int:
  """L: sampled tokens, after an older policy's prefix when prefix_rollouts are on."""
  p = config.prefix_rollouts
  return config.rl.max_new_tokens + (p.max_tokens if p.enabled else 0)


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
  _check_objective(c, check)
  _check_correction(c, check)
  check(c.env.enabled or not c.env.rollback.enabled,
        'env.rollback.enabled needs env.enabled (it rewrites tool-using episodes).')
  slate = c.get('slate') is not None and c.slate.enabled
  check(c.objective.advantage != 'slate' or slate,
        "objective.advantage='slate' reads SLATE's step rows: set slate.enabled.")
  if slate:
    _check_slate(c, check)
  if c.env.enabled:
    _check_env(c, check)
  else:
    _check_verifier_items(c, check)
  _check_sandbox(c, check)
  if c.lora.enabled:
    _check_lora(c, check)
  else:
    check(not c.lora.get('routing') and not c.lora.get('cea_every'),
          'lora.routing and lora.cea_every need lora.enabled=True.')
  if c.get('r2po') is not None and c.r2po.enabled:
    _check_r2po(c, check)
  if c.get('reward_model') is not None:
    _check_reward_model(c, check)
  if errors:
    raise ValueError('invalid config:\n  ' + '\n  '.join(errors))


def _check_sft_filter(c, check) -> None:
  """sft.filter 'answer' / 'rrs' execute a teacher's traces in the run's environment."""
  s = c.sft
  check(s.filter in SFT_FILTERS, f'sft.filter={s.filter!r}; known: {list(SFT_FILTERS)}.')
  if s.filter != 'unfiltered' and s.steps > 0:
    check(c.env.enabled, f'sft.filter={s.filter!r} executes the teacher\'s traces in the '
                         'environment: set env.enabled and env.tools.')
    check(bool(s.teacher), f'sft.filter={s.filter!r} filters a teacher\'s traces: set '
                           'sft.teacher (e.g. rlreason.envs.kb_traces:kb_trace).')
    check(s.filter_tries >= 1, f'sft.filter_tries={s.filter_tries} must be >= 1.')


def _check_r2po(c, check) -> None:
  """R²PO's schedule and what it cannot be combined with (rl/r2po.py)."""
  switches = tuple(c.r2po.switch_steps)
  check(all(isinstance(s, int) and s >= 0 for s in switches)
        and list(switches) == sorted(set(switches)),
        f'r2po.switch_steps={switches!r}: strictly increasing step numbers >= 0.')
  check(c.r2po.init_std > 0, f'r2po.init_std={c.r2po.init_std!r} must be > 0 (the reference '
        'draws the head from N(0, 1e-6)).')
  for other in ('lora', 'prefix_rollouts', 'hapo'):
    check(not c[other].enabled, f'r2po.enabled with {other}.enabled: not supported together '
          f'(the rollout head is a second trainable tree the {other} path does not carry); '
          'turn one off.')


def _check_reward_model(c, check) -> None:
  """A learned reward's path and options, and its training settings (rl/reward_model.py)."""
  import pathlib
  r, t = c.reward_model, c.reward_model.train
  if r.path:
    check(pathlib.Path(r.path, 'reward_model.json').exists(),
          f'reward_model.path={r.path!r} is not a reward model directory (no reward_model.json; '
          'train one with reward_model.train.enabled=True).')
    check(r.transform in ('sigmoid', 'raw'),
          f"reward_model.transform={r.transform!r}; known: 'sigmoid', 'raw'.")
    check(r.weight >= 0 and r.verifier_weight >= 0,
          f'reward_model.weight={r.weight} and verifier_weight={r.verifier_weight} must be >= 0.')
    check(not c.env.enabled, 'reward_model.path scores single-turn completions; env episodes '
                             'are rewarded by their environment.')
    check(not t.enabled, 'reward_model.train.enabled trains a reward model; reward_model.path '
                         'uses one in an RL run: set one of them.')
  if t.enabled:
    check(t.mode in ('pointwise', 'pairwise'),
          f"reward_model.train.mode={t.mode!r}; known: 'pointwise', 'pairwise'.")
    for name in ('steps', 'batch_size', 'problems', 'traces_per_problem', 'eval_problems'):
      check(t[name] >= 1, f'reward_model.train.{name}={t[name]} must be >= 1.')
    check(t.lr > 0, f'reward_model.train.lr={t.lr} must be > 0.')
    check(bool(c.sft.teacher), 'reward_model.train labels the answers of sft.teacher: set it '
                               '(e.g. rlreason.tasks.arithmetic:flawed_solution).')
    check(c.data.source == 'task', 'reward_model.train draws problems from a synthetic task '
                                   "(data.source='task').")


def _check_continuous(c, check) -> None:
  """rl.slots for continuous batching (rollout/continuous.py): whole groups, at most a step."""
  rl = c.rl
  n = rl.prompts_per_step * rl.group_size
  check(rl.slots >= rl.group_size and rl.slots % rl.group_size == 0,
        f'rl.slots={rl.slots} must be a positive multiple of rl.group_size={rl.group_size} '
        "(rl.sampler='continuous' admits a group into G slots at once).")
  check(rl.slots <= n, f'rl.slots={rl.slots} exceeds the rl.prompts_per_step * rl.group_size '
                       f'= {n} rows of a step.')
  check(not c.env.enabled, "rl.sampler='continuous' samples single-turn rollouts; env.enabled "
                           "episodes use rollout/episodes.py (set rl.sampler='static').")


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
  if p.enabled:
    check(p.max_tokens >= 1, f'prefix_rollouts.max_tokens={p.max_tokens} must be >= 1.')
    check(0 <= p.rows_per_group <= c.rl.group_size,
          f'prefix_rollouts.rows_per_group={p.rows_per_group} must be in [0, rl.group_size].')
    check(p.refresh_every >= 0, f'prefix_rollouts.refresh_every={p.refresh_every} must be >= 0.')
    loss = losses.POLICY_LOSSES.get(c.objective.policy_loss)
    check(loss is None or 'prefix_mask_NxL' in inspect.signature(loss).parameters,
          f'prefix_rollouts.enabled needs a policy loss that treats prefix tokens apart; '
          f'objective.policy_loss={c.objective.policy_loss!r} ignores them (use '
          "'prefix_mixed_ppo').")
  check(c.export.dtype in ('', 'float32', 'bfloat16', 'float16'),
        f"export.dtype={c.export.dtype!r}; known: '', 'float32', 'bfloat16', 'float16'.")


# Inputs the loop hands a policy loss (update._policy_loss_kwargs) or an estimator
# (rl_batch.advantages_for) by name; every other option comes from the config's kwargs.
_LOOP_LOSS_INPUTS = frozenset({'group_size', 'prefix_mask_NxL', 'behavior_logprobs_NxL',
                               'behaviour_logprobs_NxL', 'turn_ids_NxL', 'num_turns'})
_LOOP_ESTIMATOR_INPUTS = {'otb': frozenset({'group_size'}), 'gae': frozenset(),
                          'opo': frozenset({'lengths_BxG'}),
                          'reinforce_pp_baseline': frozenset({'lengths_BxG'})}


def _options_of(fn, *, given, supplied, what, check) -> None:
  """`given` options must be keyword-only parameters of fn; required ones must be given."""
  import inspect
  params = inspect.signature(fn).parameters
  keyword = {k for k, p in params.items() if p.kind == p.KEYWORD_ONLY}
  for k in sorted(set(given) - keyword):
    check(False, f'{what} has {k!r}, which {fn.__name__} does not take; it takes '
                 f'{sorted(keyword - supplied)}.')
  for k in sorted(keyword - supplied - set(given)):
    check(params[k].default is not params[k].empty, f'{what} lacks {k!r}, which '
                                                    f'{fn.__name__} needs.')


def _check_option_values(what, options, check, *, passk=False) -> None:
  """Named choices and ranges of estimator and loss options, checked before anything runs."""
  from rlreason.objectives import advantages
  from rlreason.objectives import soft_losses
  choices = {'scale': ('group', 'none') if passk else advantages.GRPO_SCALES,
             'nan_rewards': advantages.NAN_REWARDS, 'level': soft_losses.LEVELS,
             'cap': ('relative', 'absolute'), 'whiten_over': ('responses', 'tokens')}
  for key, known in choices.items():
    if key in options:
      check(options[key] in known, f'{what}.{key}={options[key]!r}; known: {known}.')
  if options.get('dual_clip') is not None:
    check(options['dual_clip'] > 1, f"{what}.dual_clip={options['dual_clip']} must be > 1.")
  for key in ('tau_pos', 'tau_neg'):
    if key in options:
      check(options[key] > 0, f'{what}.{key}={options[key]} must be > 0.')


def _check_objective(c, check) -> None:
  """Every registered estimator, loss and transform gets the inputs it needs from the loop."""
  from rlreason.objectives import advantage_transforms
  from rlreason.objectives import advantages
  from rlreason.objectives import losses
  o, critic = c.objective, c.critic
  if o.policy_loss in losses.LIBRARY_ONLY:
    check(False, f'objective.policy_loss={o.policy_loss!r} {losses.LIBRARY_ONLY[o.policy_loss]}.')
  loss = losses.POLICY_LOSSES.get(o.policy_loss)
  if loss is not None:
    _options_of(loss, given=dict(o.loss_kwargs), supplied=_LOOP_LOSS_INPUTS,
                what='objective.loss_kwargs', check=check)
    if o.policy_loss.startswith('quatro'):
      check('delta' in o.loss_kwargs and 'lam_B' not in o.loss_kwargs,
            f"objective.policy_loss={o.policy_loss!r} needs objective.loss_kwargs.delta (the "
            'KL radius); lam_B (a λ table keyed by prompt) needs per-prompt state the loop does '
            "not keep ('quatro_dual_ascent' steps λ from the closed-form dual instead).")
      if 'delta' in o.loss_kwargs:
        check(o.loss_kwargs['delta'] > 0,
              f"objective.loss_kwargs.delta={o.loss_kwargs['delta']} must be > 0.")
      if 'lam_lr' in o.loss_kwargs:
        check(o.loss_kwargs['lam_lr'] > 0,
              f"objective.loss_kwargs.lam_lr={o.loss_kwargs['lam_lr']} must be > 0.")
      if 'stabilizer' in o.loss_kwargs:
        known = ('rho_log_rho', 'kl_generator')
        check(o.loss_kwargs['stabilizer'] in known,
              f"objective.loss_kwargs.stabilizer={o.loss_kwargs['stabilizer']!r}; known: {known}.")
    if o.policy_loss == 'sorl':
      kw = dict(o.loss_kwargs)
      for key, known in (('turn_ratio', losses.SORL_TURN_RATIOS),
                         ('normalization', losses.SORL_NORMALIZATIONS)):
        check(kw.get(key, known[0]) in known,
              f'objective.loss_kwargs.{key}={kw.get(key)!r}; known: {known}.')
      check(not losses.self_normalising('sorl', kw) or o.aggregation == 'token_mean',
            "objective.policy_loss='sorl' with normalization 'reliability' divides by its "
            "weights' global sum (Σ ω ℓ / Σ ω), which needs objective.aggregation='token_mean', "
            f'not {o.aggregation!r}.')
  if loss is not None:
    _check_option_values('objective.loss_kwargs', dict(o.loss_kwargs), check)
  estimator = advantages.ESTIMATORS.get(o.advantage)
  if estimator is not None:
    _options_of(estimator, given=dict(o.advantage_kwargs),
                supplied=_LOOP_ESTIMATOR_INPUTS.get(o.advantage, frozenset()) | {'zero_tail'},
                what='objective.advantage_kwargs', check=check)
    _check_option_values('objective.advantage_kwargs', dict(o.advantage_kwargs), check,
                         passk=o.advantage == 'grpo_passk')
  check(dict(o.advantage_kwargs).get('nan_rewards') != 'ignore' or not o.transforms,
        "objective.advantage_kwargs.nan_rewards='ignore' cannot be combined with "
        f'objective.transforms={tuple(o.transforms)}: they read the raw rewards, NaN included.')
  check(o.advantage != 'gae' or critic.enabled,
        "objective.advantage='gae' needs the values V_t of a critic: set critic.enabled=True "
        '(a value head on the policy, trained with the clipped value loss).')
  check(o.advantage == 'gae' or not critic.enabled,
        f'critic.enabled trains a value head that only objective.advantage=\'gae\' reads; '
        f'objective.advantage={o.advantage!r} would ignore it.')
  if critic.enabled:
    check(critic.lr > 0, f'critic.lr={critic.lr} must be > 0.')
    check(critic.coef > 0, f'critic.coef={critic.coef} must be > 0.')
    check(critic.clip is None or critic.clip > 0, f'critic.clip={critic.clip} must be > 0.')
  for name in o.transforms:
    fn = advantage_transforms.TRANSFORMS.get(name)
    if fn is None:
      continue
    _options_of(fn, given=dict(o.transform_kwargs.get(name, {})), supplied={'num_modes'},
                what=f'objective.transform_kwargs[{name!r}]', check=check)
  if 'ifpo' in o.transforms:
    from rlreason import tasks
    has_modes = c.data.source == 'task' and tasks.behaviour_mode_fn(c.data.task) is not None
    check(has_modes, "objective.transforms has 'ifpo', which weights responses by their behaviour "
                     f'mode, but data.source={c.data.source!r} / data.task={c.data.task!r} has no '
                     "behaviour_mode (the 'policy_recall' task has: consulted the rules or not).")
    modes = dict(o.transform_kwargs.get('ifpo', {})).get('num_modes', 2)
    check(isinstance(modes, int) and modes >= 2,
          f"objective.transform_kwargs['ifpo'].num_modes={modes} must be an int >= 2.")
  length, ov = completion_length(c), c.overlong
  check(0 <= ov.cache_len <= length, f'overlong.cache_len={ov.cache_len} must be in '
                                     f'[0, {length}] (the completion length L_max).')
  check(ov.penalty_factor >= 0, f'overlong.penalty_factor={ov.penalty_factor} must be >= 0.')


def _check_correction(c, check) -> None:
  """The off-policy correction's name and options (caps > 0, intervals 0 <= low < high)."""
  import inspect
  from rlreason.objectives import losses
  from rlreason.objectives import offpolicy
  o = c.objective
  name, options = o.get('correction', ''), dict(o.get('correction_kwargs', {}))
  if not name:
    check(not options, f'objective.correction_kwargs={options} is set but objective.correction '
                       "is '' (no correction).")
    return
  fn = offpolicy.CORRECTIONS.get(name)
  if fn is None:
    check(False, f"objective.correction={name!r}; known: {[''] + sorted(offpolicy.CORRECTIONS)}.")
    return
  _options_of(fn, given=options, supplied=set(), what='objective.correction_kwargs', check=check)
  for error in offpolicy.option_errors(name, options):
    check(False, f'objective.correction_kwargs.{error}')
  loss = losses.POLICY_LOSSES.get(o.policy_loss)
  reads_behaviour = loss is not None and bool(
      {'behavior_logprobs_NxL', 'behaviour_logprobs_NxL'} & set(inspect.signature(loss).parameters))
  check(not (reads_behaviour and c.prefix_rollouts.enabled),
        f'objective.correction={name!r} weights tokens by π_prox/π_behaviour, but '
        f'objective.policy_loss={o.policy_loss!r} already takes the ratio of prefix tokens '
        'against their behaviour log-probs (prefix_rollouts.enabled): they would be corrected '
        'twice.')


def _check_env(c, check) -> None:
  """Tool names, the format, the verifier and the episode's token budgets."""
  from rlreason.envs import formats
  from rlreason.envs import registry as tool_registry
  from rlreason.verifiers import registry
  e, rl = c.env, c.rl
  if e.get('kind', 'tools') != 'tools' or e.get('state', 'raw') != 'raw':
    return _check_mind(c, check)  # MIND's patient and typed state: no tools.
  check(bool(e.tools), 'env.tools is empty; name the tools an episode offers, e.g. '
                       "('calculator',).")
  unknown = [t for t in e.tools if t not in tool_registry.TOOLS]
  check(not unknown, f'env.tools names unknown tool(s) {unknown}; known: '
                     f'{sorted(tool_registry.TOOLS)}.')
  check(e.family in formats.FORMATS, f'env.family={e.family!r}; known: {sorted(formats.FORMATS)}.')
  try:
    registry.check_name(e.verifier)
  except ValueError as err:
    check(False, f'env.verifier: {err}')
  check(e.max_turns >= 1, f'env.max_turns={e.max_turns} must be >= 1.')
  check(1 <= e.max_turn_tokens <= rl.max_new_tokens,
        f'env.max_turn_tokens={e.max_turn_tokens} must be in [1, rl.max_new_tokens='
        f'{rl.max_new_tokens}] (rl.max_new_tokens is the whole episode\'s token budget).')
  check(e.max_turns == 1 or e.max_observation_tokens >= 1,
        f'env.max_observation_tokens={e.max_observation_tokens} must be >= 1.')
  check(e.deadline_s is None or e.deadline_s > 0, f'env.deadline_s={e.deadline_s} must be > 0.')
  slate = c.get('slate') is not None and c.slate.enabled  # Its model judge is `judge`'s.
  for section in ('hapo', 'prefix_rollouts') + (() if slate else ('judge',)):
    check(not c[section].enabled, f'{section}.enabled does not apply to env episodes (their '
                                  'rows are conversations, not single completions).')
  check(not c.overlong.enabled, 'overlong.enabled does not apply to env episodes.')
  if e.rollback.enabled:
    from rlreason.rollout import rollback
    for error in rollback.config_errors(e.rollback, tools=tuple(e.tools), max_turns=e.max_turns):
      check(False, error)


def _check_mind(c, check) -> None:
  """MIND's simulated patient and typed evidence state (envs/patient.py,
  rollout/typed_episodes.py)."""
  import inspect
  from rlreason.envs import patient
  from rlreason.objectives import advantages
  from rlreason.objectives import losses
  e, rl, o = c.env, c.rl, c.objective
  check(e.kind in ('tools', 'patient'), f"env.kind={e.kind!r}; known: 'tools', 'patient'.")
  check(e.state in patient.STATES, f'env.state={e.state!r}; known: {patient.STATES}.')
  if e.kind != 'patient':
    check(e.state == 'raw', f"env.state={e.state!r} needs an environment with a typed state: "
                            "env.kind='patient'.")
    return
  check(c.data.source == 'task' and c.data.task == patient.TASK,
        f"env.kind='patient' plays the patients of data.task={patient.TASK!r}; got "
        f'data.source={c.data.source!r}, data.task={c.data.task!r}.')
  options = dict(e.options)
  unknown = sorted(set(options) - set(patient.OPTIONS))
  check(not unknown, f'env.options {unknown} unknown for the patient; known: {patient.OPTIONS}.')
  check(all(options.get(k, 0) >= 0 for k in ('info_gain_coef', 'ask_cost')),
        f'env.options={options}: info_gain_coef and ask_cost must be >= 0.')
  check(options.get('gain', 'entropy') in patient.GAINS,
        f"env.options.gain={options.get('gain')!r}; known: {patient.GAINS}.")
  check(e.max_turns >= 1, f'env.max_turns={e.max_turns} must be >= 1.')
  check(1 <= e.max_turn_tokens <= rl.max_new_tokens,
        f'env.max_turn_tokens={e.max_turn_tokens} must be in [1, rl.max_new_tokens='
        f'{rl.max_new_tokens}].')
  check(e.state == 'typed' or e.max_turns == 1 or
        e.max_observation_tokens >= patient.LONGEST_OBSERVATION,
        f'env.max_observation_tokens={e.max_observation_tokens} cannot hold the patient\'s '
        f'longest answer ({patient.LONGEST_OBSERVATION} characters): such episodes would end '
        'truncated.')
  slate = c.get('slate') is not None and c.slate.enabled
  for section, on in (('hapo', c.hapo.enabled), ('prefix_rollouts', c.prefix_rollouts.enabled),
                      ('judge', c.judge.enabled), ('overlong', c.overlong.enabled),
                      ('env.rollback', e.rollback.enabled), ('slate', slate)):
    check(not on, f"{section}.enabled does not apply to env.kind='patient' episodes.")
  if e.state != 'typed':
    return
  check(o.advantage not in advantages.TOKEN_LEVEL,
        f"env.state='typed' repeats each episode's group advantage over its turn rows; "
        f'objective.advantage={o.advantage!r} is token-level.')
  loss = losses.POLICY_LOSSES.get(o.policy_loss)
  check(loss is None or 'group_size' not in inspect.signature(loss).parameters,
        f"objective.policy_loss={o.policy_loss!r} reads rows in groups of rl.group_size; with "
        "env.state='typed' a group's rows are G episodes x env.max_turns turns.")
  check(not rl.dynamic_sampling, "rl.dynamic_sampling selects groups of rl.group_size rows; "
                                 "env.state='typed' has G x env.max_turns rows per prompt.")


def _check_slate(c, check) -> None:
  """SLATE's rows, estimator and judge (rollout/slate.py)."""
  from rlreason.rollout import episodes
  s, e, rl, o = c.slate, c.env, c.rl, c.objective
  check(e.enabled, 'slate.enabled samples the steps of env episodes: set env.enabled and '
                   'env.tools.')
  check(isinstance(s.k, int) and s.k >= 1, f'slate.k={s.k!r} must be an integer >= 1.')
  check(s.eta >= 0, f'slate.eta={s.eta} must be >= 0 (0: the argmax continuation).')
  check(s.lambda_bonus >= 0, f'slate.lambda_bonus={s.lambda_bonus} must be >= 0.')
  check(s.judge in ('rule', 'model'), f"slate.judge={s.judge!r}; known: 'rule', 'model'.")
  if s.judge == 'rule':
    check(c.data.task == 'search_qa' and tuple(e.tools) == ('search',),
          "slate.judge='rule' is search_qa's rule judge: data.task='search_qa' and "
          f"env.tools=('search',), got {c.data.task!r} and {tuple(e.tools)}.")
  else:
    check(c.judge.enabled, "slate.judge='model' scores steps with the `judge` block's model: "
                           'set judge.enabled.')
  check(rl.group_size == s.k * e.max_turns,
        f'rl.group_size={rl.group_size} must be slate.k x env.max_turns = '
        f'{s.k * e.max_turns} (one row per candidate step).')
  check(o.advantage == 'slate' and set(o.advantage_kwargs) <= {'eps'},
        "slate.enabled needs objective.advantage='slate' (A over each step's slate.k rows; "
        f"advantage_kwargs: at most 'eps'), got {o.advantage!r} with {dict(o.advantage_kwargs)}.")
  need = episodes.cache_slots(e.max_turns, e.max_turn_tokens, e.max_observation_tokens)
  check(rl.max_new_tokens >= need,
        f'rl.max_new_tokens={rl.max_new_tokens} < {need}: a SLATE row holds every earlier step '
        'and observation plus one candidate (env.max_turns x max_turn_tokens + (max_turns - 1) '
        'x max_observation_tokens).')
  check(not rl.dynamic_sampling, 'rl.dynamic_sampling does not apply to SLATE step rows.')


def _check_lora(c, check) -> None:
  """What can be checked before the model is known; model/lora.check does the rest (targets
  that match nothing, a rank above a layer's) when the run is built."""
  from rlreason.model import lora
  lc = c.lora
  check(isinstance(lc.rank, int) and lc.rank > 0, f'lora.rank={lc.rank!r} must be an integer > 0.')
  check(lc.alpha > 0, f'lora.alpha={lc.alpha} must be > 0.')
  check(lc.dropout == 0, f'lora.dropout={lc.dropout}: only 0 is supported (the adapter is merged '
                         'into the weights; model/lora.py says why).')
  check(lc.quantize in lora.QUANTIZE_MODES,
        f'lora.quantize={lc.quantize!r}; known: {list(lora.QUANTIZE_MODES)}.')
  check(bool(lc.targets), 'lora.targets is empty; e.g. ("q", "k", "v", "o").')
  check(not c.prefix_rollouts.enabled, 'prefix_rollouts.enabled is not supported with LoRA yet '
                                       '(its snapshots are full params).')
  routing = lc.get('routing', '')
  check(not c.export.peft_path or bool(c.export.path) or routing == 'dart',
        f'export.peft_path={c.export.peft_path!r} needs export.path (the merged model) too.')
  _check_dart(c, check, routing)


def _check_dart(c, check, routing: str) -> None:
  """lora.routing and lora.cea_every (model/dart.py, rl/cea.py)."""
  from rlreason.model import dart
  lc, e = c.lora, c.env
  check(routing in ('', 'dart'), f"lora.routing={routing!r}; known: '' (one adapter), 'dart'.")
  cea_every = lc.get('cea_every', 0)
  check(isinstance(cea_every, int) and cea_every >= 0,
        f'lora.cea_every={cea_every!r} must be an integer >= 0 (0: off).')
  if routing != 'dart' and not cea_every:
    return
  what = "lora.routing='dart'" if routing == 'dart' else f'lora.cea_every={cea_every}'
  check(e.enabled and e.get('kind', 'tools') == 'tools' and e.family in dart.OPEN_TAGS,
        f"{what} splits tokens by the env's call tags: it needs env.enabled with tools and "
        f'env.family in {sorted(dart.OPEN_TAGS)} (got enabled={e.enabled}, family={e.family!r}'
        '; llama3 calls have no open tag).')
  if routing != 'dart':
    return
  check(not c.export.path, f'export.path={c.export.path!r}: a merged HF checkpoint cannot '
        "represent lora.routing='dart' (each token picks its adapter); set export.path='' and "
        'export.peft_path to write both adapters in PEFT format (peft_path/reason, /tool).')
  for field, on in (('env.rollback.enabled', e.get('rollback', {}).get('enabled', False)),
                    ('slate.enabled', c.slate.enabled),
                    ("env.state='typed'", e.get('state', 'raw') == 'typed')):
    check(not on, f"{field} is not supported with lora.routing='dart' (its loop feeds tokens "
                  'through the cache without carrying the routing state).')


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
