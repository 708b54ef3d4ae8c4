"""Fork/join rollouts (rollout/fork_join.py) and the parallel_sums task.

The end-to-end cases use a rigged one-layer model: embeddings one-hot and an output matrix that
puts a large logit on a scripted next token (a bigram chain that spawns two workers), on top of
the random attention and MLP, so tokens follow the script while log-probs depend on the whole
context.
"""

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rlreason.model import tokenizer
from rlreason.model import transformer
from rlreason.rl import update
from rlreason.rollout import fork_join
from rlreason.rollout import sampler
from rlreason.tasks import parallel_sums
from rlreason.verifiers import synthetic_tasks

TOK = tokenizer.from_characters(parallel_sums.CHARS)
FMT = fork_join.SpawnFormat.from_tokenizer(TOK, **parallel_sums.THREAD_MARKERS)
CFG = transformer.ModelConfig(vocab_size=TOK.vocab_size, hidden_size=64, intermediate_size=64,
                              num_layers=1, num_heads=2, num_kv_heads=1, head_dim=16)
EOS = 1
# The script: '=' -> '<a,b>' spawns workers a and b; a worker after ':' writes '12' and EOS;
# after the join block's ']' the parent writes '+#' and EOS.
SCRIPT = {'=': '<', '<': 'a', 'a': ',', ',': 'b', 'b': '>', ':': '1', '1': '2', ']': '+',
          '+': '#'}
KW = dict(fmt=FMT, cfg=CFG, group_size=2, max_workers=3, parent_tokens=8, worker_tokens=4,
          final_tokens=4, prompt_buckets=(16,), eos=(EOS,), max_chunks=1)


def rigged_params():
  params = transformer.init_params(CFG, jax.random.key(0))
  v = CFG.vocab_size
  head = np.zeros((CFG.hidden_size, v), np.float32)
  for x in range(v):  # Unscripted tokens lead to EOS.
    head[x, EOS] = 1.5
  for a, b in SCRIPT.items():
    head[TOK.encode(a)[0], TOK.encode(b)[0]] = 2.5
  embed = np.zeros((v, CFG.hidden_size), np.float32)
  embed[np.arange(v), np.arange(v)] = 1.0
  return {**params, 'embed': jnp.asarray(embed), 'lm_head': jnp.asarray(head)}


PROMPTS = [TOK.encode('a:12 b:34='), TOK.encode('a:5 b:6=')]


def test_parse_spawn_and_join_block():
  ids = lambda s: TOK.encode(s)
  assert fork_join.parse_spawn(ids('x<a,bc>'), FMT) == [ids('a'), ids('bc')]
  assert fork_join.parse_spawn(ids('<a,,b>'), FMT) == [ids('a'), ids('b')]  # empty dropped
  assert fork_join.parse_spawn(ids('<a,b'), FMT) is None  # no end marker
  assert fork_join.parse_spawn(ids('a,b>'), FMT) is None  # no spawn marker
  assert fork_join.join_block([ids('12'), ids('3')], FMT) == ids('[12,3]')
  assert fork_join.join_width(3, 4) == 2 + 12 + 2


def test_longest_path_and_total_tokens_hand_built():
  # Episode 0: parent row 0 (5 tokens) with workers 1 (3) and 2 (7): path 5 + 7 = 12, total 15.
  # Episode 1: parent row 3 (9 tokens) alone: path 9, total 9.
  tokens_N = np.array([5, 3, 7, 9])
  parent_N = np.array([-1, 0, 0, -1])
  np.testing.assert_array_equal(fork_join.longest_path_E(tokens_N, parent_N), [12, 9])
  np.testing.assert_array_equal(fork_join.total_tokens_E(tokens_N, parent_N), [15, 9])
  with pytest.raises(ValueError, match='depth'):
    fork_join.longest_path_E(tokens_N, np.array([-1, 0, 1, -1]))


def test_markers_must_be_single_tokens():
  with pytest.raises(ValueError, match='spawn'):
    fork_join.SpawnFormat.from_tokenizer(TOK, **{**parallel_sums.THREAD_MARKERS,
                                                 'spawn': '<spawn>'})


