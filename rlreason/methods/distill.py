"""On-policy distillation in the trainer: the student samples, a frozen teacher scores every
sampled token (algorithms.md §26; objectives/distill_kl.py has the formulas).

  c.distill = dict(enabled=True, teacher='/models/teacher', form='token_kl', weight=1.0)

A learner schedule (rl/extensions.py) with one stage whose train step carries a per-token
term (update.loss_fn's `term`) and takes the teacher's params as its extra argument, so the
teacher's forward runs in the learner's jitted step, on the same batch and mesh as the
student's, per micro-batch, with no gradient and no optimizer state:

  token_kl  A_t = (1 − w) A_verifier + w Σ_{u≥t} γ^{u−t} r_u, r_u = −(log π_old − log π_t)(y_u)
            (π_old: the batch's old log-probs; the teacher's from update.logprobs_step, the
            chunked path), fed to the configured policy loss, so clipping, aggregation and
            off-policy corrections apply unchanged. Metrics: distill/kl (the sampled
            per-token reverse KL, the mean of −r over trained tokens) and
            distill/advantage_share (the distillation part's share of Σ|A|).
  full_kl   the policy loss on (1 − w) A_verifier, plus w x the full-vocabulary divergence
            (distill_kl.divergence_from_hidden: forward, reverse or JSD_β, chunked, its own
            VJP) as a per-token loss. Metrics: distill/kl (the divergence per trained token)
            and loss_term / loss_term_share (update.loss_fn).

The mixing by `weight` is ours: the issue asks for a weight, and a convex one makes 0 plain
RL and 1 distillation alone [ours]. Both models see the sampling temperature (TRL divides both
logits by one temperature [reference code]). Only trained tokens carry a signal (the batch's
loss mask: no prompt, padding, or episode observation token), and the teacher never replays
MoE routes (its forward is its own). With epochs > 1 the teacher's forward is repeated per
epoch (its log-probs do not change): the price of keeping it inside the jitted step.

Start-up (`build`): the teacher's tokenizer (its own, or distill.tokenizer) must equal the
student's, id by id and special token by special token (an error names the first difference);
its output vocabulary must cover the student's (and equal it for 'full_kl'); it may be larger
in any other dimension. The unsupported combinations are refused by config_checks/distill.py.
"""

import functools

import jax
import jax.numpy as jnp

from rlreason.model import sharding
from rlreason.model import tokenizer as tokenizer_lib
from rlreason.model import transformer
from rlreason.model import weights
from rlreason.objectives import aggregation
from rlreason.objectives import distill_kl
from rlreason.rl import extensions
from rlreason.rl import update


def check_tokenizers(student, teacher, *, where: str) -> None:
  """Raises ValueError naming the first token (id, spelling) or special token where the
  teacher's tokenizer (read from `where`) differs from the student's."""
  n_s, n_t = student.vocab_size, teacher.vocab_size
  for i in range(max(n_s, n_t)):
    a = student.id_to_token(i) if i < n_s else None
    b = teacher.id_to_token(i) if i < n_t else None
    if a != b:
      raise ValueError(f'distill: the teacher tokenizer ({where}) differs from the student\'s '
                       f'at id {i}: student {a!r}, teacher {b!r} (vocabularies of {n_s} and '
                       f'{n_t} ids); on-policy distillation needs identical tokenizers.')
  for name in ('bos_id', 'eos_id', 'pad_id'):
    a, b = getattr(student, name), getattr(teacher, name)
    if a != b:
      raise ValueError(f'distill: the teacher tokenizer ({where}) has {name}={b!r} '
                       f'({_spelling(teacher, b)}), the student {a!r} ({_spelling(student, a)}).')
  a, b = dict(student.special_tokens), dict(teacher.special_tokens)
  for key in sorted(set(a) | set(b)):
    if a.get(key) != b.get(key):
      raise ValueError(f'distill: the teacher tokenizer ({where}) has special token {key}='
                       f'{b.get(key)!r}, the student {a.get(key)!r}.')


def _spelling(tok, i):
  return None if i is None else tok.id_to_token(i)


def load_teacher(d, *, mesh, student_tok, student_cfg):
  """(teacher ModelConfig, params on `mesh` under the training rules, or on the default
  device without one), after the tokenizer and vocabulary checks. `d` is config.distill."""
  where = d.tokenizer or d.teacher
  check_tokenizers(student_tok, tokenizer_lib.load(where), where=where)
  placement = {} if mesh is None else dict(mesh=mesh, rules=sharding.TRAIN_RULES)
  cfg, params = weights.load(d.teacher, param_dtype=d.dtype, compute_dtype=d.dtype, **placement)
  if cfg.vocab_size < student_cfg.vocab_size or (
      d.form == 'full_kl' and cfg.vocab_size != student_cfg.vocab_size):
    need = 'equal' if d.form == 'full_kl' else 'at least'
    raise ValueError(f'distill.teacher={d.teacher!r} has {cfg.vocab_size} output ids, the '
                     f'student {student_cfg.vocab_size}; distill.form={d.form!r} needs {need} '
                     "the student's.")
  return cfg, params


