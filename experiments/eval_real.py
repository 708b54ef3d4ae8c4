"""SmolLM2-135M-Instruct on real word problems: GSM8K's test half and SVAMP, math-verify reward.

  # the released model: a run of 0 RL steps writes its step-0 checkpoint (and greedy pass@1)
  python -m rlreason.main --config experiments/eval_real.py:gsm8k --workdir /tmp/base_gsm8k
  python -m rlreason.rl.evaluate --config experiments/eval_real.py:gsm8k \
      --workdir /tmp/base_gsm8k --k 8 --temperature 1.0
  # the demo's trained model (experiments/demo_real.py's workdir), same prompts
  python -m rlreason.rl.evaluate --config experiments/eval_real.py:gsm8k \
      --workdir workdir/demo_real_seed0 --k 8 --temperature 1.0 --output /tmp/trained.json
  # SVAMP: first write it as GSM8K-format JSONL (python -m experiments.eval_real --svamp OUT)
  python -m experiments.eval_real --svamp /tmp/svamp.jsonl
  python -m rlreason.main --config experiments/eval_real.py:svamp:/tmp/svamp.jsonl ...

Arguments: 'gsm8k' or 'svamp:<jsonl>', optionally ':<n>' for the first n problems (default
64: a CPU-sized subset; 659 is GSM8K's whole test half here). The prompt is the question and
'Reason step by step, then give the final answer after "####".' in the model's chat template
(experiments/demo_real.CHAT_PROMPT); 256 new tokens; the `math` verifier. `rl.steps=0`: the
config exists to evaluate, not to train (experiments/grpo_gsm8k.py trains on GSM8K).
"""

import json
import pathlib
import sys

from experiments import demo_real

_SHARED = pathlib.Path(__file__).resolve().parents[2] / 'shared' / 'data'
GSM8K_TEST = _SHARED / 'gsm8k' / 'test.first_half.jsonl'
SVAMP = _SHARED / 'svamp' / 'SVAMP.json'
INSTRUCTION = '\nReason step by step, then give the final answer after "####".'


def get_config(arg: str = 'gsm8k'):
  name, _, rest = arg.partition(':')
  path, n = (str(GSM8K_TEST), rest) if name == 'gsm8k' else rest.rpartition(':')[::2]
  if name == 'svamp' and not path:  # 'svamp:<jsonl>' without ':<n>'.
    path, n = rest, ''
  if name not in ('gsm8k', 'svamp') or not path:
    raise ValueError(f"eval_real: argument {arg!r}; expected 'gsm8k[:n]' or 'svamp:<jsonl>[:n]'.")
  c = demo_real.get_config('0')
  c.data.source, c.data.format = 'jsonl', 'gsm8k'
  c.data.path = c.data.eval_path = path
  c.data.prompt_template = demo_real.CHAT_PROMPT.replace('{prompt}', '{prompt}' + INSTRUCTION)
  c.data.prompt_buckets = (128, 192, 256, 384)
  c.rl.steps, c.rl.max_new_tokens = 0, 256
  c.verifier.name, c.verifier.workers = 'math', 1
  c.eval.num_prompts = int(n) if n else 64
  c.eval.every, c.checkpoint.every = 0, 0
  return c


def write_svamp(out) -> int:
  """SVAMP.json as GSM8K-format JSONL (question = body + question, answer '#### N')."""
  records = json.loads(SVAMP.read_text(encoding='utf-8'))
  with open(out, 'w', encoding='utf-8') as f:
    for r in records:
      answer = r['Answer']
      answer = int(answer) if float(answer).is_integer() else answer
      body = r['Body'].strip()
      body = body if body.endswith(('.', '?', '!')) else body + '.'  # Some bodies lack one.
      f.write(json.dumps({'question': f'{body} {r["Question"].strip()}',
                          'answer': f'#### {answer}'}) + '\n')
  return len(records)


if __name__ == '__main__':
  if len(sys.argv) != 3 or sys.argv[1] != '--svamp':
    raise SystemExit('usage: python -m experiments.eval_real --svamp OUT.jsonl')
  print(f'wrote {write_svamp(sys.argv[2])} SVAMP problems to {sys.argv[2]}')
