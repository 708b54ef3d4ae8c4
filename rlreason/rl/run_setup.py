"""Everything a run builds once from its config: model, tokenizer, data, verifiers, jitted steps.

`build(config, workdir) -> Run`. The Run holds the pieces the loop in train.py uses, plus the
supervised warm start (`sft_loop`), which shares the same state and checkpoints. A method's
built state is not a field here: it is `run.methods[name]` (rl/extensions.py).

Deliberately not here: the RL loop (train.py), per-step batch construction (rl_batch.py).
"""

import dataclasses
import functools
import logging
import pathlib
from typing import Any, Callable

from etils import epath
import jax
import jax.numpy as jnp
import ml_collections
import optax

from rlreason import config as config_lib
from rlreason import multihost
from rlreason import tasks
from rlreason import workdir_paths
from rlreason.envs import environment as environment_lib
from rlreason.envs import render
from rlreason.envs import tasks as env_tasks  # noqa: F401 (registers the tool-use tasks)
from rlreason.model import moe_config
from rlreason.model import rollout_head
from rlreason.model import sharding
from rlreason.model import tokenizer as tokenizer_lib
from rlreason.model import transformer
from rlreason.model import weights
from rlreason.rl import adapters
from rlreason.rl import checkpoint
from rlreason.rl import extensions
from rlreason.rl import memory
from rlreason.rl import prompt_schedule
from rlreason.rl import update
from rlreason.rollout import judge as judge_lib
from rlreason.rollout import sampler
from rlreason.structs import Prompts
from rlreason.tasks import data
from rlreason.verifiers import pool as pool_lib


