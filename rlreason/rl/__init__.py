"""The RL loop and the steps it is made of.

  train            the one impure loop: data -> sample -> verify -> advantages -> update -> log
  async_rl         the sampler up to rl.max_staleness steps ahead (a process or inline)
  rl_batch         one step's batch: verification, dynamic sampling, advantages
  run_setup        a run built once from its config: model, tokenizer, data, pool, jitted steps
  sft              the supervised warm start: teacher solutions and the SFT loop
  adapters         LoRA runs: the frozen base, the trained adapter, the merged policy
  update           init_state, logprobs_step, train_step, sft_step: pure and jittable
  evaluate         pass@k / mean@k / maj@k on held-out prompts (python -m rlreason.rl.evaluate)
  prompt_schedule  which prompts a step trains on
  mixed_policy     HAPO's teacher injection, prefixes sampled by an older snapshot
  checkpoint       orbax state + data-iterator state; exact resume
  metrics          TensorBoard, JSONL and progress writers

The top of the import graph: nothing else in the package imports rl/.
"""
