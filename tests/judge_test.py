"""The judge reward: step splitting, label scores against transformer.apply, rigged judges, the
composition with a verifier reward, label checks, no recompiles, and one RL step with it."""

import functools
import string

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rlreason import config as config_lib
from rlreason.model import tokenizer
from rlreason.model import transformer
from rlreason.model import weights
from rlreason.rl import metrics
from rlreason.rl import train
from rlreason.rollout import judge
from rlreason.rollout import sampler
from rlreason.verifiers import composition

TOK = tokenizer.from_characters(string.printable)
CFG = transformer.ModelConfig(vocab_size=TOK.vocab_size, hidden_size=32, intermediate_size=64,
                        num_layers=2, num_heads=2, num_kv_heads=1, head_dim=16)
TEMPLATE = 'Q:{problem}|S:{previous}|{index}:{step}?'
BUCKETS = (32, 128)


@pytest.fixture(scope='module', autouse=True)
def traces():
  """Counts traces of the sampler's jitted body (one per compiled shape) in this module."""
  count, original = [], sampler._generate

  @functools.wraps(original)  # Same jit name, so the persistent compilation cache still hits.
  def counting(*args, **kwargs):
    count.append(1)
    return original(*args, **kwargs)

  with pytest.MonkeyPatch.context() as mp:
    mp.setattr(sampler, '_generate', counting)
    sampler._generate_fn.cache_clear()  # Jits built from here on trace `counting`.
    yield count
  sampler._generate_fn.cache_clear()


@pytest.fixture(scope='module')
def params():
  # Larger-than-default weights: peaked, prompt-dependent label distributions.
  p = transformer.init_params(CFG, jax.random.key(0))
  return jax.tree.map(lambda x: x * 5 if x.ndim > 1 else x, p)


def make_judge(params, **kw):
  kw = {'template': TEMPLATE, 'prompt_buckets': BUCKETS, 'batch_size': 4, **kw}
  return judge.Judge(cfg=CFG, tok=TOK, params=params, **kw)


def test_split_steps_hand_cases():
  text = 'a = 1\n  b = 2  \n\n\nc = 3\n'
  assert judge.split_steps(text, split='lines') == ['a = 1', 'b = 2', 'c = 3']
  assert judge.split_steps(text, split='paragraphs') == ['a = 1\n  b = 2', 'c = 3']
  marked = 'Let us go.\nStep 1: add\n1+1=2\n**Step 2.** double\nstep 3) done'
  assert judge.split_steps(marked, split='markers') == [
      'Let us go.', 'Step 1: add\n1+1=2', '**Step 2.** double', 'step 3) done']
  assert judge.split_steps('Step 1: x\nStep 2: y', split='markers') == ['Step 1: x', 'Step 2: y']
  # "steps" inside a line are not markers; without markers the text is one step.
  assert judge.split_steps('two steps: 1: a', split='markers') == ['two steps: 1: a']
  assert judge.split_steps(' \n\n ', split='lines') == []
  # Beyond max_steps the rest joins the last judged step.
  assert judge.split_steps('1\n2\n3\n4', split='lines', max_steps=2) == ['1', '2\n3\n4']
  with pytest.raises(ValueError, match="split='words'"):
    judge.split_steps('x', split='words')


def test_step_scores_and_aggregates_by_hand():
  # Rows: p ∝ (1, 2, 1) -> greedy 0, expected (-1 + 0 + 1) / 4 = 0;
  #       p ∝ (1, 1, 6) -> greedy +1, expected (-1 + 6) / 8 = 0.625.
  lp_Mx3 = np.log([[1.0, 2.0, 1.0], [2.0, 2.0, 12.0]])  # Unnormalised on purpose.
  np.testing.assert_array_equal(judge.step_scores(lp_Mx3, mode='greedy'), [0.0, 1.0])
  np.testing.assert_allclose(judge.step_scores(lp_Mx3, mode='expected'), [0.0, 0.625],
                             rtol=1e-6)
  scores = np.array([1.0, -1.0, 0.0])
  assert [judge.AGGREGATES[a](scores) for a in ('mean', 'min', 'last')] == [0.0, -1.0, 0.0]


