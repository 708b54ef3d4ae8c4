"""Offline scoring: python -m rlreason.verifiers score --verifier NAME --input in.jsonl --output out.jsonl

Each input line is a JSON object with the verifier's fields (completion, answer, ...).
Each output line is that object plus reward, components, status, detail and latency_s, in
input order. A line that is not UTF-8 or not a JSON object is reported on stderr with its
number and written as {"line": n, "error": ..., "status": "invalid_input", ...}; the run
always completes. Blank lines are skipped. A status summary goes to stderr at the end.
Exit code 0, or 2 for bad arguments (such as an unknown verifier name).
"""

import argparse
import collections
import json
import sys

from rlreason.verifiers import pool as pool_lib
from rlreason.verifiers import registry
from rlreason.verifiers import verdict as V


def _parse(raw: bytes) -> dict:
  obj = json.loads(raw.decode('utf-8'))
  if not isinstance(obj, dict):
    raise ValueError(f'expected a JSON object, got {type(obj).__name__}')
  return obj


def score(args: argparse.Namespace) -> int:
  counts = collections.Counter()
  bad = 0
  with open(args.input, 'rb') as fin, open(args.output, 'w', encoding='utf-8') as fout, \
       pool_lib.VerifierPool(num_workers=args.workers, item_timeout_s=args.item_timeout_s,
                             default_reward=args.default_reward) as pool:

    def flush(lines):
      items = [obj for _, obj, _ in lines if obj is not None]
      verdicts = iter(pool.score(items, verifier=args.verifier, deadline_s=args.deadline_s))
      for number, obj, error in lines:
        if obj is None:
          out = {'line': number, 'error': error, 'reward': args.default_reward,
                 'components': {}, 'status': V.INVALID_INPUT, 'detail': error, 'latency_s': 0.0}
        else:
          v = next(verdicts)
          out = {**obj, 'reward': v.reward, 'components': dict(v.components),
                 'status': v.status, 'detail': v.detail, 'latency_s': round(v.latency_s, 6)}
        counts[out['status']] += 1
        fout.write(json.dumps(out) + '\n')

    lines = []
    for number, raw in enumerate(fin, start=1):
      if not raw.strip():
        continue
      try:
        lines.append((number, _parse(raw), None))
      except (UnicodeDecodeError, ValueError) as e:
        print(f'{args.input}:{number}: bad line, scored as a failure: {e}', file=sys.stderr)
        lines.append((number, None, str(e)[:200]))
        bad += 1
      if len(lines) >= args.batch_size:
        flush(lines)
        lines = []
    flush(lines)
  summary = ', '.join(f'{k}={n}' for k, n in sorted(counts.items()))
  print(f'scored {sum(counts.values())} lines ({bad} bad): {summary}', file=sys.stderr)
  return 0


def main(argv=None) -> int:
  parser = argparse.ArgumentParser(prog='python -m rlreason.verifiers')
  commands = parser.add_subparsers(dest='command', required=True)
  p = commands.add_parser('score', help='score a JSONL file with one verifier')
  p.add_argument('--verifier', required=True, help=f'one of {", ".join(sorted(registry.VERIFIERS))}')
  p.add_argument('--input', required=True)
  p.add_argument('--output', required=True)
  p.add_argument('--workers', type=int, default=2)
  p.add_argument('--batch-size', type=int, default=256)
  p.add_argument('--deadline-s', type=float, default=300.0, help='per batch')
  p.add_argument('--item-timeout-s', type=float, default=10.0)
  p.add_argument('--default-reward', type=float, default=0.0)
  args = parser.parse_args(argv)
  try:
    registry.check_name(args.verifier)
  except ValueError as e:
    parser.error(str(e))
  return score(args)


if __name__ == '__main__':
  sys.exit(main())
