"""Start-up checks of fork/join threads (config.threads; rollout/fork_join.py, methods/threads.py)."""


def check_threads(c, check) -> None:
  """Budgets, markers, and the modes threaded rows cannot combine with."""
  from rlreason.objectives import advantages
  t, rl = c.threads, c.rl
  for field in ('max_workers', 'parent_tokens', 'worker_tokens', 'final_tokens',
                'max_header_tokens'):
    check(isinstance(t[field], int) and t[field] >= 1,
          f'threads.{field}={t[field]!r} must be an integer >= 1.')
  known = ('spawn', 'sep', 'end', 'worker_open', 'join_open', 'join_sep', 'join_close')
  unknown = sorted(set(t.markers) - set(known))
  check(not unknown, f'threads.markers has unknown key(s) {unknown}; known: {list(known)}.')
  check(isinstance(t.get('trie_packing', False), bool),
        f'threads.trie_packing={t.get("trie_packing")!r} must be True or False.')
  if t.get('trie_packing') and isinstance(t.max_workers, int) and t.max_workers >= 1:
    rows = rl.prompts_per_step // max(rl.minibatches, 1) * rl.group_size  # episodes per minibatch
    check(rows % max(rl.micro_batches, 1) == 0,
          f'threads.trie_packing packs whole episodes: rl.micro_batches={rl.micro_batches} must '
          f'divide the {rows} episodes of a minibatch (rl.prompts_per_step / rl.minibatches x '
          'rl.group_size).')
  check(c.objective.advantage not in advantages.TOKEN_LEVEL,
        f'threads.enabled gives one reward per episode over its 1 + threads.max_workers rows: '
        f'objective.advantage={c.objective.advantage!r} is token-level; use a group estimator '
        "(e.g. 'grpo').")
  check(rl.get('sampler', 'static') == 'static',
        "threads.enabled samples with the static sampler: set rl.sampler='static'.")
  check(not rl.get('async_mode', ''), 'threads.enabled runs in the synchronous loop: set '
                                      "rl.async_mode=''.")
  check(c.eval.get('diversity', 'iid') == 'iid',
        f"threads.enabled evaluates fork/join episodes (rl/evaluate.py): eval.diversity="
        f"{c.eval.get('diversity')!r} samples single threads; set eval.diversity='iid'.")
  for name, on in (('env', c.env.enabled), ('slate', c.get('slate') and c.slate.enabled),
                   ('hapo', c.hapo.enabled), ('prefix_rollouts', c.prefix_rollouts.enabled),
                   ('judge', c.judge.enabled), ('overlong', c.overlong.enabled),
                   ('critic', c.get('critic') and c.critic.enabled),
                   ('reward_model', c.get('reward_model') and c.reward_model.path)):
    check(not on, f'threads.enabled does not combine with {name} (its rows are single '
                  'completions or episodes, not threads).')


def check_dccot(c, check) -> None:
  """DC-CoT's stage rewards (methods/dccot.py) score threaded episodes; weights are non-negative."""
  from rlreason.tasks import parallel_sums
  d = c.dccot
  check(c.get('threads') is not None and c.threads.enabled,
        'dccot.enabled rewards threaded episodes: set threads.enabled.')
  check(isinstance(d.stage1_steps, int) and d.stage1_steps >= 0,
        f'dccot.stage1_steps={d.stage1_steps!r} must be an integer >= 0.')
  for field in ('path_weight', 'format_weight', 'worker_weight'):
    check(isinstance(d[field], (int, float)) and d[field] >= 0,
          f'dccot.{field}={d[field]!r} must be a number >= 0.')
  options = dict(c.data.task_options)
  if c.data.task == 'parallel_sums' and c.get('threads') is not None:
    groups = options.get('groups', parallel_sums.DEFAULT_GROUPS)
    check(groups <= c.threads.max_workers,
          f'dccot: data.task_options groups={groups} exceeds threads.max_workers='
          f'{c.threads.max_workers} (the director spawns one worker per group).')
