"""Start-up checks of ARTIST's role episodes (envs/artist.py, rollout/roles.py); agents.check_env
calls them for env.kind='artist'.
"""


def check_artist(c, check) -> None:
  """The task, the options, the role prompts' bucket and what the two-row episodes exclude."""
  import inspect
  from rlreason.envs import artist
  from rlreason.objectives import advantages
  from rlreason.objectives import losses
  e, rl, o, d = c.env, c.rl, c.objective, c.data
  check(d.source == 'task' and d.task == artist.TASK,
        f"env.kind='artist' plays the roles on data.task={artist.TASK!r}; got "
        f'data.source={d.source!r}, data.task={d.task!r}.')
  options = dict(e.options)
  unknown = sorted(set(options) - set(artist.OPTIONS))
  check(not unknown, f"env.options {unknown} unknown for env.kind='artist'; known: "
                     f'{artist.OPTIONS}.')
  credit = options.get('credit', 'roles')
  check(credit in artist.CREDITS, f'env.options.credit={credit!r}; known: {artist.CREDITS}.')
  check(options.get('controller_reward', 'segment') in artist.CONTROLLER_REWARDS,
        f"env.options.controller_reward={options.get('controller_reward')!r}; known: "
        f'{artist.CONTROLLER_REWARDS}.')
  check(1 <= e.max_turn_tokens <= rl.max_new_tokens,
        f'env.max_turn_tokens={e.max_turn_tokens} must be in [1, rl.max_new_tokens='
        f'{rl.max_new_tokens}] (a row is one role\'s turn).')
  width = dict(d.task_options).get('width', 8)
  if d.task == artist.TASK and 1 <= d.difficulty <= 4 and isinstance(width, int) and width >= 2:
    need = artist.longest_prompt(d.difficulty, width)
    check(max(d.prompt_buckets) >= need,
          f'data.prompt_buckets={tuple(d.prompt_buckets)}: the role prompts need up to {need} '
          f'tokens at data.difficulty={d.difficulty}, width={width} (one bucket holds both '
          'roles\' rows).')
  else:
    check(False, f'data.difficulty={d.difficulty} must be in [1, 4] and '
                 f'data.task_options.width={width!r} an integer >= 2 for {artist.TASK!r}.')
  slate = c.get('slate') is not None and c.slate.enabled
  for section, on in (('hapo', c.hapo.enabled), ('prefix_rollouts', c.prefix_rollouts.enabled),
                      ('judge', c.judge.enabled), ('overlong', c.overlong.enabled),
                      ('env.rollback', e.rollback.enabled), ('slate', slate)):
    check(not on, f"{section}.enabled does not apply to env.kind='artist' episodes.")
  check(o.advantage not in advantages.TOKEN_LEVEL,
        f"env.kind='artist' gives each row (a role's turn) one advantage; "
        f'objective.advantage={o.advantage!r} is token-level.')
  if credit == 'roles':
    check(o.advantage == 'grpo' and set(o.advantage_kwargs) <= {'std_ddof', 'eps'} and
          not o.transforms,
          "env.options.credit='roles' normalises each role's group itself (rollout/roles.py): "
          "objective.advantage='grpo' with advantage_kwargs at most std_ddof and eps and no "
          f'objective.transforms; got {o.advantage!r}, {dict(o.advantage_kwargs)}, '
          f'{tuple(o.transforms)}.')
  loss = losses.POLICY_LOSSES.get(o.policy_loss)
  check(loss is None or 'group_size' not in inspect.signature(loss).parameters,
        f'objective.policy_loss={o.policy_loss!r} reads rows in groups of rl.group_size; with '
        "env.kind='artist' a prompt's rows are G episodes x 2 roles.")
  check(not rl.dynamic_sampling, 'rl.dynamic_sampling selects groups of rl.group_size rows; '
                                 "env.kind='artist' has G x 2 rows per prompt.")
