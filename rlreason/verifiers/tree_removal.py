"""Removing a directory tree that a sandboxed program left, whatever its shape.

  tree_removal.remove_tree('/tmp/rlreason-sandbox-123-abc')  # True once it is gone

Iterative and relative to directory descriptors: a program can leave a tree deeper than
Python's recursion limit (shutil.rmtree recurses, and its RecursionError once killed the
verifier pool's housekeeper thread) or than PATH_MAX, directories without permissions,
symlinks (removed, never followed) and read-only files. One descriptor is open at a time;
`..` leads back up. Never raises: a failure is one line on stderr.
"""

import contextlib
import os
import stat
import sys

_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


def _open_dir(name: str, parent_fd: int | None) -> int:
  try:
    return os.open(name, _DIR_FLAGS, dir_fd=parent_fd)
  except PermissionError:  # not root, and the program took our permissions away.
    os.chmod(name, 0o700, dir_fd=parent_fd)
    return os.open(name, _DIR_FLAGS, dir_fd=parent_fd)


def _unlink(name: str, fd: int) -> None:
  try:
    os.unlink(name, dir_fd=fd)
  except PermissionError:
    os.chmod(fd, 0o700)
    os.unlink(name, dir_fd=fd)
  except FileNotFoundError:
    pass


def remove_tree(path: str) -> bool:
  """Removes path and all below it; True when it is gone (see the module docstring)."""
  names, fd = [], None
  try:
    try:
      mode = os.lstat(path).st_mode
    except FileNotFoundError:
      return True
    if not stat.S_ISDIR(mode):
      os.unlink(path)
      return True
    fd = _open_dir(path, None)
    while True:
      child = None
      with os.scandir(fd) as entries:
        for entry in entries:
          if entry.is_dir(follow_symlinks=False):
            child = entry.name
            break
          _unlink(entry.name, fd)
      if child is not None:
        try:
          below = _open_dir(child, fd)
        except FileNotFoundError:  # removed meanwhile (a second clean-up): look again.
          continue
        os.close(fd)
        fd = below
        names.append(child)
        continue
      if not names:
        break
      above = os.open('..', _DIR_FLAGS, dir_fd=fd)
      os.close(fd)
      fd = above
      with contextlib.suppress(FileNotFoundError):
        os.rmdir(names.pop(), dir_fd=fd)
    os.close(fd)
    fd = None
    os.rmdir(path)
    return True
  except Exception as e:  # pylint: disable=broad-except
    print(f'rlreason sandbox: cannot remove {path}: {type(e).__name__}: {e}', file=sys.stderr,
          flush=True)
    return False
  finally:
    if fd is not None:
      os.close(fd)
