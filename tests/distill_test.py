"""On-policy distillation (methods/distill.py, objectives/distill_kl.py): the sampled reverse-KL
advantage by hand, the chunked full-vocabulary divergences and their gradients against the
dense ones, no signal from an identical teacher or from untrained tokens, the tokenizer check,
the start-up refusals, and one RL step per form through the loop."""

import json
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rlreason import config as config_lib
from rlreason import tasks
from rlreason.methods import distill
from rlreason.model import tokenizer as tokenizer_lib
from rlreason.model import transformer
from rlreason.model import weights
from rlreason.objectives import distill_kl
from rlreason.rl import train
from rlreason.rl import update
from rlreason.structs import TrainBatch
from train_test import tiny_config


def test_reverse_kl_advantage_by_hand_on_two_tokens():
  # Student (0.5, 0.5) at both steps; teacher (0.8, 0.2) then (0.25, 0.75); sampled 0 then 1.
  student_lp = jnp.log(jnp.array([[0.5, 0.5, 0.5]]))
  teacher_lp = jnp.log(jnp.array([[0.8, 0.75, 0.3]]))
  mask = jnp.array([[True, True, False]])  # The third position is padding.
  r = distill_kl.sampled_reverse_kl(student_lp, teacher_lp, mask)
  r1, r2 = math.log(0.8 / 0.5), math.log(0.75 / 0.5)
  np.testing.assert_allclose(r, [[r1, r2, 0.0]], atol=1e-6)
  a = distill_kl.discounted_returns(r, mask, discount=0.5)
  np.testing.assert_allclose(a, [[r1 + 0.5 * r2, r2, 0.0]], atol=1e-6)
  # Full-vocabulary forms on the first step: the two KLs and JSD_0.5 by hand.
  p, q = np.array([0.5, 0.5]), np.array([0.8, 0.2])
  m = 0.5 * q + 0.5 * p
  by_hand = {1.0: np.sum(p * np.log(p / q)), 0.0: np.sum(q * np.log(q / p)),
             0.5: 0.5 * np.sum(q * np.log(q / m)) + 0.5 * np.sum(p * np.log(p / m))}
  for beta, want in by_hand.items():
    got = distill_kl.divergence_from_logits(jnp.log(jnp.asarray(p))[None, None],
                                            jnp.log(jnp.asarray(q))[None, None], beta=beta)
    np.testing.assert_allclose(got, [[want]], atol=1e-6)


@pytest.mark.parametrize('beta', [0.0, 0.3, 1.0])
def test_chunked_divergence_and_gradient_equal_the_dense_ones(beta):
  k = jax.random.split(jax.random.key(0), 5)
  h = 0.5 * jax.random.normal(k[0], (2, 5, 8))  # Student D = 8, teacher E = 12: larger.
  w = 0.5 * jax.random.normal(k[1], (8, 37))  # V = 37: the last vocab block overlaps.
  th = 0.5 * jax.random.normal(k[2], (2, 5, 12))
  tw = 0.5 * jax.random.normal(k[3], (12, 37))
  g = jax.random.normal(k[4], (2, 5))  # An arbitrary cotangent per position.

  chunked = lambda h, w: distill_kl.divergence_from_hidden(h, w, th, tw, beta=beta,
                                                          temperature=0.7, token_chunk=4,
                                                          vocab_chunk=8)
  dense = lambda h, w: distill_kl.divergence_from_logits(h @ w, th @ tw, beta=beta,
                                                        temperature=0.7)
  grad = lambda f: jax.grad(lambda h, w: jnp.sum(g * f(h, w)), (0, 1))
  both = jax.jit(lambda h, w: ((chunked(h, w), grad(chunked)(h, w)),
                               (dense(h, w), grad(dense)(h, w))))
  (got_d, got_g), (want_d, want_g) = both(h, w)
  np.testing.assert_allclose(got_d, want_d, atol=1e-6)
  for got, want in zip(got_g, want_g):
    np.testing.assert_allclose(got, want, atol=1e-6)


def _tiny(hidden=32, layers=1, vocab=16, seed=0):
  cfg = transformer.ModelConfig(vocab_size=vocab, hidden_size=hidden, intermediate_size=2 * hidden,
                                num_layers=layers, num_heads=2, num_kv_heads=1, head_dim=16,
                                tie_embeddings=True, family='qwen2')
  return cfg, transformer.init_params(cfg, jax.random.key(seed))


