"""`search`: BM25 over the episode's local corpus (bm25s), top-k passages as numbered text.

The corpus comes from the example's context: `corpus` (a list of passage strings) or
`corpus_path` (a JSONL file of {"text": ...}, read once per path and mtime). One index is
built per distinct corpus (keyed by a hash of its passages), so a new session is a dict
lookup. Retrieval is lexical (bm25s' default tokenizer, English stopwords, no stemmer):
"dogs" does not match "dog". Not here: dense retrieval, web search, corpus download.
"""

import contextlib
import functools
import hashlib
import json
import os
import sys
from typing import Any, Mapping, Sequence

from rlreason.envs import base

DEFAULT_K, MAX_K = 3, 10
PASSAGE_CHARS = 300


@contextlib.contextmanager
def _without_jax():
  """bm25s imports jax if it can and runs a top-k on the default device at import time;
  envs/ are host-side, so hide jax while it loads (restored afterwards)."""
  saved = {name: sys.modules[name] for name in ('jax', 'jax.lax') if name in sys.modules}
  sys.modules['jax'] = sys.modules['jax.lax'] = None
  try:
    yield
  finally:
    for name in ('jax', 'jax.lax'):
      del sys.modules[name]
    sys.modules.update(saved)


@functools.cache
def _bm25s():
  os.environ.setdefault('DISABLE_TQDM', '1')
  with _without_jax():
    import bm25s  # pylint: disable=g-import-not-at-top
  return bm25s


class _Index:
  """A BM25 index over one corpus; `search` returns (passage, score) pairs, best first."""

  def __init__(self, passages: Sequence[str]):
    bm25s = _bm25s()
    self.passages = list(passages)
    self._retriever = bm25s.BM25()
    self._retriever.index(bm25s.tokenize(self.passages, stopwords='en', show_progress=False),
                          show_progress=False)

  def search(self, query: str, k: int) -> list[tuple[str, float]]:
    bm25s = _bm25s()
    tokens = bm25s.tokenize([query], stopwords='en', return_ids=False, show_progress=False)
    k = min(k, len(self.passages))
    # numpy top-k: never the jax backend, even in a process that has jax loaded.
    docs, scores = self._retriever.retrieve(tokens, k=k, show_progress=False,
                                            backend_selection='numpy', n_threads=0)
    return [(self.passages[int(d)], float(s)) for d, s in zip(docs[0], scores[0]) if s > 0]


_INDEXES: dict[str, _Index] = {}  # sha256 of the passages -> index; the oldest goes first.
_MAX_INDEXES = 32


def _index(passages: tuple[str, ...]) -> _Index:
  key = hashlib.sha256(json.dumps(passages).encode('utf-8')).hexdigest()
  if key not in _INDEXES:
    if len(_INDEXES) >= _MAX_INDEXES:
      del _INDEXES[next(iter(_INDEXES))]
    _INDEXES[key] = _Index(passages)
  return _INDEXES[key]


@functools.lru_cache(maxsize=16)
def _read_jsonl(path: str, mtime_ns: int) -> tuple[str, ...]:
  del mtime_ns  # part of the cache key: an edited file is read again.
  with open(path, encoding='utf-8') as f:
    return tuple(json.loads(line)['text'] for line in f if line.strip())


def check_context(context: Mapping[str, Any]) -> None:
  """For start-up checks: raises ValueError naming a missing corpus or corpus file."""
  path = context.get('corpus_path')
  if path is not None and not os.path.isfile(path):
    raise ValueError(f'search: corpus_path {path!r} does not exist')
  if path is None and not isinstance(context.get('corpus'), (list, tuple)):
    raise ValueError('search: the context needs corpus (a list of passages) or corpus_path')


def _passages(context: Mapping[str, Any]) -> tuple[str, ...]:
  check_context(context)
  if context.get('corpus_path') is not None:
    path = os.path.realpath(context['corpus_path'])
    return _read_jsonl(path, os.stat(path).st_mtime_ns)
  return tuple(str(p) for p in context['corpus'])


class SearchTool:
  """Sessions are the (shared, read-only) index of the episode's corpus."""

  spec = base.ToolSpec(
      name='search',
      description='Searches the local document collection (BM25 keyword match) and returns '
                  'the best-matching passages.',
      parameters={'type': 'object', 'properties': {
          'query': {'type': 'string', 'description': 'keywords to search for'},
          'k': {'type': 'integer', 'description': f'number of passages (default {DEFAULT_K}, '
                                                  f'at most {MAX_K})'}},
                  'required': ['query']})

  def new_session(self, context: Mapping[str, Any]) -> _Index:
    passages = _passages(context)
    if not passages:
      raise ValueError('search: the corpus is empty')
    return _index(passages)

  def call(self, session: _Index, arguments: Mapping[str, Any]) -> str:
    query = arguments['query'].strip()
    if not query:
      raise base.ToolError(base.BAD_ARGUMENTS, 'search: query is empty')
    k = arguments.get('k', DEFAULT_K)
    if not 1 <= k <= MAX_K:
      raise base.ToolError(base.BAD_ARGUMENTS, f'search: k must be in 1..{MAX_K}, got {k}')
    hits = session.search(query, k)
    if not hits:
      return f'No passage matches {query!r}.'
    lines = []
    for i, (passage, _) in enumerate(hits, 1):
      text = ' '.join(passage.split())
      if len(text) > PASSAGE_CHARS:
        text = text[:PASSAGE_CHARS].rstrip() + '...'
      lines.append(f'[{i}] {text}')
    return '\n'.join(lines)


TOOL = SearchTool()
