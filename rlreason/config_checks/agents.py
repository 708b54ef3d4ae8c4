"""Start-up checks of environment episodes: tools, MIND's typed state, Prolog's protocols,
SLATE's step rows (rlreason.config_checks.validate calls them).
"""

from rlreason.config_checks import rows


def check_env(c, check) -> None:
  """Tool names, the format, the verifier and the episode's token budgets."""
  from rlreason.envs import formats
  from rlreason.envs import registry as tool_registry
  from rlreason.verifiers import registry
  if c.env.get('kind', 'tools') == 'artist':  # ARTIST's roles (config_checks/artist.py).
    from rlreason.config_checks import artist
    return artist.check_artist(c, check)
  e, rl = c.env, c.rl
  if e.get('kind', 'tools') == 'prolog':
    return check_prolog(c, check)
  if e.get('kind', 'tools') != 'tools' or e.get('state', 'raw') != 'raw':
    return check_mind(c, check)  # MIND's patient and typed state: no tools.
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


def check_mind(c, check) -> None:
  """MIND's simulated patient and typed evidence state (envs/patient.py,
  rollout/typed_episodes.py)."""
  from rlreason.envs import patient
  from rlreason.objectives import advantages
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
  rows.check_rows_per_prompt(c, check, what="env.state='typed'", rows='G x env.max_turns')


def check_prolog(c, check) -> None:
  """Prolog-as-a-Tool's protocols (envs/prolog_protocols.py)."""
  from rlreason.envs import prolog_protocols as pp
  e, rl = c.env, c.rl
  options = dict(e.options)
  unknown = sorted(set(options) - set(pp.OPTIONS))
  check(not unknown, f"env.options {unknown} unknown for env.kind='prolog'; known: {pp.OPTIONS}.")
  protocol, tries = options.get('protocol', 'single'), options.get('tries', 1)
  check(protocol in pp.PROTOCOLS, f'env.options.protocol={protocol!r}; known: {pp.PROTOCOLS}.')
  check(isinstance(tries, int) and tries >= 1 and (protocol != 'single' or tries == 1),
        f"env.options.tries={tries!r} must be an integer >= 1, and 1 with protocol='single'.")
  check(options.get('reward', 'correctness') in pp.REWARDS,
        f"env.options.reward={options.get('reward')!r}; known: {sorted(pp.REWARDS)}.")
  check(isinstance(tries, int) and e.max_turns >= tries,
        f'env.max_turns={e.max_turns} must be >= env.options.tries={tries!r} (a turn per try).')
  check(e.get('state', 'raw') == 'raw', f"env.state={e.get('state')!r}: env.kind='prolog' "
                                       "episodes keep the raw conversation.")
  check(e.family == 'tags', f"env.family={e.family!r}: env.kind='prolog' writes the 'tags' "
                            'text format only.')
  check(1 <= e.max_turn_tokens <= rl.max_new_tokens,
        f'env.max_turn_tokens={e.max_turn_tokens} must be in [1, rl.max_new_tokens='
        f'{rl.max_new_tokens}].')
  check(tries == 1 or e.max_observation_tokens >= 1,
        f'env.max_observation_tokens={e.max_observation_tokens} must be >= 1 with tries > 1.')
  slate = c.get('slate') is not None and c.slate.enabled
  for section, on in (('hapo', c.hapo.enabled), ('prefix_rollouts', c.prefix_rollouts.enabled),
                      ('judge', c.judge.enabled), ('overlong', c.overlong.enabled),
                      ('env.rollback', e.rollback.enabled), ('slate', slate)):
    check(not on, f"{section}.enabled does not apply to env.kind='prolog' episodes.")


def check_slate(c, check) -> None:
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
