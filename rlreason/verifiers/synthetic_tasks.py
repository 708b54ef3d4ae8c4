"""Checkers for rlreason's synthetic tasks: multi-digit arithmetic and group composition.

The task generators are written against these docstrings.

`arithmetic`: e.g. "4821 * 37 =". Item: completion, answer (an integer). The completion is
  either just the integer ("178377") or ends with a tagged one: <answer>178377</answer>,
  \\boxed{178377}, `#### 178377` or "The answer is 178377". Thousands separators are
  allowed. Component `digit_accuracy`: fraction of right-aligned digit positions that
  match (a dense diagnostic; the reward is 1/0).

`group_composition`: the L-step state-tracking task of algorithms.md §24. Given elements
  g_1..g_L of a group, the states are s_0 = e, s_k = g_k · s_{k-1}, so
  s_L = g_L · ... · g_1 (g_1 acts first). Only the final state is scored; intermediate
  states in the completion are ignored. Item: completion, n, and either answer (s_L) or
  elements ([g_1, ..., g_L]); group "S" (default: permutations of 1..n) or "Z" (integers
  mod n, the abelian control).
  Permutation notation (either is accepted, in answers and elements):
    one-line  [2 3 1 5 4] or [2, 3, 1, 5, 4]   (i maps to the i-th entry: 1->2, 2->3, 3->1)
    cycles    (1 2 3)(4 5), written without spaces between cycles; cycles are composed
              right to left like functions; fixed points may be omitted
    identity  () or e
  The final state is the last permutation written inside <answer>...</answer> if present,
  else in the whole completion; so "s1=[2 1 3] s2=(1 3)" answers (1 3).

Not here: the generators and their difficulty schedules.
"""

import re
from typing import Any, Mapping, Sequence

from rlreason.verifiers import answer_extraction
from rlreason.verifiers import verdict as V

_INTEGER = re.compile(r'[+-]?\d+')
# Entries are separated by a comma and/or whitespace. Written as `\d+(?:\s*,?\s*\d+)*` the
# separator may be empty, so a run of k digits splits 2^k ways: "[" + 30 digits took minutes.
_ENTRIES = r'\s*\d+(?:(?:\s*,\s*|\s+)\d+)*\s*'
_PERMUTATION = re.compile(rf'\[{_ENTRIES}\]|(?:\({_ENTRIES}\))+|\(\)')
_MAX_DIGITS = 1000

Permutation = tuple[int, ...]  # images of 0..n-1


def digit_accuracy(gold: int, pred: int) -> float:
  g, p = str(gold), str(pred)
  width = max(len(g), len(p))
  return sum(a == b for a, b in zip(g.rjust(width), p.rjust(width))) / width


@V.verifier
def verify_arithmetic(item: Mapping[str, Any]) -> V.Verdict:
  """Item: completion, answer (integer). See the module docstring for the format."""
  text = V.completion_text(item)
  gold_str = V.gold_text(item).strip()
  if not _INTEGER.fullmatch(gold_str):
    return V.failure(V.INVALID_INPUT, f'answer is not an integer: {gold_str[:40]!r}')
  answer = text.strip()
  if not _INTEGER.fullmatch(answer):
    answer, _ = answer_extraction.final_answer(text)
    if answer is None:
      return V.failure(V.PARSE_FAILURE, 'no integer answer')
    answer = answer_extraction.strip_thousands(answer.strip(' .$'))
  if not _INTEGER.fullmatch(answer) or len(answer) > _MAX_DIGITS:
    return V.failure(V.PARSE_FAILURE, f'not an integer: {answer[:40]!r}')
  gold, pred = int(gold_str), int(answer)
  return V.judged(gold == pred, components={'digit_accuracy': digit_accuracy(gold, pred)})


