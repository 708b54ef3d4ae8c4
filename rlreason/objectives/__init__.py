"""What the learner optimises, as pure functions: advantages, policy losses, KL, aggregation.

  advantages, token_advantages      rewards -> advantages (GRPO family, OPO, pass@k; per token
                                    REINFORCE++, OTB, GAE)
  advantage_transforms              F-GRPO, A-GRAE, IFPO; DAPO's and HAPO's data operators
  losses, soft_losses, ratios,      per-token policy-loss terms (PPO-clip, GSPO, SORL; CISPO,
    trust_region, quatro_variants   SAPO; shared ratio helpers; QUATRO; its [I] variants)
  kl, aggregation                   KL estimators; micro-batch-invariant loss aggregation
  loss_diagnostics, token_stats     ratio/clip diagnostics; per-token log-probs and entropy

Each formula's source is in its docstring (../shared/algorithms.md). Never imports rl/.
"""
