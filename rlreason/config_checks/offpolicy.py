"""Checks of asynchronous sampling (rl.async_mode, rl/async_rl.py): the mode, the staleness,
the sampler process's CPUs and timeout, and the features the asynchronous loop does not
carry (each named with the field that turns it off)."""

import os

ASYNC_MODES = ('', 'inline', 'process')


def check_async(c, check) -> None:
  rl = c.rl
  mode = rl.get('async_mode', '')
  check(mode in ASYNC_MODES, f'rl.async_mode={mode!r}; known: {list(ASYNC_MODES)}.')
  k = rl.get('max_staleness', 0)
  check(isinstance(k, int) and k >= 0,
        f'rl.max_staleness={k!r} must be an integer >= 0 (0: the synchronous schedule).')
  if mode != 'process':
    check(not rl.get('sampler_cpus', ()),
          f"rl.sampler_cpus={tuple(rl.sampler_cpus)} pins the sampler process: it needs "
          "rl.async_mode='process'.")
  cpus = tuple(rl.get('sampler_cpus', ()))
  count = os.cpu_count() or 1  # Not this process's affinity: the learner may be pinned.
  check(all(isinstance(x, int) and 0 <= x < count for x in cpus),
        f'rl.sampler_cpus={cpus}: CPU ids of this machine (0..{count - 1}) expected.')
  check(rl.get('sampler_timeout_s', 1.0) > 0,
        f'rl.sampler_timeout_s={rl.get("sampler_timeout_s")} must be > 0.')
  if not mode:
    return
  unsupported = [('rl.dynamic_sampling', rl.dynamic_sampling), ('env.enabled', c.env.enabled),
                 ('hapo.enabled', c.hapo.enabled),
                 ('prefix_rollouts.enabled', c.prefix_rollouts.enabled),
                 ('judge.enabled', c.judge.enabled),
                 ('slate.enabled', c.get('slate') is not None and c.slate.enabled),
                 ('r2po.enabled', c.get('r2po') is not None and c.r2po.enabled),
                 ('lora.routing', c.lora.enabled and bool(c.lora.get('routing'))),
                 ('rl.partial_rollouts', rl.get('partial_rollouts', False)),
                 ('threads.enabled', c.get('threads') is not None and c.threads.enabled)]
  for field, on in unsupported:
    check(not on, f'rl.async_mode={mode!r} samples plain single-turn rollouts with the '
                  f'policy alone: {field} is not supported with it (turn one of them off).')
  check(c.get('sample_mesh', {}).get('kind', 'train') == 'train',
        f"rl.async_mode={mode!r} samples on the training mesh's layout: set "
        "sample_mesh.kind='train'.")
