"""What one RL step needs in memory, by named part: a pure function of the config's shapes.

  est = step_estimate(config, cfg, prompt_len=P, baseline_bytes=b)
  est['total']  # bytes: baseline + state/* + the largest phase (sample, logprobs, update)

Parts are prefixed by where they live. `state/` is alive for the whole step: the trainable
params and AdamW's two moments (and, with keeps_init_params, the loaded params that
`Run.init_params` keeps when restore_or_init is not told to release them; train.train
releases them). `sample/` is sampler.memory_estimate (minus the params it shares with the
state). `logprobs/` is the old log-prob forward over all N rows at once
(rl_batch.make_train_batch). `update/` is one train_step on a minibatch, its activations
counted per micro-batch (the scan in update.accumulate_gradients keeps one micro-batch's
alive at a time), with the remat policy's saved residuals per layer plus one layer's
recomputed working set. The phases run one after the other, so only the largest counts.

The counts follow the code (transformer.py, attention.py, token_stats.py, update.py); where XLA
may or may not materialise a buffer (a transposed tied embedding, the zero-initialised
gradient sum), the part says which way it was counted. tests/memory_estimate_test.py checks
the arithmetic by hand and the update's parts against XLA's compiled memory analysis.

Remat on XLA:CPU (remat_hoisted): at Qwen2.5-0.5B's shapes the compiled train step keeps
jax.checkpoint's recomputed activations (remat='full_checkpoint', 'dots') alive until late
in the backward, nothing tying their computation or their use to the cotangent: all 24
layers' under the default concurrency-optimised scheduler, 12 of 24 under
`--xla_cpu_enable_concurrency_optimized_scheduler=false` (HLO dumps, micro-batches of 8 rows).
With remat_hoisted those layers are counted as keeping what they keep without remat, plus the
tied output matrix's transposed VxD copy: 11141 MiB estimated against XLA's 11618 MiB temp
with micro_batches=2 (0.96) and 8022 against 7443 MiB with micro_batches=4 (1.08), both under
the memory-minimising scheduler (experiments/bench/real_shapes.py; its complete step peaked
at 15110 MiB RSS against a total of 14088 here: 1.07). remat='full' (layers.
remat_after_cotangent) makes each recomputation depend on the cotangent and the layer below
on the weight gradients, so it is not hoisted: its layers keep their inputs only, and
remat_hoisted adds just the VxD copy. Measured at 0.5B widths (16 rows x 384, micro_batches=4,
XLA temp MiB, default / memory-minimising scheduler): 4 layers 'none' 3074 / 2817,
'full_checkpoint' 2963 / 2172, 'full' 2193 / 2038; 2 layers 2350 / 2230, 2296 / 1981,
1922 / 1830 (estimate for 'full', 4 layers: 2402 without the copy, 2921 with it); all 24
layers, 'full': 4906 / 5310 (jax.checkpoint's: 9678 / 7443), estimate with the copy 5302
(1.08 / 1.00); micro_batches=2, memory-minimising: 6067 (was 11618), estimate 5700 (0.94). Old
log-probs: XLA's temp is 576 MiB under that scheduler (1761 under the default) against 574
here. The tiny shapes of the test agree within 0.9-1.3x without it. An MoE model's MLP
activations (mlp_residuals) are counted from the code, not yet checked against XLA.

Deliberately not here: XLA's compile-time memory, the allocator's fragmentation and the
Python heap (tokenizer, data): measure those, and pass the process's own footprint as
`baseline_bytes`. LoRA, the critic and episodes are not modelled.
"""

import numpy as np

from rlreason import config as config_lib
from rlreason.model import attention
from rlreason.model import moe_config
from rlreason.model import transformer
from rlreason.rollout import continuous
from rlreason.rollout import sampler

# completion_stats' defaults (update.py): positions and vocabulary columns per logit chunk.
TOKEN_CHUNK, VOCAB_CHUNK = 512, 8192
# The remats that jax.checkpoint implements (transformer.Transformer.hidden), whose
# recomputations XLA:CPU keeps alive (remat_hoisted).
CHECKPOINT_REMATS = ('full_checkpoint', 'dots')


def _bytes(dtype: str) -> int:
  return np.dtype(dtype).itemsize


