"""The RL loop and what every run needs; methods plug in through extensions.py.

  train             the one impure loop: data -> sample -> verify -> advantages -> update -> log
  extensions        the registry of methods (rlreason/methods/) and the loop's extension points
  async_rl          the sampler up to rl.max_staleness steps ahead (a process or inline)
  rl_batch          one step's batch: verification, dynamic sampling, advantages
  episode_sampling  the environment's episodes as a rollout source, and their transcripts
  run_setup         a run built once from its config: model, tokenizer, data, pool, jitted steps
  sft               the supervised warm start: teacher solutions and the SFT loop
  adapters          LoRA runs: the frozen base, the trained adapter, the merged policy
  update            init_state, logprobs_step, train_step, sft_step: pure and jittable
  evaluate          pass@k / mean@k / maj@k on held-out prompts (python -m rlreason.rl.evaluate)
  prompt_schedule   which prompts a step trains on
  memory            memory estimates and the sampler's memory check
  checkpoint        orbax state + data-iterator state; exact resume
  metrics           TensorBoard, JSONL and progress writers
  timing            wall time per phase of a step

Above it: methods/ (which imports rl/), dynamics/ and main. rl/ imports no method module.
"""
