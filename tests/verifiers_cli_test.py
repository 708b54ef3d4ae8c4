"""`python -m rlreason.verifiers score`: a JSONL file in, one scored line out per input line."""

import json
import pathlib
import subprocess
import sys

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
  for number in (3, 5, 6):
    assert f'in.jsonl:{number}: bad line' in result.stderr
  assert 'scored 8 lines (3 bad)' in result.stderr
  rows = [json.loads(line) for line in out.read_text().splitlines()]
  assert [(r['status'], r['reward']) for r in rows] == [
      ('correct', 1.0), ('wrong', 0.0), ('invalid_input', -1.0), ('invalid_input', -1.0),
      ('invalid_input', -1.0), ('parse_failure', -1.0), ('invalid_input', -1.0),
      ('parse_failure', -1.0)]
  assert rows[0]['id'] == 'a' and rows[0]['latency_s'] >= 0 and rows[0]['components'] == {}
  assert [r.get('line') for r in rows[2:5]] == [3, 5, 6]


def test_unknown_verifier_lists_the_known_ones(tmp_path):
  result = cli('score', '--verifier', 'nope', '--input', str(tmp_path / 'x'), '--output',
               str(tmp_path / 'y'))
  assert result.returncode == 2
  assert "unknown verifier 'nope'" in result.stderr and 'countdown' in result.stderr
