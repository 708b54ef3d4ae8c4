"""Asynchronous sampling: the sampler runs up to rl.max_staleness steps ahead of the learner.

The schedule is fixed, so a run is reproducible whatever the speed of either side: with
k = rl.max_staleness, the rollout trained at step t is sampled with the params of version

  v(t) = max(0, t - 1 - k)        (version = RL steps applied; the warm start is 0)

on step t's prompts and key (fold_in(fold_in(root, t), 0), the synchronous loop's), so k = 0
is the synchronous loop exactly. Before step t the learner submits every step s <= t + k not
yet submitted (v(s) = t - 1 for the newest: the learner's current params, handed over then),
waits for step t's rollout, verifies and learns; meanwhile the sampler works on t+1 .. t+k.
The trainer's correction (objective.correction) sees π_prox = the learner's params when the
batch is formed (rl_batch.make_train_batch recomputes them) and μ = the sampler's recorded
log-probs; every token carries its version (rl_batch.tag_versions), so the staleness
histogram (provenance_metrics) shows t - 1 - v(t).

  rl.async_mode 'process'  a spawned process samples (`_serve`): params go to it as numpy
                           once per version, rollouts come back as numpy. It may be pinned
                           (rl.sampler_cpus; one CPU also makes its XLA single-threaded). A
                           sampler that dies or stays silent for rl.sampler_timeout_s makes
                           the learner raise SamplerError (no hang).
  rl.async_mode 'inline'   the same schedule in the learner's process, sampled when
                           submitted: staleness without the overlap (studies, tests).

Checkpoints: `save(step)` waits for the steps in flight and writes their rollouts, examples
and versions to workdir/inflight/<step>.npz beside the orbax step (which holds the data
iterator already advanced past them); `start` reloads them, so N steps = N/2 + resume + N/2
exactly. Keys are functions of (seed, step): nothing else to save. A resume whose checkpoint
was written with another staleness is refused at start-up, naming rl.max_staleness.

Extending a finished run (more rl.steps than it was saved with): its last checkpoint holds no
rollouts for the steps past its rl.steps (never submitted), and the versions the schedule
would sample them with are gone, so those steps (at most k) are sampled by the learner's
current params instead, tagged so (staleness 0 for them); every later step follows the
schedule. Deterministic, but not equal to a run started with the larger rl.steps.

Deliberately not here: partial rollouts (rows continued across a weight update), dynamic
sampling, episodes, HAPO, prefixes and the judge (config_checks/offpolicy.py refuses them
with async_mode), multi-host runs.
"""

import dataclasses
import io
import json
import logging
import multiprocessing
import os
import queue
import time
import traceback
from typing import Any

from etils import epath
import jax
import jax.numpy as jnp
import ml_collections
import numpy as np

from rlreason import compile_cache
from rlreason import workdir_paths
from rlreason.model import sharding
from rlreason.rl.rl_batch import generate_rollout, tag_versions
from rlreason.rl.run_setup import encode_prompts
from rlreason.structs import Prompts, Rollout
from rlreason.tasks.example import Example

MODES = ('', 'inline', 'process')
# XLA:CPU flags of a sampler pinned to one CPU: kernels on the calling thread only.
_ONE_THREAD_FLAGS = '--xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1'


class SamplerError(RuntimeError):
  """The sampler process died, failed, or sent nothing within rl.sampler_timeout_s."""


def version_for(step: int, max_staleness: int) -> int:
  """v(t): the params version that samples step t's rollout."""
  return max(0, step - 1 - max_staleness)


def staleness_of(config) -> int:
  """The staleness a config asks for: 0 for the synchronous loop (async_mode '')."""
  rl = config.get('rl', {})
  return int(rl.get('max_staleness', 0)) if rl.get('async_mode', '') else 0


@dataclasses.dataclass(frozen=True)
class Spec:
  """What a sampler needs besides params, prompts and a key (picklable: it crosses to the
  sampler process)."""
  rl: ml_collections.ConfigDict
  cfg: Any
  mesh: dict
  stop_tokens: tuple[int, ...]
  pad_id: int
  cache_dir: str | None = None


def generate(spec: Spec, params, prompts: Prompts, key, mesh) -> Rollout:
  """One step's rollout, as train.sample_and_verify samples it (same call, same arguments)."""
  rl = spec.rl
  with jax.set_mesh(mesh):
    return jax.block_until_ready(generate_rollout(
        rl, params, prompts, cfg=spec.cfg, group_size=rl.group_size,
        max_new_tokens=rl.max_new_tokens, temperature=rl.temperature, top_k=rl.top_k,
        top_p=rl.top_p, stop_tokens=spec.stop_tokens, pad_id=spec.pad_id, rng=key, mesh=mesh,
        prefixes=None, max_chunks=rl.decode_chunks, sample_dtype=rl.sample_dtype or None))