def parse_permutation(text: str, n: int) -> Permutation:
  """One-line, cycle or identity notation on 1..n -> images of 0..n-1; ValueError if not."""
  text = text.strip()
  if text in ('()', 'e', 'id'):
    return tuple(range(n))
  if text.startswith('['):
    images = tuple(int(x) - 1 for x in re.findall(r'\d+', text))
    if sorted(images) != list(range(n)):
      raise ValueError(f'{text!r} is not a permutation of 1..{n}')
    return images
  perm = list(range(n))
  for cycle in reversed(re.findall(r'\(([^()]*)\)', text)):  # rightmost acts first.
    points = [int(x) - 1 for x in re.findall(r'\d+', cycle)]
    if len(set(points)) != len(points) or any(not 0 <= p < n for p in points):
      raise ValueError(f'bad cycle ({cycle}) for n={n}')
    step = {a: b for a, b in zip(points, points[1:] + points[:1])}
    perm = [step.get(image, image) for image in perm]
  if not text or re.sub(r'\(([^()]*)\)', '', text).strip():
    raise ValueError(f'{text!r} is not cycle notation')
  return tuple(perm)


def compose(g: Permutation, h: Permutation) -> Permutation:
  """g · h: apply h, then g."""
  return tuple(g[h[x]] for x in range(len(h)))


def final_state(elements: Sequence[Permutation]) -> Permutation:
  """s_L for s_0 = e, s_k = g_k · s_{k-1}."""
  state = tuple(range(len(elements[0])))
  for g in elements:
    state = compose(g, state)
  return state


def format_cycles(perm: Permutation) -> str:
  seen, cycles = set(), []
  for start in range(len(perm)):
    if start in seen or perm[start] == start:
      continue
    cycle, x = [], start
    while x not in seen:
      seen.add(x)
      cycle.append(str(x + 1))
      x = perm[x]
    cycles.append('(' + ' '.join(cycle) + ')')
  return ''.join(cycles) or '()'


def format_one_line(perm: Permutation) -> str:
  return '[' + ' '.join(str(x + 1) for x in perm) + ']'


def _gold_state(item: Mapping[str, Any], group: str, n: int):
  if 'answer' in item:
    gold = V.gold_text(item)
    return int(gold) % n if group == 'Z' else parse_permutation(gold, n)
  elements = item.get('elements')
  if not isinstance(elements, list) or not elements:
    raise V.ItemError(V.INVALID_INPUT, 'need answer or a non-empty list of elements')
  if group == 'Z':
    return sum(int(e) for e in elements) % n
  return final_state([parse_permutation(str(e), n) for e in elements])


@V.verifier
def verify_group_composition(item: Mapping[str, Any]) -> V.Verdict:
  """Item: completion, n, answer or elements; optional group ('S' or 'Z')."""
  text = V.completion_text(item)
  n = V.option(item, 'n', 0, int)
  group = V.option(item, 'group', 'S', str)
  if n < 1 or group not in ('S', 'Z'):
    return V.failure(V.INVALID_INPUT, f'need n >= 1 and group S or Z, got n={n}, {group!r}')
  try:
    gold = _gold_state(item, group, n)
  except ValueError as e:
    return V.failure(V.INVALID_INPUT, f'gold: {e}')
  region = answer_extraction.last_tag(text, 'answer') or text
  if group == 'Z':
    found = _INTEGER.findall(region)
    if not found or len(found[-1]) > _MAX_DIGITS:
      return V.failure(V.PARSE_FAILURE, 'no integer state')
    return V.judged(int(found[-1]) % n == gold, detail=found[-1])
  if region.strip() in ('e', 'id'):
    found = [region.strip()]
  else:
    found = _PERMUTATION.findall(region)
  if not found:
    return V.failure(V.PARSE_FAILURE, 'no permutation in the completion')
  try:
    pred = parse_permutation(found[-1], n)
  except ValueError as e:
    return V.failure(V.PARSE_FAILURE, str(e))
  return V.judged(pred == gold, detail=format_cycles(pred))