def mlp_residuals(cfg: transformer.ModelConfig) -> int:
  """Bytes per token that the widest MLP layer's backward keeps beside its input and norm.

  Dense: gate_up (2F) and silu(gate) * up (F) in compute dtype. An MoE layer (cfg.moe,
  model/moe.py) [ours]: per routed slot (k of them) the dispatched row in and the expert's
  output row (2D) and its gate, up and hidden (3I); the shared expert's 3S; the router's fp32
  logits and probabilities (2E). The experts' weights are in the params (num_params counts
  all E); on an expert axis of size S the padded all-to-all's buffers hold up to S times the
  slots (moe.py's docstring), which is not counted here.
  """
  c = _bytes(cfg.compute_dtype)
  dense = c * 3 * cfg.intermediate_size
  if cfg.moe is None:
    return dense
  m = cfg.moe
  sparse = (c * (m.num_experts_per_tok * (2 * cfg.hidden_size + 3 * m.moe_intermediate_size)
                 + 3 * m.shared_expert_intermediate_size) + 4 * 2 * m.num_experts)
  every_layer_sparse = all(moe_config.is_moe_layer(i, m) for i in range(cfg.num_layers))
  return sparse if every_layer_sparse else max(dense, sparse)


def layer_residuals(cfg: transformer.ModelConfig) -> int:
  """Bytes per token that one layer's backward needs without remat.

  In compute dtype: the block input x and its norm (2D), the attention's custom-VJP residuals
  q, k, v and out (2 H Dh + 2 K Dh; the o projection reads `out` itself), the MLP's input and
  norm (2D), and the MLP's own (mlp_residuals: dense gate_up 2F and silu(gate) * up F). In
  fp32: the two norms' rsqrt (2) and the attention's log-sum-exp per head (H).
  """
  c = _bytes(cfg.compute_dtype)
  d, h, k, dh = cfg.hidden_size, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
  return c * (4 * d + 2 * h * dh + 2 * k * dh) + mlp_residuals(cfg) + 4 * (2 + h)


def saved_per_layer(cfg: transformer.ModelConfig) -> int:
  """Bytes per token a layer keeps for the backward under cfg.remat.

  'none': layer_residuals. 'full' and 'full_checkpoint' (nothing_saveable): the block's
  input only (its params are the state's). 'dots'
  (dots_with_no_batch_dims_saveable): the input and the outputs of the weight matmuls (q, k,
  v, o, gate_up, down); attention's einsums have a batch axis and are recomputed. The MLP's
  matmul outputs are counted as 2/3 of mlp_residuals (exactly gate_up's 2F when dense).
  """
  c = _bytes(cfg.compute_dtype)
  d, h, k, dh = cfg.hidden_size, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
  if cfg.remat == 'none':
    return layer_residuals(cfg)
  if cfg.remat in ('full', 'full_checkpoint'):
    return c * d
  return c * (3 * d + h * dh + 2 * k * dh) + 2 * mlp_residuals(cfg) // 3


def attention_scores(cfg: transformer.ModelConfig, rows: int, length: int, *,
                     backward: bool) -> int:
  """fp32 scores of one query block against its keys (attention.py): s and p forward, plus
  dp and ds backward."""
  block = attention.block_size(length)
  return (4 if backward else 2) * rows * cfg.num_heads * block * length * 4


def logit_chunk(rows: int, length: int, vocab: int, *, backward: bool) -> int:
  """fp32 logit chunks of token_stats_from_hidden: z, e and e*d forward (3); backward also
  the recomputed z, p and dz (3 more)."""
  k, v = min(TOKEN_CHUNK, rows * length), min(VOCAB_CHUNK, vocab)
  return (6 if backward else 3) * k * v * 4