@pytest.mark.parametrize('mode', judge.SCORE_MODES)
def test_scores_equal_model_apply_on_the_rubric_prompt(params, mode):
  problems = ['1+2', 'Compute 12*12 for me please, quickly']
  completions = ['1+2=3\nso 3', 'First 12*10=120\n\nthen 12*2=24, and 120+24=144\nanswer 144']
  j = make_judge(params, score_mode=mode)
  result = j.score(problems, completions)
  # Recomputed here: the rubric text by hand, a plain full forward per prompt.
  forward = jax.jit(lambda p, t: transformer.apply(p, t, cfg=CFG)[0])
  expected, lengths = [], set()
  for problem, text in zip(problems, completions):
    steps = [line.strip() for line in text.splitlines() if line.strip()]
    row = []
    for k, step in enumerate(steps):
      prompt = f'Q:{problem}|S:{chr(10).join(steps[:k]) or "(none)"}|{k + 1}:{step}?'
      ids = TOK.encode(prompt)
      lengths.add(min(b for b in BUCKETS if b >= len(ids)))
      # Right padding: causal attention keeps position len(ids) - 1 blind to it, and one
      # shape serves every prompt (the judge left-pads and reads through the KV cache).
      padded = jnp.asarray([ids + [0] * (BUCKETS[-1] - len(ids))])
      logits_V = forward(params, padded)[0, len(ids) - 1]
      lp_3 = jax.nn.log_softmax(logits_V[jnp.asarray(j.label_ids)])
      p_3 = np.exp(np.asarray(lp_3, np.float64))
      row.append([-1.0, 0.0, 1.0][int(np.argmax(p_3))] if mode == 'greedy' else
                 p_3 @ np.array([-1.0, 0.0, 1.0]))
    expected.append(row)
  assert lengths == set(BUCKETS)  # Both buckets (and their left padding) are exercised.
  for got, want in zip(result.step_scores, expected):
    np.testing.assert_allclose(got, want, atol=1e-5)
  np.testing.assert_allclose(result.rewards_N, [np.mean(r) for r in expected], atol=1e-5)
  flat = np.concatenate(expected)
  assert np.ptp(flat) > 0  # The scores depend on the prompt: not a constant judge.
  m = result.metrics()
  assert m['judge/steps_judged'] == 2 + 3 and m['judge/steps_per_completion'] == 2.5
  assert sum(m[f'judge/label_{n}_frac'] for n in judge.LABEL_NAMES) == pytest.approx(1.0)


def rigged(params):
  """Residual dimension 0 is a large constant, and only '+' reads it positively."""
  plus, others = TOK.encode('+')[0], [TOK.encode('-')[0], TOK.encode('0')[0]]
  p = jax.tree.map(lambda x: x, params)
  p['embed'] = params['embed'].at[:, 0].set(10.0)
  p['lm_head'] = params['lm_head'].at[0, plus].set(30.0).at[0, jnp.asarray(others)].set(-30.0)
  return p


def test_rigged_judge_gives_plus_and_composes_with_the_verifier(params):
  j = make_judge(rigged(params), aggregate='min')
  result = j.score(['p', 'p', 'p'], ['a\nb\nc', 'just one step', ''])
  assert [s.tolist() for s in result.step_scores] == [[1.0] * 3, [1.0], []]
  np.testing.assert_array_equal(result.rewards_N, [1.0, 1.0, 0.0])  # Empty: empty_reward.
  assert result.metrics()['judge/label_plus_frac'] == 1.0
  # reward = 1.0 * verifier + 0.5 * judge: [1 + .5, 0 + .5, 1 + 0].
  mix = composition.RewardComposition(weights={'verifier': 1.0, 'judge': 0.5})
  rewards, m = judge.combine(mix, verifier_rewards=[1.0, 0.0, 1.0],
                             judge_rewards=result.rewards_N, progress=0.0)
  np.testing.assert_allclose(rewards, [1.5, 0.5, 1.0])
  assert m['judge/weight'] == 0.5 and m['judge/contribution'] == pytest.approx(1.0 / 3)
  # A linear schedule 0 -> 1: at progress 0.25 the judge weighs 0.25.
  ramp = composition.RewardComposition(weights={'verifier': 1.0,
                                                'judge': composition.linear(0.0, 1.0)})
  rewards, _ = judge.combine(ramp, verifier_rewards=[1.0, 0.0, 1.0],
                             judge_rewards=result.rewards_N, progress=0.25)
  np.testing.assert_allclose(rewards, [1.25, 0.25, 1.0])


@pytest.mark.parametrize('labels, match', [
    (('-', '0', 'ab'), "label 'ab' encodes to 2 tokens"),
    (('-', '\u20ac', '+'), "label '\u20ac' is not a token"),
    (('-', '-', '+'), 'three different tokens'),
    (('-', '+'), 'need 3 strings'),
])
def test_labels_must_be_single_distinct_tokens(params, labels, match):
  with pytest.raises(ValueError, match=match):
    make_judge(params, labels=labels)


def test_bad_options_name_the_field(params):
  with pytest.raises(ValueError, match='Judge.template'):
    make_judge(params, template='{problem} {answer}')
  with pytest.raises(ValueError, match="Judge.aggregate='median'"):
    make_judge(params, aggregate='median')
  with pytest.raises(ValueError, match='pass params='):
    make_judge(None).score(['p'], ['s'])


