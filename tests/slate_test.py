"""SLATE (rollout/slate.py, slate_judge.py): step reward, advantage, continuation, rows, judges."""

import dataclasses
import string

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rlreason import config as config_lib
from rlreason.envs import base
from rlreason.envs import formats
from rlreason.envs import render
from rlreason.envs import slate_rules
from rlreason.envs import tasks as env_tasks
from rlreason.model import tokenizer
from rlreason.model import transformer
from rlreason.objectives import advantages
from rlreason.rl import update
from rlreason.rollout import sampler
from rlreason.rollout import slate
from rlreason.rollout import slate_judge
from rlreason.verifiers import registry

TAGS = formats.get('tags')
# A fixed 5-tuple at step t = 1 of B = 4: (kind, r_think, r_action).
TUPLE = [('search', 0, 1), ('search', 0, -1), ('answer', 0, 1), ('answer', -1, -1),
         ('search', 1, 0)]


def test_step_reward_and_advantage_on_a_fixed_tuple():
  rewards = [slate.step_reward(kind, rt, ra, step=1, budget=4, lambda_bonus=0.1)
             for kind, rt, ra in TUPLE]
  # Search steps r_think + r_query: 1, -1, 1. Answer steps add λ(B - t)/B = 0.1 * 3/4 = 0.075:
  # 0 + 1 + 0.075 = 1.075 and -1 - 1 + 0.075 = -1.925.
  np.testing.assert_allclose(rewards, [1.0, -1.0, 1.075, -1.925, 1.0], rtol=0, atol=1e-12)
  # An answer at the last step (t = 3) gets 0.1 * 1/4 = 0.025; at t = 0 the whole 0.1.
  assert slate.step_reward('answer', 0, 1, step=3, budget=4) == pytest.approx(1.025)
  assert slate.step_reward('answer', 0, 0, step=0, budget=4) == pytest.approx(0.1)
  # mean = 0.15 / 5 = 0.03; r - mean = (0.97, -1.03, 1.045, -1.955, 0.97); Σ(r - mean)² =
  # 0.9409 + 1.0609 + 1.092025 + 3.822025 + 0.9409 = 7.85675; unbiased std = √(7.85675 / 4)
  # = √1.9641875 = 1.4014947; A = (r - mean) / (1.4014947 + 1e-6).
  adv = np.asarray(slate.step_advantages(np.array([rewards])))[0]
  np.testing.assert_allclose(adv, [0.6921177, -0.7349291, 0.7456320, -1.3949382, 0.6921177],
                             atol=2e-6)
  # The same as the loop's GRPO estimator with the unbiased std and eps 1e-6.
  np.testing.assert_allclose(adv, advantages.grpo(jnp.array([rewards]), std_ddof=1,
                                                  eps=1e-6)[0], atol=1e-6)
  with pytest.raises(ValueError, match="known: 'search', 'answer'"):
    slate.step_reward('think', 0, 0, step=0, budget=4)


def test_one_candidate_has_zero_advantage_and_the_estimator_splits_steps():
  np.testing.assert_array_equal(slate.step_advantages(np.array([[3.0], [-2.5]])), 0.0)
  # Five equal answer steps (-1 + 0.1 = -0.9): exactly 0, although their float32 mean is not
  # exactly -0.9 (unguarded, (r - mean) / (std + 1e-6) gave 0.056 each).
  np.testing.assert_array_equal(slate.step_advantages(np.full((2, 5), -0.9, np.float32)), 0.0)
  np.testing.assert_array_equal(slate.slate_advantages(jnp.array([[1.0, -1.0, 2.0]]), k=1), 0.0)
  # G = 2 steps x k = 2, each step on its own: r = (1, 3): mean 2, r - mean = ±1, unbiased
  # std √2, A = ±1/(√2 + 1e-6); r = (0, 0): A = 0.
  adv = np.asarray(slate.slate_advantages(jnp.array([[1.0, 3.0, 0.0, 0.0]]), k=2))
  a = 1 / (np.sqrt(2) + 1e-6)
  np.testing.assert_allclose(adv, [[-a, a, 0.0, 0.0]], atol=1e-6)
  with pytest.raises(ValueError, match='G = 3 rows per prompt'):
    slate.slate_advantages(jnp.zeros((1, 3)), k=2)


