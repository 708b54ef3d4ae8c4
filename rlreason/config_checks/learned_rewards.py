"""Start-up checks of the rewards learned or judged beyond a verifier: rePIRL's loop
(methods/repirl.py) and SCRIBE's rubric routing (rollout/scribe.py)."""


def check_repirl(c, check) -> None:
  """rePIRL replaces the RL loop: single-turn completions of a task with expert traces."""
  r = c.repirl
  for name in ('expert_per_prompt', 'prm_steps'):
    check(r[name] >= 1, f'repirl.{name}={r[name]} must be >= 1.')
  check(r.prm_lr > 0, f'repirl.prm_lr={r.prm_lr} must be > 0.')
  check(r.alpha >= 0 and r.reward_l2 >= 0,
        f'repirl.alpha={r.alpha} and repirl.reward_l2={r.reward_l2} must be >= 0.')
  check(c.rl.group_size >= 2, f'repirl: rl.group_size={c.rl.group_size}; the leave-one-out '
                              'baseline needs >= 2 samples per prompt.')
  check(c.rl.temperature == 1.0, f'repirl: rl.temperature={c.rl.temperature}; rePIRL samples at '
                                 "1.0 (its IS weights and entropy are the policy's own).")
  for other, on in (('env', c.env.enabled), ('lora', c.lora.enabled),
                    ('judge', c.judge.enabled), ('reward_model.path', bool(c.reward_model.path)),
                    ('reward_model.train', c.reward_model.train.enabled)):
    check(not on, f'repirl.enabled with {other}: not supported together (rePIRL learns its '
                  'own reward for single-turn completions); turn one off.')


def check_scribe(c, check) -> None:
  """A named rubric library and what to do with a step it does not route."""
  from rlreason.rollout import scribe
  j = c.judge
  check(j.rubrics in scribe.LIBRARIES,
        f'judge.rubrics={j.rubrics!r}; known libraries: {sorted(scribe.LIBRARIES)}.')
  check(j.unrouted in scribe.UNROUTED,
        f'judge.unrouted={j.unrouted!r}; known: {list(scribe.UNROUTED)}.')
  check(j.enabled, 'judge.rubrics routes the model judge\'s steps: set judge.enabled.')