def _serve(requests, results, spec: Spec) -> None:
  """The sampler process: (step, params or None, prompts, key data) in, (step, rollout) out.

  Exits on None, when its parent is gone, or after reporting its first exception."""
  parent = os.getppid()
  step = -1
  try:
    compile_cache.enable(spec.cache_dir)  # The learner's directory, written whole-entry.
    mesh = sharding.make_mesh(spec.mesh)
    param_sh = sharding.param_shardings(spec.cfg, mesh, sharding.SAMPLE_RULES)
    params = None
    while True:
      try:
        request = requests.get(timeout=1.0)
      except queue.Empty:
        if os.getppid() != parent:
          return
        continue
      if request is None:
        return
      step, new_params, prompts, key_data = request
      if new_params is not None:
        params = jax.device_put(new_params, param_sh)
      prompts = Prompts(tokens_BxP=jnp.asarray(prompts[0]), mask_BxP=jnp.asarray(prompts[1]))
      rollout = generate(spec, params, prompts, jax.random.wrap_key_data(key_data), mesh)
      results.put((step, jax.device_get(rollout)))
  except BaseException:  # pylint: disable=broad-except  (reported to the learner, then exit)
    results.put((step, traceback.format_exc()))


class ProcessSampler:
  """A spawned sampler process fed through two queues (puts never block: no deadlock when
  params go out while a rollout comes back)."""

  def __init__(self, spec: Spec, *, cpus=(), timeout_s: float = 900.0):
    ctx = multiprocessing.get_context('spawn')
    self._requests, self._results = ctx.Queue(), ctx.Queue()
    self.timeout_s = timeout_s
    self._done: dict[int, Any] = {}
    env = {'XLA_FLAGS': f"{os.environ.get('XLA_FLAGS', '')} {_ONE_THREAD_FLAGS}".strip()
           } if len(cpus) == 1 else {}
    self.process = ctx.Process(target=_serve, args=(self._requests, self._results, spec),
                               daemon=True, name='rlreason-sampler')
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)  # The child's environment is copied at start.
    try:
      self.process.start()
    finally:
      for k, v in saved.items():
        if v is None:
          os.environ.pop(k, None)
        else:
          os.environ[k] = v
    if cpus:
      os.sched_setaffinity(self.process.pid, set(cpus))

  def submit(self, step: int, params, prompts: Prompts, key) -> None:
    """Queues step `step`; `params` (a device tree) or None to keep the last ones sent."""
    host = None if params is None else jax.device_get(params)
    self._requests.put((step, host, (np.asarray(prompts.tokens_BxP),
                                     np.asarray(prompts.mask_BxP)),
                        np.asarray(jax.random.key_data(key))))

  def result(self, step: int) -> Rollout:
    """Step `step`'s rollout (numpy), waiting for it; SamplerError if the process is gone."""
    deadline = time.monotonic() + self.timeout_s
    while step not in self._done:
      try:
        got, rollout = self._results.get(timeout=0.2)
      except queue.Empty:
        if not self.process.is_alive():
          raise SamplerError(
              f'the sampler process (pid {self.process.pid}) exited with code '
              f'{self.process.exitcode} before sending step {step} '
              "(rl.async_mode='process').") from None
        if time.monotonic() > deadline:
          raise SamplerError(f'no rollout from the sampler process for step {step} within '
                             f'rl.sampler_timeout_s={self.timeout_s:g}s.') from None
        continue
      if isinstance(rollout, str):
        raise SamplerError(f'the sampler process failed at step {got}:\n{rollout}')
      self._done[got] = rollout
    return self._done.pop(step)

  def close(self) -> None:
    if self.process.is_alive():
      self._requests.put(None)
      self.process.join(timeout=10)
    if self.process.is_alive():
      self.process.terminate()
      self.process.join(timeout=5)


class InlineSampler:
  """The same interface, sampling in this process when a step is submitted."""

  def __init__(self, spec: Spec, mesh):
    self.spec, self.mesh, self._params, self._done = spec, mesh, None, {}

  def submit(self, step: int, params, prompts: Prompts, key) -> None:
    if params is not None:
      self._params = params
    self._done[step] = generate(self.spec, self._params, prompts, key, self.mesh)

  def result(self, step: int) -> Rollout:
    return self._done.pop(step)

  def close(self) -> None:
    self._done.clear()


