"""rl/memory.step_estimate: its arithmetic by hand on a tiny config, and its update and
old-log-prob parts against XLA's compiled memory analysis of the real steps."""

import jax
import jax.numpy as jnp
import pytest

from rlreason import config as config_lib
from rlreason.model import transformer
from rlreason.rl import memory
from rlreason.rl import run_setup
from rlreason.rl import update
from rlreason.structs import TrainBatch


def tiny(*, remat='none', micro_batches=1, d=8, f=16, layers=1, vocab=32, heads=2, kv_heads=1,
         prompts=1, group=2, new_tokens=4, prompt_len=4):
  c = config_lib.default()
  c.rl.prompts_per_step, c.rl.group_size = prompts, group
  c.rl.max_new_tokens, c.rl.micro_batches, c.rl.decode_chunks = new_tokens, micro_batches, 1
  c.data.prompt_buckets = (prompt_len,)
  cfg = transformer.ModelConfig(vocab_size=vocab, hidden_size=d, intermediate_size=f,
                                num_layers=layers, num_heads=heads, num_kv_heads=kv_heads,
                                head_dim=d // heads, qkv_bias=True,
                                tie_embeddings=True, remat=remat)
  return c, cfg


def test_parts_by_hand():
  # V=32, D=8, F=16, 1 layer, H=2, K=1, Dh=4, qkv bias, tied, fp32; B=1, G=2 (N=2), P=4, L=4
  # (T=8), one decode chunk, one minibatch, one micro-batch.
  # Params: embed 32*8 = 256; layer: q 64, k 32, v 32, o 64, biases 8+4+4, norms 8+8,
  # gate/up/down 128 each = 608; final norm 8: 872 params, 3488 bytes.
  c, cfg = tiny()
  est = memory.step_estimate(c, cfg, baseline_bytes=100)
  assert est['state/params'] == 3488 and 'state/loaded_params' not in est  # Released.
  assert est['state/opt_state'] == 2 * 3488  # Adam's mu and nu.
  # Sampler: a KV slot is 2 (k, v) * 1 layer * 1 kv head * 4 * 4 bytes = 32; slots: the
  # prompt once (4) + 2 rows * 4 new = 12 -> 384. Prefill 1*4*(4*8 + 2*16 + 2*4)*4 = 1152,
  # decode logits 3*2*32*4 = 768, outputs 2*4*4*4 = 128, no merge with one chunk.
  assert est['sample/kv_cache'] == 384 and est['sample/kv_merge'] == 0
  assert est['sample/prefill_activations'] == 1152 and est['sample/decode_logits'] == 768
  assert est['sample/outputs'] == 128 and 'sample/params' not in est
  # Old log-probs: layers 2*8*4*(2*8 + 3*16) = 4096 + scores 2*N2*H2*8*8*4 = 2048 -> 6144;
  # head 2*4*8*4 = 256 + chunks 3*8*32*4 = 3072 + the VxD copy 1024 -> 4352; max 6144.
  assert est['logprobs/activations'] == 6144 and est['logprobs/outputs'] == 3 * 2 * 4 * 4
  # Update, m = 2 rows: grads 3488 (one micro-batch: no running sum), the tied embedding's
  # second gradient 32*8*4 = 1024. Residuals per token: 4*(4*8 + 2*2*4 + 2*1*4 + 3*16) +
  # 4*(2 + 2) = 432; saved 1 layer * 16 positions * 432 = 6912; working set 2*16*432 = 13824;
  # scores 4*2*2*8*8*4 = 4096; hidden 2*(2*8 + 2*4)*8*4 = 1536; chunks 6*8*32*4 = 6144;
  # batch 2*(5*8 + 7*4*4) = 304.
  expected = {'update/grads': 3488, 'update/tied_embed_grad': 1024,
              'update/saved_activations': 6912, 'update/layer_working_set': 13824,
              'update/attention_scores': 4096, 'update/hidden': 1536,
              'update/logit_chunks': 6144, 'update/batch': 304}
  assert {k: est[k] for k in expected} == expected
  phases = memory.phase_totals(est)
  assert phases['update'] == 37328 and phases['logprobs'] == 6240 and phases['sample'] == 2432
  # Total: baseline + the state (params and Adam's two moments: 3488 * 3) + the largest
  # phase (the update).
  assert est['total'] == 100 + 3 * 3488 + 37328


