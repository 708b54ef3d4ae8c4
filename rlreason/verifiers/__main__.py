"""Offline scoring: python -m rlreason.verifiers score --verifier NAME --input in.jsonl --output out.jsonl

Each input line is a JSON object with the verifier's fields (completion, answer, ...).
Each output line is that object plus reward, components, status, detail and latency_s, in
input order: output line n is input line n's. A line that is blank, not UTF-8, not a JSON
object or nested too deeply to parse is reported on stderr with its number and written as
{"line": n, "error": ..., "status": "invalid_input", ...}; one that fails later, on its way
through the pool or back out, gets its failure verdict. The run always completes. A status
summary goes to stderr at the end.

The output is strict JSON: non-finite floats (NaN, Infinity, which Python's json reads and
would write back) become null, wherever they are (reward, components, passed-through
fields). It is written to a temporary file beside the output and renamed over it at the
end, so an interrupted run leaves the old output (or none), never half of one; an output
that is the input (also through a link) is refused.
Exit code 0, or 2 for bad arguments (an unknown verifier, the output being the input, a
missing input file or output directory).
"""

import argparse
import collections
import json
import math
import os
import sys
import tempfile
from typing import Any

from rlreason.verifiers import pool as pool_lib
from rlreason.verifiers import registry
from rlreason.verifiers import sandbox
from rlreason.verifiers import verdict as V

_PROG = 'python -m rlreason.verifiers'


class _UsageError(Exception):
  """A problem with the arguments or paths: one line on stderr, exit code 2."""


def _parse(raw: bytes) -> dict:
  if not raw.strip():
    raise ValueError('blank line')
  try:
    obj = json.loads(raw.decode('utf-8'))
  except RecursionError:
    raise ValueError('nested too deeply to parse') from None
  if not isinstance(obj, dict):
    raise ValueError(f'expected a JSON object, got {type(obj).__name__}')
  return obj


def _finite(value: Any) -> Any:
  """`value` with every non-finite float replaced by None (strict JSON has no NaN)."""
  if isinstance(value, float):
    return value if math.isfinite(value) else None
  if isinstance(value, dict):
    return {k: _finite(v) for k, v in value.items()}
  if isinstance(value, list):
    return [_finite(v) for v in value]
  return value


def _error_row(number: int, error: str, status: str, reward: float) -> dict:
  return {'line': number, 'error': error, 'reward': reward, 'components': {}, 'status': status,
          'detail': error, 'latency_s': 0.0}


def _encode(row: dict, number: int, reward: float) -> tuple[str, str]:
  """One output line and its status; a row that cannot be written becomes an error row."""
  try:
    try:
      return json.dumps(row, allow_nan=False), row['status']
    except ValueError:  # a NaN or an infinity somewhere.
      return json.dumps(_finite(row), allow_nan=False), row['status']
  except (RecursionError, ValueError, TypeError) as e:
    error = f'output not writable as JSON: {type(e).__name__}: {e}'[:200]
    row = _error_row(number, error, V.INVALID_INPUT, reward)
    return json.dumps(row, allow_nan=False), V.INVALID_INPUT


def _paths(args: argparse.Namespace) -> str:
  """Checks the input and output paths; returns the file to write (links resolved)."""
  if not os.path.isfile(args.input):
    raise _UsageError(f'--input {args.input}: no such file')
  target = os.path.realpath(args.output)
  if os.path.isdir(target):
    raise _UsageError(f'--output {args.output} is a directory')
  if not os.path.isdir(os.path.dirname(target)):
    raise _UsageError(f'--output {args.output}: directory {os.path.dirname(target)} does not exist')
  if target == os.path.realpath(args.input) or (
      os.path.exists(target) and os.path.samefile(target, args.input)):
    raise _UsageError(f'--output {args.output} is the input file; write somewhere else')
  return target


def score(args: argparse.Namespace) -> int:
  target = _paths(args)
  try:
    tmp = tempfile.NamedTemporaryFile(  # pylint: disable=consider-using-with
        'w', encoding='utf-8', dir=os.path.dirname(target),
        prefix=f'.{os.path.basename(target)}.', suffix='.tmp', delete=False)
  except OSError as e:
    raise _UsageError(f'--output {args.output}: cannot write there ({e.strerror})') from None
  counts = collections.Counter()
  bad = 0
  try:
    with open(args.input, 'rb') as fin, tmp as fout, pool_lib.VerifierPool(
        num_workers=args.workers, item_timeout_s=args.item_timeout_s,
        default_reward=args.default_reward) as pool:

      def flush(lines):
        items = [obj for _, obj, _ in lines if obj is not None]
        try:
          verdicts = iter(pool.score(items, verifier=args.verifier, deadline_s=args.deadline_s))
        except Exception as e:  # pylint: disable=broad-except
          # Whatever went wrong, each line still gets its row.
          failure = V.failure(V.CRASH, f'pool failed: {type(e).__name__}: {e}',
                              reward=args.default_reward)
          verdicts = iter([failure] * len(items))
        for number, obj, error in lines:
          if obj is None:
            row = _error_row(number, error, V.INVALID_INPUT, args.default_reward)
          else:
            v = next(verdicts)
            row = {**obj, 'reward': v.reward, 'components': dict(v.components),
                   'status': v.status, 'detail': v.detail, 'latency_s': round(v.latency_s, 6)}
          line, status = _encode(row, number, args.default_reward)
          counts[status] += 1
          fout.write(line + '\n')

      lines = []
      for number, raw in enumerate(fin, start=1):
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
    os.replace(tmp.name, target)
  finally:
    if os.path.exists(tmp.name):
      os.unlink(tmp.name)
  summary = ', '.join(f'{k}={n}' for k, n in sorted(counts.items()))
  print(f'scored {sum(counts.values())} lines ({bad} bad): {summary}', file=sys.stderr)
  return 0


def main(argv=None) -> int:
  parser = argparse.ArgumentParser(prog=_PROG)
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
  p.add_argument('--allow-weak-sandbox', action='store_true',
                 help='run code-executing verifiers even where the sandbox has only rlimits')
  args = parser.parse_args(argv)
  try:
    registry.check_name(args.verifier)
  except ValueError as e:
    parser.error(str(e))
  if args.workers < 1 or args.batch_size < 1:
    parser.error('--workers and --batch-size must be at least 1')
  if not math.isfinite(args.default_reward):
    parser.error('--default-reward must be a finite number')
  if args.verifier in registry.RUNS_CODE:
    try:
      sandbox.check_isolation(allow_weak=args.allow_weak_sandbox)
    except RuntimeError as e:
      parser.error(str(e))
  try:
    return score(args)
  except _UsageError as e:
    print(f'{_PROG} score: error: {e}', file=sys.stderr)
    return 2


if __name__ == '__main__':
  sys.exit(main())