class AsyncSampler:
  """The learner's side of the schedule: what is submitted, what is in flight."""

  def __init__(self, run, sampler, *, max_staleness: int, start: int, inflight=None,
               catch_up_through: int | None = None):
    self.run, self.sampler, self.k = run, sampler, max_staleness
    self.submitted = start  # Steps <= this have been submitted (or trained).
    # Steps <= this not in flight are sampled by the learner's params when submitted (a
    # finished run extended: module doc), not by the schedule's older version.
    self.catch_up_through = start if catch_up_through is None else catch_up_through
    self.versions: dict[int, int] = {}  # The version that samples each submitted step.
    self.examples: dict[int, list] = {}
    self._loaded: dict[int, Rollout] = {}
    for step, (examples, rollout) in (inflight or {}).items():
      self.examples[step], self._loaded[step] = examples, rollout
      self.submitted = max(self.submitted, step)

  def _submit_through(self, last: int, policy, *, version: int) -> None:
    """Submits steps submitted+1 .. last, which the schedule samples with `policy`, the
    learner's params of `version` (see the module doc: never an older one)."""
    params = None
    for step in range(self.submitted + 1, last + 1):
      if version_for(step, self.k) != version and step > self.catch_up_through:
        raise AssertionError(f'step {step} is sampled by version {version_for(step, self.k)}, '
                             f'the learner holds version {version}.')
      examples = next(self.run.data_iter)
      key = jax.random.fold_in(jax.random.fold_in(self.run.root_rng, step), 0)
      first = params is None  # The params travel once per version.
      if first:
        params = sharding.reshard(policy, self.run.sample_shardings)
      self.sampler.submit(step, params if first else None, encode_prompts(self.run, examples),
                          key)
      self.examples[step], self.versions[step] = examples, version
      self.submitted = step

  def rollout(self, policy, step: int) -> tuple[list, Rollout]:
    """(examples, rollout tagged with its version) of step `step`; submits what the schedule
    allows first. `policy`: the learner's rollout params (version step - 1)."""
    self._submit_through(min(step + self.k, self.run.config.rl.steps), policy,
                         version=step - 1)
    rollout = self._loaded.pop(step, None)
    if rollout is None:
      rollout = self.sampler.result(step)
    rollout = jax.device_put(rollout, jax.tree.map(
        lambda x: sharding.data_sharding(self.run.mesh, x.shape), rollout))
    return self.examples.pop(step), self._tagged(step, rollout)

  def _tagged(self, step: int, rollout: Rollout) -> Rollout:
    """The rollout tagged with the version that sampled it (one loaded from an in-flight
    file carries its tags; older files without them follow the schedule)."""
    version = self.versions.pop(step, None)
    if version is None and rollout.version_NxL is not None:
      return rollout
    return tag_versions(rollout, version=version_for(step, self.k) if version is None
                        else version)

  def save(self, step: int) -> None:
    """Writes the rollouts in flight after `step` (waiting for them), tagged with their
    versions, to inflight/<step>.npz, and drops the files of steps the checkpointer no
    longer keeps."""
    pending = sorted(s for s in self.examples if s > step)
    for s in pending:
      if s not in self._loaded:
        self._loaded[s] = jax.device_get(self.sampler.result(s))
      self._loaded[s] = jax.device_get(self._tagged(s, self._loaded[s]))  # Keeps its tags.
    if jax.process_index() == 0:
      write_inflight(inflight_path(self.run.workdir, step), max_staleness=self.k,
                     inflight={s: (self.examples[s], self._loaded[s]) for s in pending})
      keep = set(self.run.checkpointer.steps()) | {step}
      for path in inflight_path(self.run.workdir, 0).parent.glob('*.npz'):
        if path.stem.isdigit() and int(path.stem) not in keep:
          path.unlink()

  def close(self) -> None:
    self.sampler.close()


def inflight_path(workdir, step: int) -> epath.Path:
  return workdir_paths.as_path(workdir) / 'inflight' / f'{step}.npz'


def write_inflight(path, *, max_staleness: int, inflight: dict) -> None:
  """inflight: {step: (examples, numpy Rollout)}; written whole or not at all (tmp file and
  rename locally, a single put on an object store: workdir_paths.write_atomic)."""
  arrays, meta = {}, {'max_staleness': max_staleness, 'steps': {}}
  for step, (examples, rollout) in inflight.items():
    fields = {'prompts.tokens_BxP': rollout.prompts.tokens_BxP,
              'prompts.mask_BxP': rollout.prompts.mask_BxP}
    fields.update({f.name: getattr(rollout, f.name) for f in dataclasses.fields(rollout)
                   if f.name not in ('prompts', 'group_size')
                   and getattr(rollout, f.name) is not None})
    arrays.update({f'{step}/{name}': np.asarray(x) for name, x in fields.items()})
    meta['steps'][str(step)] = {'group_size': rollout.group_size, 'fields': sorted(fields),
                                'examples': [dataclasses.asdict(e) for e in examples]}
  buffer = io.BytesIO()
  np.savez(buffer, __meta__=np.array(json.dumps(meta)), **arrays)
  workdir_paths.write_atomic(path, buffer.getvalue())


