"""Prompt scheduling: which B prompts an RL step trains on.

  uniform  the stream's next B prompts, in order (`UniformSchedule`)
  heapa    HeaPA's frontier pool (`FrontierPool` + `FrontierSchedule`; arXiv 2601.22448,
           reference code horizon-rl/HeaPA `recipe/dapo/dapo_ray_trainer_HeaPA.py`,
           class `ThreadSafeQueryPool`; algorithms.md §17)

Both are iterators of lists of Examples with `record(examples, rewards_BxG)` (the loop calls it
with each sampled batch's policy rewards), `get_state()` and `set_state(state)`. The state is
JSON-able and saved with the checkpoint, so a resumed run draws exactly the prompts the
uninterrupted one would. The uniform schedule's state is the stream iterator's own, unchanged.

The frontier pool, as in the reference code [C]: a bounded pool of prompts, each with the mean
reward of its last trained group. Unscored ("cold") prompts wait in a FIFO queue and are
served first. Scored prompts are split at the capability boundary into a `low` (harder) and a
`high` (easier) side; a batch takes 2k candidates alternately from the two sides' boundary
ends (high first: the hardest of the easy and the easiest of the hard), keeps k of them at
random and leaves the rest in the pool. Served prompts leave the pool and wait, with their new
reward, until the pool holds fewer than k prompts; then all of them are put back. When the
pool is over capacity, a scored insertion evicts the lowest-reward prompt and a cold one the
highest-reward prompt (else the oldest cold one). `easy_medium` mode takes half of the batch
from the very easiest prompts instead.

Deliberate differences from the reference [I]: the boundary is exact, the lowest
round(low_fraction * n) scored prompts by (reward, insertion order) are `low` (the reference
rebalances two heaps lazily, at most four moves per operation, within a tolerance of one), so
the candidates do not depend on the order of insertions; put-back keeps recording order (the
reference shuffles); ties are broken by insertion order. Not here: the teacher's query
augmentation and the reward refresh over its augmentation tree (no teacher model; there is no
tree without augmented children). Instead `FrontierSchedule(fresh_per_step=m)` admits m new
prompts from the stream each step, so an infinite synthetic stream keeps feeding the pool.
"""

import dataclasses
from typing import Any, Iterator

import numpy as np

from rlreason import config as config_lib
from rlreason import tasks

MODES = config_lib.HEAPA_MODES


