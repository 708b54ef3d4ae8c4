"""Times multi-turn episode decoding: rlreason's kept cache against re-prefilling each turn.

  python -m experiments.bench.episodes --runs 3
  python -m experiments.bench.episodes --smoke     # tiny model, 1 run: checks it all runs

The sampler benchmark's mid config (experiments/bench/sampler.py: Qwen2-style, qkv bias,
untied embeddings, fp32, random weights with nonzero biases and norm scales), 8 distinct
64-token prompts x G = 8 (64 rows), 4 turns of exactly 32 sampled tokens (temperature 1, no
top-k/top-p), and after each of the first 3 turns 48 observation tokens from an instant fake
tool (fixed ids per turn, the same for every row), so that only the model path is timed.
Three contenders on the same weights, taking turns call by call; one call is one whole batch
of episodes, prompt prefill included:

  kept cache     `episodes.run_episodes`: each row's KV cache lives across turns; an
                 observation is fed into it (48 tokens a row), nothing is re-prefilled.
  jax reprefill  `sampler.generate` once per turn on the conversation so far as the prompt
                 (turn 1: the 8 prompts with group_size=8; then the 64 conversations with
                 group_size=1), max_new_tokens=32: a loop without a kept cache on the same
                 sampler.
  transformers   `generate` once per turn on the growing conversation (torch, KV cache within
                 a call, do_sample, min_new_tokens = max_new_tokens = 32; turn 1 with
                 num_return_sequences=8), the observation ids appended in between: what most
                 Python agent loops do.

All three run the same host step between turns: the turn's ids decoded to text, the fake
environment stepped, the observation rendered and encoded. The tokenizer writes ids as
space-separated integers (encode(decode(ids)) == ids) and has no EOS, and no stop sequences
are given, so every turn samples exactly 32 tokens; each call's sampled-token count is
checked. tokens/s = sampled tokens (64 * 4 * 32 = 8192) / median wall time of `--runs` calls
after one warm-up call each (which compiles). The headline is

  episode_speedup_vs_reprefill = t(transformers) / t(kept cache)   (issue #16 item 7: >= 2)
  episode_speedup_vs_jax_reprefill = t(jax reprefill) / t(kept cache)

Measured on the 2-core CPU VM (2026-12-02, `--runs 3`, ~9 minutes, compiles included), twice,
both times with another process's test suite running (load average 2.5-3.3):
kept cache 15.7 s and 11.0 s a call (521 and 744 sampled tok/s), jax reprefill 32.9 s and
27.4 s, transformers 77.2 s and 51.5 s: episode_speedup_vs_reprefill = 4.91 and 4.68,
episode_speedup_vs_jax_reprefill = 2.09 and 2.49. Not yet measured on a quiet machine, where
torch's OpenMP suffers less (see the sampler benchmark) and the first ratio may be lower.

The machine may be shared: the load average is printed before and after the timed calls.
`--cpu_devices` (default: the core count) splits the CPU into single-threaded XLA devices
(sharding.split_cpu_host) and runs both JAX contenders data-parallel over all of them; torch
gets `--threads` threads, with `--torch_omp_wait PASSIVE` as in the sampler benchmark.
"""

import argparse
import contextlib
import dataclasses
import os
import statistics
import sys
import tempfile
import time

if __package__ in (None, ''):  # Run as a script: make `rlreason` importable.
  sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

from experiments.bench import sampler as sampler_bench  # noqa: E402
from rlreason.envs import base  # noqa: E402
from rlreason.model import sharding  # noqa: E402
from rlreason.model import transformer  # noqa: E402
from rlreason.model import weights  # noqa: E402
from rlreason.rollout import episodes  # noqa: E402
from rlreason.rollout import sampler  # noqa: E402
from rlreason.structs import Prompts  # noqa: E402


@dataclasses.dataclass(frozen=True)
class Setup:
  model: dict  # transformer.ModelConfig fields (architecture)
  prompts: int  # B distinct prompts
  group: int  # G episodes per prompt
  prompt_len: int
  turns: int
  turn_tokens: int  # sampled per turn, exactly
  obs_tokens: int  # fed after each turn but the last

  @property
  def rows(self) -> int:
    return self.prompts * self.group

  @property
  def length(self) -> int:  # completion columns: every turn and every observation
    return self.turns * self.turn_tokens + (self.turns - 1) * self.obs_tokens

  @property
  def sampled(self) -> int:
    return self.rows * self.turns * self.turn_tokens

  def fed(self, kept_cache: bool) -> int:
    """Tokens a call runs through the model in prefill (decode steps not counted)."""
    prompt = self.prompts * self.prompt_len
    if kept_cache:
      return prompt + self.rows * (self.turns - 1) * self.obs_tokens
    step = self.turn_tokens + self.obs_tokens
    return prompt + sum(self.rows * (self.prompt_len + t * step) for t in range(1, self.turns))


