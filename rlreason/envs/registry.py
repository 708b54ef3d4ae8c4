"""Tool names -> tool objects, imported on first use so a missing dependency names the tool."""

import importlib

from rlreason.envs import base

# name -> "module:attribute" of a module-level Tool instance.
TOOLS = {
    'calculator': 'rlreason.envs.calculator:TOOL',
    'kb': 'rlreason.envs.kb:TOOL',
    'timeseries': 'rlreason.envs.timeseries:TOOL',
    'search': 'rlreason.envs.search:TOOL',
    'python': 'rlreason.envs.python_tool:TOOL',
    'prolog': 'rlreason.envs.prolog_tool:TOOL',
}


def get_tool(name: str) -> base.Tool:
  if name not in TOOLS:
    raise ValueError(f'unknown tool {name!r}; known: {", ".join(sorted(TOOLS))}')
  module, attr = TOOLS[name].split(':')
  return getattr(importlib.import_module(module), attr)


def get_tools(names) -> dict[str, base.Tool]:
  """Every named tool, or a ValueError naming the first unknown one (checked at start-up)."""
  return {name: get_tool(name) for name in names}