def test_rubric_goes_through_the_chat_template():
  from conftest import SHARED_DATA
  qwen = tokenizer.load(SHARED_DATA / 'qwen_tokenizer')
  cfg = CFG.replace(vocab_size=qwen.vocab_size)
  j = judge.Judge(cfg=cfg, tok=qwen, response_prefix='Verdict: ')
  text = j.render('What is 2+2?', ['2+2 is 4.'], 'So the answer is 4.', 2)
  assert text.startswith('<|im_start|>system\n')
  user = text.split('<|im_start|>user\n')[1].split('<|im_end|>')[0]
  assert 'Problem:\nWhat is 2+2?' in user and 'Earlier steps:\n2+2 is 4.' in user
  assert 'Step 2:\nSo the answer is 4.' in user
  assert text.endswith('<|im_start|>assistant\nVerdict: ')
  assert j.label_ids == tuple(qwen.encode(x)[0] for x in '-0+')
  plain = judge.Judge(cfg=cfg, tok=qwen, use_chat_template=False)
  assert plain.render('p', [], 's', 1) == judge.DEFAULT_TEMPLATE.format(
      problem='p', previous='(none)', step='s', index=1)


def test_long_prompts_keep_head_and_tail(params):
  j = make_judge(params)
  ids, cut = j.prompt_ids('p' * 200, ['the step'])
  assert cut == 1 and len(ids[0]) == 128
  full = TOK.encode(j.render('p' * 200, [], 'the step', 1))
  assert len(full) > 200 and ids[0] == full[:32] + full[-96:]


def test_no_recompilation_across_calls_in_the_same_buckets(params, traces):
  j = make_judge(params)
  j.score(['p'], ['x=1\ny=2'])  # Bucket 32 only.
  before = len(traces)
  # Other completions and problems, more steps (two calls of 4 rows), the same bucket.
  result = j.score(['q', 'r'], ['a\nb\nc', 'dd\nee\nff\ngg\nhh'])
  assert result.metrics()['judge/steps_judged'] == 8
  assert len(traces) == before
  # A prompt in the other bucket is one new shape: exactly one trace.
  j.score(['q' * 60], ['a'])
  assert len(traces) <= before + 1


def test_from_config_builds_a_random_tiny_judge_and_its_mix():
  c = config_lib.default().judge
  c.model, c.schedule, c.weight, c.weight_end = 'random-tiny', 'linear', 0.0, 1.0
  c.template, c.prompt_buckets, c.batch_size = TEMPLATE, BUCKETS, 2
  j, mix = judge.from_config(c, policy_cfg=CFG, policy_tok=TOK)
  assert j.params is not None and j.cfg.num_layers == 2
  assert mix.weights_at(0.5) == {'verifier': 1.0, 'judge': 0.5}
  c.model = ''
  with pytest.raises(ValueError, match='judge.model is empty'):
    judge.from_config(c, policy_cfg=CFG, policy_tok=TOK)


def test_from_config_loads_a_judge_from_an_hf_directory(params, tmp_path):
  weights.save(tmp_path, CFG, params)
  TOK.backend.save(str(tmp_path / 'tokenizer.json'))
  c = config_lib.default().judge
  c.model, c.template, c.prompt_buckets, c.batch_size = str(tmp_path), TEMPLATE, BUCKETS, 4
  j, _ = judge.from_config(c, policy_cfg=None, policy_tok=None)
  assert j.cfg.num_layers == CFG.num_layers and j.tok.vocab_size == TOK.vocab_size
  # The loaded judge scores as the in-memory one does.
  want = make_judge(params).score(['1+2'], ['1+2=3\nso 3']).rewards_N
  np.testing.assert_allclose(j.score(['1+2'], ['1+2=3\nso 3']).rewards_N, want, atol=1e-6)


def test_one_rl_step_with_the_policy_as_judge(tmp_path):
  from train_test import tiny_config
  c = tiny_config(steps=1)
  # Otherwise train_test's tiny config unchanged: its compilations are the same programs, so
  # the persistent cache shares them between the two files.
  c.sft.steps, c.checkpoint.every = 0, 0
  # The arithmetic task's characters have no '-': another label for -1.
  c.judge.update(dict(enabled=True, model='policy', labels=('#', '0', '+'), weight=0.5,
                      template='{problem}|{step}=', prompt_buckets=(32,), batch_size=8))
  train.train(c, str(tmp_path))
  row = [r for r in metrics.read_jsonl(tmp_path / 'metrics.jsonl') if r['step'] == 1][0]
  for key in ('judge/steps_judged', 'judge/label_plus_frac', 'judge/mean', 'judge/weight',
              'verifier/mean', 'reward/mean'):
    assert key in row, key
  assert row['judge/weight'] == 0.5 and row['judge/steps_judged'] > 0
  # The trained reward is the composition: verifier mean + 0.5 * judge mean.
  assert row['train/reward'] == pytest.approx(row['verifier/mean'] + 0.5 * row['judge/mean'],
                                              abs=1e-5)
