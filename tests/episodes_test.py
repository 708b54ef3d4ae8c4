"""Multi-turn episodes: token in/token out, kept cache == full forward, masks, budgets, errors."""

import dataclasses
import functools
import string

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rlreason.envs import base
from rlreason.envs import environment
from rlreason.envs import render
from rlreason.envs import tasks as env_tasks
from rlreason.model import tokenizer
from rlreason.model import transformer
from rlreason.rollout import episodes as episodes_lib
from rlreason.rollout import sampler

TOK = tokenizer.from_characters(string.printable)
CFG = transformer.ModelConfig(vocab_size=TOK.vocab_size, hidden_size=32, intermediate_size=64,
                              num_layers=2, num_heads=4, num_kv_heads=2, head_dim=8,
                              qkv_bias=True)
RENDERER = render.TextRenderer(prompt_template='Q:{prompt}\nA:')


@pytest.fixture(scope='module')
def params():
  return transformer.init_params(CFG, jax.random.key(0))


@dataclasses.dataclass
class _State:
  example: object
  turns: int = 0
  tool_calls: int = 0
  reward: float = 0.0
  errors: dict = dataclasses.field(default_factory=dict)


class FakeEnv:
  """Ignores what the model wrote: `observations[t]` after turn t, done after the last one.
  The reward is 0.25 per turn taken."""

  def __init__(self, observations):
    self.observations = observations

  def reset(self, example):
    return _State(example)

  def step(self, state, turn_text):
    t = state.turns
    state.turns += 1
    state.reward += 0.25
    done = t >= len(self.observations)
    messages = [] if done else [{'role': 'tool', 'content': self.observations[t]}]
    return base.Step(observation='', reward=0.25, done=done,
                     info={'messages': messages, 'truncated': False})


def _examples(count):
  return [env_tasks.calc_multiply(0, i, difficulty=2) for i in range(count)]


def _run(params, env, examples, **kw):
  args = dict(cfg=CFG, group_size=2, max_turns=3, max_turn_tokens=6, max_observation_tokens=24,
              max_total_tokens=64, rng=jax.random.key(3), prompt_buckets=(48,), temperature=1.0,
              stop_seqs=((TOK.token_to_id('!'),),))
  args.update(kw)
  return episodes_lib.run_episodes(params, env, RENDERER, TOK, examples, **args)


def _full_forward_logprobs(params, ep, temperature=1.0):
  tokens, mask = sampler.sequences(ep.rollout)
  return _forward_logprobs(params, tokens, mask, ep.rollout.tokens_NxL, temperature,
                           p=ep.rollout.prompts.tokens_BxP.shape[1])


@functools.partial(jax.jit, static_argnames='p')  # One compilation (op by op: one per primitive).
def _forward_logprobs(params, tokens, mask, sampled_NxL, temperature, *, p):
  logits = transformer.apply(params, tokens, cfg=CFG, mask_NxT=mask)[0] / temperature
  logp = jax.nn.log_softmax(logits, -1)
  return jnp.take_along_axis(logp[:, p - 1:-1], sampled_NxL[..., None], -1)[..., 0]


def test_episode_tokens_are_the_hand_built_conversation(params):
  env = FakeEnv(['12', '345'])
  ep = _run(params, env, _examples(2))
  r = ep.rollout
  tokens, count = np.asarray(r.tokens_NxL), np.asarray(r.lengths_N)
  loss, turn = np.asarray(r.loss_mask_NxL), np.asarray(r.turn_NxL)
  for n in range(4):
    text = ''
    for t, entry in enumerate(ep.transcripts[n]):
      assert entry['turn'] == t
      text += entry['text']
      if entry.get('observation'):
        assert entry['observation'] == f'<result>{env.observations[t]}</result>'
        text += entry['observation']
    # Each turn's text is re-tokenised only here, to compare (chars: one token per char).
    assert TOK.decode(tokens[n, :count[n]].tolist(), skip_special_tokens=True) == text
    assert ep.turns_N[n] == len(ep.transcripts[n]) == 3
    assert ep.rewards_N[n] == 0.75
    # Loss only on sampled tokens; observation tokens carry the turn they answer.
    obs_cols = np.flatnonzero(~loss[n, :count[n]])
    assert len(obs_cols) == ep.observation_tokens_N[n] == len('<result>12</result>') + len(
        '<result>345</result>')
    assert not loss[n, count[n]:].any()
    assert turn[n, obs_cols[0]] == 0 and turn[n, obs_cols[-1]] == 1
    assert set(turn[n, :count[n]][loss[n, :count[n]]]) <= {0, 1, 2}


@pytest.mark.parametrize('temperature', [1.0, 0.7])
def test_kept_cache_equals_full_forward(params, temperature):
  """Log-probs recorded while decoding with the kept cache equal a fresh forward pass over
  the whole conversation (fp32), on every sampled token of every turn."""
  ep = _run(params, FakeEnv(['7', '89']), _examples(3), temperature=temperature)
  full = _full_forward_logprobs(params, ep, temperature)
  loss = np.asarray(ep.rollout.loss_mask_NxL)
  assert loss.sum() > 20 and (~loss & np.asarray(ep.rollout.mask_NxL)).sum() > 10
  np.testing.assert_allclose(np.asarray(ep.rollout.logprobs_NxL)[loss], np.asarray(full)[loss],
                             atol=1e-5)


