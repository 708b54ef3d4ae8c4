"""Extension points: how a method (rlreason/methods/) plugs into the loop without the loop
naming it.

A method is a module with `build(run) -> object | None` (None: this config does not turn it
on), listed once in `METHODS`. `rl/run_setup.build` calls every listed module's `build` after
the core pieces exist and keeps the objects that came back in `run.methods[name]`, in
`METHODS` order. The loop then asks for capabilities, never for names; an object defines any
of these (all optional):

  rollout source (at most one per run; the core's static sampler or episodes otherwise):
    sample_and_score(run, params, examples, rng, *, step, progress, times) -> (rollout, Scores)
  prefixes for the static sampler (SOUP / prefix rollouts):
    prefixes(run, prompts, rng) -> (structs.Prefixes, prefix_version) | (None, None)
  batch hooks, in order, on a scored batch (HAPO's injection):
    after_score(run, rollout, scores, examples, *, rng, step, params, progress)
      -> (rollout, scores)
  reward hooks inside rl_batch.score (a reward model's mixing, before overlong shaping):
    mix_rewards(run, rollout, rewards_BxG) -> (rewards_BxG, metrics)
  metric hooks inside rl_batch.score (reward-hacking monitors, after overlong shaping):
    score_metrics(run, *, texts, items, examples, rewards_BxG, verifier_BxG, lengths_N,
                  judge_N, params, progress) -> metrics
  trie packing of the learner's batch (fork/join threads): trie(run, tokens_NxT, mask_NxT)
  metrics of a built batch, before the update (perplexity split, CEA):
    batch_metrics(run, *, policy, params, batch, rollout, step) -> metrics
  after the update: after_update(run, params, step)
  after a step's metrics (monitors' alarms): watch(run, step, metrics, writer) -> stop reasons;
    report_stop(run, stop, *, step, writer)
  evaluation (threaded episodes): evaluate(run, params, *, k, temperature, rng) -> summary | None
  SFT teacher filter (rejection sampling): sft_solutions(run, teacher) -> solutions | None
  checkpoints: on_save(run, step, state) (after the train state's), on_restore(run, step,
    abstract) (after it, on resume), close()

A method that changes the learner (R²PO's stages) is a *learner schedule*: its module defines
`learner_schedule(config) -> object | None`, used before the state is built (see
run_setup.build and `PlainSchedule`); a stage's step may carry a per-token term with extra
arguments (`make_train_step(optimizer, to_model, term)`, update.loss_fn: on-policy
distillation's teacher, methods/distill.py). A method that replaces the loop (rePIRL) defines
`replaces_loop(config) -> bool` and `train(config, workdir)`.

Adding a method: its module, one line in `METHODS` (or `register` from your own code), and
its config section with its checks (docs/adding_a_method.md).
"""

import dataclasses
import importlib
from typing import Any, Callable

# name -> module; the order is the order hooks run in.
METHODS = {
    'slate': 'rlreason.methods.slate_steps',
    'threads': 'rlreason.methods.threads',
    'partial': 'rlreason.methods.partial_rollouts',
    'prefixes': 'rlreason.methods.soup',
    'hapo': 'rlreason.methods.mixed_policy',
    'reward_model': 'rlreason.methods.reward_model',
    'monitors': 'rlreason.methods.monitors',
    'cea': 'rlreason.methods.cea',
    'rejection_sampling': 'rlreason.methods.rejection_sampling',
    'diversity': 'rlreason.methods.diversity',
    'r2po': 'rlreason.methods.r2po',
    'distill': 'rlreason.methods.distill',
    'repirl': 'rlreason.methods.repirl',
    'pot': 'rlreason.methods.pot',
}
_REGISTERED: dict[str, Any] = {}  # name -> module object, from `register`.


def register(name: str, module) -> None:
  """Adds a method from outside the package: `module` has `build(run)` (and may have
  `learner_schedule`, `replaces_loop`/`train`), as a listed module."""
  if name in METHODS or name in _REGISTERED:
    raise ValueError(f'extensions.register: a method named {name!r} exists already.')
  _REGISTERED[name] = module


def unregister(name: str) -> None:
  _REGISTERED.pop(name, None)


def module(name: str):
  """The method module registered as `name`."""
  if name in _REGISTERED:
    return _REGISTERED[name]
  if name not in METHODS:
    raise ValueError(f'no method named {name!r}; known: {sorted(METHODS) + sorted(_REGISTERED)}')
  return importlib.import_module(METHODS[name])


def modules():
  """(name, module) of every method, listed first, then registered."""
  return [(name, module(name)) for name in (*METHODS, *_REGISTERED)]


def build_methods(run) -> dict[str, Any]:
  """{name: built object} of the methods this run's config turns on."""
  built = {}
  for name, mod in modules():
    fn = getattr(mod, 'build', None)
    obj = None if fn is None else fn(run)
    if obj is not None:
      built[name] = obj
  sources = [n for n, m in built.items() if hasattr(m, 'sample_and_score')]
  if len(sources) > 1:
    raise ValueError(f'methods {sources} each bring their own rollout source; turn all but one '
                     'off.')
  return built


def hooks(run, capability: str) -> list[Callable]:
  """The bound `capability` of every built method that has it, in order."""
  return [getattr(m, capability) for m in getattr(run, 'methods', {}).values()
          if hasattr(m, capability)]


def rollout_source(run):
  """The method that produces the rows, or None (the core's sampler or episodes)."""
  for m in getattr(run, 'methods', {}).values():
    if hasattr(m, 'sample_and_score'):
      return m
  return None


def loop_replacement(config):
  """The method module whose `train(config, workdir)` replaces the loop, or None."""
  for _, mod in modules():
    fn = getattr(mod, 'replaces_loop', None)
    if fn is not None and fn(config):
      return mod
  return None


@dataclasses.dataclass(frozen=True)
class Stage:
  """What one RL step's update uses: which policy the learner sees (old and new log-probs),
  which advantage estimator ('' for the configured one) and the jitted train step."""
  number: int  # 0: a plain run; a schedule's stages count from 1.
  learner: Callable[[Any], Any]
  advantage: str
  train_step: Callable
  metric: str = ''  # The metric the stage's number is logged as (number > 0).


class PlainSchedule:
  """The default learner schedule: one stage, every step, the configured estimator."""

  def setup_params(self, config, cfg, params, *, mesh, param_shardings, sample_shardings,
                   sample_mesh):
    del config, cfg, mesh, sample_mesh
    return params, param_shardings, sample_shardings

  def optimizer(self, make_optimizer):
    return make_optimizer()

  def build_stages(self, make_train_step, make_optimizer, train_step, detach) -> None:
    del make_train_step, make_optimizer
    self.plain = Stage(0, learner=detach, advantage='', train_step=train_step)

  def stage(self, step: int) -> Stage:
    del step
    return self.plain


def learner_schedule(config):
  """The schedule of the method that brings one (R²PO's stages), else PlainSchedule()."""
  found = []
  for name, mod in modules():
    fn = getattr(mod, 'learner_schedule', None)
    schedule = None if fn is None else fn(config)
    if schedule is not None:
      found.append((name, schedule))
  if len(found) > 1:
    raise ValueError(f'methods {[n for n, _ in found]} each bring a learner schedule; turn all '
                     'but one off.')
  return found[0][1] if found else PlainSchedule()