SETUPS = {
    'mid': Setup(sampler_bench.CONFIGS['mid'], prompts=8, group=8, prompt_len=64, turns=4,
                 turn_tokens=32, obs_tokens=48),
    'smoke': Setup(dict(vocab_size=256, hidden_size=32, intermediate_size=64, num_layers=2,
                        num_heads=4, num_kv_heads=2),
                   prompts=2, group=2, prompt_len=8, turns=2, turn_tokens=4, obs_tokens=5),
}


def model_config(setup: Setup) -> transformer.ModelConfig:
  c = setup.model
  return transformer.ModelConfig(**c, head_dim=c['hidden_size'] // c['num_heads'], qkv_bias=True,
                                 tie_embeddings=False, family='qwen2', rope_theta=10_000.0,
                                 rms_norm_eps=1e-6, max_position_embeddings=4096)


# ----------------------------------------------------------------------------- fakes


class IdsTokenizer:
  """Text is the ids written out, each after a space: encode(decode(ids)) == ids, and
  decode(a) + decode(b) == decode(a + b). No EOS: a turn ends at max_turn_tokens only."""
  eos_ids = frozenset()

  def encode(self, text: str) -> list[int]:
    return [int(t) for t in text.split()]

  def encode_pieces(self, pieces) -> list[int]:
    """As model/tokenizer.Tokenizer.encode_pieces (run_episodes encodes observations so):
    there are no added tokens here, so trusted or not, the ids of the joined text."""
    return self.encode(''.join(text for text, _ in pieces))

  def decode(self, ids, skip_special_tokens: bool = False) -> str:
    del skip_special_tokens
    return ''.join(f' {int(i)}' for i in ids)

  def decode_batch(self, batch, skip_special_tokens: bool = False) -> list[str]:
    return [self.decode(ids, skip_special_tokens) for ids in batch]

  def token_to_id(self, token: str) -> int:
    return int(token)


class IdsRenderer:
  """An example is its prompt's text; an observation is its tool messages' text, verbatim."""

  def prompt_text(self, example: str) -> str:
    return example

  def observation_text(self, messages, ended: bool) -> str:
    del ended
    return ''.join(m['content'] for m in messages)


@dataclasses.dataclass
class _EnvState:
  turns: int = 0
  tool_calls: int = 0
  reward: float = 0.0
  errors: dict = dataclasses.field(default_factory=dict)


class InstantToolEnv:
  """Ignores what the model wrote: after turn t a tool message of `observation_ids[t]`,
  done after `turns` turns."""

  def __init__(self, observation_ids, turns: int, tok: IdsTokenizer):
    self.texts = [tok.decode(ids) for ids in observation_ids]
    self.turns = turns

  def reset(self, example):
    del example
    return _EnvState()

  def step(self, state: _EnvState, turn_text: str) -> base.Step:
    del turn_text
    t = state.turns
    state.turns += 1
    done = state.turns >= self.turns
    state.tool_calls += 0 if done else 1
    messages = [] if done else [{'role': 'tool', 'content': self.texts[t]}]
    return base.Step(observation='', reward=0.0, done=done,
                     info={'messages': messages, 'truncated': False})


def host_step(env, renderer, tok, states, turn_ids_NxT: np.ndarray) -> np.ndarray | None:
  """The loops' work between turns, as run_episodes does it: decode each row's turn, step
  its environment, encode the observation. Observation ids NxO, or None once all are done."""
  texts = tok.decode_batch(turn_ids_NxT.tolist(), skip_special_tokens=True)
  steps = [env.step(s, text) for s, text in zip(states, texts)]
  if all(s.done for s in steps):
    return None
  obs = [tok.encode(renderer.observation_text(s.info['messages'], False)) for s in steps]
  return np.asarray(obs, np.int64)  # Rectangular: every row's observation has obs_tokens ids.


# ----------------------------------------------------------------------------- contenders


def random_params(cfg: transformer.ModelConfig):
  """init_params with nonzero biases and norm scales, so a mis-exported tensor shows in the
  logit check (as in the sampler benchmark)."""
  params = transformer.init_params(cfg, jax.random.key(0))
  leaves, treedef = jax.tree_util.tree_flatten_with_path(params)
  return treedef.unflatten([
      x + 0.1 * jax.random.normal(jax.random.key(i), x.shape)
      if 'bias' in jax.tree_util.keystr(path) or 'scale' in jax.tree_util.keystr(path) else x
      for i, (path, x) in enumerate(leaves)])


