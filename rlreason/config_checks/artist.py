"""Start-up checks of ARTIST's role episodes (envs/artist.py, rollout/roles.py); agents.check_env
calls them for env.kind='artist'.
"""


def check_artist(c, check) -> None:
  """The task, the options, the role prompts' bucket and what the two-row episodes exclude."""
  from rlreason.envs import artist
  from rlreason.objectives import advantages
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
  from rlreason.config_checks import rows
  rows.check_rows_per_prompt(c, check, what="env.kind='artist'", rows='G episodes x 2 roles')
