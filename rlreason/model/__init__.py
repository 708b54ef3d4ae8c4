"""The policy network and what surrounds it: weights in and out, tokens in and out, sharding.

  transformer  decoder-only transformer (Llama 3 / Qwen2 / Qwen3), explicit KV cache, value head
  layers       RMSNorm, attention, the gated MLP and the block as nnx modules
  rope         rotary position embeddings: frequencies (Llama 3 scaling), cos/sin tables
  kv_cache     the explicit KV cache and its frozen (shared-prefix) segments
  attention    blocked causal self-attention with a custom VJP; attention over cache segments
  weights      Hugging Face safetensors <-> params, streamed into their shardings
  tokenizer    HF tokenizer.json, BPE, sentencepiece, chat templates
  sharding     meshes, logical-axis rule tables, the CPU host split into devices
  lora         LoRA adapters as a pure transformation of the params (merge), target patterns
  quantize     int8 / NF4 storage of a frozen base (QLoRA)
  adapter_export  merged HF checkpoints and PEFT adapter directories

Imports nothing from the other stages.
"""