def test_continuation_is_drawn_from_softmax_of_advantage_over_eta():
  adv = np.array([0.6921177, -0.7349291, 0.7456320, -1.3949382, 0.6921177])
  # exp(A / 0.7) normalised: hand-evaluated with numpy once.
  expected = np.array([0.30671373, 0.03993594, 0.33108123, 0.01555538, 0.30671373])
  np.testing.assert_allclose(slate.continuation_probs(adv, eta=0.7), expected, atol=1e-6)
  draws = 40_000
  picks = slate.choose(np.tile(adv, (draws, 1)), jax.random.key(7), eta=0.7)
  freq = np.bincount(picks, minlength=5) / draws
  # Binomial standard error <= √(0.25 / 40000) = 0.0025; 4 of them.
  np.testing.assert_allclose(freq, expected, atol=0.01)
  assert (slate.choose(adv[None], jax.random.key(0), eta=0.0) == [2]).all()  # eta 0: argmax
  with pytest.raises(ValueError, match='eta=0'):
    slate.continuation_probs(adv, eta=0.0)


# ------------------------------------------------------------------ the rule judge, by hand

EX = env_tasks.search_qa(0, 0, difficulty=0)  # Founder of Pefa Corp (Faro Galavo) -> Tibeta.
FACT_1 = 'Pefa Corp was founded by Faro Galavo.'
FACT_2 = 'Faro Galavo was born in Tibeta.'


def _call(query, k=None):
  args = {'query': query} if k is None else {'query': query, 'k': k}
  import json
  return f'<call>search: {json.dumps(args)}</call>'


def test_rule_judge_scores_each_dimension_by_the_rubric():
  assert (EX.prompt.startswith('Where was the founder of Pefa Corp born?')
          and EX.answer == 'Tibeta')
  judge = slate_rules.SearchRuleJudge(verify=registry.get_verifier('exact'))
  assert judge.facts(EX) == ([FACT_1, FACT_2], ['Pefa Corp', 'Faro Galavo'])
  after_hop_1 = [{'text': _call('Pefa Corp founded'), 'observation': f'[1] {FACT_1}'}]
  score = lambda text, hist=(): judge.score_step(EX, list(hist), slate_judge.parse_step(text,
                                                                                         TAGS))
  # The gold first query retrieves FACT_1 (new): +1; no reasoning: r_think 0.
  assert score(_call('Pefa Corp founded')) == (0.0, 1.0)
  # The same query once FACT_1 is in the context: its only chain hit is old, redundant: -1.
  assert score(_call('Pefa Corp founded', k=1), after_hop_1) == (0.0, -1.0)
  # Top-1 hit 'Pefa Corp is headquartered in Tibeta.' is no chain fact, but the query names
  # the question's entity: 0. A query naming nothing known that hits nothing in the chain: -1.
  assert score(_call('Pefa Corp headquartered', k=1)) == (0.0, 0.0)
  assert score(_call('zzz qqq')) == (0.0, -1.0)
  # Malformed JSON, an unknown tool, an out-of-range k: -1 (what the tool would refuse).
  assert score('<call>search: {"query": </call>') == (0.0, -1.0)
  assert score('<call>lookup: {"query": "Pefa Corp"}</call>') == (0.0, -1.0)
  assert score(_call('Pefa Corp founded', k=99)) == (0.0, -1.0)
  # Reasoning: naming the next hop's subject (Faro Galavo once FACT_1 is known) +1, another
  # known entity 0, no known entity -1; the second hop's gold query is progress: +1.
  think = lambda t: f'<think>{t}</think>' + _call('Faro Galavo born')
  assert score(think('Now find where Faro Galavo was born'), after_hop_1) == (1.0, 1.0)
  assert score(think('Pefa Corp again'), after_hop_1) == (0.0, 1.0)
  assert score(think('no idea'), after_hop_1) == (-1.0, 1.0)
  # Answers: the exact verifier's +1, the answer inside other text 0, wrong -1.
  assert score('Tibeta') == (0.0, 1.0)
  assert score('I think it is Tibeta or Pefa') == (0.0, 0.0)
  assert score('Pefa') == (0.0, -1.0)
  step = slate_judge.parse_step('<think>hop two</think>' + _call('Faro Galavo born'), TAGS)
  assert (step.kind, step.thinking, step.content) == ('search', 'hop two', 'Faro Galavo born')


