"""`python -m rlreason.verifiers score`: a JSONL file in, one scored line out per input line."""

import json
import os
import pathlib
import subprocess
import sys

import pytest

REPO = pathlib.Path(__file__).resolve().parents[1]


def cli(*args):
  return subprocess.run([sys.executable, '-m', 'rlreason.verifiers', *args], cwd=REPO,
                        capture_output=True, text=True, timeout=300)


def test_scores_a_file_and_reports_bad_lines(tmp_path):
  lines = [
      json.dumps({'completion': '#### 72', 'answer': '72', 'id': 'a'}).encode(),
      b'{"completion": "\\\\boxed{3}", "answer": "4"}',
      b'{not json',
      b'',
      b'{"completion": "\\\\boxed{1} \xff\xfe", "answer": "1"}',  # raw invalid UTF-8.
      b'["a list"]',
      json.dumps({'completion': '\\boxed{1} \udcff', 'answer': '1'}).encode(),  # escaped surrogate.
      json.dumps({'answer': '1'}).encode(),
      json.dumps({'completion': '\\boxed{9^{9^{9^9}}}', 'answer': '1'}).encode(),
  ]
  src, out = tmp_path / 'in.jsonl', tmp_path / 'out.jsonl'
  src.write_bytes(b'\n'.join(lines) + b'\n')
  result = cli('score', '--verifier', 'math', '--input', str(src), '--output', str(out),
               '--workers', '1', '--default-reward', '-1')
  assert result.returncode == 0, result.stderr
  for number in (3, 4, 5, 6):
    assert f'in.jsonl:{number}: bad line' in result.stderr
  assert 'scored 9 lines (4 bad)' in result.stderr
  rows = [json.loads(line) for line in out.read_text().splitlines()]
  assert [(r['status'], r['reward']) for r in rows] == [
      ('correct', 1.0), ('wrong', 0.0), ('invalid_input', -1.0), ('invalid_input', -1.0),
      ('invalid_input', -1.0), ('invalid_input', -1.0), ('parse_failure', -1.0),
      ('invalid_input', -1.0), ('parse_failure', -1.0)]
  assert rows[0]['id'] == 'a' and rows[0]['latency_s'] >= 0 and rows[0]['components'] == {}
  assert [r.get('line') for r in rows[2:6]] == [3, 4, 5, 6]
  assert rows[3]['error'] == 'blank line'


def test_unknown_verifier_lists_the_known_ones(tmp_path):
  result = cli('score', '--verifier', 'nope', '--input', str(tmp_path / 'x'), '--output',
               str(tmp_path / 'y'))
  assert result.returncode == 2
  assert "unknown verifier 'nope'" in result.stderr and 'countdown' in result.stderr


def strict_rows(path):
  """The output's rows, parsed as strict JSON (NaN or Infinity would raise)."""

  def reject(constant):
    raise ValueError(f'non-standard JSON constant {constant}')

  return [json.loads(line, parse_constant=reject) for line in path.read_text().splitlines()]


def test_every_line_gets_a_row_whatever_it_holds(tmp_path):
  deep = 100_000  # json.loads raises RecursionError (the old CLI lost every line, rc 1).
  nested = 600  # parses, but is too deep to pickle for the pool.
  lines = [
      json.dumps({'completion': '#### 1', 'answer': '1'}).encode(),
      b'{"completion": ' + b'[' * deep + b']' * deep + b'}',
      b'{"completion": "#### 2", "answer": "2", "x": ' + b'[' * nested + b']' * nested + b'}',
      json.dumps({'completion': '#### 3', 'answer': '3', 'cpu_s': 0}).encode(),
      json.dumps({'completion': '#### 4', 'answer': '4', 'cpu_s': -1.5}).encode(),
      json.dumps({'completion': '#### 5', 'answer': '5'}).encode(),
  ]
  src, out = tmp_path / 'in.jsonl', tmp_path / 'out.jsonl'
  src.write_bytes(b'\n'.join(lines) + b'\n')
  out.write_text('old output\n')
  result = cli('score', '--verifier', 'math', '--input', str(src), '--output', str(out),
               '--workers', '1', '--batch-size', '2')
  assert result.returncode == 0, result.stderr
  assert 'in.jsonl:2: bad line' in result.stderr and 'nested too deeply' in result.stderr
  rows = strict_rows(out)
  assert [r['status'] for r in rows] == ['correct', 'invalid_input', 'invalid_input',
                                         'invalid_input', 'invalid_input', 'correct']
  assert rows[1]['line'] == 2
  assert 'pickle' in rows[2]['detail']
  assert rows[3]['detail'].startswith('cpu_s:') and rows[4]['detail'].startswith('cpu_s:')
  assert sorted(p.name for p in tmp_path.iterdir()) == ['in.jsonl', 'out.jsonl']  # no temp left.


def test_non_finite_numbers_are_written_as_null(tmp_path):
  src, out = tmp_path / 'in.jsonl', tmp_path / 'out.jsonl'
  src.write_text('{"reward": NaN, "extra": {"a": Infinity, "b": [-Infinity, 1.5]}}\n'
                 '{"reward": 0.5}\n')
  result = cli('score', '--verifier', 'rlreason.verifiers.faults:echo', '--input', str(src),
               '--output', str(out), '--workers', '1')
  assert result.returncode == 0, result.stderr
  rows = strict_rows(out)
  assert [(r['status'], r['reward']) for r in rows] == [('correct', None), ('correct', 0.5)]
  assert rows[0]['extra'] == {'a': None, 'b': [None, 1.5]}


@pytest.mark.parametrize('link', ['same', 'symlink', 'hardlink', 'dotted'])
def test_output_that_is_the_input_is_refused(tmp_path, link):
  src = tmp_path / 'in.jsonl'
  content = json.dumps({'completion': '#### 1', 'answer': '1'}) + '\n'
  src.write_text(content)
  out = {'same': src, 'symlink': tmp_path / 'link.jsonl', 'hardlink': tmp_path / 'hard.jsonl',
         'dotted': tmp_path / '.' / 'in.jsonl'}[link]
  if link == 'symlink':
    out.symlink_to(src)
  elif link == 'hardlink':
    os.link(src, out)
  result = cli('score', '--verifier', 'math', '--input', str(src), '--output', str(out))
  assert result.returncode == 2
  assert 'is the input file' in result.stderr and 'Traceback' not in result.stderr
  assert src.read_text() == content


def test_missing_paths_are_a_one_line_error(tmp_path):
  src = tmp_path / 'in.jsonl'
  src.write_text(json.dumps({'completion': '#### 1', 'answer': '1'}) + '\n')
  for args, message in [((str(src), str(tmp_path / 'no' / 'out.jsonl')), 'does not exist'),
                        ((str(tmp_path / 'none.jsonl'), str(tmp_path / 'o.jsonl')), 'no such file'),
                        ((str(src), str(tmp_path)), 'is a directory')]:
    result = cli('score', '--verifier', 'math', '--input', args[0], '--output', args[1])
    assert result.returncode == 2, result.stderr
    assert message in result.stderr and len(result.stderr.strip().splitlines()) == 1, result.stderr
  assert sorted(p.name for p in tmp_path.iterdir()) == ['in.jsonl']
