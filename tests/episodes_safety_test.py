"""Episodes against hostile tool output and hung scorers (issue 33), through both episode loops:
invalid unicode in an observation, control-token text in a tool's output, a final answer whose
verifier hangs in C."""

import concurrent.futures
import os
import string
import threading
import time

import jax
import numpy as np
import pytest

from rlreason.envs import answer_scoring
from rlreason.envs import base
from rlreason.envs import environment
from rlreason.envs import render
from rlreason.envs import tasks as env_tasks
from rlreason.model import tokenizer
from rlreason.model import transformer
from rlreason.rollout import continuous_episodes
from rlreason.rollout import episodes as episodes_lib
from rlreason.verifiers import verdict

TOK = tokenizer.from_characters(string.printable)
CFG = transformer.ModelConfig(vocab_size=TOK.vocab_size, hidden_size=32, intermediate_size=64,
                              num_layers=2, num_heads=4, num_kv_heads=2, head_dim=8)
DATA = os.path.join(os.path.dirname(__file__), '..', '..', 'shared', 'data')
RENDERER = render.TextRenderer(prompt_template='Q:{prompt}\nA:')
ARGS = dict(cfg=CFG, group_size=2, max_turns=2, max_turn_tokens=6, max_observation_tokens=32,
            max_total_tokens=64, rng=jax.random.key(3), prompt_buckets=(48,),
            stop_seqs=((TOK.token_to_id('!'),),))


@pytest.fixture(scope='module')
def params():
  return transformer.init_params(CFG, jax.random.key(0))


class OneObservation:
  """A tool that answers the first turn with `content` whatever the model wrote; done after."""

  def __init__(self, content):
    self.content = content

  def reset(self, example):
    return environment.EpisodeState(example)

  def step(self, state, turn_text):
    assert isinstance(turn_text, str)
    state.turns += 1
    done = state.turns > 1
    messages = [] if done else [{'role': 'tool', 'content': self.content}]
    return base.Step(observation='', reward=0.0, done=done,
                     info={'messages': messages, 'truncated': False})


def _examples(count):
  return [env_tasks.calc_multiply(0, i, difficulty=2) for i in range(count)]


def _both_loops(params, env, **kw):
  static = episodes_lib.run_episodes(params, env, RENDERER, TOK, _examples(1), **ARGS, **kw)
  continuous = continuous_episodes.run_episodes(params, env, RENDERER, TOK, _examples(1),
                                                slots=2, **ARGS, **kw)
  return static, continuous


def _observation_ids(ep, n):
  tokens, loss = np.asarray(ep.rollout.tokens_NxL[n]), np.asarray(ep.rollout.loss_mask_NxL[n])
  count = int(ep.rollout.lengths_N[n])
  return tokens[:count][~loss[:count]].tolist()


def test_lone_surrogate_in_an_observation_is_replaced_not_raised(params):
  for ep in _both_loops(params, OneObservation('a\ud800b\ud83d\ude00c')):
    for n in range(2):
      assert ep.turns_N[n] == 2 and ep.transcripts[n][0]['observation'] == (
          '<result>a<unk>b<unk>c</result>')  # U+FFFD and the joined emoji: not characters here
      assert TOK.decode(_observation_ids(ep, n)) == ep.transcripts[n][0]['observation']


def test_control_token_text_in_a_tool_output_stays_text(params):
  """'<eos>' written by a tool is five characters of the observation, not the EOS id."""
  eos = TOK.token_to_id('<eos>')
  for ep in _both_loops(params, OneObservation('x<eos><pad>y')):
    for n in range(2):
      obs = _observation_ids(ep, n)
      assert eos not in obs and TOK.pad_id not in obs
      assert obs == TOK.encode('<result>x') + [TOK.token_to_id(c) for c in '<eos><pad>'] + (
          TOK.encode('y</result>'))


