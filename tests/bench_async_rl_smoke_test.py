"""experiments/bench/async_rl.py --smoke --inline runs both arms end to end and prints its
table, the CPU-time speedup and the final line (numbers only: the smoke's timing means nothing).

In this process (--inline: rlreason.main.run per arm, the async arm rl.async_mode='inline',
the process sampler's schedule without the process; async_rl_test.py covers the sampler
process), 2 RL steps of the runlocal model: the earlier version ran both arms as
subprocesses, 64 s on CI.
"""

import json
import re

from experiments.bench import async_rl


def test_smoke_prints_the_table_and_speedup(tmp_path, capsys):
  async_rl.main(['--smoke', '--inline', '--steps', '2', '--workdir', str(tmp_path)])
  lines = capsys.readouterr().out.strip().splitlines()
  for arm in ('sync', 'async (staleness 1)'):
    row = [line for line in lines if line.startswith(arm + ' ')]
    assert len(row) == 1, lines
    steps, per_s, _, _, _, cpu = row[0][len(arm):].split()[:6]
    assert int(steps) == 2 and float(per_s) > 0 and float(cpu) > 0, row
  assert re.fullmatch(r'cpu_speedup=\d+\.\d{3}', lines[-2]), lines[-2]
  assert re.fullmatch(r'async_speedup=\d+\.\d{3}', lines[-1]), lines[-1]
  # The async arm started from the sync arm's warm start and trained one step behind from
  # step 2 on (step 1 samples with the warm start, as the sync loop).
  rows = [json.loads(line) for line in (tmp_path / 'async' / 'metrics.jsonl').open()]
  assert [r['offpolicy/staleness/1'] > 0 for r in rows if r['step'] > 0] == [False, True]
  # Restored from the copied step-0 checkpoint: no SFT of its own (SFT rows have steps <= 0).
  assert [r['step'] for r in rows] == [1, 2]
  sync_rows = [json.loads(line) for line in (tmp_path / 'sync' / 'metrics.jsonl').open()]
  assert any(r['step'] <= 0 for r in sync_rows)