class _StubJudge:
  """judge.Judge's surface that ModelStepJudge reads; label log-probs fixed per prompt kind."""
  tok = tokenizer.from_characters(string.printable)
  use_chat_template, response_prefix, chat_kwargs = False, '', {}
  prompt_buckets, score_mode, params = (4096,), 'greedy', 'judge-params'

  def __init__(self):
    self.prompts = []

  def label_logprobs(self, token_lists, *, params):
    assert params == 'judge-params'
    texts = [self.tok.decode(ids) for ids in token_lists]
    self.prompts += texts
    # Reasoning rubric -> '-', query rubric -> '+', answer rubric -> '0'.
    pick = lambda t: 0 if 'reasoning step' in t else 2 if 'search query' in t else 1
    return np.log(np.eye(3)[[pick(t) for t in texts]] * 0.8 + 0.1)


def test_model_judge_asks_one_rubric_per_dimension():
  stub = _StubJudge()
  cands = [slate_judge.parse_step(t, TAGS) for t in (_call('Pefa Corp founded'), 'Tibeta')]
  (scores,) = slate_judge.ModelStepJudge(stub).score([EX], [[]], [cands])
  np.testing.assert_array_equal(scores, [[-1.0, 1.0], [-1.0, 0.0]])
  assert len(stub.prompts) == 4 and 'Ground truth: Tibeta' in stub.prompts[3]
  assert 'Query:\nPefa Corp founded' in stub.prompts[1]


# ------------------------------------------------------------------ rows from a tiny model

TOK = tokenizer.from_characters(string.printable)
CFG = transformer.ModelConfig(vocab_size=TOK.vocab_size, hidden_size=32, intermediate_size=64,
                              num_layers=1, num_heads=2, num_kv_heads=1, head_dim=16)
RENDERER = render.TextRenderer(prompt_template='Q:{prompt}\nA:')


@dataclasses.dataclass
class _State:
  example: object
  turns: int = 0
  reward: float = 0.0


class _FakeEnv:
  """Every turn gets the observation 'obs<t>'; the episode ends after `turns` turns."""
  format = TAGS

  def __init__(self, turns):
    self.turns = turns

  def reset(self, example):
    return _State(example)

  def step(self, state, turn_text):
    state.turns += 1
    done = state.turns >= self.turns
    messages = [] if done else [{'role': 'tool', 'content': f'obs{state.turns}'}]
    return base.Step(observation=f'obs{state.turns}', reward=0.0, done=done,
                     info={'messages': messages, 'truncated': False})


class _LengthJudge:
  """Deterministic ternary scores from the text: (len mod 3 - 1, 1 if it has 'a' else -1)."""

  def score(self, examples, histories, candidates, *, params=None):
    return [np.array([[len(c.text) % 3 - 1, 1.0 if 'a' in c.text else -1.0] for c in cs])
            for cs in candidates]