def test_turn_stops_at_stop_sequence_and_budget_truncates(params):
  # Greedy decoding of this random model: find a token it emits, make it the stop sequence.
  probe = _run(params, FakeEnv(['1']), _examples(1), temperature=0.0, max_turns=1,
               stop_seqs=())
  first = int(probe.rollout.tokens_NxL[0, 0])
  ep = _run(params, FakeEnv(['1', '2']), _examples(1), temperature=0.0, stop_seqs=((first,),))
  tokens = np.asarray(ep.rollout.tokens_NxL[0])
  loss = np.asarray(ep.rollout.loss_mask_NxL[0])
  assert ep.transcripts[0][0]['tokens'] == 1
  # Every turn ends at the stop token or at max_turn_tokens.
  starts = np.flatnonzero(loss & ~np.concatenate([[False], loss[:-1]]))
  for entry, start in zip(ep.transcripts[0], starts):
    assert entry['tokens'] == 6 or tokens[start + entry['tokens'] - 1] == first
  # A budget too small for the second observation: the episode ends truncated, no loss there.
  small = _run(params, FakeEnv(['1' * 10, '2']), _examples(1), max_total_tokens=12,
               temperature=0.0, stop_seqs=((first,),))
  assert small.truncated_N.all() and (np.asarray(small.rollout.lengths_N) <= 12).all()


def test_compiles_once_per_bucket(params):
  _run(params, FakeEnv(['1', '22']), _examples(2))
  sizes = [f._cache_size() for f in _compiled(params)]
  _run(params, FakeEnv(['333', '4']), _examples(4)[2:], rng=jax.random.key(9))
  # Other tests compiled other batch sizes; the second batch (same shapes) adds nothing.
  assert [f._cache_size() for f in _compiled(params)] == sizes and min(sizes) >= 1


def _compiled(params):
  del params
  static = dict(cfg=CFG, group_size=2, length=64, slots=episodes_lib.cache_slots(3, 6, 24),
                pad_id=0, cache_dtype=None, mesh=None)
  stop = ((TOK.token_to_id('!'),),)
  return [episodes_lib._start_fn(**static),
          episodes_lib._decode_fn(**static, steps=6, greedy=False, top_k=0, top_p=1.0,
                                  eos=tuple(sorted(TOK.eos_ids)), stop_seqs=stop),
          episodes_lib._observe_fn(**static, width=24)]


class ScriptedEnv:
  """A real ToolEnvironment fed scripted turns instead of the model's (bad input cases)."""

  def __init__(self, turns, **kw):
    self.env = environment.ToolEnvironment(tools=['calculator'], family='tags', verifier='exact',
                                           **kw)
    self.turns = turns
    self.format = self.env.format

  def reset(self, example):
    return self.env.reset(example)

  def step(self, state, turn_text):
    del turn_text
    return self.env.step(state, self.turns[state.turns])


def test_tool_errors_are_observations_and_counted(params):
  turns = ['<call>calculator: {"expression": 2*</call>',  # malformed JSON
           '<call>calc: {"expression": "1"}</call><call>calculator: {"expression": 5}</call>',
           '<call>calculator: {"expression": "9**9**9**9"}</call>']
  ep = _run(params, ScriptedEnv(turns + ['done'], max_turns=5), _examples(1), max_turns=4,
            max_observation_tokens=200, max_total_tokens=600)
  errors = {k: int(v[0]) for k, v in ep.errors_N.items()}
  assert errors['malformed'] == 1 and errors['unknown_tool'] == 1
  assert errors['bad_arguments'] == 1 and sum(errors.values()) >= 4
  observations = [e.get('observation') or '' for e in ep.transcripts[0]]
  assert 'malformed' in observations[0] and 'unknown tool' in observations[1]
  assert ep.tool_calls_N[0] == 3 and ep.turns_N[0] == 4 and not ep.truncated_N[0]


def test_long_observation_is_cut_with_a_marker(params):
  env = FakeEnv(['x' * 500])
  ep = _run(params, env, _examples(1), max_observation_tokens=60, max_total_tokens=200)
  obs = ep.transcripts[0][0]['observation']
  assert obs.startswith('<result>x') and 'truncated' in obs and len(obs) <= 60


# --- the Qwen chat templates, against transformers --------------------------------------------

QWEN_DIR = __import__('pathlib').Path(__file__).resolve().parents[2] / 'shared' / 'data' / 'qwen_tokenizer'


