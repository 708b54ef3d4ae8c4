"""A user's own data file: the plain format, and errors that name the file, line and fields."""

import json

import pytest

from rlreason.tasks import data


def _write(path, records):
  path.write_text(''.join((r if isinstance(r, str) else json.dumps(r)) + '\n' for r in records))
  return path


def test_plain_format_reads_the_final_answer_as_is(tmp_path):
  path = _write(tmp_path / 'mine.jsonl', [{'question': 'What is 100 + 48?', 'answer': '148'},
                                          {'question': 'Two?', 'answer': 2, 'source': 'x'}])
  exs = data.load_jsonl(path, data.record_format('plain'))
  assert [(e.prompt, e.answer, e.solution, e.task) for e in exs] == [
      ('What is 100 + 48?', '148', None, 'plain'), ('Two?', '2', None, 'plain')]
  assert exs[1].meta == {'source': 'x'} and exs[0].id == 'plain/mine/0'


def test_unknown_format_lists_the_known_ones_with_their_fields():
  with pytest.raises(ValueError, match=r"data.format='txt'.*'plain' \(fields: question, answer\)"):
    data.record_format('txt')


def test_gsm8k_format_without_hashes_points_at_plain(tmp_path):
  path = _write(tmp_path / 'q.jsonl', [{'question': 'q', 'answer': '148'}])
  with pytest.raises(ValueError, match=r"q.jsonl:line 1: .*no \"####\".*data.format='plain'"):
    data.load_jsonl(path, data.GSM8K)


def test_missing_field_names_file_line_and_required_fields(tmp_path):
  path = _write(tmp_path / 'm.jsonl', [{'problem': 'p', 'answer': '1'}, '', {'problem': 'p'}])
  with pytest.raises(ValueError, match=r"m.jsonl:line 3: .*missing field\(s\) \['answer'\] of "
                     r"format 'math' \(needs \['problem', 'answer'\]\)"):
    data.load_jsonl(path, data.MATH)


def test_math_format_without_solution_id_or_level_loads():
  # MATH's solution, unique_id and level are optional (a bare KeyError before).
  ex = data.record_to_example({'problem': 'p', 'answer': '1'}, data.MATH, default_id='math/f/0')
  assert (ex.solution, ex.id, ex.difficulty) == (None, 'math/f/0', 0)


def test_empty_unreadable_and_malformed_files_are_named(tmp_path):
  empty = tmp_path / 'empty.jsonl'
  empty.write_text('\n\n')
  with pytest.raises(ValueError, match=r'data file .*empty.jsonl holds no examples'):
    data.load_jsonl(empty, data.PLAIN)
  with pytest.raises(ValueError, match=r'cannot read data file .*absent.jsonl'):
    data.load_jsonl(tmp_path / 'absent.jsonl', data.PLAIN)
  bad = tmp_path / 'bad.jsonl'
  bad.write_text('{"question": "q", "answer": "1"}\n{"question": \n')
  with pytest.raises(ValueError, match=r'bad.jsonl:2: not a JSON object'):
    data.load_jsonl(bad, data.PLAIN)
  with pytest.raises(ValueError, match=r'bad2.jsonl:line 1: .*must be a JSON object, got list'):
    data.load_jsonl(_write(tmp_path / 'bad2.jsonl', [[1, 2]]), data.PLAIN)
