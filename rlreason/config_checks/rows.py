"""Checks for episodes that train on several rows per prompt (MIND's typed turns, ARTIST's
roles): agents.py and artist.py both call it.
"""


def check_rows_per_prompt(c, check, *, what: str, rows: str) -> None:
  """Episodes that train on several rows per episode (`rows` per prompt) cannot use what
  reads rows in groups of rl.group_size: a group-shaped policy loss, dynamic sampling."""
  import inspect
  from rlreason.objectives import losses
  loss = losses.POLICY_LOSSES.get(c.objective.policy_loss)
  check(loss is None or 'group_size' not in inspect.signature(loss).parameters,
        f'objective.policy_loss={c.objective.policy_loss!r} reads rows in groups of '
        f"rl.group_size; with {what} a prompt's rows are {rows}.")
  check(not c.rl.dynamic_sampling, 'rl.dynamic_sampling selects groups of rl.group_size rows; '
                                   f'{what} has {rows} rows per prompt.')