def make_contenders(setup: Setup, cfg, params, net, mesh):
  """{name: call}; each call runs one batch of episodes and returns its sampled-token count."""
  import torch  # pylint: disable=g-import-not-at-top
  rng = np.random.default_rng(1)
  prompt_ids_BxP = rng.integers(1, cfg.vocab_size, (setup.prompts, setup.prompt_len))
  obs_ids = rng.integers(1, cfg.vocab_size, (setup.turns - 1, setup.obs_tokens))
  tok, renderer = IdsTokenizer(), IdsRenderer()
  env = InstantToolEnv(obs_ids, setup.turns, tok)
  examples = [tok.decode(ids) for ids in prompt_ids_BxP]
  on_mesh = lambda: jax.set_mesh(mesh) if mesh is not None else contextlib.nullcontext()
  calls_made = [0]

  def key():  # A fresh key per call: no two calls sample alike.
    calls_made[0] += 1
    return jax.random.key(calls_made[0])

  def kept_cache():
    with on_mesh():
      ep = episodes.run_episodes(
          params, env, renderer, tok, examples, cfg=cfg, group_size=setup.group,
          max_turns=setup.turns, max_turn_tokens=setup.turn_tokens,
          max_observation_tokens=setup.obs_tokens, max_total_tokens=setup.length, rng=key(),
          prompt_buckets=(setup.prompt_len,), temperature=1.0, stop_seqs=(), mesh=mesh)
      sampled = int(jax.device_get(ep.rollout.loss_mask_NxL.sum()))
    assert (ep.turns_N == setup.turns).all() and not ep.truncated_N.any(), ep.turns_N
    assert (ep.observation_tokens_N == (setup.turns - 1) * setup.obs_tokens).all()
    return sampled

  def jax_reprefill():
    states = [env.reset(None) for _ in range(setup.rows)]
    conv_NxT = np.repeat(prompt_ids_BxP, setup.group, axis=0)
    sampled, rng_call = 0, key()
    for turn in range(setup.turns):
      first = turn == 0
      tokens = prompt_ids_BxP if first else conv_NxT
      prompts = Prompts(tokens_BxP=jnp.asarray(tokens, jnp.int32),
                        mask_BxP=jnp.ones(tokens.shape, bool))
      with on_mesh():
        out = sampler.generate(params, prompts, cfg=cfg, group_size=setup.group if first else 1,
                               max_new_tokens=setup.turn_tokens, temperature=1.0,
                               rng=jax.random.fold_in(rng_call, turn), mesh=mesh)
        new_NxT, mask_NxT = jax.device_get((out.tokens_NxL, out.mask_NxL))
      sampled += int(mask_NxT.sum())
      conv_NxT = np.concatenate([conv_NxT, new_NxT], axis=1)
      obs_NxO = host_step(env, renderer, tok, states, new_NxT)
      if obs_NxO is None:
        break
      conv_NxT = np.concatenate([conv_NxT, obs_NxO], axis=1)
    return sampled

  @torch.no_grad()
  def transformers_generate():
    states = [env.reset(None) for _ in range(setup.rows)]
    conv = torch.from_numpy(prompt_ids_BxP)
    sampled = 0
    for turn in range(setup.turns):
      out = net.generate(conv, attention_mask=torch.ones_like(conv), do_sample=True,
                         num_return_sequences=setup.group if turn == 0 else 1,
                         max_new_tokens=setup.turn_tokens, min_new_tokens=setup.turn_tokens,
                         temperature=1.0, top_k=0, top_p=1.0, use_cache=True, pad_token_id=0,
                         eos_token_id=None)
      new = out[:, out.shape[1] - setup.turn_tokens:]
      assert out.shape[0] == setup.rows, out.shape
      sampled += new.numel()
      obs_NxO = host_step(env, renderer, tok, states, new.numpy())
      if obs_NxO is None:
        break
      conv = torch.cat([out, torch.from_numpy(obs_NxO)], dim=1)
    return sampled

  return prompt_ids_BxP, {'kept cache': kept_cache, 'jax reprefill': jax_reprefill,
                          'transformers': transformers_generate}


def time_interleaved(calls, runs: int, expected: int) -> dict[str, list[float]]:
  """Wall times of each call after one warm-up each, the calls taking turns run by run;
  every call must sample `expected` tokens."""
  for name, call in calls.items():
    start = time.perf_counter()
    got = call()
    print(f'{name:14s} warm-up (compile + run) {time.perf_counter() - start:6.1f}s, '
          f'{got} sampled tokens', flush=True)
    assert got == expected, (name, got, expected)
  times = {name: [] for name in calls}
  for _ in range(runs):
    for name, call in calls.items():
      start = time.perf_counter()
      got = call()
      times[name].append(time.perf_counter() - start)
      assert got == expected, (name, got, expected)
  return times


# ----------------------------------------------------------------------------- main


def load() -> str:
  return ' '.join(f'{x:.1f}' for x in os.getloadavg())


