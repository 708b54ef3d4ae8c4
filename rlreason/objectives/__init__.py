"""What the learner optimises, as pure functions: advantages, policy losses, KL, aggregation.

  advantages, advantage_transforms  rewards_BxG -> advantages (GRPO family, OTB, GAE, ...)
  losses, trust_region              per-token policy-loss terms (PPO-clip, CISPO, GSPO, QUATRO, ...)
  kl, aggregation                   KL estimators; micro-batch-invariant loss aggregation
  loss_diagnostics, token_stats     ratio/clip diagnostics; per-token log-probs and entropy

Each formula's source is in its docstring (../shared/algorithms.md). Never imports rl/.
"""
