"""Start-up checks of on-policy distillation (methods/distill.py): its fields, and the
combinations it refuses, each named (rlreason.config_checks.validate calls them).

Supported: the static sampler, episodes (the teacher scores only the trained tokens, never
an episode's observations: the loss mask), the critic, every rollout source of a method.
Refused: LoRA students, asynchronous rollouts, continuous batching, R²PO (a second learner
schedule) and a self-normalising policy loss with form 'token_kl' (its weights' global sum
would be taken from the advantages before the teacher's replace them).
"""

FORMS = ('token_kl', 'full_kl')
DTYPES = ('float32', 'bfloat16')


def check_distill(c, check) -> None:
  """distill.* when distill.enabled."""
  from rlreason.config_checks import inputs
  from rlreason.objectives import losses
  d = c.distill
  check(bool(d.teacher), 'distill.teacher is empty: an HF directory or a .gguf file '
                         "('pkg:<package>/<file>.gguf' too).")
  for field in ('teacher', 'tokenizer'):  # tokenizer '': the teacher's own.
    if inputs._local(d[field]):  # pylint: disable=protected-access
      check(inputs._exists(d[field]), f'distill.{field}={d[field]!r} does not exist.')  # pylint: disable=protected-access
  check(d.form in FORMS, f'distill.form={d.form!r}; known: {list(FORMS)}.')
  check(d.dtype in DTYPES, f'distill.dtype={d.dtype!r}; known: {list(DTYPES)}.')
  for name in ('weight', 'discount', 'beta'):
    check(0.0 <= d[name] <= 1.0, f'distill.{name}={d[name]} must be in [0, 1].')
  check(d.discount == 0.0 or d.form == 'token_kl',
        f"distill.discount={d.discount} sums the sampled-token signal: form 'token_kl' only, "
        f'not {d.form!r}.')
  refused = (('lora.enabled', c.lora.enabled, 'a LoRA student'),
             ('rl.async_mode', bool(c.rl.get('async_mode', '')), 'asynchronous rollouts'),
             ("rl.sampler='continuous'", c.rl.get('sampler', 'static') == 'continuous',
              'continuous batching'),
             ('r2po.enabled', c.get('r2po') is not None and c.r2po.enabled,
              "R²PO's stages (a second learner schedule)"))
  for field, on, what in refused:
    check(not on, f'distill.enabled with {field}: {what} is not supported with on-policy '
                  'distillation yet; turn one off.')
  o = c.objective
  check(d.form != 'token_kl' or not losses.self_normalising(o.policy_loss, o.loss_kwargs),
        f"distill.form='token_kl' with objective.policy_loss={o.policy_loss!r} (self-normalising"
        "): its weights' sum would not see the teacher's advantages; use form 'full_kl' or "
        "another loss.")