def run(setup: Setup, args) -> dict[str, float]:
  import torch  # pylint: disable=g-import-not-at-top
  import transformers  # pylint: disable=g-import-not-at-top
  cfg = model_config(setup)
  params = random_params(cfg)
  with tempfile.TemporaryDirectory() as tmp:
    weights.save(tmp, cfg, params)
    net = transformers.AutoModelForCausalLM.from_pretrained(tmp, dtype=torch.float32).eval()
  mesh = None
  if jax.device_count() > 1:
    mesh = sharding.make_mesh({'data': jax.device_count(), 'fsdp': 1, 'tensor': 1})
    with jax.set_mesh(mesh):
      params = jax.device_put(params, sharding.param_shardings(cfg, mesh, sharding.SAMPLE_RULES))

  prompt_ids_BxP, calls = make_contenders(setup, cfg, params, net, mesh)
  with torch.no_grad():
    logits_torch = net(input_ids=torch.from_numpy(prompt_ids_BxP)).logits.numpy()
  logits_jax = np.asarray(transformer.apply(jax.device_get(params),
                                            jnp.asarray(prompt_ids_BxP, jnp.int32), cfg=cfg)[0])
  diff = float(np.abs(logits_torch - logits_jax).max())
  print(f'prompt logits |jax - torch| max = {diff:.1e}', flush=True)
  if diff > 1e-3:
    raise SystemExit('the exported weights do not reproduce the logits')

  load_before = load()
  times = time_interleaved(calls, args.runs, setup.sampled)
  for name, t in times.items():
    print(f'{name:14s} ' + ' '.join(f'{x:.2f}' for x in t), flush=True)
  med = {name: statistics.median(t) for name, t in times.items()}

  print(f'\nload average {load_before} before the timed calls, {load()} after, on '
        f'{os.cpu_count()} cores; threads {args.threads}; JAX on {jax.device_count()} '
        f'device(s){" data-parallel" if mesh is not None else ""}; '
        f'OMP_WAIT_POLICY={os.environ.get("OMP_WAIT_POLICY")}')
  print(f'{args.setup}: {setup.prompts} prompts x {setup.prompt_len} tokens, G={setup.group} '
        f'({setup.rows} rows), {setup.turns} turns x {setup.turn_tokens} sampled tokens, '
        f'{setup.obs_tokens} observation tokens between turns; median of {args.runs} calls '
        'after a warm-up (whole batches of episodes)')
  header = (f'{"contender":<14} {"median s":>9} {"sampled tok/s":>14} {"prefilled tok":>14} '
            f'{"kept cache speedup":>19}')
  print(header)
  print('-' * len(header))
  for name, t in med.items():
    fed = setup.fed(kept_cache=name == 'kept cache')
    print(f'{name:<14} {t:>9.2f} {setup.sampled / t:>14.0f} {fed:>14} '
          f'{t / med["kept cache"]:>18.2f}x')
  print('sampled tok/s = sampled tokens / median s; prefilled tok = tokens fed in prefill '
        'per call (prompts, observations, and for the reprefill loops every earlier turn); '
        'kept cache speedup = t(contender) / t(kept cache)')
  speedups = {'jax_reprefill': med['jax reprefill'] / med['kept cache'],
              'reprefill': med['transformers'] / med['kept cache']}
  print(f'episode_speedup_vs_jax_reprefill={speedups["jax_reprefill"]:.3f}')
  print(f'episode_speedup_vs_reprefill={speedups["reprefill"]:.3f}')
  return speedups


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  parser.add_argument('--runs', type=int, default=3)
  parser.add_argument('--smoke', action='store_true',
                      help='a tiny model and setup, 1 timed run: checks that everything runs')
  parser.add_argument('--torch_omp_wait', default='PASSIVE', choices=('PASSIVE', 'ACTIVE'))
  parser.add_argument('--cpu_devices', type=int, default=os.cpu_count(),
                      help='sharding.split_cpu_host(N): the CPU as N single-threaded devices, '
                      'both JAX contenders data-parallel on all of them (1: XLA default)')
  parser.add_argument('--threads', type=int, default=os.cpu_count(),
                      help='cores for the process: torch threads and the cores XLA may use '
                      '(forward.limit_threads)')
  args = parser.parse_args(argv)
  args.setup = 'smoke' if args.smoke else 'mid'
  if args.smoke:
    args.runs = 1
  from experiments.bench import forward  # pylint: disable=g-import-not-at-top
  forward.limit_threads(args.threads)  # Before torch loads OpenMP and JAX creates its backend.
  if args.cpu_devices > 1:
    sharding.split_cpu_host(args.cpu_devices)
  # Read by OpenMP when torch first loads it, so it must be set before the first import.
  os.environ['OMP_WAIT_POLICY'] = args.torch_omp_wait
  import torch  # pylint: disable=g-import-not-at-top
  torch.set_num_threads(args.threads)
  return run(SETUPS[args.setup], args)


if __name__ == '__main__':
  main()