def _batch(params, cfg, loss_mask_NxL):
  """Two rows: 3 prompt tokens and 4 completion tokens, the last padding."""
  tokens = jnp.array([[3, 4, 5, 6, 7, 8, 0], [3, 5, 4, 9, 10, 11, 0]])
  mask_NxT = jnp.array([[1, 1, 1, 1, 1, 1, 0]] * 2, bool)
  old = update.logprobs_step(params, tokens, mask_NxT, cfg=cfg, completion_len=4).logprobs_NxT
  zeros = jnp.zeros((2, 4))
  return TrainBatch(tokens_NxT=tokens, mask_NxT=mask_NxT, loss_mask_NxL=loss_mask_NxL,
                    advantages_NxL=jnp.where(loss_mask_NxL, 1.0, 0.0), old_logprobs_NxL=old,
                    ref_logprobs_NxL=old, behaviour_logprobs_NxL=old,
                    prefix_mask_NxL=zeros.astype(bool))


def _term(form, teacher_cfg, weight=0.75, discount=0.9, beta=0.5):
  return distill.make_term(form=form, weight=weight, discount=0.0 if form == 'full_kl' else discount,
                           beta=beta, teacher_cfg=teacher_cfg, temperature=1.0)


def _logit_inputs(params, cfg, batch):
  return update.completion_stats(params, batch.tokens_NxT, batch.mask_NxT, cfg=cfg,
                                 completion_len=4, return_logits_inputs=True)[1]


def test_a_student_identical_to_the_teacher_gets_no_signal():
  cfg, params = _tiny()
  loss_mask = jnp.array([[1, 1, 1, 0], [1, 1, 1, 0]], bool)

  @jax.jit
  def token_kl(p):
    b = _batch(p, cfg, loss_mask)
    return b, _term('token_kl', cfg)(b, *_logit_inputs(p, cfg, b), params)

  batch, (adv, loss, metrics) = token_kl(params)
  assert loss is None
  np.testing.assert_allclose(adv, 0.25 * batch.advantages_NxL, atol=1e-6)  # (1 - w) A only.
  np.testing.assert_allclose(metrics['distill/kl'], 0.0, atol=1e-6)

  def full_kl(p):
    b = _batch(p, cfg, loss_mask)
    return jnp.sum(_term('full_kl', cfg)(b, *_logit_inputs(p, cfg, b), params)[1])

  value, grads = jax.jit(jax.value_and_grad(full_kl))(params)
  assert abs(float(value)) < 1e-6
  assert max(float(jnp.abs(x).max()) for x in jax.tree.leaves(grads)) < 1e-6


def test_observation_prompt_and_padding_tokens_carry_no_signal():
  student_cfg, student = _tiny(seed=0)
  teacher_cfg, teacher = _tiny(hidden=48, layers=2, seed=1)  # Larger in width and depth.
  # Row 0: completion token 1 is an episode's observation, token 3 padding.
  loss_mask = jnp.array([[1, 0, 1, 0], [1, 1, 1, 0]], bool)

  @jax.jit
  def both(student, teacher):
    batch = _batch(student, student_cfg, loss_mask).replace(
        advantages_NxL=jnp.zeros((2, 4)))  # No verifier signal: what is left is the teacher's.
    inputs = _logit_inputs(student, student_cfg, batch)
    lp_t = update.logprobs_step(teacher, batch.tokens_NxT, batch.mask_NxT, cfg=teacher_cfg,
                                completion_len=4).logprobs_NxT
    return (lp_t - batch.old_logprobs_NxL, _term('token_kl', teacher_cfg)(batch, *inputs, teacher)[0],
            _term('full_kl', teacher_cfg)(batch, *inputs, teacher)[1])

  r, adv, loss = both(student, teacher)
  for x in (adv, loss):
    assert np.all(np.asarray(x)[~np.asarray(loss_mask)] == 0.0)
    assert np.all(np.asarray(x)[np.asarray(loss_mask)] != 0.0)
  # The observation passes the return through undiscounted: A_0 = w (r_0 + γ r_2).
  np.testing.assert_allclose(adv[0, 0], 0.75 * (r[0, 0] + 0.9 * r[0, 2]), rtol=1e-5)


def _char_tokenizer(chars):
  return tokenizer_lib.from_characters(chars)