@dataclasses.dataclass
class FrontierPool:
  """HeaPA's bounded prompt pool; items are any JSON-able values (see module docstring).

  `cold` holds [seq, item] (FIFO), `scored` and `trained` hold [reward, seq, item]; `seq` is
  the insertion counter that orders ties. `rng` is the numpy bit generator state.
  """
  capacity: int
  low_fraction: float = 0.5
  mode: str = 'medium'
  seed: int = 0
  cold: list = dataclasses.field(default_factory=list)
  scored: list = dataclasses.field(default_factory=list)
  trained: list = dataclasses.field(default_factory=list)
  next_seq: int = 0
  rng: dict | None = None

  def __post_init__(self):
    if self.capacity < 1:
      raise ValueError(f'heapa pool capacity={self.capacity} must be >= 1.')
    if not 0.0 < self.low_fraction < 1.0:
      raise ValueError(f'heapa low_fraction={self.low_fraction} must be in (0, 1).')
    if self.mode not in MODES:
      raise ValueError(f'heapa mode={self.mode!r}; known: {MODES}.')
    if self.rng is None:
      self.rng = np.random.PCG64(self.seed).state

  def size(self) -> int:
    """Prompts in the pool (cold and scored); served prompts awaiting put-back do not count."""
    return len(self.cold) + len(self.scored)

  def _seq(self) -> int:
    self.next_seq += 1
    return self.next_seq - 1

  def _sorted(self) -> None:
    self.scored.sort(key=lambda e: (e[0], e[1]))

  def add_cold(self, item) -> None:
    """A prompt without a reward yet; when full, the easiest scored one makes room."""
    if self.size() >= self.capacity:
      if self.scored:
        self._sorted()
        self.scored.pop()
      else:
        self.cold.pop(0)
    self.cold.append([self._seq(), item])

  def add_scored(self, item, reward: float) -> None:
    """A prompt with its last mean reward; when over capacity, the hardest one leaves."""
    self.scored.append([float(reward), self._seq(), item])
    self._sorted()
    while self.size() > self.capacity:
      if self.scored:
        self.scored.pop(0)
      else:
        self.cold.pop(0)

  def record(self, item, reward: float) -> None:
    """A served prompt's new mean reward; it re-enters the pool at the next put-back."""
    self.trained.append([float(reward), self._seq(), item])

  def put_back(self) -> None:
    trained, self.trained = self.trained, []
    for reward, _, item in trained:
      self.add_scored(item, reward)

  def boundary(self) -> int:
    """Number of scored prompts on the low (harder) side: round(low_fraction * n)."""
    return int(np.floor(self.low_fraction * len(self.scored) + 0.5))

  def sample(self, k: int) -> list:
    """k items (fewer if the pool is smaller): cold first, then from the boundary."""
    if self.size() < k:
      self.put_back()
    chosen = [item for _, item in self.cold[:k]]
    self.cold = self.cold[k:]
    need = k - len(chosen)
    if need and self.mode == 'easy_medium':
      self._sorted()
      easy = min(need // 2, len(self.scored) - self.boundary())
      if easy:
        chosen += [item for _, _, item in self.scored[-easy:]]
        self.scored = self.scored[:-easy]
        need -= easy
    if need:
      chosen += self._medium(need)
    return chosen

  def _medium(self, need: int) -> list:
    self._sorted()
    n = len(self.scored)
    if need >= n:
      chosen, self.scored = [item for _, _, item in self.scored], []
      return chosen
    b = self.boundary()
    high, low, order, want_high = b, b - 1, [], True
    while len(order) < min(2 * need, n):
      # Alternate sides from the boundary outwards; an exhausted side yields to the other.
      if (want_high and high < n) or low < 0:
        order.append(high)
        high += 1
      else:
        order.append(low)
        low -= 1
      want_high = not want_high
    bit_generator = np.random.PCG64()
    bit_generator.state = self.rng
    picks = np.random.Generator(bit_generator).choice(len(order), size=need, replace=False)
    self.rng = bit_generator.state
    picked = {order[i] for i in picks}
    chosen = [e[2] for i, e in enumerate(self.scored) if i in picked]
    self.scored = [e for i, e in enumerate(self.scored) if i not in picked]
    return chosen

  def state(self) -> dict[str, Any]:
    return {'cold': self.cold, 'scored': self.scored, 'trained': self.trained,
            'next_seq': self.next_seq, 'rng': self.rng}

  def set_state(self, state: dict[str, Any]) -> None:
    self.cold, self.scored, self.trained = state['cold'], state['scored'], state['trained']
    self.next_seq, self.rng = state['next_seq'], state['rng']


def example_to_json(example: tasks.Example) -> dict[str, Any]:
  return dataclasses.asdict(example)


def example_from_json(record: dict[str, Any]) -> tasks.Example:
  return tasks.Example(**record)


class UniformSchedule:
  """The stream's batches in order; `record` is a no-op and the state is the stream's."""

  def __init__(self, batches: Iterator):
    self._batches = batches

  def __iter__(self):
    return self

  def __next__(self) -> list:
    return next(self._batches)

  def record(self, examples, rewards_BxG) -> None:
    del examples, rewards_BxG

  def get_state(self):
    return self._batches.get_state()

  def set_state(self, state) -> None:
    self._batches.set_state(state)


class FrontierSchedule:
  """Batches of `batch_size` prompts from a FrontierPool fed by a stream of single Examples.

  The pool starts with `pool.capacity` prompts from the stream; each step admits
  `fresh_per_step` more, and tops up from the stream whenever put-back leaves fewer than a
  batch. A prompt's reward is the mean of its group's rewards (as the reference code's `reward`).
  """

  def __init__(self, examples: Iterator, *, batch_size: int, pool: FrontierPool,
               fresh_per_step: int = 0):
    if fresh_per_step < 0:
      raise ValueError(f'heapa fresh_per_step={fresh_per_step} must be >= 0.')
    if pool.capacity < batch_size:
      raise ValueError(f'heapa pool capacity={pool.capacity} is below the batch size '
                       f'{batch_size}: a batch is drawn from the pool.')
    self._examples, self.pool = examples, pool
    self.batch_size, self.fresh_per_step = batch_size, fresh_per_step
    self._started = False

  def __iter__(self):
    return self

  def __next__(self) -> list:
    if not self._started:
      for _ in range(self.pool.capacity):
        self.pool.add_cold(example_to_json(next(self._examples)))
      self._started = True
    else:
      for _ in range(self.fresh_per_step):
        self.pool.add_cold(example_to_json(next(self._examples)))
    if self.pool.size() < self.batch_size:
      self.pool.put_back()
    while self.pool.size() < self.batch_size:
      self.pool.add_cold(example_to_json(next(self._examples)))
    return [example_from_json(item) for item in self.pool.sample(self.batch_size)]

  def record(self, examples, rewards_BxG) -> None:
    mean_B = np.asarray(rewards_BxG, np.float64).mean(axis=-1)
    if len(examples) != len(mean_B):
      raise ValueError(f'record: {len(examples)} examples for {len(mean_B)} reward groups.')
    for example, reward in zip(examples, mean_B):
      self.pool.record(example_to_json(example), float(reward))

  def get_state(self) -> dict[str, Any]:
    return {'stream': self._examples.get_state(), 'started': self._started,
            'pool': self.pool.state()}

  def set_state(self, state: dict[str, Any]) -> None:
    if 'pool' not in state:
      raise ValueError('the checkpoint\'s data state is not a heapa schedule\'s (keys '
                       f'{sorted(state)}); was the run started with another data.schedule?')
    self._examples.set_state(state['stream'])
    self._started = state['started']
    self.pool.set_state(state['pool'])