def test_rows_hold_the_prefix_then_one_step_and_match_a_teacher_forced_recompute():
  params = transformer.init_params(CFG, jax.random.key(0))
  examples = [env_tasks.calc_multiply(0, i, difficulty=2) for i in range(2)]
  k, turns, step_tokens, obs_tokens = 3, 3, 6, 24
  width = turns * step_tokens + (turns - 1) * obs_tokens  # 66
  out = slate.sample_steps(
      params, _FakeEnv(turns), RENDERER, TOK, examples, judge=_LengthJudge(), cfg=CFG, k=k,
      max_turns=turns, max_turn_tokens=step_tokens, max_observation_tokens=obs_tokens,
      # One bucket holds the prompt (43) plus the longest prefix (2 x 6 + 2 x 24): one compile.
      max_total_tokens=width, rng=jax.random.key(1), prompt_buckets=(112,),
      stop_seqs=((TOK.token_to_id('!'),),))
  r, g = out.rollout, turns * k
  assert r.group_size == g and r.tokens_NxL.shape == (2 * g, width)
  assert out.valid_BxT.all() and (out.chosen_BxT >= 0).all()
  tokens, mask, prefix, loss = (np.asarray(x) for x in (r.tokens_NxL, r.mask_NxL,
                                                        r.prefix_mask_NxL, r.loss_mask_NxL))
  for b in range(2):
    q = 0
    for t in range(turns):
      rows = b * g + t * k + np.arange(k)
      for n in rows:
        step_len = int(loss[n].sum())
        # A step ends at its stop token or an EOS, or is cut at max_turn_tokens.
        last = int(tokens[n, q + step_len - 1]) if step_len else None
        ends = {TOK.token_to_id('!'), *TOK.eos_ids}
        assert step_len == step_tokens or (0 < step_len and last in ends), (step_len, last)
        # The prefix (every earlier chosen step and observation), then the step: nothing else.
        np.testing.assert_array_equal(prefix[n], np.arange(width) < q)
        cols = np.arange(width)
        np.testing.assert_array_equal(loss[n], (cols >= q) & (cols < q + step_len))
        np.testing.assert_array_equal(mask[n], prefix[n] | loss[n])
        np.testing.assert_array_equal(tokens[n, :q], tokens[rows[0], :q])
      chosen = rows[out.chosen_BxT[b, t]]
      step = tokens[chosen, q:q + int(loss[chosen].sum())]
      if t + 1 < turns:  # The next step's prefix continues with the chosen step.
        nxt = b * g + (t + 1) * k
        np.testing.assert_array_equal(tokens[nxt, q:q + len(step)], step)
        assert TOK.decode(tokens[nxt, q + len(step):int(prefix[nxt].sum())].tolist()).endswith(
            f'obs{t + 1}</result>')
        q = int(prefix[nxt].sum())
  # Each step's advantage is over its own k: the step rewards' A, as the estimator finds it.
  np.testing.assert_allclose(out.advantages_BxG, slate.slate_advantages(out.rewards_BxG, k=k),
                             atol=1e-6)
  # Branches' log-probs (and the chosen prefix steps') equal a teacher-forced forward of
  # prompt + prefix + step.
  tokens_NxT, mask_NxT = sampler.sequences(r)
  recomputed = update.logprobs_step(params, tokens_NxT, mask_NxT, cfg=CFG,
                                    completion_len=r.tokens_NxL.shape[1]).logprobs_NxT
  policy = np.asarray(loss | (prefix & (np.asarray(r.logprobs_NxL) != 0)))
  diff = np.abs(np.asarray(recomputed) - np.asarray(r.logprobs_NxL))[policy]
  assert policy.sum() > 2 * g * 3 and diff.max() <= 1e-5, diff.max()


def test_config_checks_name_slate_fields():
  import importlib
  c = importlib.import_module('experiments.slate').get_config('runlocal')
  config_lib.validate(c, num_devices=8)
  c.rl.group_size = 6
  c.objective.advantage_kwargs = {'k': 3}
  c.rl.max_new_tokens = 40
  with pytest.raises(ValueError) as e:
    config_lib.validate(c, num_devices=8)
  for text in ('rl.group_size=6 must be slate.k x env.max_turns = 4',
               "advantage_kwargs: at most 'eps'", 'rl.max_new_tokens=40 < 80'):
    assert text in str(e.value)
  c = config_lib.default()
  c.objective.advantage = 'slate'
  with pytest.raises(ValueError, match='set slate.enabled'):
    config_lib.validate(c, num_devices=1)
