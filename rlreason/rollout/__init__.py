"""Sampling from the policy: grouped rollouts with exact behaviour log-probs, and model judges.

  sampler   prefill once per prompt, share its KV segment with G rows, chunked decode -> Rollout
  sampling  one step's next token: temperature, top-k, exact top-p, both log-probs
  judge     a model-judged step reward through the sampler

Builds on model/; never imports rl/.
"""
