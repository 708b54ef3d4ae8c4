"""Composition of k elements of a finite group, with the chain of partial products.

The state-tracking task of the implicit-curriculum paper (algorithms.md §24, arXiv
2602.14872): given g_1 ... g_k, emit s_1 ... s_k with s_0 = e and s_i = g_i · s_{i-1}; the
answer is s_k. Difficulty is the horizon k.

Groups, named in the prompt:
  'S2' ... 'S9'    permutations of {1..n} in bracketed one-line notation: '[3 1 2]' maps
                   1->3, 2->1, 3->2. g · s applies s first, then g: (g · s)(x) = g(s(x)).
  'Z2', 'Z97', ... integers mod n, in decimal; g · s = (g + s) mod n.

Formats (S3, k = 3):
  prompt    'S3: [2 1 3] [1 3 2] [3 2 1] ='
  solution  '[2 1 3] [3 1 2] [1 3 2] #### [1 3 2]'      s_1 ... s_k, then ' #### ' and s_k
  answer    '[1 3 2]'
  meta      {'group': 'S', 'n': 3, 'elements': ['[2 1 3]', '[1 3 2]', '[3 2 1]']}

These are the notation and item fields of rlreason.verifiers' `group_composition` checker
(it scores the last permutation, or for Z_n the last integer, of the completion).

Not here: the frozen one-step model or the REINFORCE recipe of §24 (those train on this
data); groups other than S_n and Z_n.
"""

import itertools

from rlreason.tasks import example as example_lib

NAME = 'group_composition'
DEFAULT_DIFFICULTY = 8
DEFAULT_GROUP = 'S5'
CHARS = ' #0123456789:=SZ[]'

Element = int | tuple[int, ...]  # Z_n: an int; S_n: the images of 0..n-1.


def _parse_group(group: str) -> tuple[str, int]:
  kind, n = group[:1], group[1:]
  # One digit per image keeps S_n elements short and the notation unambiguous.
  if kind not in ('S', 'Z') or not n.isdigit() or int(n) < 2 or (kind == 'S' and int(n) > 9):
    raise ValueError(f'group={group!r}: expected S<n> (2 <= n <= 9) or Z<n> (n >= 2).')
  return kind, int(n)


def _write(x: Element) -> str:
  return str(x) if isinstance(x, int) else '[' + ' '.join(str(v + 1) for v in x) + ']'


def _read(text: str) -> Element:
  text = text.strip()
  return tuple(int(v) - 1 for v in text[1:-1].split()) if text.startswith('[') else int(text)


def _multiply(kind: str, n: int, g: Element, s: Element) -> Element:
  if kind == 'Z':
    return (g + s) % n
  return tuple(g[s[x]] for x in range(n))


def elements(group: str) -> list[str]:
  """Every element of the group, as written in prompts."""
  kind, n = _parse_group(group)
  return [_write(x) for x in (range(n) if kind == 'Z' else itertools.permutations(range(n)))]


def multiply(group: str, g: str, s: str) -> str:
  """g · s, on elements as written; in S_n, s is applied first."""
  return _write(_multiply(*_parse_group(group), _read(g), _read(s)))


def generate(seed: int, index: int, *, difficulty: int = DEFAULT_DIFFICULTY,
             group: str = DEFAULT_GROUP) -> example_lib.Example:
  """The (seed, index)-th product of `difficulty` uniformly drawn elements of `group`."""
  if difficulty < 1:
    raise ValueError(f'group_composition difficulty (k) must be >= 1, got {difficulty}.')
  kind, n = _parse_group(group)
  rng = example_lib.example_rng(NAME, seed, index, difficulty)
  if kind == 'Z':
    gs = [int(v) for v in rng.integers(n, size=difficulty)]
  else:
    gs = [tuple(int(v) for v in rng.permutation(n)) for _ in range(difficulty)]
  states, s = [], 0 if kind == 'Z' else tuple(range(n))
  for g in gs:
    s = _multiply(kind, n, g, s)
    states.append(_write(s))
  written = [_write(g) for g in gs]
  return example_lib.Example(
      id=example_lib.example_id(NAME, seed, index, difficulty),
      prompt=f'{group}: {" ".join(written)} =',
      answer=states[-1],
      solution=' '.join(states) + example_lib.ANSWER_MARKER + states[-1],
      task=NAME,
      difficulty=difficulty,
      meta={'group': kind, 'n': n, 'elements': written},
  )


def problem_key(example: example_lib.Example) -> str:
  # The order matters (S_n is not abelian), so the key is the whole sequence.
  meta = example.meta
  return f'{meta["group"]}{meta["n"]}:{" ".join(meta["elements"])}'
