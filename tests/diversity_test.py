"""Tests for rlreason.methods.diversity: the schedules (deterministic per seed, even spread), the
Countdown lists, the eval.diversity checks, and sampling with per-row prompts and prefixes."""

import collections
import types

import jax
import numpy as np
import pytest

from rlreason import config as config_lib
from rlreason import config_checks
from rlreason.methods import diversity
from rlreason.model import tokenizer as tokenizer_lib
from rlreason.model import transformer
from rlreason.rl import evaluate
from rlreason.rl import rl_batch
from rlreason.tasks import countdown


def example(index=0):
  return countdown.generate(0, index, difficulty=3, max_number=9, max_target=30)


def test_countdown_skeletons_are_the_top_level_shapes():
  ex = countdown._example([3, 7, 3], 13, '3+7+3', example_id='x', difficulty=3)
  skeletons = diversity.countdown_skeletons(ex)
  assert skeletons[:4] == ['3+', '3-', '3*', '3/'] and skeletons[4:8] == ['7+', '7-', '7*', '7/']
  assert skeletons[8:12] == ['(3+', '(3-', '(3*', '(3/'] and len(skeletons) == 16  # 3 once.


def test_paraphrases_and_comments_use_the_task_alphabet():
  ex = example()
  for mode in ('paraphrase', 'comment', 'skeleton'):
    for v in diversity.variants(mode, ex):
      assert set(v.prompt + v.prefix) <= set(countdown.CHARS), (mode, v)
  for v in diversity.variants('paraphrase', ex):
    assert all(str(n) in v.prompt for n in ex.meta['numbers']) and ex.answer in v.prompt
  assert {v.prompt for v in diversity.variants('paraphrase', ex)}.isdisjoint({ex.prompt})


def test_schedule_is_deterministic_per_seed_and_spreads_evenly():
  exs = [example(i) for i in range(6)]
  for mode in ('skeleton', 'paraphrase', 'comment'):
    for ex in exs:
      a = diversity.schedule(mode, ex, k=32, seed=3)
      assert a == diversity.schedule(mode, ex, k=32, seed=3)
      counts = collections.Counter(a)
      m = len(diversity.variants(mode, ex))
      assert set(counts) == set(diversity.variants(mode, ex)) or m > 32
      assert max(counts.values()) - min(counts.values()) <= 1
    offsets = lambda seed: [diversity.schedule(mode, ex, k=1, seed=seed)[0] for ex in exs]
    assert offsets(3) != offsets(4)  # Another seed rotates some schedules.
  assert diversity.schedule('iid', exs[0], k=4, seed=0) == [diversity.Variant(exs[0].prompt)] * 4


def test_modes_and_checks_agree_with_config_checks():
  assert config_checks.DIVERSITY_MODES == diversity.MODES
  assert set(config_checks.DIVERSITY_TASKS) == set(diversity.SKELETONS) == set(
      diversity.PARAPHRASES)
  c = config_lib.default()
  c.eval.diversity = 'skeleton'
  c.data.task = 'arithmetic'
  with pytest.raises(ValueError, match="eval.diversity='skeleton' has no schedule"):
    config_lib.validate(c, num_devices=1)
  c.eval.diversity = 'bogus'
  with pytest.raises(ValueError, match="eval.diversity='bogus'; known"):
    config_lib.validate(c, num_devices=1)
  with pytest.raises(ValueError, match='eval.diversity'):
    diversity.check_mode('skeleton', 'arithmetic')


def test_sample_verdicts_feeds_each_row_its_prompt_and_prefix(monkeypatch):
  tok = tokenizer_lib.from_characters(countdown.CHARS)
  cfg = transformer.ModelConfig(vocab_size=tok.vocab_size, hidden_size=16, intermediate_size=32,
                                num_layers=1, num_heads=2, num_kv_heads=1, head_dim=8)
  config = config_lib.default()
  config.data.prompt_buckets = (192,)
  config.rl.max_new_tokens = 4
  exs = [example(i) for i in range(3)]
  run = types.SimpleNamespace(config=config, cfg=cfg, tok=tok, pad_id=tok.pad_id, mesh=None,
                              eval_examples=exs, eval_chunk=2)
  seen = []

  def fake_verify(run, rollout, examples, *, progress, return_verdicts):
    texts = rl_batch.decode_completions(run, rollout)
    seen.append((texts, examples))
    first = [str(ex.meta['numbers'][0]) for ex in examples]  # "correct": starts with number 0
    return None, [types.SimpleNamespace(status='correct' if t.startswith(f) else 'wrong')
                  for t, f in zip(texts, first)]

  monkeypatch.setattr(rl_batch, 'verify', fake_verify)
  params = transformer.init_params(cfg, jax.random.key(0))
  correct, answers, _ = diversity.sample_verdicts(
      run, params, k=8, temperature=1.0, rng=jax.random.key(1), mode='skeleton', seed=0)
  assert correct.shape == (3, 8) and len(answers) == 3
  texts = [t for chunk, _ in seen for t in chunk]
  for b, ex in enumerate(exs):
    want = [v.prefix for v in diversity.schedule('skeleton', ex, k=8, seed=0)]
    got = texts[b * 8:(b + 1) * 8]
    assert all(t.startswith(p) for t, p in zip(got, want))
    np.testing.assert_array_equal(correct[b], [p.startswith(str(ex.meta['numbers'][0]))
                                               for p in want])
  # Through evaluate(): the same verdicts, summarised.
  seen.clear()
  out = evaluate.evaluate(run, params, k=8, temperature=1.0, rng=jax.random.key(1),
                          diversity='skeleton')
  assert out['pass@8'] == pytest.approx(correct.any(1).mean())
  assert out['pass@1'] == pytest.approx(correct.mean()) and 0 < out['pass@1'] < 1
