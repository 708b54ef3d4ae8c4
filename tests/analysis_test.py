"""analysis/: the logit lens's last layer is the model's logits, patching everything from B
into A gives B, and the prompt/answer perplexity split on a hand case."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rlreason.analysis import logit_lens
from rlreason.analysis import patching
from rlreason.analysis import perplexity
from rlreason.model import transformer

CFG = transformer.ModelConfig(vocab_size=13, hidden_size=32, intermediate_size=48, num_layers=2,
                              num_heads=2, num_kv_heads=1, head_dim=16)


def _inputs():
  tokens_NxT = jax.random.randint(jax.random.key(3), (2, 7), 0, CFG.vocab_size)
  mask_NxT = jnp.array([[0, 0, 1, 1, 1, 1, 1], [1] * 7], bool)  # Row 0 left-padded.
  return tokens_NxT, mask_NxT


def _real(x_NxTxV, mask_NxT):
  """Real positions only: a left-padding query attends to no key, its output is arbitrary."""
  return np.asarray(x_NxTxV)[np.asarray(mask_NxT)]


def _params(seed):
  return transformer.init_params(CFG, jax.random.key(seed))


@pytest.mark.parametrize('jit', [True, False])
def test_last_layer_lens_is_the_model_logits(jit):
  tokens_NxT, mask_NxT = _inputs()
  params = _params(0)
  logits_NxTxV, _ = transformer.apply(params, tokens_NxT, cfg=CFG, mask_NxT=mask_NxT)
  fn = logit_lens.lens_logits if jit else logit_lens.lens_logits.__wrapped__
  lens_KxNxTxV = fn(params, tokens_NxT, cfg=CFG, mask_NxT=mask_NxT)
  assert lens_KxNxTxV.shape == (CFG.num_layers + 1, 2, 7, CFG.vocab_size)
  np.testing.assert_allclose(_real(lens_KxNxTxV[-1], mask_NxT), _real(logits_NxTxV, mask_NxT),
                             rtol=1e-5, atol=1e-5)
  # Earlier layers read something else (the blocks do change the stream).
  assert float(jnp.abs(lens_KxNxTxV[0] - logits_NxTxV).max()) > 1e-3
  logprobs_KxNxT = logit_lens.lens_logprobs(params, tokens_NxT, cfg=CFG, mask_NxT=mask_NxT)
  want_NxT = logit_lens.next_token_logprobs(logits_NxTxV, tokens_NxT)
  np.testing.assert_allclose(logprobs_KxNxT[-1], want_NxT, rtol=1e-5, atol=1e-5)


def test_next_token_logprobs_hand_case():
  # Uniform logits over V = 4 at every position: log(1/4) for every predicted token.
  logits = jnp.zeros((1, 3, 4))
  got = logit_lens.next_token_logprobs(logits, jnp.array([[1, 2, 3]]))
  np.testing.assert_allclose(got, [[0.0, np.log(0.25), np.log(0.25)]], rtol=1e-6)


def test_patching_all_positions_from_b_reproduces_b():
  tokens_NxT, mask_NxT = _inputs()
  a, b = _params(0), _params(1)
  everywhere_NxT = jnp.ones(tokens_NxT.shape, bool)
  logits_a, _ = transformer.apply(a, tokens_NxT, cfg=CFG, mask_NxT=mask_NxT)
  # Parameter patching: every component from B is B.
  hybrid = patching.patch_params(a, b, patching.components(CFG))
  logits_b, _ = transformer.apply(b, tokens_NxT, cfg=CFG, mask_NxT=mask_NxT)
  np.testing.assert_allclose(
      _real(transformer.apply(hybrid, tokens_NxT, cfg=CFG, mask_NxT=mask_NxT)[0], mask_NxT),
      _real(logits_b, mask_NxT), rtol=1e-6, atol=1e-6)
  # Activation patching of the final residual (before the norm) at every position: with B
  # sharing A's norm and head, A's readout of B's stream is B's logits.
  b_blocks = patching.patch_params(b, a, ('final_norm', 'lm_head'))
  want, _ = transformer.apply(b_blocks, tokens_NxT, cfg=CFG, mask_NxT=mask_NxT)
  got = patching.activation_patch(a, b_blocks, tokens_NxT, cfg=CFG, layer=CFG.num_layers,
                                   where_NxT=everywhere_NxT, mask_NxT=mask_NxT)
  np.testing.assert_allclose(_real(got, mask_NxT), _real(want, mask_NxT), rtol=1e-5, atol=1e-5)
  # Residual 0 (the embeddings) at every position, B = A but for its embeddings.
  b_embed = patching.patch_params(a, b, ('embed',))
  want, _ = transformer.apply(b_embed, tokens_NxT, cfg=CFG, mask_NxT=mask_NxT)
  got = patching.activation_patch(a, b_embed, tokens_NxT, cfg=CFG, layer=0,
                                  where_NxT=everywhere_NxT, mask_NxT=mask_NxT)
  np.testing.assert_allclose(_real(got, mask_NxT), _real(want, mask_NxT), rtol=1e-5, atol=1e-5)
  # Patching no position is A; patching the last position only leaves earlier positions A's
  # (causal: nothing before the patched position can see it).
  nowhere = patching.activation_patch(a, b, tokens_NxT, cfg=CFG, layer=1,
                                      where_NxT=~everywhere_NxT, mask_NxT=mask_NxT)
  np.testing.assert_allclose(_real(nowhere, mask_NxT), _real(logits_a, mask_NxT), rtol=1e-5,
                             atol=1e-5)
  last_NxT = jnp.zeros(tokens_NxT.shape, bool).at[:, -1].set(True)
  part = patching.activation_patch(a, b, tokens_NxT, cfg=CFG, layer=1, where_NxT=last_NxT,
                                   mask_NxT=mask_NxT)
  np.testing.assert_allclose(_real(part[:, :-1], mask_NxT[:, :-1]),
                             _real(logits_a[:, :-1], mask_NxT[:, :-1]), rtol=1e-5, atol=1e-5)
  assert float(jnp.abs(part[:, -1] - logits_a[:, -1]).max()) > 1e-4


def test_patch_params_names_a_missing_component():
  with pytest.raises(ValueError, match="'layers.9'"):
    patching.patch_params(_params(0), _params(1), ('layers.9',))


def test_answer_vs_prompt_perplexity_hand_case():
  # T = 5, L = 2 (columns 3, 4 are the answer). Row 0: left padding in column 0, so column 1
  # (no real predecessor) is not scored; prompt tokens scored: column 2 of row 0, columns 1, 2
  # of row 1; answer tokens: columns 3, 4 of both rows.
  logprobs_NxT = jnp.log(jnp.array([[1.0, 0.9, 0.5, 0.25, 0.5],
                                    [1.0, 0.5, 0.5, 0.5, 1.0]]))
  mask_NxT = jnp.array([[0, 1, 1, 1, 1], [1, 1, 1, 1, 1]], bool)
  got = perplexity.split_perplexity(logprobs_NxT, mask_NxT, completion_length=2)
  # prompt: exp(-(3 log 0.5) / 3) = 2; answer: exp(-(log .25 + log .5 + log .5 + 0) / 4)
  # = (0.25 * 0.5 * 0.5)^(-1/4) = 16^(1/4) = 2.
  np.testing.assert_allclose(got['prompt'], 2.0, rtol=1e-6)
  np.testing.assert_allclose(got['answer'], 2.0, rtol=1e-6)
  # Dropping the answer's last column from the mask leaves column 3 of both rows:
  # (0.25 * 0.5)^(-1/2) = sqrt(8).
  mask_NxT = mask_NxT.at[:, 4].set(False)
  got = perplexity.split_perplexity(logprobs_NxT, mask_NxT, completion_length=2)
  np.testing.assert_allclose(got['answer'], np.sqrt(8.0), rtol=1e-6)


def test_batch_metrics_matches_the_split_of_the_models_logprobs():
  tokens_NxT, mask_NxT = _inputs()
  params = _params(0)
  logits_NxTxV, _ = transformer.apply(params, tokens_NxT, cfg=CFG, mask_NxT=mask_NxT)
  want = perplexity.split_perplexity(logit_lens.next_token_logprobs(logits_NxTxV, tokens_NxT),
                                     mask_NxT, completion_length=3)
  got = perplexity.batch_metrics(params, tokens_NxT, mask_NxT, completion_length=3, cfg=CFG)
  np.testing.assert_allclose(got['perplexity/answer'], want['answer'], rtol=1e-5)
  np.testing.assert_allclose(got['perplexity/prompt'], want['prompt'], rtol=1e-5)
  # A random model over 13 tokens is near-uniform: perplexity near 13.
  assert 10 < float(got['perplexity/answer']) < 16


def test_path_patching_by_hand():
  tokens_NxT, mask_NxT = _inputs()
  a = _params(0)
  b = patching.patch_params(a, _params(1), ('embed',))  # A's blocks, B's embeddings.
  everywhere_NxT = jnp.ones(tokens_NxT.shape, bool)
  logits_a, _ = transformer.apply(a, tokens_NxT, cfg=CFG, mask_NxT=mask_NxT)
  none = patching.path_patch(a, b, tokens_NxT, cfg=CFG, receivers=(), where_NxT=everywhere_NxT,
                             mask_NxT=mask_NxT)
  np.testing.assert_allclose(_real(none, mask_NxT), _real(logits_a, mask_NxT), rtol=1e-5,
                             atol=1e-5)
  # Every sublayer reads B's inputs and (same weights) writes B's outputs into A's stream, which
  # starts from A's embeddings: final = resid_B - embed_B + embed_A, read out by A.
  every = tuple(f'layers.{i}.{s}' for i in range(CFG.num_layers) for s in ('attn', 'mlp'))
  got = patching.path_patch(a, b, tokens_NxT, cfg=CFG, receivers=every,
                            where_NxT=everywhere_NxT, mask_NxT=mask_NxT)
  resid_b = logit_lens.residual_stream(b, tokens_NxT, cfg=CFG, mask_NxT=mask_NxT)
  resid_a = logit_lens.residual_stream(a, tokens_NxT, cfg=CFG, mask_NxT=mask_NxT)
  want = logit_lens.readout(a, resid_b[-1] - resid_b[0] + resid_a[0], cfg=CFG)
  np.testing.assert_allclose(_real(got, mask_NxT), _real(want, mask_NxT), rtol=1e-4, atol=1e-4)
  # A receiver the model does not have is named in the error.
  with pytest.raises(ValueError, match='layers.7.mlp'):
    patching.path_patch(a, b, tokens_NxT, cfg=CFG, receivers=('layers.7.mlp',),
                        where_NxT=everywhere_NxT)
