"""launch/: every script's --dry-run prints well-formed commands; the AOT check compiles for TPU.

The shell scripts' lines are parsed back with shlex (they print with `printf %q`), and the
remote command that `ssh --command` carries is parsed a second time, as the worker's shell
will. The AOT check runs in a subprocess: libtpu must not load into the test process.
"""

import importlib.util
import json
import os
import pathlib
import shlex
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
LAUNCH = ROOT / 'launch'


def _lines(*args, expect_ok=True):
  p = subprocess.run([str(a) for a in args], cwd=ROOT, capture_output=True, text=True,
                     timeout=120)
  if expect_ok:
    assert p.returncode == 0, p.stderr
  return p, [shlex.split(line) for line in p.stdout.splitlines() if line.strip()]


def _flag(argv, name):
  return argv[argv.index(name) + 1]


def test_tpu_vm_create_and_queued_spot():
  _, [create] = _lines(LAUNCH / 'tpu_vm.sh', 'create', '--name', 'rl-a', '--zone', 'us-west4-a',
                       '--type', 'v5litepod-16', '--spot', '--project', 'p', '--dry-run')
  assert create[:6] == ['gcloud', 'compute', 'tpus', 'tpu-vm', 'create', 'rl-a']
  assert _flag(create, '--accelerator-type') == 'v5litepod-16'
  assert _flag(create, '--version') == 'v2-alpha-tpuv5-lite' and '--spot' in create
  assert _flag(create, '--project') == 'p'
  _, [queued, describe] = _lines(LAUNCH / 'tpu_vm.sh', 'queued', '--name', 'rl-a', '--zone', 'z',
                                 '--type', 'v6e-256', '--spot', '--dry-run')
  assert queued[:6] == ['gcloud', 'compute', 'tpus', 'queued-resources', 'create', 'rl-a-qr']
  assert _flag(queued, '--node-id') == 'rl-a' and '--spot' in queued
  assert _flag(queued, '--runtime-version') == 'v2-alpha-tpuv6e'
  assert describe[3:6] == ['queued-resources', 'describe', 'rl-a-qr']


def test_tpu_vm_setup_and_run_reach_every_worker():
  _, setup = _lines(LAUNCH / 'tpu_vm.sh', 'setup', '--name', 'rl-a', '--zone', 'z', '--dry-run')
  assert [c[3:5] for c in setup] == [['tpu-vm', 'ssh'], ['tpu-vm', 'scp'], ['tpu-vm', 'ssh']]
  assert all('--worker=all' in c for c in setup)
  assert shlex.split(_flag(setup[2], '--command'))[:2] == [
      'bash', 'rlreason/launch/setup_tpu_vm.sh']
  _, [run] = _lines(LAUNCH / 'tpu_vm.sh', 'run', '--name', 'rl-a', '--zone', 'z', '--config',
                    'experiments/grpo_gsm8k.py:qwen2.5-0.5b', '--workdir', 'gs://b/run',
                    '--dry-run', '--', '--config.rl.steps=3', '--config.data.prompt_template=a b')
  assert run[3:6] == ['tpu-vm', 'ssh', 'rl-a'] and '--worker=all' in run
  remote = shlex.split(_flag(run, '--command'))
  assert remote[:3] == ['cd', 'rlreason', '&&']
  main = remote[3:]
  assert main[:3] == ['.venv/bin/python', '-m', 'rlreason.main']
  assert _flag(main, '--config') == 'experiments/grpo_gsm8k.py:qwen2.5-0.5b'
  assert _flag(main, '--workdir') == 'gs://b/run'
  # An argument with a space survives both shells as one argument.
  assert main[-2:] == ['--config.rl.steps=3', '--config.data.prompt_template=a b']


def test_tpu_vm_delete_and_errors():
  _, [delete] = _lines(LAUNCH / 'tpu_vm.sh', 'delete', '--name', 'a', '--zone', 'z', '--dry-run')
  assert delete[3:6] == ['tpu-vm', 'delete', 'a'] and '--quiet' in delete
  _, [qdelete] = _lines(LAUNCH / 'tpu_vm.sh', 'delete', '--name', 'a', '--zone', 'z', '--queued',
                        '--dry-run')
  assert qdelete[3:6] == ['queued-resources', 'delete', 'a-qr'] and '--force' in qdelete
  p, _ = _lines(LAUNCH / 'tpu_vm.sh', 'create', '--name', 'a', '--dry-run', expect_ok=False)
  assert p.returncode != 0 and '--zone is required' in p.stderr


