"""R²PO in the trainer (arXiv 2601.11960): a residual rollout head, trained in alternating stages.

  c.r2po = dict(enabled=True, switch_steps=(40, 80, 100), init_std=1e-6)

With `config.r2po.enabled` the TrainState's params are the model's plus the head
(model/rollout_head.py, under params['rollout_head']). Every rollout samples from the
head-augmented policy z = W_lm h + W2 ReLU(W1 h), and the sampler records its behaviour
log-probs; evaluation, export and the KL reference use the model's own logits (`Run.policy`
drops the head). The stages, as the reference code runs them [C] (RRPO-ARR/Code
`rollout_head_train.py`, `adaptor_grpo_split.py`, `2stage_train.sh`):

  stage 1 (head)      the backbone frozen; the learner is the head-augmented policy (old and
                      new log-probs with the head); advantages: the rarity reward
                      (objectives/advantages.r2po_rarity), group z-scored 1/count(R = R_i).
  stage 2 (backbone)  the head frozen; the learner is the base policy (old and new log-probs
                      from W_lm h, as `lm_logits` in the reference); advantages: the
                      configured estimator (objective.advantage, GRPO by default).

Stage 1 runs for steps 1..s1, stage 2 for s1+1..s2, stage 1 again, ..., alternating at each
of `switch_steps` (the reference's 2stage_train.sh switches at 40, 80, 100, ...); the stage
after the last switch runs to the end. A frozen part gets no update at all: each stage has
its own optimizer over the same state (optax.multi_transform, the frozen label's transform
keeps its state and returns zero updates), and its gradient is zero (stop_gradient, or
absent from the forward), so global-norm clipping sees only the trained part.

The ratio choice, made explicit (algorithms.md §18 caveat): in stage 2 the behaviour policy
is the head-augmented one but π_old is the base policy's, so the PPO ratio ignores that
mismatch, as the reference code does. The mismatch is always logged (offpolicy/...
metrics: the behaviour log-probs are the sampler's); `objective.correction` (e.g.
'tis_token') corrects it by π_old/π_behaviour like any other off-policy data. Default '':
the reference's choice.

Not with LoRA (refused at start-up): the head would be a second trainable tree beside the
adapter. One compiled train step per stage.
"""

from typing import Any, Callable

import jax
import optax

from rlreason.model import rollout_head
from rlreason.model import sharding
from rlreason.rl import extensions

HEAD, BACKBONE = 'head', 'backbone'


Stage = extensions.Stage  # What one RL step's update uses (rl/extensions.py).


def stage_at(step: int, switch_steps) -> int:
  """1 for steps 1..s1, 2 for s1+1..s2, 1 for s2+1..s3, ...: 1 + (#switches before step) % 2."""
  flips = sum(1 for s in switch_steps if step > s)
  return 1 + flips % 2


def labels(params) -> Any:
  """'head' for the rollout head's leaves, 'backbone' for every other leaf."""
  return {k: jax.tree.map(lambda _: HEAD if k == rollout_head.KEY else BACKBONE, v)
          for k, v in params.items()}


def frozen(inner: optax.GradientTransformation) -> optax.GradientTransformation:
  """`inner`'s state, kept as it is, and zero updates: the params under it do not move."""
  def update(updates, state, params=None):
    del params
    return jax.tree.map(lambda u: u * 0, updates), state
  return optax.GradientTransformation(inner.init, update)


def stage_optimizer(make: Callable[[], optax.GradientTransformation], stage: int):
  """The optimizer of `stage` (1: head, 2: backbone); both have the same state structure."""
  trained = HEAD if stage == 1 else BACKBONE
  return optax.multi_transform(
      {name: make() if name == trained else frozen(make()) for name in (HEAD, BACKBONE)},
      labels)


def to_model(stage: int) -> Callable[[Any], Any]:
  """Trainable params -> the learner's model params in `stage`.

  Stage 1: the head-augmented policy with the backbone under stop_gradient. Stage 2: the base
  policy (the head is not in the forward, so its gradient is zero).
  """
  if stage == 1:
    return lambda p: rollout_head.attach(jax.lax.stop_gradient(rollout_head.detach(p)),
                                         p[rollout_head.KEY])
  return rollout_head.detach


def setup(config, cfg, params, mesh, param_shardings):
  """(params with a fresh head, their shardings), placed on the mesh."""
  head = rollout_head.init(cfg, jax.random.fold_in(jax.random.key(config.seed), 11),
                           init_std=float(config.r2po.init_std))
  params = rollout_head.attach(params, head)
  shardings = with_head_shardings(param_shardings, params, mesh, sharding.TRAIN_RULES)
  return jax.device_put(params, shardings), shardings


def with_head_shardings(model_shardings, params, mesh, rules):
  """`model_shardings` (the model's params on `mesh`) plus the head's, under `rules`."""
  head = jax.eval_shape(lambda: params[rollout_head.KEY])
  return rollout_head.attach(model_shardings, sharding.tree_shardings(
      head, rollout_head.axes(), mesh, rules))


def stages(make_train_step: Callable[[Any, Callable], Callable],
           make_optimizer: Callable[[], optax.GradientTransformation]) -> dict[int, Stage]:
  """The two stages' update pieces; `make_train_step(optimizer, to_model)` jits one step."""
  return {
      1: Stage(1, learner=lambda policy: policy, advantage='r2po_rarity',
               train_step=make_train_step(stage_optimizer(make_optimizer, 1), to_model(1)),
               metric='r2po/stage'),
      2: Stage(2, learner=rollout_head.detach, advantage='',
               train_step=make_train_step(stage_optimizer(make_optimizer, 2), to_model(2)),
               metric='r2po/stage'),
  }


def learner_schedule(config):
  """R²PO's stages under r2po.enabled (rl/extensions.py: the learner schedule), or None."""
  return R2poSchedule(config) if config.r2po.enabled else None


class R2poSchedule:
  """The params gain the rollout head; the state's optimizer is the backbone stage's (both
  stages' have the same state); the step's stage alternates at r2po.switch_steps."""

  def __init__(self, config):
    self.config, self.stages = config, None

  def setup_params(self, config, cfg, params, *, mesh, param_shardings, sample_shardings,
                   sample_mesh):
    params, trainable = setup(config, cfg, params, mesh, param_shardings)
    return params, trainable, with_head_shardings(sample_shardings, params, sample_mesh,
                                                  sharding.SAMPLE_RULES)

  def optimizer(self, make_optimizer):
    return stage_optimizer(make_optimizer, 2)

  def build_stages(self, make_train_step, make_optimizer, train_step, detach) -> None:
    del train_step, detach
    self.stages = stages(make_train_step, make_optimizer)

  def stage(self, step: int) -> Stage:
    return self.stages[stage_at(step, tuple(self.config.r2po.switch_steps))]
