"""The JAX platform default of the command lines: CPU where the host has no accelerator.

With libtpu installed (the test and tpu extras), JAX probes for a TPU at start-up and prints
several lines of libtpu errors on a machine without one. The entry points call
`default_to_cpu()` before JAX is imported; a JAX_PLATFORMS the user set is left alone.
Standard library only: it runs before anything heavy is imported.
"""

import glob
import os
from typing import MutableMapping

# Device nodes of TPUs (accel*, vfio), NVIDIA GPUs and AMD GPUs (kfd).
ACCELERATOR_NODES = ('/dev/accel*', '/dev/vfio/[0-9]*', '/dev/nvidia[0-9]*', '/dev/kfd')


def has_accelerator(patterns=ACCELERATOR_NODES) -> bool:
  return any(glob.glob(p) for p in patterns)


def default_to_cpu(environ: MutableMapping[str, str] | None = None, *,
                   patterns=ACCELERATOR_NODES) -> bool:
  """Sets JAX_PLATFORMS=cpu unless it is set or an accelerator is present; True if it did."""
  environ = os.environ if environ is None else environ
  if environ.get('JAX_PLATFORMS') or has_accelerator(patterns):
    return False
  environ['JAX_PLATFORMS'] = 'cpu'
  return True