def read_inflight(path) -> tuple[int, dict]:
  """(max_staleness, {step: (examples, numpy Rollout)}) from `write_inflight`'s file."""
  with workdir_paths.as_path(path).open('rb') as f, np.load(f) as z:
    meta = json.loads(str(z['__meta__']))
    inflight = {}
    for step, m in meta['steps'].items():
      get = lambda name: z[f'{step}/{name}']  # pylint: disable=cell-var-from-loop
      prompts = Prompts(tokens_BxP=get('prompts.tokens_BxP'), mask_BxP=get('prompts.mask_BxP'))
      rest = {name: get(name) for name in m['fields'] if not name.startswith('prompts.')}
      inflight[int(step)] = ([Example(**e) for e in m['examples']],
                             Rollout(prompts=prompts, group_size=m['group_size'], **rest))
  return meta['max_staleness'], inflight


def check_resume(config, saved_config: dict | None, *, step: int, workdir) -> dict:
  """The in-flight rollouts to resume at `step` with; ValueError naming rl.max_staleness when
  the checkpoint was written with another staleness (its rollouts were sampled by versions
  this schedule would not use), or its in-flight file is missing."""
  k = staleness_of(config)
  if step == 0:  # The warm start: nothing was ever in flight, every version is 0.
    return {}
  saved_k = staleness_of(saved_config or {})
  path = inflight_path(workdir, step)
  if path.exists():
    saved_k, inflight = read_inflight(path)
  elif saved_k:
    raise ValueError(f'rl.max_staleness={saved_k}: the checkpoint at step {step} in {workdir} '
                     f'has no in-flight file {path}; it cannot be resumed exactly.')
  else:
    inflight = {}
  if saved_k != k:
    raise ValueError(
        f'rl.max_staleness: the checkpoint at step {step} in {workdir} was written with '
        f'staleness {saved_k} ({len(inflight)} rollouts in flight), this run asks for {k} '
        f"(rl.async_mode={config.rl.async_mode!r}, rl.max_staleness={config.rl.max_staleness});"
        + (f" resume with rl.max_staleness={saved_k} and rl.async_mode 'process' or 'inline'."
           if saved_k else " resume with rl.async_mode='' (or rl.max_staleness=0)."))
  # The saved run submitted nothing past its own rl.steps: an extended run samples those
  # steps when it reaches them (AsyncSampler.catch_up_through).
  saved_steps = (saved_config or {}).get('rl', {}).get('steps', config.rl.steps)
  expected = set(range(step + 1, min(step + k, config.rl.steps, saved_steps) + 1))
  if set(inflight) != expected:
    raise ValueError(f'rl.steps: the in-flight rollouts saved at step {step} are for steps '
                     f'{sorted(inflight)}, this run expects {sorted(expected)} '
                     f'(rl.steps={config.rl.steps}, rl.max_staleness={k}).')
  return inflight


def start(run, step: int) -> AsyncSampler | None:
  """The run's sampler from its config (None when rl.async_mode is ''), resuming after
  `step` with the rollouts in flight then. Checks the resume even in sync mode: a checkpoint
  written with rollouts in flight is not resumed synchronously."""
  config = run.config
  inflight = check_resume(config, run.checkpointer.saved_config() if step else None,
                          step=step, workdir=run.workdir)
  rl = config.rl
  if not rl.get('async_mode', ''):
    return None
  if jax.process_count() > 1:
    raise ValueError('rl.async_mode is single-host for now.')
  cache_dir = jax.config.jax_compilation_cache_dir
  spec = Spec(rl=ml_collections.ConfigDict(rl.to_dict()), cfg=run.cfg, mesh=dict(config.mesh),
              stop_tokens=tuple(run.tok.eos_ids), pad_id=run.pad_id,
              cache_dir=str(cache_dir) if cache_dir else None)
  if rl.async_mode == 'process':
    sampler = ProcessSampler(spec, cpus=tuple(rl.sampler_cpus), timeout_s=rl.sampler_timeout_s)
  else:
    sampler = InlineSampler(spec, run.sample_mesh)
  logging.info('async sampling (%s), max_staleness %d, %d rollouts in flight at step %d',
               rl.async_mode, rl.max_staleness, len(inflight), step)
  catch_up = min(step + rl.max_staleness, rl.steps) if step else step
  if step and len(inflight) < catch_up - step:
    logging.warning('steps %d..%d were past the saved run\'s rl.steps: sampled by the params '
                    'of step %d when submitted (rl/async_rl.py: extending a finished run).',
                    step + 1 + len(inflight), catch_up, step)
  return AsyncSampler(run, sampler, max_staleness=rl.max_staleness, start=step,
                      inflight=inflight, catch_up_through=catch_up)
