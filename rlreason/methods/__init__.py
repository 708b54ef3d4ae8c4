"""The seed methods: what changes how rows are produced, scored or learned, one module each.

Each plugs into the loop through rl/extensions.py (`build(run)`, and its listed line in
extensions.METHODS): a rollout source (slate_steps, threads, partial_rollouts), batch and
score hooks (mixed_policy's HAPO injection, reward_model's mixing, monitors), the static
sampler's prefixes (soup), metrics of a built batch (cea, monitors' perplexity), a learner
schedule (r2po), an SFT teacher filter (rejection_sampling), evaluation samplers (threads,
diversity), a loop of its own (repirl), or a command-line evaluation (pot). dccot rewards
threads' episodes. The core (rl/) imports none of them.
"""