def step_estimate(config, cfg: transformer.ModelConfig, *, prompt_len: int | None = None,
                  baseline_bytes: int = 0, keeps_init_params: bool = False,
                  remat_hoisted: bool = False,
                  teacher_cfg: transformer.ModelConfig | None = None) -> dict[str, int]:
  """Bytes by part of one RL step on one device (see the module docstring), and 'total'.

  Args:
    config: the run's ConfigDict (rl.*, objective.kl_coef, prefix_rollouts).
    cfg: the model's config (weights.load's or the random arch's), remat included.
    prompt_len: P, the prompt bucket the step pads to; default the largest bucket.
    baseline_bytes: the process's own footprint before any array exists (measured).
    keeps_init_params: `Run.init_params` stays alive beside the TrainState (restore_or_init
      without release_init_params; train.train releases them: the state takes their buffers).
    remat_hoisted: XLA:CPU at Qwen2.5-0.5B's shapes (see the module docstring): the tied
      output matrix's transposed copy is counted, and under a jax.checkpoint remat
      ('full_checkpoint', 'dots') every layer holds what it holds without remat (the
      compiler keeps their recomputed activations); remat='full' is not hoisted.
    teacher_cfg: with config.distill.enabled, the teacher's config (methods/distill.py): its
      params (frozen: no moments) are resident, and each micro-batch of the update adds its
      forward (no gradient, counted as the old log-probs' layers and head are) and what the
      loss keeps of it: the hidden states for 'full_kl' (and the divergence's second logit
      block beside the student's), the log-probs for 'token_kl'.
  """
  rl = config.rl
  if config.lora.enabled or config.critic.enabled or config.env.enabled:
    raise ValueError('step_estimate models full fine-tuning of single-turn rollouts only.')
  p = prompt_len or max(config.data.prompt_buckets)
  b, g = rl.prompts_per_step, rl.group_size
  n, l = b * g, config_lib.completion_length(config)
  t = p + l
  c, pb = _bytes(cfg.compute_dtype), _bytes(cfg.param_dtype)
  v, d = cfg.vocab_size, cfg.hidden_size
  params = cfg.num_params() * pb
  est = {'baseline': baseline_bytes, 'state/params': params, 'state/opt_state': 2 * params}
  if keeps_init_params:
    est['state/loaded_params'] = params
  if config.objective.kl_coef:
    est['state/ref_params'] = params

  q = config.prefix_rollouts.max_tokens if config.prefix_rollouts.enabled else 0
  sample = sampler.memory_estimate(cfg, batch=b, group_size=g, prompt_len=p,
                                   max_new_tokens=rl.max_new_tokens, prefix_len=q,
                                   max_chunks=rl.decode_chunks,
                                   sample_dtype=rl.sample_dtype or None)
  est.update({f'sample/{k}': x for k, x in sample.items() if k not in ('params', 'total')})

  # Old log-probs: all N rows in one call, no gradient. Two stages, one after the other: the
  # layers (the residual stream in and out, the MLP's gate_up and hidden, one query block's
  # scores) and the head (the completion hidden NxLxD and its logit chunks).
  layers = (n * t * (c * 2 * d + mlp_residuals(cfg))
            + attention_scores(cfg, n, t, backward=False))
  # The output matrix re-laid out once for the column blocks (XLA's compiled temp holds a VxD
  # fp32 copy, tied or untied).
  head = n * l * d * c + logit_chunk(n, l, v, backward=False) + v * d * 4
  est['logprobs/activations'] = max(layers, head)
  est['logprobs/outputs'] = 3 * n * l * 4

  # One train_step on a minibatch of N / minibatches rows, micro-batches of m rows.
  rows = n // rl.minibatches
  m = rows // rl.micro_batches
  # The gradient of this micro-batch, and with more than one the scan's running sum (with
  # one, XLA folds zeros + grads away).
  est['update/grads'] = params * (2 if rl.micro_batches > 1 else 1)
  # Tied: the embedding's two gradients (the input gather's scatter and token_stats' fp32
  # dW of the output matrix) exist side by side before they are summed.
  est['update/tied_embed_grad'] = v * d * 4 if cfg.tie_embeddings else 0
  hoisted = remat_hoisted and cfg.remat in CHECKPOINT_REMATS
  saved = layer_residuals(cfg) if hoisted else saved_per_layer(cfg)
  est['update/saved_activations'] = cfg.num_layers * m * t * saved
  # The layer being differentiated: its residuals (recomputed under remat) and their
  # cotangents, about as large again.
  est['update/layer_working_set'] = 2 * m * t * layer_residuals(cfg)
  est['update/attention_scores'] = attention_scores(cfg, m, t, backward=True)
  # Final hidden states, the completion slice and their cotangents.
  est['update/hidden'] = m * (2 * t + 2 * l) * d * c
  est['update/logit_chunks'] = logit_chunk(m, l, v, backward=True)
  if remat_hoisted:  # The VxD output matrix re-laid out for its column blocks, as in logprobs.
    est['update/output_matrix_copy'] = v * d * 4
  if teacher_cfg is not None and config.get('distill') is not None and config.distill.enabled:
    est.update(_teacher_parts(teacher_cfg, form=config.distill.form, rows=m, length=t,
                              completion=l))
  # The minibatch's TrainBatch: tokens and mask (NxT), seven NxL per-token fields.
  est['update/batch'] = rows * (5 * t + 7 * 4 * l)

  phases = {name: sum(x for k, x in est.items() if k.startswith(name + '/'))
            for name in ('sample', 'logprobs', 'update')}
  resident = baseline_bytes + sum(x for k, x in est.items() if k.startswith('state/'))
  est['total'] = resident + max(phases.values())
  return est