@dataclasses.dataclass
class Run:
  """The built pieces of a run; see `build`."""
  config: ml_collections.ConfigDict
  workdir: epath.Path  # Local or gs:// (workdir_paths.py).
  cfg: transformer.ModelConfig
  tok: tokenizer_lib.Tokenizer
  pad_id: int
  mesh: jax.sharding.Mesh
  state_shardings: Any
  sample_shardings: Any
  objective: update.Objective
  train_step: Callable
  logprobs: Callable
  init_params: Any
  data_iter: Any
  eval_examples: list
  eval_chunk: int
  pool: pool_lib.VerifierPool
  checkpointer: checkpoint.Checkpointer
  root_rng: jax.Array
  eval_rng: jax.Array
  optimizer: Any
  ref_params: Any = None
  sample_mesh: Any = None  # Where the sampler runs (config.sample_mesh); the mesh by default.
  judge: Any = None  # With config.judge.enabled: a judge.Judge and the RewardComposition
  reward_mix: Any = None  # of its reward with the verifier's.
  values: Callable | None = None  # With critic.enabled: jitted update.values_step,
  init_value_params: Any = None  # the fresh value head
  value_optimizer: Any = None  # and its optimizer (critic.lr).
  restored: bool = False  # Set by restore_or_init: whether a checkpoint was found.
  env: Any = None  # With env.enabled: the envs.environment.ToolEnvironment
  renderer: Any = None  # and the text around its turns (envs.render).
  adapter: Any = None  # With lora.enabled: the frozen base and its merge (rl/adapters.py).
  # The learner schedule (rl/extensions.py): one plain stage, or a method's (R²PO's stages).
  schedule: Any = dataclasses.field(default_factory=extensions.PlainSchedule)
  # The methods this config turns on, by name (rl/extensions.py): each one's built state.
  methods: dict = dataclasses.field(default_factory=dict)

  def policy(self, trainable):
    """The model's params from the TrainState's (what evaluation, export and the reference
    policy use): the adapter merged into the frozen base under LoRA, R²PO's rollout head
    left out, else the params themselves."""
    return rollout_head.detach(self.rollout_policy(trainable))

  def rollout_policy(self, trainable):
    """The params the sampler runs: `policy`'s, with R²PO's rollout head when it has one."""
    return trainable if self.adapter is None else self.adapter.merge(self.adapter.base,
                                                                      trainable)

  def stage(self, step: int) -> extensions.Stage:
    """What step `step`'s update uses: the learner schedule's stage then."""
    return self.schedule.stage(step)

  def restore_or_init(self, release_init_params: bool = False):
    """(state, step): the newest restorable checkpoint, or fresh state at step 0.

    Sets `self.restored`: a restored step 0 is the finished warm start, not a fresh state.
    With `release_init_params` (the training loop, whose later code reads only their shapes),
    a fresh state takes over the buffers of `self.init_params` (donated, not copied) and
    `self.init_params` becomes their ShapeDtypeStructs, so the loaded weights are not held
    twice (2 GB at Qwen2.5-0.5B's shapes: experiments/bench/real_shapes.py).
    """
    self.restored = False
    abstract = jax.tree.map(lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s),
                            jax.eval_shape(self.init_state, self.init_params),
                            self.state_shardings)  # Shapes only: no second state in memory.
    saved_config = self.checkpointer.saved_config()
    if saved_config is not None:  # Before the state: a LoRA state's tree is not a full one's.
      adapters.check_resume(saved_config, self.adapter, self.config)
    restored = self.checkpointer.restore(abstract, config=self.saved_config())
    if jax.process_index() == 0:  # Only now: a failed resume keeps the old record.
      checkpoint.write_run_config(self.workdir, self.config.to_dict())
    if release_init_params:
      shapes = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=x.sharding),
                            self.init_params)
      state = self._fresh_state(donate=True) if restored is None else None
      self.init_params = shapes
      if restored is None:
        return state, 0
    elif restored is None:
      return self._fresh_state(), 0
    step, state, data_state, _ = restored
    self.restored = True
    if data_state:
      self.data_iter.set_state(data_state)
    if jax.process_index() == 0:
      print(f'resumed from step {step} (workdir {self.workdir})', flush=True)
    if self.config.objective.kl_coef:
      self.ref_params = self.warm_start_policy(abstract)
    for hook in extensions.hooks(self, 'on_restore'):  # Methods' state at that step.
      hook(self, step, abstract)
    return state, step

  def saved_config(self) -> dict:
    """The config a checkpoint of this run carries (with a LoRA base's fingerprint)."""
    config = self.config.to_dict()
    if self.adapter is not None:
      config[adapters.FINGERPRINT_KEY] = self.adapter.fingerprint
    return config

  def init_state(self, params):
    """A fresh TrainState around `params` (with the critic head when the config has one)."""
    return update.init_state(params, self.optimizer, value_params=self.init_value_params,
                             value_optimizer=self.value_optimizer)

  def _fresh_state(self, donate: bool = False):
    with jax.set_mesh(self.mesh):
      return jax.jit(self.init_state, out_shardings=self.state_shardings,
                     donate_argnums=(0,) if donate else ())(self.init_params)

  def warm_start_policy(self, abstract):
    """The step-0 policy (after the warm start): the reference policy, or None."""
    restored = warm_start_checkpointer(self.workdir).restore(abstract)
    return None if restored is None else self.policy(restored[1].params)

  def save(self, step: int, state, *, metrics=None) -> None:
    if step == 0 and self.config.objective.kl_coef:
      self.ref_params = jax.tree.map(jnp.copy, self.policy(state.params))
    kw = dict(data_state=self.data_iter.get_state(), config=self.saved_config(), force=True)
    self.checkpointer.save(step, state, metrics=metrics, **kw)
    self.checkpointer.wait()
    for hook in extensions.hooks(self, 'on_save'):  # Methods' state beside the checkpoint.
      hook(self, step, state)
    if step == 0:  # Kept apart from keep-last-k: the reference policy and baselines start here.
      warm = warm_start_checkpointer(self.workdir)
      warm.save(0, state, **kw)
      warm.wait()
      warm.close()

  def close(self) -> None:
    self.checkpointer.close()
    for close in extensions.hooks(self, 'close'):
      close()
    self.pool.close()


def warm_start_checkpointer(workdir) -> checkpoint.Checkpointer:
  """The step-0 state (after the SFT warm start), outside keep-last-k rotation."""
  return checkpoint.Checkpointer(workdir_paths.as_path(workdir) / 'warm_start', keep=1)