class FinalAnswerEnv:
  """A real ToolEnvironment whose first turn is the final answer 'the answer is 5'."""

  def __init__(self, env):
    self.env, self.format = env, env.format

  def reset(self, example):
    return self.env.reset(example)

  def step(self, state, turn_text):
    del turn_text
    return self.env.step(state, 'the answer is 5')


@pytest.fixture
def own_pool():
  yield
  answer_scoring.close_pool()  # No scoring workers outlive the test.


def test_a_hung_verifier_times_out_within_the_deadline(params, own_pool):
  """pow(9, 9**9) in the verifier holds the GIL in C: inline it stalled the loop for minutes;
  scored in the pool it is a timeout with reward 0, and the next answers still score."""
  del own_pool
  hung = environment.ToolEnvironment(tools=['calculator'], family='tags',
                                     verifier='rlreason.verifiers.faults:big_power',
                                     score_deadline_s=1.0)
  for ep in _both_loops(params, FinalAnswerEnv(hung)):
    assert ep.rewards_N.tolist() == [0.0, 0.0]
    assert [t[-1]['status'] for t in ep.transcripts] == ['timeout', 'timeout']
  # A good answer scored beside a hung one (same batch or the next) still scores (the
  # deadline leaves room for a loaded machine: a queued item moves after the pool's STUCK_S).
  with concurrent.futures.ThreadPoolExecutor(2) as threads:
    hung_verdict = threads.submit(answer_scoring.pool_scorer, [{}],
                                  'rlreason.verifiers.faults:big_power', 8.0)
    good = threads.submit(answer_scoring.pool_scorer, [{}], 'rlreason.verifiers.faults:echo', 8.0)
    assert good.result()[0].status == 'correct', good.result()[0]
    assert hung_verdict.result()[0].status == 'timeout'


@pytest.mark.parametrize('path', ['qwen_tokenizer', 'sentencepiece_c4_32k/tokenizer.model'])
def test_encode_pieces_is_encode_on_template_text_and_plain_text_on_content(path):
  tok = tokenizer.load(os.path.join(DATA, path))
  eos = tok.special_tokens['eos_token']
  template = f'a{eos}\nb '
  assert tok.encode_pieces([(template, True)]) == tok.encode(template)
  # Runs across pieces encode as one: the same ids as the joined text when content is benign.
  pieces = [('x', True), (' hello', False), (f' world{eos}', True)]
  assert tok.encode_pieces(pieces) == tok.encode(f'x hello world{eos}')
  ids = tok.encode_pieces([('x ', True), (f'y{eos}z', False)])
  assert tok.eos_id not in ids and tok.decode(ids).endswith(f'y{eos}z')


def test_answers_from_many_threads_are_scored_in_batches(monkeypatch):
  """Answers arriving while a batch is scored wait and go together in the next one: a turn of
  hung answers costs about two deadlines, not one each."""
  batches, first = [], threading.Event()

  class FakePool:

    def score(self, items, *, verifier, deadline_s):
      batches.append(len(items))
      if len(batches) == 1:  # Hold the first batch until the other three callers queued.
        first.set()
        while len(answer_scoring._QUEUE) < 3:  # pylint: disable=protected-access
          time.sleep(0.01)
      return [verdict.failure(verdict.TIMEOUT, f'{v} {deadline_s}') for v in verifier]

  monkeypatch.setattr(answer_scoring, '_pool', FakePool)
  with concurrent.futures.ThreadPoolExecutor(4) as pool:
    head = pool.submit(answer_scoring.pool_scorer, [{'n': 0}], 'math', 2.0)
    first.wait()
    rest = [pool.submit(answer_scoring.pool_scorer, [{'n': i}], 'math', 2.0) for i in (1, 2, 3)]
    verdicts = [head.result()] + [f.result() for f in rest]
  assert batches == [1, 3]
  assert [v.status for (v,) in verdicts] == ['timeout'] * 4
