"""Checks of rl.partial_rollouts (methods/partial_rollouts.py) and rl.sample_memory_gb: what a
carried sampler pool needs, and the features that draw or rewrite a step's rows some other
way (each named with the field that turns it off). The memory estimate itself needs the
model's shapes: rl/memory.check_sample_memory runs it when the run is built."""


def check_partial_rollouts(c, check) -> None:
  rl = c.rl
  gb = rl.get('sample_memory_gb', 0.0)
  check(isinstance(gb, (int, float)) and gb >= 0,
        f'rl.sample_memory_gb={gb!r} must be a number >= 0 (0: no check).')
  check(not gb or rl.get('sampler', 'static') == 'continuous',
        f"rl.sample_memory_gb={gb} bounds the continuous sampler's slots: it needs "
        "rl.sampler='continuous' (or set it to 0).")
  if not rl.get('partial_rollouts', False):
    check(not rl.get('partial_recompute', False),
          'rl.partial_recompute re-prefills carried rows: it needs rl.partial_rollouts=True.')
    return
  check(rl.get('sampler', 'static') == 'continuous',
        "rl.partial_rollouts carries unfinished rows of the continuous sampler's slots: set "
        f"rl.sampler='continuous' (rl.sampler={rl.get('sampler', 'static')!r}).")
  unsupported = [('rl.dynamic_sampling', rl.dynamic_sampling),
                 ('rl.async_mode', bool(rl.get('async_mode', ''))),
                 ('prefix_rollouts.enabled', c.prefix_rollouts.enabled),
                 ('hapo.enabled', c.hapo.enabled), ('env.enabled', c.env.enabled),
                 ('threads.enabled', c.get('threads') is not None and c.threads.enabled)]
  for field, on in unsupported:
    check(not on, f'rl.partial_rollouts draws each step\'s groups from its carried pool: '
                  f'{field} is not supported with it (turn one of them off).')
