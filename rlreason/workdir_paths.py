"""Workdir paths on local disk or on Google Cloud Storage (gs://), as `etils.epath` paths.

A run writes config.json, metrics.jsonl, TensorBoard events, transcripts, orbax checkpoints
and its methods' state under `--workdir`. With `pathlib` or `os`, `gs://bucket/run` becomes a
local folder `./gs:/bucket/run`; every reader and writer of the workdir therefore takes
`as_path(workdir)`, an `etils.epath.Path`, the path type orbax itself uses: a local path goes
through `os`, gs:// through fsspec (gcsfs), and orbax writes the arrays with TensorStore's own
GCS driver.

Writes: on local disk `write_atomic` writes a temporary file beside the target and renames it,
so a process killed meanwhile leaves the previous file (issue 33's crash-safe checkpoints). On
an object store an upload is a single put that replaces the object whole or not at all, so it
is written in place, with no temporary (a rename there is a copy and a delete). Object stores
have no append: `append_text` rewrites the object with the text added.

`check(workdir)` runs at start-up, before anything compiles: a gs:// workdir without its
packages names the 'gcs' extra and the missing package; any other scheme is refused, because
orbax (0.12) checkpoints only to gs:// or to a local path (a mounted bucket is a local path).

Deliberately not here: what the files hold (checkpoint.py, metrics.py, envs/transcripts.py).
"""

import importlib.util
import os
import re
import tempfile

from etils import epath

# Packages a gs:// workdir needs, with what needs them. [ours]
GCS_PACKAGES = {
    'gcsfs': 'etils.epath reads and writes gs:// files through it',
    'google.cloud.storage': 'orbax lists and deletes checkpoint steps through it',
}
_PIP_NAMES = {'gcsfs': 'gcsfs', 'google.cloud.storage': 'google-cloud-storage'}
_SCHEME = re.compile(r'^([A-Za-z][A-Za-z0-9+.-]*)://')


def scheme(path) -> str | None:
  """'gs' for 'gs://bucket/run', None for a local path."""
  match = _SCHEME.match(os.fspath(path))
  return match.group(1).lower() if match else None


def is_local(path) -> bool:
  return scheme(path) is None


def as_path(path) -> epath.Path:
  """The workdir (or a path under it) as an epath.Path; a local path stays as given."""
  return path if isinstance(path, epath.Path) else epath.Path(os.fspath(path))


def _installed(module: str) -> bool:
  try:
    return importlib.util.find_spec(module) is not None
  except ModuleNotFoundError:  # A missing parent package ('google.cloud').
    return False


def missing_packages(path) -> list[str]:
  """The pip names of the packages `path`'s scheme needs and this Python lacks."""
  if scheme(path) != 'gs':
    return []
  return [_PIP_NAMES[m] for m in GCS_PACKAGES if not _installed(m)]


def check(path, *, what: str = 'workdir') -> epath.Path:
  """`as_path(path)`, or a one-line error naming the scheme's missing extra and package.

  Called by the entry points before anything compiles."""
  kind = scheme(path)
  if kind is None:
    return as_path(path)
  if kind != 'gs':
    raise ValueError(f'{what} {path}: {kind}:// is not supported; orbax checkpoints only to '
                     'gs:// or a local path (mount the bucket, e.g. with s3fs-fuse or '
                     'blobfuse, and pass the mount point).')
  missing = missing_packages(path)
  if missing:
    why = '; '.join(f'{_PIP_NAMES[m]}: {GCS_PACKAGES[m]}' for m in GCS_PACKAGES
                    if _PIP_NAMES[m] in missing)
    raise ModuleNotFoundError(f"{what} {path}: needs the 'gcs' extra (pip install "
                              f"'rlreason[gcs]'); not installed: {', '.join(missing)} ({why}).")
  return as_path(path)


def write_atomic(path, data: str | bytes) -> epath.Path:
  """Writes `data` to `path` whole or not at all (see the module docstring): locally a
  temporary file beside it, then a rename; on an object store a single put."""
  path = as_path(path)
  path.parent.mkdir(parents=True, exist_ok=True)
  mode = 'wb' if isinstance(data, bytes) else 'w'
  if not is_local(path):
    with path.open(mode) as f:
      f.write(data)
    return path
  fd, tmp = tempfile.mkstemp(dir=os.fspath(path.parent), prefix=f'.{path.name}.', suffix='.tmp')
  try:
    with os.fdopen(fd, mode) as f:
      f.write(data)
    os.replace(tmp, os.fspath(path))
  except BaseException:
    if os.path.exists(tmp):
      os.unlink(tmp)
    raise
  return path


def append_text(path, text: str) -> None:
  """Appends `text` to `path`; on an object store (no append) rewrites the object with it."""
  path = as_path(path)
  if is_local(path):
    with path.open('a') as f:
      f.write(text)
    return
  write_atomic(path, (path.read_text() if path.exists() else '') + text)


def upload_tree(local_dir, path) -> epath.Path:
  """Copies the files under the local directory `local_dir` to `path` (for writers that only
  write local files, such as a HF checkpoint's safetensors), each file a single put."""
  path = as_path(path)
  for root, _, names in os.walk(local_dir):
    for name in names:
      source = os.path.join(root, name)
      with open(source, 'rb') as f:
        write_atomic(path / os.path.relpath(source, local_dir), f.read())
  return path
