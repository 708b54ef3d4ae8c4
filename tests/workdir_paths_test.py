"""A gs:// workdir end to end, on a fake GCS server: config, metrics, TensorBoard, transcripts,
orbax checkpoints land in the bucket, a resume and evaluate's config read them from it, and
nothing lands locally.

The fake: gcp-storage-emulator, an in-memory server of GCS's JSON API, in this process. The
real clients talk to it: gcsfs (etils.epath's gs:// backend) and google-cloud-storage through
STORAGE_EMULATOR_HOST, TensorStore's GCS driver (orbax's array writes) through
TENSORSTORE_GCS_HTTP_URL. No code path of the run is replaced. One fix to the emulator: its
downloads lack GCS's x-goog-generation header, without which TensorStore's next conditional
write of that object (an OCDBT manifest) fails on a 'Malformed StorageGeneration'.
"""

import gc
import json
import os
import socket

from etils import epath
import fsspec
from gcp_storage_emulator import exceptions as emulator_errors
from gcp_storage_emulator import server as emulator
from gcp_storage_emulator.handlers import objects as emulator_objects
import pytest

from rlreason import main as main_lib
from rlreason import workdir_paths
from rlreason.envs import transcripts
from rlreason.rl import evaluate
from rlreason.rl import metrics
from rlreason.rl import train
from train_episodes_test import env_config  # tests/ is on sys.path
from train_test import train_preempted_at


def small_config():
  """train_episodes_test's episodes config (its runs write transcripts), trimmed for time."""
  c = env_config(steps=2)
  c.sft.steps, c.eval.num_prompts, c.rl.max_new_tokens = 1, 2, 24
  c.env.update(max_turns=1, transcripts=2)
  return c


def _download_with_generation(download):
  def wrapped(request, response, storage, *args, **kwargs):
    download(request, response, storage, *args, **kwargs)
    try:
      obj = storage.get_file_obj(request.params['bucket_name'], request.params['object_id'])
    except emulator_errors.NotFound:
      return
    response['x-goog-generation'] = obj['generation']
    response['x-goog-metageneration'] = obj['metageneration']
  return wrapped


@pytest.fixture(scope='module')
def bucket():
  """gs://bkt on an in-memory GCS emulator; the environment points every client at it."""
  with socket.socket() as s:
    s.bind(('localhost', 0))
    port = s.getsockname()[1]
  server = emulator.create_server('localhost', port, in_memory=True, default_bucket='bkt')
  server.start()
  url = f'http://localhost:{port}'
  with pytest.MonkeyPatch.context() as env:
    env.setattr(emulator_objects, 'download',
                _download_with_generation(emulator_objects.download))
    env.setenv('STORAGE_EMULATOR_HOST', url)  # gcsfs, google-cloud-storage.
    env.setenv('TENSORSTORE_GCS_HTTP_URL', url)  # TensorStore's gcs driver (orbax arrays).
    env.setenv('GOOGLE_AUTH_TOKEN_FOR_TESTING', 'fake')  # TensorStore: no credential lookup.
    env.setenv('GOOGLE_CLOUD_PROJECT', 'test')
    env.setenv('NO_GCE_CHECK', 'true')  # google-auth: no metadata-server probe.
    env.setenv('GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT', 'false')  # gcsfs: no bucket-layout RPC.
    env.setitem(fsspec.config.conf, 'gcs', {'token': 'anon'})
    yield 'gs://bkt'
  gc.collect()  # tensorboardX's gs:// writers upload again when collected: while it serves.
  server.stop()


def test_a_missing_extra_is_named_before_anything_runs(monkeypatch, tmp_path):
  monkeypatch.chdir(tmp_path)
  monkeypatch.setattr(workdir_paths, '_installed', lambda module: module != 'gcsfs')
  with pytest.raises(ModuleNotFoundError, match=r"workdir gs://b/run: needs the 'gcs' extra "
                     r"\(pip install 'rlreason\[gcs\]'\); not installed: gcsfs \("):
    main_lib.run(env_config(), 'gs://b/run')
  with pytest.raises(ValueError, match=r'workdir memory://x: memory:// is not supported'):
    main_lib.run(env_config(), 'memory://x')
  assert not os.listdir(tmp_path)  # No './gs:/b/run' nor './memory:/x'.


def test_local_writes_are_atomic_and_appends_append(tmp_path):
  path = tmp_path / 'd' / 'f.txt'
  workdir_paths.write_atomic(path, 'a')
  workdir_paths.append_text(path, 'b')
  assert path.read_text() == 'ab' and os.listdir(tmp_path / 'd') == ['f.txt']  # No temporary.


def test_rl_steps_resume_and_evaluate_config_in_a_bucket(bucket, monkeypatch, tmp_path, capsys):
  monkeypatch.chdir(tmp_path)
  workdir = f'{bucket}/run'
  train_preempted_at(1, small_config(), workdir)  # Saves step 1, then exits.
  train.train(small_config(), workdir)
  assert f'resumed from step 1 (workdir {workdir})' in capsys.readouterr().out
  root = epath.Path(workdir)
  saved = sorted(int(p.name) for p in (root / 'checkpoints').iterdir() if p.name.isdigit())
  assert saved == [0, 1, 2]
  assert json.loads((root / 'config.json').read_text())['config']['rl']['steps'] == 2
  # Both runs' rows: an object store has no append, the log is rewritten whole.
  steps = [row['step'] for row in metrics.read_jsonl(root / 'metrics.jsonl')]
  assert 1 in steps and 2 in steps and steps == sorted(steps)
  assert list((root / 'tensorboard').iterdir())  # Event files, through metrics._ObjectEvents.
  assert transcripts.available(workdir, 'eval') == [0, 2]
  assert len(transcripts.read(transcripts.path_for(workdir, 2, 'train'))) == 2

  config = evaluate.workdir_config(workdir)  # The run's config, read from the bucket.
  assert config.rl.steps == 2 and config.env.tools == ('calculator',)
  assert not os.listdir(tmp_path)  # Nothing local: no './gs:/bkt/run'.



def test_bucket_writes_appends_and_directory_uploads(bucket, tmp_path):
  log = epath.Path(f'{bucket}/files/log.txt')
  workdir_paths.write_atomic(log, 'a\n')
  workdir_paths.append_text(log, 'b\n')  # No append on an object store: rewritten whole.
  assert log.read_text() == 'a\nb\n'
  (tmp_path / 'hf' / 'sub').mkdir(parents=True)  # reward_model.save's local HF directory.
  (tmp_path / 'hf' / 'config.json').write_text('{}')
  (tmp_path / 'hf' / 'sub' / 'w.bin').write_bytes(b'\x00\x01')
  dest = workdir_paths.upload_tree(tmp_path / 'hf', f'{bucket}/files/hf')
  assert (dest / 'config.json').read_text() == '{}'
  assert (dest / 'sub' / 'w.bin').read_bytes() == b'\x00\x01'
