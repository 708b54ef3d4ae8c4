"""Times tool episodes with a heavy-tailed turn count: the static episode loop vs continuous
batching (rollout/continuous_episodes.py) with the same number of slots.

  python -m experiments.bench.continuous_episodes --runs 2
  python -m experiments.bench.continuous_episodes --smoke      # tiny, 1 run: checks it runs

B prompts x G episodes; each example's episode lasts T turns, T ~ lognormal (median
--median_turns, sigma --sigma) rounded and clipped to [1, --max_turns], the same T for a
group (a fake instant tool ends the episode after T turns and otherwise answers a few
characters). The tokenizer has no EOS and there are no stop sequences, so every turn samples
exactly --turn_tokens tokens and both paths do the same useful work. Static: the episode loop
(episodes.run_episodes) on slots // G prompts at a time, one call after the other, each as
long as its longest episode. Continuous: one call with `slots` rows. Random weights (a
Qwen2-style model of --hidden / --layers), fp32. tokens/s = sampled tokens / median wall time
of --runs calls after a warm-up (compiling) call. The load average is printed (the machine may
be shared). Final line: continuous_episodes_speedup=<static wall / continuous wall>.

Measured 2026-12-02 on the shared 2-core VM with the defaults (32 prompts x G=4, slots=32,
turns mean 2.09, max 8, p99/median 3.5; d=256, 4 layers), never quiet: load 15.4 -> 15.8,
`--runs 3`: static 10.71 / 10.71 / 9.48 s, continuous 6.89 / 5.07 / 7.22 s, speedup 1.555
(400 vs 623 sampled tokens/s); earlier runs at load 15-21 gave 1.307 (--runs 2) and 1.427
(--chunk_steps 8, --runs 3), before each slot's cache was cut from P + L + O to
P + min(L, cache_slots) + O columns. The decode-step bound for this mix is 2.4x (static: 320
steps of its four calls; continuous: 134 slot-filled steps); the rest goes to host round trips
per chunk, one admission call per group and the per-slot (vmapped) cache writes.
"""

import argparse
import dataclasses
import os
import statistics
import string
import sys
import time

if __package__ in (None, ''):  # Run as a script: make `rlreason` importable.
  sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

import jax  # noqa: E402
import numpy as np  # noqa: E402

from rlreason.envs import base  # noqa: E402
from rlreason.envs import environment  # noqa: E402
from rlreason.envs import render  # noqa: E402
from rlreason.envs import tasks as env_tasks  # noqa: E402
from rlreason.model import tokenizer  # noqa: E402
from rlreason.model import transformer  # noqa: E402
from rlreason.rollout import continuous_episodes  # noqa: E402
from rlreason.rollout import episodes as episodes_lib  # noqa: E402


class TurnsEnv:
  """Ends example i's episode after meta['turns'] turns; answers the turn number otherwise."""

  def reset(self, example):
    return environment.EpisodeState(example)

  def step(self, state, text):
    del text
    state.turns += 1
    done = state.turns >= state.example.meta['turns']
    messages = [] if done else [{'role': 'tool', 'content': str(state.turns)}]
    return base.Step(observation='', reward=0.0, done=done,
                     info={'messages': messages, 'truncated': False})


