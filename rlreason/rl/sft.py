"""The supervised warm start: teacher solutions, their token rows, and the SFT loop.

`sft_loop(run, state, steps=...)` trains the TrainState's params (under LoRA the adapter) by
next-token cross-entropy on a teacher's solutions, before RL or as a baseline; it shares the
run's model, tokenizer and layout (rl/run_setup.py builds them).

Deliberately not here: the RL loop (train.py), the run's construction (run_setup.py).
"""

import functools
import importlib
import itertools
from typing import Callable

import jax
import jax.numpy as jnp
import numpy as np

from rlreason.rl import adapters
from rlreason.rl import extensions
from rlreason.rl import update
from rlreason.rl.run_setup import Run, make_optimizer, prompt_text
from rlreason.tasks import data


def teacher_fn(name: str, options) -> Callable:
  """The SFT teacher: reference solutions, or 'package.module:function'(example, rng=, **opts)."""
  if not name:
    return lambda example, rng: example.solution
  module, attr = name.split(':')
  fn = getattr(importlib.import_module(module), attr)
  return lambda example, rng: fn(example, rng=rng, **dict(options))


def problem_stream(config, *, seed_offset: int = 0):
  """The warm start's train-split problems (a seed apart from the RL loop's)."""
  d = config.data
  return data.synthetic_stream(d.task, seed=config.seed + 7919 + seed_offset,
                               difficulty=d.difficulty, options=dict(d.task_options),
                               held_out_fraction=d.held_out_fraction)


def demonstration_set(config, *, seed_offset: int = 0) -> list:
  """The first sft.num_demos problems, which the warm start cycles over (a small
  demonstration set); [] when num_demos is 0 (fresh problems every step)."""
  n = config.sft.get('num_demos', 0)
  return list(itertools.islice(iter(problem_stream(config, seed_offset=seed_offset)), n))


def sft_batch(run: Run, examples, solutions, length: int):
  """Right-padded prompt+solution+eos rows and the loss mask on solution+eos.

  A solution is a string, or (for tool-use traces) a list of [text, trained] segments: an
  episode's turns (trained) and its observations (encoded the same way, never trained).
  """
  tokens = np.full((len(examples), length), run.pad_id, np.int32)
  loss_mask = np.zeros((len(examples), length), bool)
  for i, (ex, sol) in enumerate(zip(examples, solutions)):
    prompt = run.tok.encode(prompt_text(run, ex))
    pieces = [[sol, True]] if isinstance(sol, str) else sol
    ids, trained = list(prompt), [False] * len(prompt)
    for text, train_it in pieces:
      piece = run.tok.encode(text)
      ids += piece
      trained += [bool(train_it)] * len(piece)
    ids, trained = (ids + [run.tok.eos_id])[:length], (trained + [True])[:length]
    tokens[i, :len(ids)] = ids
    loss_mask[i, :len(ids)] = trained
  return jnp.asarray(tokens), jnp.asarray(loss_mask)


def sft_loop(run: Run, state, *, steps: int, writer=None, solutions=None, seed_offset: int = 0,
             every: int = 0, on_every: Callable | None = None):
  """Supervised next-token training on teacher solutions; returns (state, metrics).

  `on_every(steps_done, params)` runs after every `every` steps and after the last one
  (the baselines' learning curves), with the model's params (`Run.policy`) in the training
  layout.

  `solutions(examples, rng) -> list[str | None]` overrides the configured teacher (rejection
  sampling fine-tuning passes verified samples); rows whose solution is None are skipped.
  Otherwise `sft.filter` ('rrs', 'answer') keeps only the teacher's traces that pass it when
  executed in the run's environment (methods/rejection_sampling.py), `sft.filter_tries` per problem.
  `seed_offset` picks another problem stream, so that a continuation does not replay the
  warm start's problems.
  """
  if steps <= 0:
    return state, {}
  s = run.config.sft
  optimizer = make_optimizer(lr=s.lr, warmup_steps=s.warmup_steps, grad_clip=s.grad_clip,
                             decay_steps=steps if s.decay else 0)
  teacher = teacher_fn(s.teacher, s.teacher_options)
  filtered = None
  for hook in (extensions.hooks(run, 'sft_solutions') if solutions is None else ()):
    filtered = hook(run, teacher)  # sft.filter (methods/rejection_sampling.py).
  solutions = solutions or filtered or (lambda exs, rng: [teacher(ex, rng) for ex in exs])
  # A copy: the jitted step donates its state, and callers may still hold `state`.
  sft_state = update.init_state(jax.tree.map(jnp.copy, state.params), optimizer)
  length = max(run.config.data.prompt_buckets) + run.config.rl.max_new_tokens + 1
  base = None if run.adapter is None else run.adapter.base
  step_fn = functools.partial(jax.jit(
      lambda st, t, m, base: update.sft_step(st, t, m, cfg=run.cfg, optimizer=optimizer,
                                             to_model=adapters.to_model(run.adapter, base,
                                                                        run.cfg)),
      donate_argnums=0), base=base)  # The base is an argument, never a baked-in constant.
  demos, bs = demonstration_set(run.config, seed_offset=seed_offset), s.batch_size
  stream = (([demos[(i * bs + j) % len(demos)] for j in range(bs)] for i in itertools.count())
            if demos else iter(data.batched(problem_stream(run.config, seed_offset=seed_offset),
                                            bs)))
  rng = np.random.default_rng([run.config.seed, 1, seed_offset])
  metrics = {}
  for i in range(steps):
    examples = next(stream)
    sols = solutions(examples, rng)
    keep = [(ex, sol) for ex, sol in zip(examples, sols) if sol is not None]
    if not keep:
      continue
    # Cycle the kept rows to a full batch: one shape, one compilation.
    take = [keep[i % len(keep)] for i in range(len(examples))]
    tokens, mask = sft_batch(run, [ex for ex, _ in take], [sol for _, sol in take], length)
    sft_state, metrics = step_fn(sft_state, tokens, mask)
    if writer is not None and (i % 50 == 0 or i == steps - 1):
      host = writer.write(i - steps, metrics, prefix='sft/')
      writer.progress(i + 1, host, keys=('sft/loss',), label=f'sft {i + 1}/{steps}')
    if on_every is not None and every and ((i + 1) % every == 0 or i == steps - 1):
      on_every(i + 1, run.policy(jax.device_put(sft_state.params, run.state_shardings.params)))
  # Back in the training layout: the SFT step's outputs carry whatever shardings XLA chose,
  # and a state in another layout would compile the RL train step a second time.
  state = state.replace(params=jax.device_put(sft_state.params, run.state_shardings.params))
  return state, {**{f'sft/{k}': v for k, v in metrics.items()},
                 **(filtered.metrics() if filtered else {})}

