"""The completion length L every check and the loop size the batch by (a module of its own:
the package's __init__ re-exports it and its checks import it)."""


def completion_length(config) -> int:
  """L: sampled tokens, after an older policy's prefix when prefix_rollouts are on."""
  p = config.prefix_rollouts
  return config.rl.max_new_tokens + (p.max_tokens if p.enabled else 0)