def _teacher_parts(tc: transformer.ModelConfig, *, form: str, rows: int, length: int,
                   completion: int) -> dict[str, int]:
  """On-policy distillation's teacher (methods/distill.py): resident params, and per
  micro-batch of the update its no-gradient forward and what the loss keeps of it."""
  c, e, v = _bytes(tc.compute_dtype), tc.hidden_size, tc.vocab_size
  layers = (rows * length * c * (2 * e + 3 * tc.intermediate_size)
            + attention_scores(tc, rows, length, backward=False))
  head = rows * completion * e * c + logit_chunk(rows, completion, v, backward=False) + v * e * 4
  parts = {'state/teacher_params': tc.num_params() * _bytes(tc.param_dtype),
           'update/teacher_forward': max(layers, head)}
  if form == 'full_kl':  # Kept for the backward; the teacher's logit block beside the student's.
    parts['update/teacher_hidden'] = rows * completion * e * c
    parts['update/teacher_logit_chunks'] = logit_chunk(rows, completion, v, backward=True)
  else:
    parts['update/teacher_logprobs'] = rows * completion * 4
  return parts


def phase_totals(est: dict[str, int]) -> dict[str, int]:
  """Each phase's own bytes (its parts' sum) from a step_estimate."""
  names = sorted({k.split('/')[0] for k in est if '/' in k})
  return {name: sum(x for k, x in est.items() if k.startswith(name + '/')) for name in names}


def compiled_peak(compiled) -> int:
  """XLA's own peak for a compiled executable: arguments + outputs not aliased to them +
  temporaries (memory_analysis(); a lower bound on what running it holds)."""
  a = compiled.memory_analysis()
  return (a.argument_size_in_bytes + a.output_size_in_bytes - a.alias_size_in_bytes
          + a.temp_size_in_bytes)


def check_sample_memory(config, cfg) -> None:
  """ValueError naming rl.slots when the continuous sampler's memory estimate (with its
  carried pool under partial rollouts) exceeds rl.sample_memory_gb (0: no check)."""
  rl = config.rl
  budget_gb = rl.get('sample_memory_gb', 0)
  if not budget_gb or rl.get('sampler', 'static') != 'continuous':
    return
  p = config.prefix_rollouts
  kw = dict(rows=rl.prompts_per_step * rl.group_size * (2 if rl.get('partial_rollouts') else 1),
            group_size=rl.group_size, prompt_len=max(config.data.prompt_buckets),
            max_new_tokens=rl.max_new_tokens, prefix_len=p.max_tokens if p.enabled else 0,
            sample_dtype=rl.sample_dtype or None)
  est = continuous.memory_estimate(cfg, slots=rl.slots, **kw)
  budget = int(budget_gb * 2**30)
  if est['total'] > budget:
    parts = ', '.join(f'{k}={v / 2**30:.3f} GiB' for k, v in est.items())
    raise ValueError(
        f'rl.slots={rl.slots}: the continuous sampler needs about {est["total"] / 2**30:.3f} '
        f'GiB ({parts}), more than rl.sample_memory_gb={budget_gb}; at most '
        f'{continuous.max_slots(budget, cfg, **kw)} slots fit. Lower rl.slots or '
        'rl.max_new_tokens, or raise rl.sample_memory_gb.')


# The config fields that fix the pool's shapes: a resumed pool must have been sampled with them.
