"""KBQA-R1 (arXiv 2512.10999) at toy scale: an RRS cold start, then GRPO on kb episodes.

  python -m rlreason.main --config experiments/kbqa_r1.py:rrs --workdir /tmp/kbqa_rrs
  python -m rlreason.main --config experiments/kbqa_r1.py:unfiltered,1 --workdir /tmp/kbqa_u1
  python -m experiments.dynamics.kbqa_rrs      # the study: rrs vs answer vs unfiltered

arg: the SFT source, 'rrs' | 'answer' | 'unfiltered' (methods/rejection_sampling.py), optionally
',<seed>'; 'runlocal' is a seconds-long smoke run of 'rrs'.

Task: kb_qa (envs/tasks.py) at difficulty 1: a graph of 6 people, 6 companies, 3 cities in
the episode's context; three question kinds answered with 2-3 calls of the `kb` tool
(relations / neighbours / intersection / count, envs/kb.py: KBQA-R1's "list of actions"
[S: abstract]) in the 'tags' format, character tokenizer, a 2-layer d=64 model from scratch.
Cold start: SFT on envs/kb_traces.py's teacher, which follows the gold action sequence in 30%
of its traces and a plausible wrong procedure otherwise (sometimes right by luck); sft.filter
picks which of its traces are trained on, asking it up to sft.filter_tries = 4 times per
problem. RL: GRPO (PPO-clip, token-mean, G = 8) on the environment's reward: 1 for an exact
final answer, minus env.error_penalty = 0.1 per failed or malformed call (our formalisation
[I] of "execution feedback": the paper's reward terms were not read; the abstract says the
policy learns from execution results, the project page that queries must execute against the
KB schema).

Runtime and headline number: not measured end to end. SFT costs ~0.4 CPU-s a step (32 x 489
tokens), so the 500-step warm start is ~3.5 CPU-min and the job roughly 8-10; on the shared
2-core machine (load 20-28) a reduced run of the study (experiments/dynamics/kbqa_rrs.py, the
same settings) left the model at accuracy 0.000 after 600 RRS SFT steps: this warm start is
too short for a from-scratch character model to learn to copy entity names, and the GRPO
phase was not reached. Treat these settings as a working starting point, not a tuned recipe.
"""

from experiments import demo_tools
from rlreason.config_checks import SFT_FILTERS


def get_config(arg: str = ''):
  name, _, seed = (arg or 'rrs').partition(',')
  runlocal = name == 'runlocal'
  name = 'rrs' if runlocal else name
  if name not in SFT_FILTERS:
    raise ValueError(f'experiments/kbqa_r1.py: arg {arg!r}; use one of {list(SFT_FILTERS)}, '
                     'optionally ",<seed>", or "runlocal"')
  # The longest kb_qa prompt is 86 characters, + '\n'.
  c = demo_tools.tool_config('kb_qa', difficulty=1, prompt_buckets=(88,), seed=int(seed or 0))
  # A call turn is at most 104 characters at difficulty 1, an observation 57, a whole gold
  # episode 398 (measured over 2000 problems).
  c.env.update(enabled=True, tools=('kb',), family='tags', verifier='exact', max_turns=4,
               max_turn_tokens=104, max_observation_tokens=60, error_penalty=0.1,
               transcripts=8, workers=4)
  c.rl.max_new_tokens = 400
  c.sft.update(steps=500, batch_size=32, lr=3e-3, grad_clip=1.0, decay=False,
               teacher='rlreason.envs.kb_traces:kb_trace',
               teacher_options={'gold_prob': 0.3, 'answer_prefix': '#### '},
               filter=name, filter_tries=4)
  c.rl.steps = 30
  c.rl.prompts_per_step = 16
  c.rl.group_size = 8
  c.optimizer.lr = 5e-4
  c.optimizer.grad_clip = 1.0
  c.eval.every = 10
  c.eval.num_prompts = 200
  c.checkpoint.every = 0
  if runlocal:
    shrink_for_runlocal(c)
  return c


def shrink_for_runlocal(c) -> None:
  """Seconds-long settings: a 1-layer d=32 model, 2 SFT steps, 2 RL steps of 2 x 4 episodes."""
  c.model.arch.update(demo_tools.SMALL_MODEL)
  c.env.update(max_turns=3, max_turn_tokens=32, max_observation_tokens=16, transcripts=2)
  c.rl.max_new_tokens = 96
  c.sft.steps, c.sft.batch_size = 2, 4
  c.rl.steps = 2
  c.rl.prompts_per_step, c.rl.group_size = 2, 4  # 8 rows: one per fake CPU device in tests
  c.eval.every, c.eval.num_prompts = 2, 2
