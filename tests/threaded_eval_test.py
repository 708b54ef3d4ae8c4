"""The loop's evaluation of a threaded policy forks (methods/threads.py's thread_verdicts).

The model is fork_join_test's rigged one (one-hot embeddings, an output matrix that scripts a
bigram chain over random attention) on experiments/parallel_reasoning.py's runlocal setting:
greedy, every prompt (ending in '=') gives the parent text '<a,b>[12,12]+#': a spawn block of
5 tokens, two workers writing '12' + EOS (3 each), the ending '+#' + EOS (3): critical path
5 + 3 + 3 = 11 tokens, 14 sampled in all.
"""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rlreason import config as config_lib
from rlreason.methods import threads
from rlreason.rl import evaluate
from rlreason.rl import run_setup
from rlreason.rl import train
from rlreason.rollout import fork_join
from rlreason.verifiers import text_answer

SCRIPT = {'=': '<', '<': 'a', 'a': ',', ',': 'b', 'b': '>', ':': '1', '1': '2', ']': '+',
          '+': '#'}
TEXT = '<a,b>[12,12]+#'


def rigged(run):
  params = jax.device_get(run.init_params)
  v, d, eos = run.cfg.vocab_size, run.cfg.hidden_size, run.tok.eos_id
  head = np.zeros((d, v), np.float32)
  head[np.arange(v), eos] = 1.5  # Unscripted tokens lead to EOS.
  for a, b in SCRIPT.items():
    head[run.tok.encode(a)[0], run.tok.encode(b)[0]] = 2.5
  embed = np.zeros((v, d), np.float32)
  embed[np.arange(v), np.arange(v)] = 1.0
  return {**params, 'embed': jnp.asarray(embed), 'lm_head': jnp.asarray(head)}


@pytest.fixture(scope='module')
def setup(tmp_path_factory):
  from experiments import parallel_reasoning
  c = parallel_reasoning.get_config('runlocal')
  c.model.arch.update(hidden_size=64, intermediate_size=64)  # one-hot rig: d >= vocab
  c.verifier.name = 'exact'  # The parent's whole text is the answer: TEXT is right.
  c.eval.num_prompts = 6
  run = run_setup.build(c, tmp_path_factory.mktemp('threaded_eval'))
  # Prompts 0, 2, 4 expect the scripted text, 1, 3, 5 another one.
  run.eval_examples = [dataclasses.replace(ex, answer=TEXT if i % 2 == 0 else '<a>[1]+#')
                       for i, ex in enumerate(run.eval_examples)]
  run.eval_chunk = 4  # Two chunks, the second padded with 2 copies of its last prompt.
  yield run, rigged(run)
  run.close()


def test_loop_eval_equals_greedy_threads_and_the_verifier(setup):
  run, params = setup
  got = train.evaluate_policy(run, params, run.eval_rng)
  # The reference: one greedy fork/join episode per prompt, judged by the verifier itself.
  out = threads.sample_threads(run, params, run.eval_examples, jax.random.key(7),
                               temperature=0.0, group_size=1)
  assert out.final_texts == [TEXT] * 6 and out.spawned_E.all()
  tokens_N = np.asarray(out.rollout.loss_mask_NxL).sum(axis=1)
  path_E = fork_join.longest_path_E(tokens_N, out.parent_N)
  total_E = fork_join.total_tokens_E(tokens_N, out.parent_N)
  ok = [text_answer.verify_exact({'completion': t, 'answer': ex.answer}).reward
        for t, ex in zip(out.final_texts, run.eval_examples)]
  assert ok == [1.0, 0.0] * 3 and list(path_E) == [11] * 6 and list(total_E) == [14] * 6
  assert got['eval/pass@1'] == np.mean(ok) == 0.5
  assert got['eval/longest_path_mean'] == path_E.mean() == 11.0
  assert got['eval/total_tokens_mean'] == total_E.mean() == 14.0
  assert got['eval/spawned_frac'] == 1.0 and got['tokens/eval'] == 6 * 14
  assert got['eval/maj@1'] == 0.5


def test_pass_at_k_samples_k_episodes_per_prompt(setup):
  run, params = setup
  got = evaluate.evaluate(run, params, k=2, temperature=0.0, rng=run.eval_rng)
  assert got['pass@1'] == got['pass@2'] == got['mean@2'] == 0.5  # greedy: k equal episodes
  assert got['generated_tokens'] == 6 * 2 * 14 and got['longest_path_mean'] == 11.0


def test_diversity_schedules_are_refused_with_threads(setup):
  run, params = setup
  with pytest.raises(ValueError, match="eval.diversity='skeleton' samples single threads"):
    evaluate.sample_verdicts(run, params, k=2, temperature=1.0, rng=run.eval_rng,
                             diversity='skeleton')
  c = run.config.copy_and_resolve_references()
  c.eval.diversity = 'paraphrase'
  with pytest.raises(ValueError, match="eval.diversity='paraphrase' samples single threads"):
    config_lib.validate(c, num_devices=8)