def main(argv=None):
  ap = argparse.ArgumentParser()
  ap.add_argument('--smoke', action='store_true')
  ap.add_argument('--runs', type=int, default=2)
  ap.add_argument('--prompts', type=int, default=32)
  ap.add_argument('--group', type=int, default=4)
  ap.add_argument('--slots', type=int, default=32)
  ap.add_argument('--max_turns', type=int, default=8)
  ap.add_argument('--median_turns', type=float, default=1.5)
  ap.add_argument('--sigma', type=float, default=1.0)
  ap.add_argument('--turn_tokens', type=int, default=16)
  ap.add_argument('--chunk_steps', type=int, default=0, help='0: the default (turn_tokens // 4)')
  ap.add_argument('--hidden', type=int, default=256)
  ap.add_argument('--layers', type=int, default=4)
  a = ap.parse_args(argv)
  if a.smoke:
    a.runs, a.prompts, a.group, a.slots, a.hidden, a.layers = 1, 4, 2, 4, 32, 1
    a.max_turns, a.turn_tokens = 3, 4
  tok = dataclasses.replace(tokenizer.from_characters(string.digits + string.ascii_lowercase
                                                      + ' <>/*?'), eos_ids=frozenset())
  heads = max(1, a.hidden // 64)
  cfg = transformer.ModelConfig(vocab_size=tok.vocab_size, hidden_size=a.hidden,
                                intermediate_size=2 * a.hidden, num_layers=a.layers,
                                num_heads=heads, num_kv_heads=max(1, heads // 2),
                                head_dim=a.hidden // heads, qkv_bias=True)
  params = transformer.init_params(cfg, jax.random.key(0))
  rng = np.random.default_rng(1)
  turns_B = np.clip(np.round(a.median_turns * np.exp(a.sigma * rng.standard_normal(a.prompts))),
                    1, a.max_turns).astype(int)
  examples = [dataclasses.replace(ex, meta=dict(ex.meta, turns=int(t))) for ex, t in zip(
      (env_tasks.calc_multiply(0, i, difficulty=2) for i in range(a.prompts)), turns_B)]
  renderer = render.TextRenderer(prompt_template='{prompt}\n')
  obs = 24
  kw = dict(cfg=cfg, group_size=a.group, max_turns=a.max_turns, max_turn_tokens=a.turn_tokens,
            max_observation_tokens=obs, max_total_tokens=a.max_turns * (a.turn_tokens + obs),
            prompt_buckets=(48,), temperature=1.0, stop_seqs=(), rng=jax.random.key(2))
  per_call = a.slots // a.group

  def static():
    return [episodes_lib.run_episodes(params, TurnsEnv(), renderer, tok,
                                      examples[i:i + per_call], **kw)
            for i in range(0, a.prompts, per_call)]

  def cont():
    return [continuous_episodes.run_episodes(
        params, TurnsEnv(), renderer, tok, examples, slots=a.slots,
        chunk_steps=a.chunk_steps or None, **kw)]

  sampled, times = {}, {'static': [], 'continuous': []}
  for path, call in (('static', static), ('continuous', cont)):
    start = time.perf_counter()
    out = call()
    print(f'{path}: first call (compiles) {time.perf_counter() - start:.1f} s', flush=True)
    sampled[path] = sum(int(np.asarray(e.rollout.loss_mask_NxL).sum()) for e in out)
    turns = np.concatenate([e.turns_N for e in out])
    np.testing.assert_array_equal(turns, np.repeat(turns_B, a.group))
  assert sampled['static'] == sampled['continuous'] == a.group * turns_B.sum() * a.turn_tokens
  load0 = os.getloadavg()
  for _ in range(a.runs):
    for path, call in (('static', static), ('continuous', cont)):
      start = time.perf_counter()
      jax.block_until_ready([e.rollout for e in call()])
      times[path].append(time.perf_counter() - start)
  load1 = os.getloadavg()
  wall = {k: statistics.median(v) for k, v in times.items()}
  print(f'{a.prompts} prompts x G={a.group}, slots={a.slots}, turns lognormal(median '
        f'{a.median_turns}, sigma {a.sigma}) in [1, {a.max_turns}] (p99/median '
        f'{np.percentile(turns_B, 99) / np.median(turns_B):.1f}, mean {turns_B.mean():.2f}), '
        f'{a.turn_tokens} tokens a turn; d={a.hidden}, {a.layers} layers; load average '
        f'{load0[0]:.1f} -> {load1[0]:.1f} on {os.cpu_count()} cores')
  for path in ('static', 'continuous'):
    print(f'{path:<11} wall {" ".join(f"{t:.2f}" for t in times[path])} s, '
          f'{sampled[path] / wall[path]:.0f} sampled tokens/s')
  print(f'continuous_episodes_speedup={wall["static"] / wall["continuous"]:.3f}')


if __name__ == '__main__':
  main()