def _save_teacher(path, tok, *, hidden=48, layers=2, seed=1):
  cfg, params = _tiny(hidden=hidden, layers=layers, vocab=tok.vocab_size, seed=seed)
  weights.save(path, cfg, params)
  tok.backend.save(str(path / 'tokenizer.json'))
  (path / 'tokenizer_config.json').write_text(json.dumps(
      {'eos_token': '<eos>', 'pad_token': '<pad>', 'unk_token': '<unk>'}))
  return path


def test_a_tokenizer_mismatch_is_refused_naming_the_token(tmp_path):
  chars = tasks.get_task('arithmetic').chars
  student = _char_tokenizer(chars)
  other = ''.join('@' if c == chars[4] else c for c in chars)
  teacher_dir = _save_teacher(tmp_path, _char_tokenizer(other))
  d = config_lib.default().distill
  d.teacher = str(teacher_dir)
  with pytest.raises(ValueError, match=f"at id 7: student {chars[4]!r}, teacher '@'"):
    distill.load_teacher(d, mesh=None, student_tok=student, student_cfg=_tiny()[0])
  same_dir = _save_teacher(tmp_path / 'same', _char_tokenizer(chars))
  distill.check_tokenizers(student, tokenizer_lib.load(same_dir), where='same')  # Equal: passes.


def test_unsupported_combinations_are_refused_at_start_up():
  c = tiny_config()
  c.distill.enabled, c.distill.teacher = True, '/teacher'
  c.lora.enabled, c.rl.async_mode, c.distill.form, c.distill.discount = True, 'thread', 'full_kl', 0.5
  with pytest.raises(ValueError) as err:
    config_lib.validate(c, num_devices=8)
  for named in ('distill.enabled with lora.enabled', 'distill.enabled with rl.async_mode',
                'distill.discount=0.5', "distill.teacher='/teacher' does not exist"):
    assert named in str(err.value), (named, str(err.value))


def test_one_rl_step_per_form_through_the_loop(tmp_path):
  c = tiny_config(steps=1)
  tok = _char_tokenizer(tasks.get_task(c.data.task).chars)
  c.distill.update(enabled=True, teacher=str(_save_teacher(tmp_path / 'teacher', tok)),
                   form='token_kl', weight=0.5, discount=0.9)
  c.rl.minibatches = 1
  config_lib.validate(c, num_devices=jax.device_count())
  run = train.build(c, str(tmp_path / 'run'))
  schedule = run.methods['distill']
  assert isinstance(schedule, distill.DistillSchedule) and schedule is run.schedule
  try:
    state, _ = run.restore_or_init()
    for form in ('token_kl', 'full_kl'):  # One run: the second form only rebuilds the step.
      if form == 'full_kl':
        schedule.distill.update(form='full_kl', discount=0.0)
        schedule.attach(schedule.teacher_cfg, schedule.teacher, temperature=1.0)
      before = jax.tree.map(np.asarray, state.params)
      with jax.set_mesh(run.mesh):
        state, metrics = train.rl_step(run, state, 1, {})
      assert float(metrics['distill/kl']) > 0.0  # A random teacher disagrees with the student.
      share = 'loss_term_share' if form == 'full_kl' else 'distill/advantage_share'
      assert 0.0 < float(metrics[share]) <= 1.0, (form, metrics[share])
      assert ('loss_term' in metrics) == (form == 'full_kl')
      moved = jax.tree.map(lambda a, b: float(np.abs(np.asarray(a) - b).max()), state.params,
                           before)
      assert max(jax.tree.leaves(moved)) > 0.0, form
  finally:
    run.close()


def test_the_teacher_is_in_the_memory_estimate():
  from rlreason.rl import memory
  c = tiny_config()
  c.distill.update(enabled=True, teacher='/teacher', form='full_kl')
  cfg = transformer.ModelConfig(**{**dict(c.model.arch), 'vocab_size': 16})
  teacher_cfg = _tiny(hidden=48, layers=2)[0]
  plain = memory.step_estimate(c, cfg)
  est = memory.step_estimate(c, cfg, teacher_cfg=teacher_cfg)
  assert est['state/teacher_params'] == 4 * teacher_cfg.num_params()  # fp32, no moments.
  assert est['total'] >= plain['total'] + est['state/teacher_params']
  half = memory.step_estimate(c, cfg, teacher_cfg=teacher_cfg.replace(param_dtype='bfloat16'))
  assert half['state/teacher_params'] == est['state/teacher_params'] // 2
  c.distill.enabled = False  # Off: the teacher is not counted.
  assert memory.step_estimate(c, cfg, teacher_cfg=teacher_cfg) == plain