@pytest.mark.parametrize('remat,saved', [('none', 16 * 432), ('full', 16 * 4 * 8),
                                         ('full_checkpoint', 16 * 4 * 8),
                                         ('dots', 16 * 4 * (3 * 8 + 8 + 2 * 4 + 2 * 16))])
def test_remat_policies_save_what_they_keep(remat, saved):
  # full: the block input (D); dots: input, q/k/v/o and down outputs, gate_up (2F).
  c, cfg = tiny(remat=remat)
  assert memory.step_estimate(c, cfg)['update/saved_activations'] == saved


def test_micro_batches_split_activations_and_add_a_gradient_sum():
  c1, cfg = tiny(group=4)
  c2, _ = tiny(group=4, micro_batches=2)
  one, two = memory.step_estimate(c1, cfg), memory.step_estimate(c2, cfg)
  assert two['update/grads'] == 2 * one['update/grads']
  assert 2 * two['update/saved_activations'] == one['update/saved_activations']
  assert 2 * two['update/layer_working_set'] == one['update/layer_working_set']


def test_kept_init_params_count_once_more():
  c, cfg = tiny()
  kept = memory.step_estimate(c, cfg, keeps_init_params=True)
  assert kept['state/loaded_params'] == 3488
  assert kept['total'] == memory.step_estimate(c, cfg)['total'] + 3488


def test_hoisted_remat_keeps_every_layers_residuals_and_the_output_copy():
  # remat='full_checkpoint' saves the block input only (4*8 bytes a token); hoisted, the 16
  # positions of each of 2 layers keep all 432 bytes of layer_residuals, and the VxD copy
  # 32*8*4. remat='full' (recomputed after the cotangent) is not hoisted: inputs and the copy.
  c, cfg = tiny(remat='full_checkpoint', layers=2)
  plain, hoisted = memory.step_estimate(c, cfg), memory.step_estimate(c, cfg, remat_hoisted=True)
  assert plain['update/saved_activations'] == 2 * 16 * 32
  assert 'update/output_matrix_copy' not in plain
  assert hoisted['update/saved_activations'] == 2 * 16 * 432
  assert hoisted['update/output_matrix_copy'] == 1024
  c, cfg = tiny(remat='full', layers=2)
  hoisted = memory.step_estimate(c, cfg, remat_hoisted=True)
  assert hoisted['update/saved_activations'] == 2 * 16 * 32
  assert hoisted['update/output_matrix_copy'] == 1024


def test_kl_keeps_a_reference_copy():
  c, cfg = tiny()
  c.objective.kl_coef = 0.1
  assert memory.step_estimate(c, cfg)['state/ref_params'] == 3488


def compiled_steps(c, cfg, *, logprobs=True):
  """The update and old-log-prob steps as the loop jits them, compiled on abstract inputs
  (the second None unless `logprobs`: each compile of the tiny models is seconds of CPU)."""
  n, l = c.rl.prompts_per_step * c.rl.group_size, c.rl.max_new_tokens
  t = c.data.prompt_buckets[0] + l
  opt = run_setup.make_optimizer(lr=1e-6, warmup_steps=0)
  params = jax.eval_shape(lambda: transformer.init_params(cfg, jax.random.key(0)))
  state = jax.eval_shape(lambda p: update.init_state(p, opt), params)
  spec = jax.ShapeDtypeStruct
  per_token = lambda dtype: spec((n, l), dtype)
  batch = TrainBatch(
      tokens_NxT=spec((n, t), jnp.int32), mask_NxT=spec((n, t), bool),
      loss_mask_NxL=per_token(bool), advantages_NxL=per_token(jnp.float32),
      old_logprobs_NxL=per_token(jnp.float32), ref_logprobs_NxL=per_token(jnp.float32),
      behaviour_logprobs_NxL=per_token(jnp.float32), prefix_mask_NxL=per_token(bool),
      turn_ids_NxL=per_token(jnp.int32), old_values_NxL=None, version_NxL=per_token(jnp.int32))
  objective = update.Objective(group_size=c.rl.group_size)
  step = jax.jit(lambda s, b: update.train_step(s, b, cfg=cfg, objective=objective,
                                                optimizer=opt,
                                                micro_batches=c.rl.micro_batches),
                 donate_argnums=0)
  logprobs_fn = jax.jit(lambda p, tk, m: update.logprobs_step(p, tk, m, cfg=cfg,
                                                              completion_len=l))
  return (step.lower(state, batch).compile(),
          logprobs_fn.lower(params, spec((n, t), jnp.int32), spec((n, t), bool)).compile()
          if logprobs else None)


