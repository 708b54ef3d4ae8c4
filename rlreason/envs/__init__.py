"""Environments and tools for multi-turn episodes: the host side. Never imports JAX.

  base       Environment protocol, ToolSpec / ToolCall / ToolResult, ToolError, run_tool
  registry   tool names -> tools (calculator, python, prolog, search, kb, timeseries)
  formats    tool schemas into the prompt and tool calls out of the model's text, per chat template

Not here: decoding episodes on the device (rlreason/rollout, later), reward verifiers
(rlreason/verifiers).
"""
