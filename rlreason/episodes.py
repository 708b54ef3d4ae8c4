"""Reads episode transcripts: `python -m rlreason.episodes show WORKDIR [--step N]`.

A run with env.enabled writes the transcripts of `env.transcripts` episodes at each
evaluation step to WORKDIR/episodes/{train,eval}_stepNNNNNN.jsonl (envs/transcripts.py);
this prints them, the policy's sampled (trained) text as written and the observations the
tools returned marked `<<obs ... obs>>`. The episode loop itself is rlreason/rollout/episodes.py.

  python -m rlreason.episodes show /tmp/tools            # the latest train step
  python -m rlreason.episodes show /tmp/tools --step 40 --kind eval --limit 3
"""

import argparse
import sys

from rlreason.envs import transcripts


def show(workdir: str, *, step: int | None = None, kind: str = 'train', limit: int = 4,
         color: bool = False) -> str:
  steps = transcripts.available(workdir, kind)
  if not steps:
    raise FileNotFoundError(f'no {kind} transcripts in {workdir}/{transcripts.DIR} (a run '
                            'writes them at evaluation steps when env.enabled).')
  if step is None:
    step = steps[-1]
  elif step not in steps:
    raise FileNotFoundError(f'no {kind} transcript for step {step} in {workdir}/'
                            f'{transcripts.DIR}; steps with one: {steps}')
  records = transcripts.read(transcripts.path_for(workdir, step, kind))[:limit]
  return '\n\n'.join(transcripts.format_record(r, color=color) for r in records)


def main(argv=None) -> int:
  parser = argparse.ArgumentParser(prog='python -m rlreason.episodes', description=__doc__,
                                   formatter_class=argparse.RawDescriptionHelpFormatter)
  sub = parser.add_subparsers(dest='command', required=True)
  p = sub.add_parser('show', help='print transcripts of a run')
  p.add_argument('workdir')
  p.add_argument('--step', type=int, default=None, help='default: the latest')
  p.add_argument('--kind', choices=('train', 'eval'), default='train')
  p.add_argument('--limit', type=int, default=4, help='episodes to print')
  p.add_argument('--color', action='store_true', help='dim observations (ANSI) instead')
  args = parser.parse_args(argv)
  try:
    print(show(args.workdir, step=args.step, kind=args.kind, limit=args.limit, color=args.color))
  except FileNotFoundError as e:
    print(f'error: {e}', file=sys.stderr)
    return 1
  return 0


if __name__ == '__main__':
  sys.exit(main())