def test_setup_tpu_vm_installs_the_tpu_extra(tmp_path):
  (tmp_path / 'setup.py').write_text('# stand-in checkout\n')
  _, lines = _lines('bash', LAUNCH / 'setup_tpu_vm.sh', tmp_path, '--dry-run')
  assert lines[0] == ['python3', '-m', 'venv', f'{tmp_path}/.venv']
  assert [f'{tmp_path}/.venv/bin/pip', 'install', f'{tmp_path}[tpu,gcs]'] in lines


_SWEEP_EXPERIMENT = '''
from experiments import demo

def get_config(arg=''):
  return demo.get_config(arg)

def sweep(add):
  for g in (4, 8):
    add(**{'config.rl.group_size': g, 'config.seed': 1})
'''


def test_xm_launch_dry_run_prints_one_command_per_sweep_point(tmp_path):
  experiment = tmp_path / 'swept.py'
  experiment.write_text(_SWEEP_EXPERIMENT)
  _, lines = _lines(sys.executable, LAUNCH / 'xm_launch.py', '--config', f'{experiment}:runlocal',
                    '--workdir', 'gs://b/{xid}/{wid}', '--dry-run', '--', '--config.rl.steps=3')
  assert len(lines) == 2
  for wid, (argv, g) in enumerate(zip(lines, (4, 8)), start=1):
    assert argv[:3] == ['python', '-m', 'rlreason.main']
    assert _flag(argv, '--config') == f'{experiment}:runlocal'
    assert _flag(argv, '--workdir') == f'gs://b/DRYRUN/{wid}'
    assert argv[-3:] == [f'--config.rl.group_size={g}', '--config.seed=1', '--config.rl.steps=3']
  # Without a sweep: one work unit. Dry runs never import xmanager.
  _, [single] = _lines(sys.executable, LAUNCH / 'xm_launch.py', '--config', 'experiments/demo.py',
                       '--workdir', '/tmp/x', '--dry-run')
  assert single == ['python', '-m', 'rlreason.main', '--config', 'experiments/demo.py',
                    '--workdir', '/tmp/x']


@pytest.mark.skipif(importlib.util.find_spec('libtpu') is None,
                    reason='libtpu (the tpu extra) is not installed: no TPU compiler here')
def test_aot_check_compiles_for_a_tpu_topology():
  env = dict(os.environ, JAX_PLATFORMS='cpu', XLA_FLAGS='')
  p = subprocess.run([sys.executable, str(LAUNCH / 'aot_check.py'), '--topology', 'v5e:2x2',
                      '--config', 'experiments/demo.py:runlocal', '--json'], cwd=ROOT, env=env,
                     capture_output=True, text=True, timeout=600)
  assert p.returncode == 0, p.stderr[-3000:]
  [row] = [json.loads(line) for line in p.stdout.splitlines() if line.startswith('{')]
  assert row['topology'] == 'v5e:2x2' and row['mesh'] == {'data': 1, 'fsdp': 4, 'tensor': 1}
  assert row['fits'] and row['hbm'] == 16 * 2**30
  total = row['params_B'] * 1e9 * 4  # fp32 parameters.
  # FSDP over 4 chips: each holds at least a quarter; Adam's two moments follow the params.
  assert total / 4 <= row['params'] < total / 2
  assert row['opt_state'] >= 2 * row['params']
  assert row['sample_params'] == pytest.approx(total, rel=1e-6)  # SAMPLE keeps weights whole.
  assert row['sample_temp'] > 0  # The sampler's logits and cache buffers.
  assert row['peak'] >= row['params'] + row['opt_state']


@pytest.mark.parametrize('flag', ['--help', '-h', 'help'])
def test_tpu_vm_help_prints_usage_and_succeeds(flag):
  p = subprocess.run(['bash', str(LAUNCH / 'tpu_vm.sh'), flag], capture_output=True, text=True,
                     timeout=60)
  assert p.returncode == 0 and 'launch/tpu_vm.sh create' in p.stdout, (p.stdout, p.stderr)
  assert 'set -euo' not in p.stdout
