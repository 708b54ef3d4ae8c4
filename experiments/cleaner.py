"""CLEANER (arXiv 2601.15141): GRPO on episodes whose failed tool calls were rolled back.

  python -m rlreason.main --config experiments/cleaner.py --workdir /tmp/cleaner
  python -m rlreason.main --config experiments/cleaner.py:plain --workdir /tmp/cleaner_plain
  python -m rlreason.main --config experiments/cleaner.py:runlocal --workdir /tmp/x  # smoke

The tool demo's task and model (experiments/demo_tools.py: calc_multiply with 4-digit operands,
the 'tags' format, a character tokenizer, a 2-layer d=64 model) warm-started on a teacher that
calls the calculator in 60% of its traces and writes half of those calls broken first
('1234 * * 5678', the calculator's SyntaxError class), sees the error and writes the right call
(envs/cleaner_traces.py); the other 40% guess the product. Then GRPO with CLEANER's rollback
(env.rollback, rollout/rollback.py): a broken call is regenerated after the error and replaced
by the correction, at most 3 retries per turn; the corrected calls' tokens are off-policy
(sampled with the error in context) and token-level truncated IS (objective.correction
'tis_token', C = 2) weights them by π_old/μ. The feedback is the tool's own error message
(feedback '{error}'): the tiny model learned to correct after that text, the reference's English
instruction means nothing to it. ':plain' is the same run without rollback (plain GRPO on the
raw episodes). 1 CPU: SFT ~2-4 min, 30 GRPO steps ~3-6 min (the 2-core shared VM).
Expected result: experiments/dynamics/cleaner_rollback.py (colab/09) measures both arms.
"""

from rlreason import config as config_lib


def get_config(arg: str = ''):
  c = config_lib.default()
  c.seed = 0
  c.data.task = 'calc_multiply'
  c.data.difficulty = 4
  c.data.prompt_template = '{prompt}\n'
  c.data.prompt_buckets = (41,)  # 'What is 1234 * 5678? Use the calculator.\n'
  c.model.arch = dict(vocab_size=0, hidden_size=64, intermediate_size=192, num_layers=2,
                      num_heads=4, num_kv_heads=4, head_dim=16, qkv_bias=False, qk_norm=False,
                      tie_embeddings=False, family='qwen2', rope_theta=10_000.0)
  c.tokenizer.kind = 'chars'
  # The longest teacher episode: a broken call (56 tokens), its error (63), the call (54), the
  # result (<= 25) and '#### ' + the answer right-aligned to 8 + EOS (14): 212.
  c.env.update(enabled=True, tools=('calculator',), family='tags', verifier='exact',
               max_turns=3, max_turn_tokens=58, max_observation_tokens=72, transcripts=8,
               workers=4)
  c.env.rollback.update(enabled=arg != 'plain', max_retries=3, feedback='{error}',
                        error_classes={'calculator': ('SyntaxError',)})
  c.rl.max_new_tokens = 220
  c.sft.steps = 600
  c.sft.batch_size = 32
  c.sft.lr = 3e-3
  c.sft.decay = False
  c.sft.teacher = 'rlreason.envs.cleaner_traces:broken_call_trace'
  c.sft.teacher_options = {'call_prob': 0.6, 'broken_prob': 0.5}
  c.rl.steps = 30
  c.rl.prompts_per_step = 8
  c.rl.group_size = 8
  c.rl.temperature = 1.0
  c.objective.advantage = 'grpo'
  c.objective.policy_loss = 'ppo_clip'
  c.objective.aggregation = 'token_mean'
  c.objective.correction = 'tis_token'  # the corrected calls are off-policy (rollback.py)
  c.optimizer.lr = 5e-4
  c.optimizer.grad_clip = 1.0
  c.verifier.workers = 2
  c.eval.every = 10
  c.eval.num_prompts = 128
  c.checkpoint.every = 0
  c.mesh = dict(data=1, fsdp=-1, tensor=1)
  c.log_every = 1
  if arg == 'runlocal':
    shrink_for_runlocal(c)
  return c


def shrink_for_runlocal(c) -> None:
  """Seconds-long settings for smoke tests: a smaller model, 2-digit operands, 2 RL steps."""
  c.data.difficulty = 2
  c.data.prompt_buckets = (37,)
  c.model.arch.update(hidden_size=32, intermediate_size=64, num_layers=1, num_heads=2,
                      num_kv_heads=1, head_dim=16)
  c.env.update(max_turn_tokens=52, max_observation_tokens=64, transcripts=2)
  c.rl.max_new_tokens = 200
  c.sft.steps, c.sft.batch_size = 2, 8
  c.rl.steps = 2
  c.rl.prompts_per_step = max(c.rl.minibatches, 2) * 2
  c.eval.every, c.eval.num_prompts = 2, 4
