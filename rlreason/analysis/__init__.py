"""Mechanistic analysis tools on the JAX model, for the perplexity-paradox study (issue #23 6).

  logit_lens  the residual stream after every layer, each read out through the final norm and
              the unembedding (per-layer next-token log-probs)
  patching    activation patching of the residual stream between two parameter sets, path
              patching (only chosen sublayers read B's inputs), and parameter (component)
              patching: which layers carry a run's change
  perplexity  prompt-token vs answer-token perplexity of a batch (also logged during training
              with monitors.perplexity)

Below rl/ (rl may import it for the training-time metric; it imports model/ only).
"""
