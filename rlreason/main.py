"""Command line of the RL job: `python -m rlreason.main --config experiments/demo.py --workdir DIR`.

Overrides go through ml_collections' config flags (`--config.rl.group_size=16`); a config
file may take an argument (`--config experiments/grpo_gsm8k.py:runlocal`). The resolved
config and the git commit are logged and written to the workdir before anything compiles.

Deliberately not here: anything that runs per step (train.py).
"""

import json
import logging
import pathlib
import subprocess

from absl import app
from absl import flags
from absl import logging as absl_logging
from ml_collections import config_flags

from rlreason import config as config_lib

_CONFIG = config_flags.DEFINE_config_file('config', None, 'Experiment config file.')
_WORKDIR = flags.DEFINE_string('workdir', None, 'Where checkpoints and logs go.')
flags.mark_flags_as_required(['config', 'workdir'])


def _git_commit() -> str:
  try:
    return subprocess.run(['git', 'rev-parse', 'HEAD'], capture_output=True, text=True,
                          cwd=pathlib.Path(__file__).parent, timeout=10).stdout.strip()
  except (OSError, subprocess.SubprocessError):
    return 'unknown'


def main(argv):
  del argv
  # orbax logs every file it writes at INFO; keep the console for the run's own progress.
  absl_logging.set_verbosity(absl_logging.WARNING)
  import jax
  from rlreason import train
  config, workdir = _CONFIG.value, pathlib.Path(_WORKDIR.value)
  config_lib.validate(config, num_devices=jax.device_count())
  workdir.mkdir(parents=True, exist_ok=True)
  commit = _git_commit()
  (workdir / 'config.json').write_text(json.dumps(
      {'git_commit': commit, 'config': config.to_dict()}, indent=2, default=str))
  logging.info('git commit %s; config:\n%s', commit, config)
  _, metrics = train.train(config, str(workdir))
  print(' '.join(f'{k}={v:.4f}' for k, v in sorted(metrics.items())))


if __name__ == '__main__':
  app.run(main)
