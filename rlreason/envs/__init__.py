"""Environments and tools for multi-turn episodes: the host side. Never imports JAX.

  base         Environment protocol, ToolSpec / ToolCall / ToolResult, ToolError, run_tool
  registry     tool names -> tools: calculator, kb, timeseries (pure), search (bm25s),
               python and prolog (in the verifiers' sandbox)
  formats      tool calls out of the model's text and results back in, per chat template
  environment  ToolEnvironment: tool turns, then a final answer scored by a verifier
  render       the prompt and each observation's text, as the chat template writes them
  transcripts  episode transcripts (JSONL) and their readable print
  tasks        synthetic tool-use tasks (big products, multi-hop search, KB questions,
               time-series queries) and a flawed calculator teacher

Not here: decoding episodes on the device (rlreason/rollout/episodes.py), reward verifiers
(rlreason/verifiers).
"""