# Shapes where activations dominate and where the parameters do, with and without remat and
# micro-batches. Measured ratios (estimate / XLA temp) when written: 1.08, 1.28, 1.00, 0.89
# for the update, 1.09, 1.09, 1.20, 1.20 for old log-probs (the first and last with remat=
# 'full' then jax.checkpoint). The first with today's remat='full' (recomputed after the
# cotangent): 1.94, out of the band: the estimate's layer working set and backward
# attention scores overcount it at this size.
BAND = (0.6, 1.6)


@pytest.mark.parametrize('kw', [
    dict(remat='full_checkpoint', micro_batches=2, d=64, f=128, layers=2, vocab=2048, heads=4, kv_heads=2,
         prompts=2, group=4, new_tokens=32, prompt_len=96),
    dict(remat='none', micro_batches=1, d=64, f=128, layers=2, vocab=2048, heads=4, kv_heads=2,
         prompts=2, group=4, new_tokens=32, prompt_len=96),
    dict(remat='none', micro_batches=2, d=256, f=1024, layers=2, vocab=4096, heads=4,
         kv_heads=2, prompts=2, group=2, new_tokens=8, prompt_len=8),
    dict(remat='full', micro_batches=2, d=256, f=1024, layers=2, vocab=4096, heads=4,
         kv_heads=2, prompts=2, group=2, new_tokens=8, prompt_len=8),
])
def test_estimate_is_within_a_band_of_xla_memory_analysis(kw):
  c, cfg = tiny(**kw)
  est = memory.step_estimate(c, cfg)
  phases = memory.phase_totals(est)
  step, logprobs = compiled_steps(c, cfg)
  # XLA's temp holds what the step allocates beyond its arguments (state, batch) and the
  # outputs aliased to them: the estimate's update parts but the batch.
  update_temp = step.memory_analysis().temp_size_in_bytes
  ratio = (phases['update'] - est['update/batch']) / update_temp
  assert BAND[0] <= ratio <= BAND[1], (ratio, est, update_temp)
  ratio = est['logprobs/activations'] / logprobs.memory_analysis().temp_size_in_bytes
  assert BAND[0] <= ratio <= BAND[1], ratio
  # The compiled peak adds the arguments: params and AdamW state (and the batch).
  state = est['state/params'] + est['state/opt_state']
  assert memory.compiled_peak(step) >= state + est['update/batch']


def test_full_remat_recomputes_in_the_backward_and_keeps_less():
  # XLA:CPU keeps jax.checkpoint's recomputed activations alive ('full_checkpoint' within
  # ~10% of no remat here); 'full' ties each recomputation to the cotangent. Measured when
  # written (bytes): none 118443656, full_checkpoint 110055112, full 40474376 (4 layers, prompt
  # 192); at prompt 64 (T = 128: one attention block, a third less to compile) none 54218120,
  # full_checkpoint 50023816, full 19442312. With 2 layers (prompt 192) 'full' keeps 0.62 of
  # 'full_checkpoint': the 4 layers are what the comparison needs.
  kw = dict(d=64, f=256, layers=4, vocab=256, heads=4, kv_heads=2, prompts=2, group=4,
            new_tokens=64, prompt_len=64)
  temp = {remat: compiled_steps(*tiny(remat=remat, **kw), logprobs=False)[0]
                 .memory_analysis().temp_size_in_bytes
          for remat in ('none', 'full_checkpoint', 'full')}
  assert temp['full'] < 0.5 * temp['full_checkpoint'] < 0.5 * temp['none'], temp
