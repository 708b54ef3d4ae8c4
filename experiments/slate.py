"""SLATE on search_qa: truncated step-level sampling, rule-judged steps, PPO-clip + k3 KL.

  python -m rlreason.main --config experiments/slate.py --workdir /tmp/slate
  python -m rlreason.main --config experiments/slate.py:runlocal --workdir /tmp/slate_smoke

Task: search_qa at difficulty 1 (2-3 hop questions over 42 one-fact passages, BM25 top-3),
the 'tags' format ('<call>search: {"query": "Pefa Corp founded"}</call>'), character
tokenizer, a random-init 2-layer d = 64 model (no warm start: there is no search teacher).
SLATE as in its reference code (algoprog/SLATE configs/slate.yaml): k = 5 candidates per step,
η = 0.7, B = env.max_turns = 4 steps, λ = 0.1; the rule judge of envs/slate_rules.py stands
in for the LLM judge. Objective: per-token PPO-clip (ε = 0.2) on each candidate's step tokens,
k3 KL to the initial policy with β = 0.001, each candidate's token mean averaged over the
rows (rollout/slate.py says how this relates to the reference's Eq. 7). Each step trains on
prompts_per_step x k x max_turns = 8 x 20 rows.

Hardware and runtime: measured for two steps only (CPU, the shared 2-core machine at load
~20): 195 s for the first step (compilation included), 71 s for the second (the update).
From random init the model writes no tool call: in both steps all 40 candidates were answer
steps scored -1 + 0.1 = -0.9 and every step group was flat, so A = 0 and only the KL term
acts (that run predates step_advantages' flat-group guard: its loss, -0.056, was rounding).
SLATE needs a policy that already issues calls (there is no search_qa teacher for a warm start
in the repo); the variance study (experiments/dynamics/slate_variance.py) is where its claim
is checked. `:runlocal` is the seconds-long smoke setting tests/train_test.py runs (k = 2,
2 steps, tiny model).
"""

from experiments import demo_tools


def get_config(arg: str = ''):
  # The longest search_qa prompt is 115 characters.
  c = demo_tools.tool_config('search_qa', difficulty=1, prompt_buckets=(128,))
  c.env.update(enabled=True, tools=('search',), family='tags', verifier='exact',
               max_turns=4, max_turn_tokens=64, max_observation_tokens=160, transcripts=8,
               workers=2)
  # A row: every earlier step and observation plus one candidate: 4 x 64 + 3 x 160 = 736.
  c.rl.max_new_tokens = 736
  c.slate.update(enabled=True, k=5, eta=0.7, lambda_bonus=0.1, judge='rule')
  c.rl.group_size = c.slate.k * c.env.max_turns
  c.rl.prompts_per_step = 8
  c.rl.steps = 200
  c.objective.advantage = 'slate'  # A over each step's k rows, eps 1e-6 (rollout/slate.py).
  c.objective.policy_loss = 'ppo_clip'
  c.objective.aggregation = 'seq_mean_token_mean'
  c.objective.kl_coef = 0.001
  c.objective.kl_estimator = 'k3'
  c.optimizer.lr = 3e-4
  c.eval.every = 50
  c.eval.num_prompts = 100
  if arg == 'runlocal':
    c.data.difficulty = 0
    c.model.arch.update(demo_tools.SMALL_MODEL)
    c.env.update(max_turns=2, max_turn_tokens=16, max_observation_tokens=48, transcripts=2)
    c.rl.max_new_tokens = 2 * 16 + 48
    c.slate.k = 2
    c.rl.group_size = c.slate.k * c.env.max_turns
    c.rl.steps, c.rl.prompts_per_step = 2, 2
    c.eval.every, c.eval.num_prompts = 2, 4
    c.checkpoint.every = 0
  return c
