"""Start-up checks of the reward-hacking monitors (methods/monitors.py): `monitors.*`
(rlreason.config_checks.validate calls `check_monitors`)."""

# methods/monitors.py's MONITORS and STOP_POLICIES (tests/monitors_test.py checks they agree).
MONITORS = ('audit', 'agreement', 'length', 'template', 'judge')
STOP_POLICIES = ('', 'warn', 'stop')


def check_monitors(c, check) -> None:
  """Known monitor names and stop policy, a positive audit sample and window, thresholds >= 0,
  and an audit verifier the registry knows."""
  from rlreason.verifiers import registry
  m = c.monitors
  unknown = sorted(set(m.which) - set(MONITORS))
  check(not unknown, f'monitors.which has {unknown}; known: {list(MONITORS)}.')
  check(m.stop in STOP_POLICIES,
        f"monitors.stop={m.stop!r}; known: '' (log only), 'warn', 'stop'.")
  check(not m.stop or m.enabled, f'monitors.stop={m.stop!r} needs monitors.enabled=True.')
  for name in ('audit_size', 'judge_sample', 'patience'):
    check(isinstance(m[name], int) and m[name] >= 1, f'monitors.{name}={m[name]!r} must be an '
                                                     'integer >= 1.')
  check(isinstance(m.window, int) and m.window >= 2,
        f'monitors.window={m.window!r} must be an integer >= 2 (a trend needs two steps).')
  for name in ('judge_tol', 'max_disagreement', 'max_length_corr', 'max_template_lift',
               'min_judge_agreement'):
    check(m[name] >= 0, f'monitors.{name}={m[name]} must be >= 0 (0: off).')
  check(m.max_length_corr <= 1 and m.max_disagreement <= 1 and m.min_judge_agreement <= 1,
        'monitors.max_length_corr, max_disagreement and min_judge_agreement are fractions <= 1.')
  check(isinstance(m.template_tokens, (tuple, list))
        and all(isinstance(t, str) and t for t in m.template_tokens),
        f'monitors.template_tokens={m.template_tokens!r} must be a tuple of non-empty strings.')
  check(not m.enabled or not c.env.enabled,
        'monitors.enabled reads single-turn training batches; env episodes are rewarded by '
        'their environment (not supported yet).')
  if m.audit_verifier:
    try:
      registry.get_verifier(m.audit_verifier)
    except (KeyError, ValueError, ImportError, AttributeError) as e:
      check(False, f'monitors.audit_verifier={m.audit_verifier!r} is not a known verifier: {e}')