def _tokenizer(config) -> tokenizer_lib.Tokenizer:
  if config.tokenizer.kind == 'chars':
    if config.data.source != 'task':
      raise ValueError("tokenizer.kind='chars' needs data.source='task' (it uses the task's "
                       'character set); set tokenizer.kind="hf" and tokenizer.path.')
    return tokenizer_lib.from_characters(tasks.get_task(config.data.task).chars)
  path = config.tokenizer.path or config.model.path  # The checkpoint's own, unless set.
  return tokenizer_lib.load(path, extra_eos=tuple(config.tokenizer.extra_eos))


def _examples(config):
  """(infinite batched train iterator, held-out list) for the configured source."""
  d, b = config.data, config.rl.prompts_per_step
  # Every host reads the same global stream and owns a block of each batch (multihost.py):
  # the data then does not depend on the host count, and its iterator state is the same on
  # every host (process 0 checkpoints it).
  shard = dict(shard_index=0, shard_count=1)
  if d.source == 'task':
    options = dict(d.task_options)
    stream = data.synthetic_stream(d.task, seed=config.seed, difficulty=d.difficulty,
                                   options=options, held_out_fraction=d.held_out_fraction,
                                   **shard)
    held_out = data.held_out_set(d.task, config.eval.num_prompts, seed=config.seed,
                                 difficulty=d.difficulty, options=options,
                                 held_out_fraction=d.held_out_fraction)
  else:
    fmt = data.record_format(d.format)
    load = data.load_jsonl if d.source == 'jsonl' else data.load_parquet
    train_examples = load(d.path, fmt)
    if d.eval_path:
      held_out = load(d.eval_path, fmt)[:config.eval.num_prompts]
    else:  # The file's last examples, kept out of training.
      k = min(config.eval.num_prompts, len(train_examples) // 10)
      train_examples, held_out = train_examples[:len(train_examples) - k], train_examples[-k:]
      logging.info('data.eval_path is empty: the last %d examples of %s are held out.', k,
                   d.path)
    stream = data.examples_dataset(train_examples, seed=config.seed, **shard)
  return _schedule(config, stream), held_out


def _schedule(config, stream):
  """The prompt schedule over the train stream: uniform batches or HeaPA's frontier pool."""
  b, h = config.rl.prompts_per_step, config.data.heapa
  if config.data.schedule == 'uniform':
    return prompt_schedule.UniformSchedule(iter(data.batched(stream, b)))
  pool = prompt_schedule.FrontierPool(capacity=h.pool_size, low_fraction=h.low_fraction,
                                      mode=h.mode, seed=config.seed)
  return prompt_schedule.FrontierSchedule(iter(stream), batch_size=b, pool=pool,
                                          fresh_per_step=h.fresh_per_step)


def _params(config, tok):
  m = config.model
  if m.init == 'hf':
    cfg, params = weights.load(m.path, param_dtype=m.param_dtype, compute_dtype=m.compute_dtype)
    return cfg.replace(remat=m.remat), params
  arch = dict(m.arch)
  arch['vocab_size'] = arch['vocab_size'] or tok.vocab_size
  moe = m.get('moe')
  moe = (moe_config.MoEConfig(**{**dict(moe), 'mlp_only_layers': tuple(moe.mlp_only_layers)})
         if moe and moe.num_experts else None)
  cfg = transformer.ModelConfig(**arch, param_dtype=m.param_dtype, compute_dtype=m.compute_dtype,
                          remat=m.remat, moe=moe)
  return cfg, transformer.init_params(cfg, jax.random.key(config.seed))


def make_optimizer(*, lr: float, warmup_steps: int, b1: float = 0.9, b2: float = 0.999,
                   weight_decay: float = 0.0, grad_clip: float = 1.0,
                   decay_steps: int = 0):
  """AdamW with linear warmup (then cosine decay to lr/10 over decay_steps if > 0), after
  global-norm clipping when grad_clip > 0."""
  if decay_steps:
    warmup = min(warmup_steps, decay_steps // 2)  # Short runs (smoke tests) still decay.
    schedule = optax.warmup_cosine_decay_schedule(0.0, lr, warmup, decay_steps, lr / 10)
  else:
    schedule = optax.linear_schedule(0.0, lr, warmup_steps) if warmup_steps else lr
  adamw = optax.adamw(schedule, b1=b1, b2=b2, weight_decay=weight_decay)
  return optax.chain(optax.clip_by_global_norm(grad_clip), adamw) if grad_clip > 0 else adamw


def build(config: ml_collections.ConfigDict, workdir: str | pathlib.Path) -> Run:
  workdir = workdir_paths.check(workdir)  # A missing 'gcs' extra, before anything loads.
  tok = _tokenizer(config)
  cfg, params = _params(config, tok)
  if tok.vocab_size > cfg.vocab_size:
    raise ValueError(f'tokenizer has {tok.vocab_size} ids but the model only '
                     f'{cfg.vocab_size} (model.arch.vocab_size / the checkpoint).')
  memory.check_sample_memory(config, cfg)  # rl.sample_memory_gb against rl.slots.
  mesh = sharding.make_mesh(dict(config.mesh))
  sample_mesh = multihost.sample_mesh(mesh, **dict(config.get('sample_mesh', {'kind': 'train'})))
  others = ('prefix_rollouts', 'hapo', 'judge')
  if sample_mesh is not mesh and any(config[k].enabled for k in others):
    raise ValueError("sample_mesh.kind='host' samples the policy only: prefix_rollouts, hapo "
                     'and judge still sample on the training mesh; turn them off.')
  param_sh = sharding.param_shardings(cfg, mesh, sharding.TRAIN_RULES)
  adapter, trainable_sh = None, param_sh
  if adapters.lora_config(config) is not None:  # Train an adapter; the base stays frozen.
    adapter, params, trainable_sh = adapters.setup(config, cfg, params, mesh, param_sh, tok=tok)
  sample_sh = sharding.param_shardings(cfg, sample_mesh, sharding.SAMPLE_RULES)
  # DART: the policy carries its routed adapters (rl/adapters.py).
  sample_sh = adapters.rollout_shardings(adapter, sample_sh, trainable_sh, sample_mesh)
  schedule = extensions.learner_schedule(config)  # R²PO's: the params + its rollout head.
  params, trainable_sh, sample_sh = schedule.setup_params(
      config, cfg, params, mesh=mesh, param_shardings=trainable_sh, sample_shardings=sample_sh,
      sample_mesh=sample_mesh)
  params = jax.device_put(params, trainable_sh)
  opt = config.optimizer
  make_opt = functools.partial(make_optimizer, lr=opt.lr, warmup_steps=opt.warmup_steps,
                               b1=opt.b1, b2=opt.b2, weight_decay=opt.weight_decay,
                               grad_clip=opt.grad_clip)
  optimizer = schedule.optimizer(make_opt)  # A schedule's stages share the state's structure.
  critic = config.critic
  value_optimizer = value_params = None
  if critic.enabled:
    value_params = transformer.init_value_head(cfg)
    value_optimizer = make_optimizer(lr=critic.lr, warmup_steps=critic.warmup_steps,
                                     b1=opt.b1, b2=opt.b2, grad_clip=critic.grad_clip)
  abstract_state = jax.eval_shape(lambda p, v: update.init_state(
      p, optimizer, value_params=v, value_optimizer=value_optimizer), params, value_params)
  state_sh = update.state_shardings(abstract_state, trainable_sh, mesh)
  o = config.objective
  objective = update.Objective(
      policy_loss=o.policy_loss, loss_kwargs=tuple(sorted(dict(o.loss_kwargs).items())),
      aggregation=o.aggregation, max_len=config_lib.completion_length(config), kl_coef=o.kl_coef,
      kl_estimator=o.kl_estimator, entropy_coef=o.entropy_coef,
      temperature=max(config.rl.temperature, 1e-6), group_size=config.rl.group_size,
      value_coef=critic.coef if critic.enabled else 0.0, value_clip=critic.clip,
      num_turns=config.env.max_turns if config.env.enabled else 1,
      correction=o.get('correction', ''),
      correction_kwargs=tuple(sorted(dict(o.get('correction_kwargs', {})).items())))
  train_step = jax.jit(
      lambda s, b, base: update.train_step(s, b, cfg=cfg, objective=objective,
                                           optimizer=optimizer,
                                           micro_batches=config.rl.micro_batches,
                                           value_optimizer=value_optimizer,
                                           to_model=adapters.to_model(adapter, base, cfg)),
      out_shardings=(state_sh, None), donate_argnums=0)
  train_step = functools.partial(train_step, base=None if adapter is None else adapter.base)
  # One train step per stage, each with its optimizer and learner (a plain run: train_step);
  # a stage's `term` (update.loss_fn; methods/distill.py) takes the step's extra arguments.
  schedule.build_stages(lambda stage_opt, stage_to_model, term=None: jax.jit(
      lambda s, b, *args: update.train_step(s, b, cfg=cfg, objective=objective,
                                            optimizer=stage_opt,
                                            micro_batches=config.rl.micro_batches,
                                            value_optimizer=value_optimizer,
                                            to_model=stage_to_model, term=term, term_args=args),
      out_shardings=(state_sh, None), donate_argnums=0), make_opt, train_step,
                        rollout_head.detach)
  logprobs = jax.jit(lambda p, t, m, l, trie=None: update.logprobs_step(
      p, t, m, cfg=cfg, completion_len=l, temperature=objective.temperature, trie=trie),
                     static_argnums=3)
  data_iter, eval_examples = _examples(config)
  pad_id = tok.pad_id if tok.pad_id is not None else 0
  root = jax.random.key(config.seed)
  run = Run(
      config=config, workdir=workdir, cfg=cfg, tok=tok, pad_id=pad_id, mesh=mesh,
      state_shardings=state_sh,
      sample_shardings=sample_sh,
      sample_mesh=sample_mesh,
      objective=objective, train_step=train_step, logprobs=logprobs, init_params=params,
      data_iter=data_iter, eval_examples=eval_examples,
      eval_chunk=multihost.round_up(min(len(eval_examples), 256) or 1),
      # Forked from one JAX-free server per process with sympy/math-verify preloaded: a second
      # run in the same process (a notebook, the tests) starts its pool in ~0.1 s, not ~3 s.
      pool=pool_lib.VerifierPool(num_workers=config.verifier.workers, start_method='forkserver'),
      checkpointer=checkpoint.Checkpointer(workdir, keep=config.checkpoint.keep,
                                           best_metric='eval/pass@1'),
      root_rng=multihost.replicate_key(jax.random.fold_in(root, 1), mesh),
      eval_rng=multihost.replicate_key(jax.random.fold_in(root, 2), mesh),
      optimizer=optimizer, init_value_params=value_params, value_optimizer=value_optimizer,
      adapter=adapter, schedule=schedule)
  if critic.enabled:
    run.init_value_params = jax.device_put(value_params, state_sh.value_params)
    run.values = jax.jit(lambda p, v, t, m, l: update.values_step(
        p, v, t, m, cfg=cfg, completion_len=l), static_argnums=4)
  if jax.process_count() > 1 and config.env.enabled:
    raise ValueError('env.enabled is single-host for now: the episode loop reads every row\'s '
                     'tokens on the host between turns.')
  if config.env.enabled:
    run.env, run.renderer = make_environment(config, tok, eval_examples[:8])
  if config.judge.enabled:
    run.judge, run.reward_mix = judge_lib.from_config(config.judge, policy_cfg=cfg, policy_tok=tok,
                                                      mesh=mesh, seed=config.seed)
    if config.judge.get('rubrics'):  # SCRIBE: each step judged with its routed rubric.
      from rlreason.rollout import scribe
      run.judge = scribe.wrap(config.judge, run.judge)
  run.methods = extensions.build_methods(run)  # Last: a method may read any core piece.
  return run


def make_environment(config, tok, examples=()):
  """(ToolEnvironment, renderer) from config.env; `examples`' tool contexts are checked now
  (a missing corpus file fails at start-up, naming it)."""
  e = config.env
  if e.get('kind', 'tools') == 'patient':  # MIND's simulated patient (envs/patient.py).
    from rlreason.envs import patient
    return patient.make_environment(config)
  if e.get('kind', 'tools') == 'artist':  # ARTIST's roles on ts_rare_event (envs/artist.py).
    from rlreason.envs import artist
    return artist.make_environment(config)
  if e.get('kind', 'tools') == 'prolog':  # Prolog-as-a-Tool's protocols (envs/prolog_protocols).
    from rlreason.envs import prolog_protocols
    return prolog_protocols.make_environment(config)
  env = environment_lib.ToolEnvironment(
      tools=tuple(e.tools), family=e.family, verifier=e.verifier, max_turns=e.max_turns,
      error_penalty=e.error_penalty, deadline_s=e.deadline_s)
  for example in examples:
    env.check_context(example.meta)
  renderer = render.make_renderer(tok, family=e.family, tools=env.specs(),
                                  system_prompt=e.system_prompt,
                                  prompt_template=config.data.prompt_template,
                                  chat_kwargs=dict(e.chat_kwargs),
                                  tool_calls_per_turn=e.get('tool_calls_per_turn', ''))
  return env, renderer


_TOKENIZER_FILES = ('tokenizer.json', 'tokenizer_config.json', 'special_tokens_map.json',
                    'vocab.json', 'merges.txt', 'tokenizer.model', 'generation_config.json',
                    'chat_template.jinja')


def export_policy(run: Run, params, path, *, dtype: str = '') -> pathlib.Path:
  """Writes the policy of the TrainState's `params` as a HF directory (weights.save) with the
  HF tokenizer's files, if any; under LoRA the merged model, and with export.peft_path also
  the adapter in PEFT's format (model/adapter_export.py)."""
  import shutil
  path = pathlib.Path(path)
  weights.save(path, run.cfg, run.policy(params), dtype=dtype or None)
  peft_path = run.config.export.get('peft_path', '')
  if run.adapter is not None and peft_path:
    from rlreason.model import adapter_export
    quantized = run.adapter.lora_cfg.quantize
    # A quantised base is written dequantised beside the adapter: peft applies it to that.
    base_name = (f'{peft_path}-dequantized-base' if quantized else
                 run.config.model.path if run.config.model.init == 'hf' else '')
    adapter_export.save_peft(peft_path, run.cfg, jax.device_get(params), run.adapter.lora_cfg,
                             base_name,
                             quantized_base=jax.device_get(run.adapter.base) if quantized else None)
    logging.info('exported the LoRA adapter (PEFT format) to %s', peft_path)
  if run.config.tokenizer.kind == 'hf':
    for name in _TOKENIZER_FILES:
      source = pathlib.Path(run.config.tokenizer.path) / name
      if source.is_file():
        shutil.copyfile(source, path / name)
  logging.info('exported the policy to %s', path)
  return path


def encode_prompts(run: Run, examples) -> Prompts:
  ids = [run.tok.encode(render_prompt(run.config.data.prompt_template, run.tok, ex.prompt))
         for ex in examples]
  return sampler.prepare_prompts(ids, buckets=run.config.data.prompt_buckets, pad_id=run.pad_id)


def render_prompt(template: str, tok, prompt: str) -> str:
  """data.prompt_template applied: 'chat' renders one user turn with the tokenizer's own chat
  template and its generation prompt; anything else is a format string with {prompt}."""
  if template == 'chat':
    return tok.apply_chat_template([{'role': 'user', 'content': prompt}],
                                   add_generation_prompt=True)
  return template.format(prompt=prompt)


def prompt_text(run: Run, example) -> str:
  """The prompt as the policy sees it: the episode renderer's, or data.prompt_template's."""
  if run.renderer is not None:
    return run.renderer.prompt_text(example)
  return render_prompt(run.config.data.prompt_template, run.tok, example.prompt)