def test_task_solutions_verify_and_threads_match_the_sequential_solution():
  ex = parallel_sums.generate(0, 3, difficulty=4, groups=3)
  spawn, workers, ending = parallel_sums.threaded_solution(ex)
  assert spawn == '<a,b,c>' and [h for h, _ in workers] == ['a', 'b', 'c']
  assert ex.solution == ' '.join(f'{h}:{w}' for h, w in workers) + ' ' + ending
  digits = ex.meta['groups']
  assert ex.answer == str(sum(map(sum, digits)) % 10)
  for text in (ex.solution, parallel_sums.threaded_text(ex)):
    assert synthetic_tasks.verify_arithmetic({'completion': text, 'answer': ex.answer}).reward \
        == 1.0
  assert set(ex.prompt + ex.solution + parallel_sums.threaded_text(ex)) <= set(
      parallel_sums.CHARS)
  # The SFT teacher: each thread kind as one row, the parent's join block and a worker's
  # context out of the loss.
  rows = [parallel_sums.threaded_teacher(ex, np.random.default_rng(i)) for i in range(40)]
  assert [['<a,b,c>', True], ['[' + ','.join(w for _, w in workers) + ']', False],
          [ending, True]] in rows
  for h, w in workers:
    assert [['<a,b,c>' + h + ':', False], [w, True]] in rows


@pytest.fixture(scope='module')
def threaded():
  params = rigged_params()
  rng = jax.random.key(3)
  out = fork_join.sample_threads(params, PROMPTS, rng=rng,
                                 decode=lambda ids: TOK.decode(ids, skip_special_tokens=True),
                                 **KW)
  return params, rng, out


def test_rows_threads_and_loss_masks(threaded):
  _, _, out = threaded
  per = 1 + KW['max_workers']
  assert out.rollout.tokens_NxL.shape[0] == len(PROMPTS) * KW['group_size'] * per
  assert out.rollout.group_size == KW['group_size'] * per
  assert out.spawned_E.all() and out.final_texts[0] == '<a,b>[12,12]+#'
  np.testing.assert_array_equal(out.thread_N[:per], [0, 1, 2, 3])
  np.testing.assert_array_equal(out.parent_N[:2 * per], [-1, 0, 0, 0, -1, 4, 4, 4])
  np.testing.assert_array_equal(out.threads_E, [3, 3, 3, 3])  # the parent and 2 workers
  tokens, loss, mask, prefix = (np.asarray(x) for x in (
      out.rollout.tokens_NxL, out.rollout.loss_mask_NxL, out.rollout.mask_NxL,
      out.rollout.prefix_mask_NxL))
  text = lambda r, m: TOK.decode(tokens[r][m[r]].tolist())
  # Parent: spawn block and ending trained, join block context; worker: own tokens only.
  assert text(0, mask) == '<a,b>[12,12]+#' + '<eos>' and text(0, loss) == '<a,b>+#<eos>'
  assert text(1, mask) == '<a,b>a:12<eos>' and text(1, prefix) == '<a,b>a:'
  assert text(1, loss) == '12<eos>' and text(2, loss) == '12<eos>'
  assert not mask[3].any()  # the third slot was not spawned
  # No token counted twice: 5 + 3 parent tokens, 3 per worker, and nothing else.
  assert loss[:per].sum() == 8 + 3 + 3
  assert not (loss & prefix).any() and not (loss & ~mask).any()
  m = out.metrics()
  assert m['threads/total_tokens_mean'] == 14 and m['threads/longest_path_mean'] == 8 + 3
  assert m['threads/per_episode_mean'] == 3 and m['threads/spawned_frac'] == 1


