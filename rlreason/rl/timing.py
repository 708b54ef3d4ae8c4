"""Wall time per phase of a step (generate, verify, update, eval), summed into time/<phase>_s."""

import contextlib
import time


@contextlib.contextmanager
def phase(times: dict[str, float], name: str):
  start = time.perf_counter()
  yield
  times[f'time/{name}_s'] = times.get(f'time/{name}_s', 0.0) + time.perf_counter() - start
