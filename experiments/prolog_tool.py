"""Prolog-as-a-Tool (arXiv 2512.07407) as episodes: a protocol, a reward, a tiny model.

  python -m rlreason.main --config experiments/prolog_tool.py:agentic,structure --workdir /tmp/pl
  python -m rlreason.main --config experiments/prolog_tool.py:single,correctness,1 --workdir ...
  python -m experiments.dynamics.prolog_protocols   # the study: protocols x rewards

arg: '<protocol>,<reward>[,<seed>]' with protocol 'single' | 'multi_try' | 'agentic' (2 tries
for the last two) and reward 'correctness' | 'structure' (envs/prolog_protocols.py); 'runlocal'
is a seconds-long smoke run of 'agentic,structure'.

Task: prolog_arith (envs/prolog_tasks.py) at difficulty 2, four word-problem templates over
numbers below 100, instead of GSM8K: a 2-layer d=64 character model from scratch cannot
write a GSM8K program (the paper starts from Qwen2.5-3B-Instruct); it can learn to copy a
problem's numbers into facts. Each turn is a program in <answer>...</answer>, run by
SWI-Prolog in the sandbox (verifiers/prolog.py). Warm start: 500 SFT steps on
envs/prolog_traces.py's teacher (half derivations, half hard-coded numbers right half of the
time, 30% of first tries slipping; under multi_try / agentic the slip is followed by the
observation and the clean program). RL: GRPO (PPO-clip, token-mean, G = 8, 16 prompts) on the
final program's reward. Rows hold `tries` turns of 112 tokens and the observations between.

Runtime and headline numbers: not run end to end with these 30 GRPO steps. Study 15
(experiments/dynamics/prolog_protocols.py) ran them with 10 GRPO steps of 8 prompts: after
SFT 'single' held-out accuracy at T = 1 is 0.055 (derived 0.33), after GRPO 0.078 with the
correctness reward and 0.141 with the structure reward (derived 0.56 / 0.77); about 17 min
of wall time per reward arm at load 25 on 2 shared cores. Nothing here is tuned.
"""

from rlreason import config as config_lib
from rlreason.envs import prolog_protocols

TRIES = 2


def get_config(arg: str = ''):
  parts = (arg or 'agentic,structure').split(',')
  runlocal = parts[0] == 'runlocal'
  if runlocal:
    parts = ['agentic', 'structure']
  protocol, reward = parts[0], parts[1] if len(parts) > 1 else 'structure'
  if protocol not in prolog_protocols.PROTOCOLS or reward not in prolog_protocols.REWARDS:
    raise ValueError(f'experiments/prolog_tool.py: arg {arg!r}; use "<protocol>,<reward>'
                     f'[,<seed>]" with protocol in {prolog_protocols.PROTOCOLS} and reward in '
                     f'{sorted(prolog_protocols.REWARDS)}, or "runlocal"')
  tries = 1 if protocol == 'single' else TRIES
  c = config_lib.default()
  c.seed = int(parts[2]) if len(parts) > 2 else 0
  c.data.task = 'prolog_arith'
  c.data.difficulty = 2
  c.data.prompt_template = '{prompt}\n'
  c.data.prompt_buckets = (64,)  # the longest prompt at difficulty 2 is 59 characters + '\n'
  c.model.arch = dict(vocab_size=0, hidden_size=64, intermediate_size=192, num_layers=2,
                      num_heads=4, num_kv_heads=4, head_dim=16, qkv_bias=False, qk_norm=False,
                      tie_embeddings=False, family='qwen2', rope_theta=10_000.0)
  c.tokenizer.kind = 'chars'
  c.verifier.update(name='prolog', workers=1)  # checks the sandbox at start-up
  # The longest program turn is 102 characters, the longest observation 41.
  c.env.update(enabled=True, kind='prolog', family='tags', max_turns=TRIES,
               max_turn_tokens=112, max_observation_tokens=48, transcripts=8, workers=4,
               options={'protocol': protocol, 'tries': tries, 'reward': reward})
  c.rl.max_new_tokens = tries * 112 + (tries - 1) * 48
  c.sft.update(steps=500, batch_size=32, lr=3e-3, warmup_steps=20, decay=False,
               teacher='rlreason.envs.prolog_traces:prolog_trace',
               teacher_options={'protocol': protocol, 'tries': tries, 'derive_prob': 0.5,
                                'head_right_prob': 0.5, 'slip_prob': 0.3})
  c.rl.update(steps=30, prompts_per_step=16, group_size=8, temperature=1.0)
  c.objective.update(advantage='grpo', policy_loss='ppo_clip', aggregation='token_mean')
  c.optimizer.update(lr=5e-4, grad_clip=1.0)
  c.eval.update(every=10, num_prompts=64)
  c.checkpoint.every = 0
  c.mesh = dict(data=1, fsdp=-1, tensor=1)
  c.log_every = 5
  if runlocal:
    shrink_for_runlocal(c)
  return c


def shrink_for_runlocal(c) -> None:
  """Seconds-long settings: a 1-layer d=32 model, 2 SFT steps, 2 RL steps of 2 x 4 episodes
  (8 rows: one per fake CPU device in tests), turns cut to 24 tokens (programs unfinished:
  every turn runs as a failed program)."""
  c.model.arch.update(hidden_size=32, intermediate_size=64, num_layers=1, num_heads=2,
                      num_kv_heads=1, head_dim=16)
  c.env.update(max_turns=2, max_turn_tokens=24, max_observation_tokens=48, transcripts=2)
  c.env.options.tries = 2
  c.sft.teacher_options.tries = 2
  c.rl.max_new_tokens = 2 * 24 + 48
  c.sft.update(steps=2, batch_size=4)
  c.rl.update(steps=2, prompts_per_step=2, group_size=4)
  c.eval.update(every=2, num_prompts=2)
