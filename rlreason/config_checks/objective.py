"""Start-up checks of the objective: every estimator, loss, transform and off-policy correction
gets the inputs and options it needs (rlreason.config_checks.validate calls them).
"""

from rlreason.config_checks import lengths


# Inputs the loop hands a policy loss (update._policy_loss_kwargs) or an estimator
# (rl_batch.advantages_for) by name; every other option comes from the config's kwargs.
_LOOP_LOSS_INPUTS = frozenset({'group_size', 'prefix_mask_NxL', 'behavior_logprobs_NxL',
                               'behaviour_logprobs_NxL', 'turn_ids_NxL', 'num_turns'})
_LOOP_ESTIMATOR_INPUTS = {'otb': frozenset({'group_size'}), 'gae': frozenset(),
                          'opo': frozenset({'lengths_BxG'}),
                          'reinforce_pp_baseline': frozenset({'lengths_BxG'})}


def options_of(fn, *, given, supplied, what, check) -> None:
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


def option_values(what, options, check, *, passk=False) -> None:
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


def check_objective(c, check) -> None:
  """Every registered estimator, loss and transform gets the inputs it needs from the loop."""
  from rlreason.objectives import advantage_transforms
  from rlreason.objectives import advantages
  from rlreason.objectives import losses
  o, critic = c.objective, c.critic
  if o.policy_loss in losses.LIBRARY_ONLY:
    check(False, f'objective.policy_loss={o.policy_loss!r} {losses.LIBRARY_ONLY[o.policy_loss]}.')
  loss = losses.POLICY_LOSSES.get(o.policy_loss)
  if loss is not None:
    options_of(loss, given=dict(o.loss_kwargs), supplied=_LOOP_LOSS_INPUTS,
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
    option_values('objective.loss_kwargs', dict(o.loss_kwargs), check)
  estimator = advantages.ESTIMATORS.get(o.advantage)
  if estimator is not None:
    options_of(estimator, given=dict(o.advantage_kwargs),
                supplied=_LOOP_ESTIMATOR_INPUTS.get(o.advantage, frozenset()) | {'zero_tail'},
                what='objective.advantage_kwargs', check=check)
    option_values('objective.advantage_kwargs', dict(o.advantage_kwargs), check,
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
    options_of(fn, given=dict(o.transform_kwargs.get(name, {})), supplied={'num_modes'},
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
  length, ov = lengths.completion_length(c), c.overlong
  check(0 <= ov.cache_len <= length, f'overlong.cache_len={ov.cache_len} must be in '
                                     f'[0, {length}] (the completion length L_max).')
  check(ov.penalty_factor >= 0, f'overlong.penalty_factor={ov.penalty_factor} must be >= 0.')


def check_correction(c, check) -> None:
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
  options_of(fn, given=options, supplied=set(), what='objective.correction_kwargs', check=check)
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