def teacher_hidden(teacher, tokens_NxT, mask_NxT, *, cfg, completion_len: int):
  """The teacher's final hidden states NxLxE before each completion token, and its output
  matrix ExV (logits = h @ w), without gradients."""
  teacher = jax.lax.stop_gradient(teacher)
  h_NxTxE, _ = transformer.apply(teacher, tokens_NxT, cfg=cfg, mask_NxT=mask_NxT,
                                 return_hidden=True)
  p = tokens_NxT.shape[1] - completion_len
  w_ExV = teacher['embed'].T if cfg.tie_embeddings else teacher['lm_head']
  return h_NxTxE[:, p - 1:-1], w_ExV


def make_term(*, form: str, weight: float, discount: float, beta: float, teacher_cfg,
              temperature: float):
  """update.loss_fn's `term` (batch, h_NxLxE, w_ExV, teacher) -> (advantages, loss, metrics)
  for distillation `form`; see the module docstring."""

  def term(batch, h_NxLxE, w_ExV, teacher):
    mask_NxL = batch.loss_mask_NxL
    length = mask_NxL.shape[1]
    verifier_NxL = (1.0 - weight) * batch.advantages_NxL
    if form == 'token_kl':
      teacher_lp_NxL = update.logprobs_step(
          jax.lax.stop_gradient(teacher), batch.tokens_NxT, batch.mask_NxT, cfg=teacher_cfg,
          completion_len=length, temperature=temperature).logprobs_NxT
      r_NxL = distill_kl.sampled_reverse_kl(batch.old_logprobs_NxL, teacher_lp_NxL, mask_NxL)
      distill_NxL = weight * distill_kl.discounted_returns(r_NxL, mask_NxL, discount=discount)
      size = jnp.sum(jnp.abs(verifier_NxL) * mask_NxL) + jnp.sum(jnp.abs(distill_NxL))
      metrics = {'distill/kl': aggregation.masked_mean(-r_NxL, mask_NxL),
                 'distill/advantage_share': jnp.sum(jnp.abs(distill_NxL)) / jnp.maximum(
                     size, 1e-9)}
      return (verifier_NxL + distill_NxL) * mask_NxL, None, metrics
    teacher_h_NxLxE, teacher_w_ExV = teacher_hidden(teacher, batch.tokens_NxT, batch.mask_NxT,
                                                    cfg=teacher_cfg, completion_len=length)
    div_NxL = distill_kl.divergence_from_hidden(h_NxLxE, w_ExV, teacher_h_NxLxE, teacher_w_ExV,
                                                beta=beta, temperature=temperature)
    div_NxL = jnp.where(mask_NxL, div_NxL, 0.0)
    return (verifier_NxL * mask_NxL, weight * div_NxL,
            {'distill/kl': aggregation.masked_mean(div_NxL, mask_NxL)})

  return term


def learner_schedule(config):
  """The distillation schedule under distill.enabled (rl/extensions.py), or None."""
  d = config.get('distill')
  return DistillSchedule(config) if d is not None and d.enabled else None


def build(run):
  """Loads the teacher into the run's schedule (after the tokenizer check): run.methods
  ['distill'] is the schedule itself. None when distillation is off."""
  d = run.config.get('distill')
  if d is None or not d.enabled:
    return None
  cfg, params = load_teacher(d, mesh=run.mesh, student_tok=run.tok, student_cfg=run.cfg)
  run.schedule.attach(cfg, params, temperature=run.objective.temperature)
  return run.schedule


class DistillSchedule:
  """One stage, every step: the configured estimator, then the teacher's term in the step."""

  def __init__(self, config):
    self.distill, self.teacher_cfg, self.teacher = config.distill, None, None
    self._stage = self._make_step = self._optimizer = self._learner = None

  def setup_params(self, config, cfg, params, *, mesh, param_shardings, sample_shardings,
                   sample_mesh):
    del config, cfg, mesh, sample_mesh
    return params, param_shardings, sample_shardings

  def optimizer(self, make_optimizer):
    self._optimizer = make_optimizer()
    return self._optimizer

  def build_stages(self, make_train_step, make_optimizer, train_step, detach) -> None:
    del make_optimizer, train_step  # The step is built once the teacher is known (`attach`).
    self._make_step, self._learner = make_train_step, detach

  def attach(self, teacher_cfg, teacher, *, temperature: float) -> None:
    """The teacher's config and params: builds the stage's jitted step around them."""
    d = self.distill
    self.teacher_cfg, self.teacher = teacher_cfg, teacher
    term = make_term(form=d.form, weight=float(d.weight), discount=float(d.discount),
                     beta=float(d.beta), teacher_cfg=teacher_cfg, temperature=temperature)
    step = self._make_step(self._optimizer, None, term)
    self._stage = extensions.Stage(0, learner=self._learner, advantage='',
                                   train_step=functools.partial(_with_teacher, step, teacher))

  def stage(self, step: int) -> extensions.Stage:
    del step
    if self._stage is None:
      raise RuntimeError('distill: no teacher attached (methods/distill.build loads it when '
                         'the run is built).')
    return self._stage


def _with_teacher(step, teacher, state, batch):
  return step(state, batch, teacher)