@pytest.fixture(scope='module', params=['qwen2.5', 'qwen3'])
def qwen(request, tmp_path_factory):
  transformers = pytest.importorskip('transformers')
  directory = QWEN_DIR
  if request.param == 'qwen3':
    directory = tmp_path_factory.mktemp('qwen3')
    for name in ('vocab.json', 'merges.txt'):
      (directory / name).symlink_to(QWEN_DIR / name)
    (directory / 'tokenizer_config.json').symlink_to(QWEN_DIR / 'qwen3' / 'tokenizer_config.json')
  return transformers.AutoTokenizer.from_pretrained(str(directory)), tokenizer.load(directory)


class QwenFake(FakeEnv):

  def __init__(self, observations, fmt):
    super().__init__(observations)
    self.format = fmt  # run_episodes reads the call's end (the stop sequence) from it.


def test_qwen_episode_is_the_template_rendering(qwen):
  """A random policy's two tool-calling turns, observations from the real template: the
  episode's text up to the second observation is what transformers renders for the same
  conversation, and the prompt and observation token ids are the template's."""
  hf, tok = qwen
  env = environment.ToolEnvironment(tools=['calculator'], family='qwen', verifier='exact')
  renderer = render.make_renderer(tok, family='qwen', tools=env.specs(),
                                  system_prompt='You are terse.', tool_calls_per_turn='one')
  cfg = CFG.replace(vocab_size=tok.vocab_size)
  params = transformer.init_params(cfg, jax.random.key(1))
  examples = _examples(2)
  ep = episodes_lib.run_episodes(
      params, QwenFake(['5', 'a coffee house'], env.format), renderer, tok, examples, cfg=cfg, group_size=1,
      max_turns=3, max_turn_tokens=5, max_observation_tokens=64, max_total_tokens=160,
      rng=jax.random.key(2), prompt_buckets=(256,), stop_seqs=None)
  # A turn stops at the call's end with tool_calls_per_turn='one'; Qwen's default is several
  # calls per turn, ended by <|im_end|> (no stop sequence).
  assert episodes_lib.turn_stops(tok, env, renderer) == ((tok.token_to_id('</tool_call>'),),)
  assert episodes_lib.stop_sequences(tok, env.format) == ()
  tools = [s.as_json_schema() for s in env.specs()]
  tokens, loss = np.asarray(ep.rollout.tokens_NxL), np.asarray(ep.rollout.loss_mask_NxL)
  for n, example in enumerate(examples):
    messages = [{'role': 'system', 'content': 'You are terse.'},
                {'role': 'user', 'content': example.prompt}]
    prompt_ids = list(hf.apply_chat_template(messages, tools=tools, add_generation_prompt=True,
                                             tokenize=True, return_dict=False))
    row_prompt = np.asarray(ep.rollout.prompts.tokens_BxP[n])[np.asarray(
        ep.rollout.prompts.mask_BxP[n])].tolist()
    assert row_prompt == prompt_ids
    ids, col = list(prompt_ids), 0
    for t, content in enumerate(['5', 'a coffee house']):
      k = ep.transcripts[n][t]['tokens']
      sampled = tokens[n, col:col + k].tolist()
      assert loss[n, col:col + k].all()
      messages += [{'role': 'assistant', 'content': tok.decode(sampled)},
                   {'role': 'tool', 'content': content}]
      obs = ep.transcripts[n][t]['observation']
      obs_ids = tokens[n, col + k:col + k + len(tok.encode(obs))].tolist()
      assert obs_ids == hf.encode(obs, add_special_tokens=False) and not loss[
          n, col + k:col + k + len(obs_ids)].any()
      ids += sampled + obs_ids
      col += k + len(obs_ids)
    rendered = hf.apply_chat_template(messages, tools=tools, add_generation_prompt=True,
                                      tokenize=False)
    assert tok.decode(ids) == rendered


def test_ok_calls_count_calls_that_ran_without_error():
  n = 4
  zeros = np.zeros(n, np.int32)
  ep = episodes_lib.Episodes(
      rollout=None, rewards_N=np.zeros(n, np.float32), turns_N=zeros, observation_tokens_N=zeros,
      tool_calls_N=np.array([0, 1, 2, 2], np.int32), truncated_N=np.zeros(n, bool),
      errors_N={'unknown_tool': np.array([0, 1, 1, 0], np.int32),
                'malformed': np.array([1, 0, 0, 3], np.int32)},  # not counted as calls
      transcripts=[[]] * n)
  np.testing.assert_array_equal(episodes_lib.ok_calls_N(ep), [0, 0, 1, 2])
  m = episodes_lib.metrics(ep)
  assert m['episodes/ok_call_frac'] == 0.5 and m['episodes/tool_call_frac'] == 0.75


def test_budget_errors_name_the_budget():
  episodes_lib.check_budgets(1, 1, 1, 0)  # One turn needs no observation budget.
  with pytest.raises(ValueError, match='max_turns=0'):
    episodes_lib.check_budgets(0, 8, 8, 8)
  with pytest.raises(ValueError, match='max_observation_tokens=0 must be >= 1 when max_turns=2'):
    episodes_lib.check_budgets(2, 8, 8, 0)
