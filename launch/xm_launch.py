"""Launches an experiment with XManager: one work unit per point of its `sweep(add)`.

  python launch/xm_launch.py --config experiments/grpo_gsm8k.py:qwen2.5-0.5b \
      --workdir gs://BUCKET/xm/{xid}/{wid} --tpu v5litepod-16 [--dry-run]

An experiment file may define `sweep(add)` next to `get_config` (big_vision's convention):
each `add(**{'config.rl.group_size': 16, 'config.seed': 1})` is one work unit, launched as
`python -m rlreason.main --config FILE:ARG --workdir DIR --config.rl.group_size=16 ...`.
Without `sweep`, the experiment is one work unit. `--dry-run` prints each work unit's command
and needs nothing beyond this checkout; a real launch imports xmanager (the `launch` extra)
and submits to Vertex AI through xm_local. Never imported by the package.
"""

import argparse
import importlib.util
import pathlib
import shlex
import sys

_ROOT = pathlib.Path(__file__).resolve().parents[1]


def sweep_points(config_path: str) -> list[dict[str, object]]:
  """The points of `sweep(add)` in the experiment file (one empty point without a sweep)."""
  path = pathlib.Path(config_path.split(':', 1)[0])
  if not path.is_file():
    raise SystemExit(f'xm_launch: --config {config_path}: no file {path}.')
  spec = importlib.util.spec_from_file_location(f'_xm_experiment_{path.stem}', path)
  module = importlib.util.module_from_spec(spec)
  sys.path.insert(0, str(_ROOT))  # Experiment files import rlreason.
  try:
    spec.loader.exec_module(module)
  finally:
    sys.path.remove(str(_ROOT))
  if not hasattr(module, 'sweep'):
    return [{}]
  points = []
  module.sweep(lambda **kw: points.append(kw))
  for i, point in enumerate(points):
    bad = [k for k in point if not k.startswith('config.')]
    if bad:
      raise SystemExit(f'xm_launch: sweep point {i} of {path} has keys {bad}; every key is a '
                       "flag such as 'config.rl.group_size'.")
  return points


def work_unit_args(*, config: str, workdir: str, point: dict[str, object],
                   extra: list[str]) -> list[str]:
  """main.py's arguments for one work unit."""
  args = ['--config', config, '--workdir', workdir]
  args += [f'--{key}={value}' for key, value in sorted(point.items())]
  return args + list(extra)


def _launch(args, points) -> None:
  from xmanager import xm  # Lazy: --dry-run must work without xmanager installed.
  from xmanager import xm_local
  with xm_local.create_experiment(experiment_title=args.title or args.config) as experiment:
    [executable] = experiment.package([xm.python_container(
        executor_spec=xm_local.Vertex.Spec(), path=str(_ROOT), base_image=args.base_image,
        entrypoint=xm.ModuleName('rlreason.main'), use_deep_module=True)])
    requirements = xm.JobRequirements(**{args.accelerator: args.chips})
    for i, point in enumerate(points):
      workdir = args.workdir.format(xid=experiment.experiment_id, wid=i + 1)
      experiment.add(xm.Job(
          executable=executable, executor=xm_local.Vertex(requirements=requirements),
          args=work_unit_args(config=args.config, workdir=workdir, point=point,
                              extra=args.extra)))


def main(argv=None) -> None:
  parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  parser.add_argument('--config', required=True, help='experiments/FILE.py[:ARG]')
  parser.add_argument('--workdir', required=True,
                      help='per work unit; {xid} and {wid} are filled in')
  parser.add_argument('--title', default='')
  parser.add_argument('--accelerator', default='TPU_V3', help='an xm.JobRequirements key')
  parser.add_argument('--chips', type=int, default=8)
  parser.add_argument('--base_image', default='python:3.11')
  parser.add_argument('--dry-run', action='store_true', help='print the commands only')
  parser.add_argument('extra', nargs='*', help='after --: flags passed to every work unit')
  args = parser.parse_args(argv)
  points = sweep_points(args.config)
  if args.dry_run:
    for i, point in enumerate(points):
      workdir = args.workdir.format(xid='DRYRUN', wid=i + 1)
      command = ['python', '-m', 'rlreason.main'] + work_unit_args(
          config=args.config, workdir=workdir, point=point, extra=args.extra)
      print(shlex.join(command))
    return
  _launch(args, points)


if __name__ == '__main__':
  main()
