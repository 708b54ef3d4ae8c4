"""The README's own job, run exactly as written: your model, your data, your reward.

The commands and the reward are read from README.md's "Your model, your data, your reward"
section; only the paths are swapped for files this test builds (a random 1-layer Qwen2
checkpoint saved by transformers with the real Qwen tokenizer, a three-line JSONL, the
README's reward file) and size overrides are appended, so the test fails if the README's
commands stop working or change without this test.
"""

import pathlib
import re
import shlex
import shutil
import subprocess
import sys

import pytest

from conftest import SHARED_DATA

ROOT = pathlib.Path(__file__).resolve().parents[1]
SECTION = '## Your model, your data, your reward'
# The README's placeholders and what this test puts in their place.
PLACEHOLDERS = ('/ckpt/Qwen2.5-0.5B-Instruct', 'mine.jsonl', 'myreward.py', 'runs/mine')
TINY = ['--config.rl.steps=1', '--config.rl.prompts_per_step=4', '--config.rl.group_size=2',
        '--config.rl.max_new_tokens=4', '--config.rl.micro_batches=1',
        '--config.data.prompt_buckets=(96,)', '--config.model.remat=none',
        '--config.eval.num_prompts=4', '--config.eval.every=1', '--config.verifier.workers=1']


def readme_blocks():
  text = (ROOT / 'README.md').read_text()
  section = text[text.index(SECTION):]
  section = section[:section.index('\n## ', len(SECTION))]
  blocks = re.findall(r'```(\w*)\n(.*?)```', section, re.DOTALL)
  commands = [' '.join(line.rstrip(' \\') for line in body.strip().splitlines())
              for lang, body in blocks if not lang]
  reward = [body for lang, body in blocks if lang == 'python']
  return commands, reward[0]


def tiny_checkpoint(path):
  transformers = pytest.importorskip('transformers')
  torch = pytest.importorskip('torch')
  torch.manual_seed(0)
  config = transformers.Qwen2Config(
      vocab_size=151936, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
      num_attention_heads=2, num_key_value_heads=1, tie_word_embeddings=True,
      max_position_embeddings=512)
  transformers.Qwen2ForCausalLM(config).save_pretrained(path, safe_serialization=True)
  for name in ('vocab.json', 'merges.txt', 'tokenizer_config.json'):
    shutil.copy(SHARED_DATA / 'qwen_tokenizer' / name, path / name)


def test_the_readme_job_trains_and_evaluates(tmp_path):
  commands, reward = readme_blocks()
  train_command, evaluate_command = commands[0], commands[1]
  assert train_command.startswith('python -m rlreason.main')
  assert evaluate_command.split('#')[0].strip().startswith('python -m rlreason.rl.evaluate')
  tiny_checkpoint(tmp_path / 'ckpt')
  (tmp_path / 'mine.jsonl').write_text(''.join(
      f'{{"question": "What is {a} + {b}?", "answer": "{a + b}"}}\n'
      for a, b in [(3, 4), (10, 5), (7, 7), (2, 9), (6, 1), (8, 8), (4, 4), (9, 3), (5, 5),
                   (1, 2), (12, 4), (3, 3), (6, 6), (2, 2), (7, 1), (9, 9)]))
  (tmp_path / 'myreward.py').write_text(reward)
  paths = (tmp_path / 'ckpt', tmp_path / 'mine.jsonl', tmp_path / 'myreward.py',
           tmp_path / 'runs' / 'mine')

  def run(command):
    for placeholder, path in zip(PLACEHOLDERS, paths):
      command = command.replace(placeholder, str(path))
    argv = shlex.split(command.split('#')[0])
    assert argv[:2] == ['python', '-m']
    return subprocess.run([sys.executable, *argv[1:]], cwd=ROOT, capture_output=True,
                          text=True, timeout=600)

  first = run(train_command + ' ' + ' '.join(TINY))
  assert first.returncode == 0, first.stderr[-3000:]
  assert 'step 1/1' in first.stdout, first.stdout
  assert (paths[3] / 'config.json').is_file()
  evaluated = run(evaluate_command)
  assert evaluated.returncode == 0, evaluated.stderr[-3000:]
  assert re.search(r'step=1 .*pass@1=', evaluated.stdout), evaluated.stdout