def test_workers_equal_independent_rows(threaded):
  """Worker k of parent r equals row r*K + k of a plain call whose prompts are the parents'
  contexts plus `h_k :` (the same row keys), token for token and log-prob for log-prob."""
  params, rng, out = threaded
  k, per = KW['max_workers'], 1 + KW['max_workers']
  tokens, loss, prefix = (np.asarray(x) for x in (out.rollout.tokens_NxL,
                                                   out.rollout.loss_mask_NxL,
                                                   out.rollout.prefix_mask_NxL))
  n = len(PROMPTS) * KW['group_size']
  contexts = []
  for r in range(n):
    parent = tokens[r * per][loss[r * per]].tolist()[:5]  # its spawn block
    for j in range(k):
      head = [TOK.encode('ab'[j])[0]] if j < 2 else [FMT.sep]
      contexts.append(list(PROMPTS[r // KW['group_size']]) + parent + head + [FMT.worker_open])
  ref = sampler.generate(params, sampler.prepare_prompts(contexts, buckets=(32,)), cfg=CFG,
                         group_size=1, max_new_tokens=KW['worker_tokens'],
                         rng=jax.random.split(rng, 3)[1], stop_tokens=(EOS,), row_rng=True,
                         max_chunks=1)
  for r in range(n):
    for j in range(2):
      row, m = r * per + 1 + j, r * k + j
      got = tokens[row][loss[row]]
      want = np.asarray(ref.tokens_NxL[m])[np.asarray(ref.mask_NxL[m])]
      np.testing.assert_array_equal(got, want)
      np.testing.assert_allclose(np.asarray(out.rollout.logprobs_NxL[row])[loss[row]],
                                 np.asarray(ref.logprobs_NxL[m])[np.asarray(ref.mask_NxL[m])],
                                 atol=1e-5)
      assert prefix[row].sum() == 5 + 2


def test_join_equals_prefilling_the_concatenated_text(threaded):
  """The parent's phase-3 tokens equal a plain call on prompt + spawn block + join block, and
  every trained token's recorded log-prob equals the learner's teacher-forced one on the row."""
  params, rng, out = threaded
  per, n = 1 + KW['max_workers'], len(PROMPTS) * KW['group_size']
  tokens, loss, mask = (np.asarray(x) for x in (out.rollout.tokens_NxL,
                                                 out.rollout.loss_mask_NxL,
                                                 out.rollout.mask_NxL))
  contexts = [list(PROMPTS[r // KW['group_size']]) + tokens[r * per][mask[r * per]].tolist()[:12]
              for r in range(n)]  # spawn block (5) + join block (7)
  ref = sampler.generate(params, sampler.prepare_prompts(contexts, buckets=(16 + 8 + 16,)),
                         cfg=CFG, group_size=1, max_new_tokens=KW['final_tokens'],
                         rng=jax.random.split(rng, 3)[2], stop_tokens=(EOS,), row_rng=True,
                         max_chunks=1)
  for r in range(n):
    ref_toks = np.asarray(ref.tokens_NxL[r])[np.asarray(ref.mask_NxL[r])]
    np.testing.assert_array_equal(tokens[r * per][12:12 + len(ref_toks)], ref_toks)
  seq_NxT, seq_mask_NxT = sampler.sequences(out.rollout)
  width = out.rollout.tokens_NxL.shape[1]
  stats = update.logprobs_step(params, seq_NxT, seq_mask_NxT, cfg=CFG, completion_len=width)
  np.testing.assert_allclose(np.where(loss, np.asarray(stats.logprobs_NxT), 0.0),
                             np.asarray(out.rollout.logprobs_NxL), atol=1e-5)


def test_no_recompiles_across_batches(monkeypatch):
  """Three phases compile once each; another batch (other prompts, key) compiles nothing."""
  monkeypatch.setattr(sampler, '_generate', chex.assert_max_traces(sampler._generate, n=3))
  sampler._generate_fn.cache_clear()
  params = rigged_params()
  fork_join.sample_threads(params, PROMPTS, rng=jax.random.key(0), **KW)
  fork_join.sample_threads(params, [TOK.encode('a:9='), TOK.encode('a:1 b:2 c:3=')],
                           rng=jax.random.key(1), **KW)
  sampler._generate_fn.cache_clear()


def test_parent_context_is_prefilled_once(monkeypatch):
  """Counted at trace time, every forward over more than one token: the prompts (B x P), the
  workers' headers (N K (max_header_tokens + 1)) and the join blocks (N join_width), nothing
  else. Prefilling each parent's context again for the workers and for the join cost
  N (P + parent_tokens) twice more: 348 positions here against 156."""
  seen, apply = [], transformer.apply

  def counting(params, tokens_NxT, **kw):
    if tokens_NxT.shape[1] > 1:
      seen.append(tokens_NxT.shape[0] * tokens_NxT.shape[1])
    return apply(params, tokens_NxT, **kw)

  monkeypatch.setattr(transformer, 'apply', counting)
  sampler._generate_fn.cache_clear()
  out = fork_join.sample_threads(rigged_params(), PROMPTS, rng=jax.random.key(3), **KW)
  sampler._generate_fn.cache_clear()
  assert out.spawned_E.all()
  b, n, k, p = len(PROMPTS), len(PROMPTS) * KW['group_size'], KW['max_workers'], 16
  join = fork_join.join_width(k, KW['worker_tokens'])
  assert seen == [b * p, n * k * (FMT.max_header_tokens + 1), n * join] == [32, 60, 64]
  before = b * p + n * (p + KW['parent_tokens']) * 2 + n * k * 5 + n * join
  assert (sum(seen), before) == (156, 348)


def test_memory_estimate_covers_worker_slots():
  kw = dict(batch=2, group_size=2, prompt_len=16, parent_tokens=8, worker_tokens=4,
            final_tokens=4, max_header_tokens=4)
  one, four = (fork_join.memory_estimate(CFG, max_workers=k, **kw) for k in (1, 4))
  assert four['phase_workers'] > one['phase_workers'] and four['rows'] > one['rows']
  assert four['total'] == max(four['phase_parent'], four['phase_workers'],
                              four['phase_join']) + four['rows']


def test_trainer_gives_each_episode_one_advantage_over_its_threads(threaded):
  """rl_batch.advantages_for with the loop's group estimator: an episode's advantage on every
  trained token of its parent and workers, nothing elsewhere; the loss sees each sampled token
  once (the loss mask's count is the episodes' total tokens)."""
  import types
  import ml_collections
  from rlreason.objectives import advantages
  from rlreason.rl import rl_batch
  _, _, out = threaded
  g, per = KW['group_size'], 1 + KW['max_workers']
  run = types.SimpleNamespace(config=ml_collections.ConfigDict(dict(
      objective=dict(advantage='grpo', advantage_kwargs={}, transforms=()),
      rl=dict(group_size=g))))
  rewards_BxG = np.array([[1.0, 0.0], [0.0, 0.0]], np.float32)
  scores = rl_batch.Scores(rewards_BxG=rewards_BxG, verifier_BxG=rewards_BxG,
                           modes_BxG=np.full((2, 2), -1), metrics={})
  loss = out.rollout.loss_mask_NxL
  batch = types.SimpleNamespace(loss_mask_NxL=loss)
  adv_NxL, _ = rl_batch.advantages_for(run, scores, None, batch, progress=0.0)
  want_E = np.asarray(advantages.grpo(jnp.asarray(rewards_BxG))).reshape(-1)
  assert want_E[0] > 0 > want_E[1]
  want_NxL = np.where(np.asarray(loss), np.repeat(want_E, per)[:, None], 0.0)
  np.testing.assert_allclose(np.asarray(adv_NxL), want_NxL, rtol=1e-6)
  tokens_N = np.asarray(loss).sum(axis=1)
  assert tokens_N.sum() == fork_join.total_tokens_E(tokens_N, out.parent_N).sum() == 4 * 14


def test_config_checks_name_the_threads_fields():
  from rlreason import config as config_lib
  from experiments import parallel_reasoning
  c = parallel_reasoning.get_config('runlocal')
  config_lib.validate(c, num_devices=8)
  c.objective.advantage = 'otb'
  c.threads.worker_tokens = 0
  c.threads.markers = {'spawnn': '<'}
  with pytest.raises(ValueError) as e:
    config_lib.validate(c, num_devices=8)
  for text in ('threads.worker_tokens=0', "unknown key(s) ['spawnn']", "'otb' is token-level"):
    assert text in str(e.value)
