"""Start-up checks of trainable additions to the model: LoRA, DART routing, R²PO's rollout head
and learned reward models (rlreason.config_checks.validate calls them).
"""


def check_lora(c, check) -> None:
  """What can be checked before the model is known; model/lora.check does the rest (targets
  that match nothing, a rank above a layer's) when the run is built."""
  from rlreason.model import lora
  lc = c.lora
  check(isinstance(lc.rank, int) and lc.rank > 0, f'lora.rank={lc.rank!r} must be an integer > 0.')
  check(lc.alpha > 0, f'lora.alpha={lc.alpha} must be > 0.')
  check(lc.dropout == 0, f'lora.dropout={lc.dropout}: only 0 is supported (the adapter is merged '
                         'into the weights; model/lora.py says why).')
  check(lc.quantize in lora.QUANTIZE_MODES,
        f'lora.quantize={lc.quantize!r}; known: {list(lora.QUANTIZE_MODES)}.')
  check(bool(lc.targets), 'lora.targets is empty; e.g. ("q", "k", "v", "o").')
  check(not c.prefix_rollouts.enabled, 'prefix_rollouts.enabled is not supported with LoRA yet '
                                       '(its snapshots are full params).')
  routing = lc.get('routing', '')
  check(not c.export.peft_path or bool(c.export.path) or routing == 'dart',
        f'export.peft_path={c.export.peft_path!r} needs export.path (the merged model) too.')
  check_dart(c, check, routing)


def check_dart(c, check, routing: str) -> None:
  """lora.routing and lora.cea_every (model/dart.py, methods/cea.py)."""
  from rlreason.model import dart
  lc, e = c.lora, c.env
  check(routing in ('', 'dart'), f"lora.routing={routing!r}; known: '' (one adapter), 'dart'.")
  cea_every = lc.get('cea_every', 0)
  check(isinstance(cea_every, int) and cea_every >= 0,
        f'lora.cea_every={cea_every!r} must be an integer >= 0 (0: off).')
  if routing != 'dart' and not cea_every:
    return
  what = "lora.routing='dart'" if routing == 'dart' else f'lora.cea_every={cea_every}'
  check(e.enabled and e.get('kind', 'tools') == 'tools' and e.family in dart.OPEN_TAGS,
        f"{what} splits tokens by the env's call tags: it needs env.enabled with tools and "
        f'env.family in {sorted(dart.OPEN_TAGS)} (got enabled={e.enabled}, family={e.family!r}'
        '; llama3 calls have no open tag).')
  if routing != 'dart':
    return
  check(not c.export.path, f'export.path={c.export.path!r}: a merged HF checkpoint cannot '
        "represent lora.routing='dart' (each token picks its adapter); set export.path='' and "
        'export.peft_path to write both adapters in PEFT format (peft_path/reason, /tool).')
  for field, on in (('env.rollback.enabled', e.get('rollback', {}).get('enabled', False)),
                    ('slate.enabled', c.slate.enabled),
                    ("env.state='typed'", e.get('state', 'raw') == 'typed')):
    check(not on, f"{field} is not supported with lora.routing='dart' (its loop feeds tokens "
                  'through the cache without carrying the routing state).')


def check_r2po(c, check) -> None:
  """R²PO's schedule and what it cannot be combined with (methods/r2po.py)."""
  switches = tuple(c.r2po.switch_steps)
  check(all(isinstance(s, int) and s >= 0 for s in switches)
        and list(switches) == sorted(set(switches)),
        f'r2po.switch_steps={switches!r}: strictly increasing step numbers >= 0.')
  check(c.r2po.init_std > 0, f'r2po.init_std={c.r2po.init_std!r} must be > 0 (the reference '
        'draws the head from N(0, 1e-6)).')
  for other in ('lora', 'prefix_rollouts', 'hapo'):
    check(not c[other].enabled, f'r2po.enabled with {other}.enabled: not supported together '
          f'(the rollout head is a second trainable tree the {other} path does not carry); '
          'turn one off.')


def check_reward_model(c, check) -> None:
  """A learned reward's path and options, and its training settings (methods/reward_model.py)."""
  import pathlib
  r, t = c.reward_model, c.reward_model.train
  if r.path:
    check(pathlib.Path(r.path, 'reward_model.json').exists(),
          f'reward_model.path={r.path!r} is not a reward model directory (no reward_model.json; '
          'train one with reward_model.train.enabled=True).')
    check(r.transform in ('sigmoid', 'raw'),
          f"reward_model.transform={r.transform!r}; known: 'sigmoid', 'raw'.")
    check(r.weight >= 0 and r.verifier_weight >= 0,
          f'reward_model.weight={r.weight} and verifier_weight={r.verifier_weight} must be >= 0.')
    check(not c.env.enabled, 'reward_model.path scores single-turn completions; env episodes '
                             'are rewarded by their environment.')
    check(not t.enabled, 'reward_model.train.enabled trains a reward model; reward_model.path '
                         'uses one in an RL run: set one of them.')
  if t.enabled:
    check(t.mode in ('pointwise', 'pairwise'),
          f"reward_model.train.mode={t.mode!r}; known: 'pointwise', 'pairwise'.")
    for name in ('steps', 'batch_size', 'problems', 'traces_per_problem', 'eval_problems'):
      check(t[name] >= 1, f'reward_model.train.{name}={t[name]} must be >= 1.')
    check(t.lr > 0, f'reward_model.train.lr={t.lr} must be > 0.')
    check(bool(c.sft.teacher), 'reward_model.train labels the answers of sft.teacher: set it '
                               '(e.g. rlreason.tasks.arithmetic:flawed_solution).')
    check(c.data.source == 'task', 'reward_model.train draws problems from a synthetic task '
                                   "(data.source='task').")
