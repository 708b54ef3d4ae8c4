"""SLATE's rule judge for search_qa: ternary step scores from the known facts (no model).

  judge = SearchRuleJudge(verify=env.verify)
  scores_Kx2 = judge.score(examples, histories, candidates)[b]   # (r_think, r_action) per step

`candidates` are rollout/slate_judge.Step values (text, thinking, kind, content, calls, errors);
`histories[b]` the chosen steps so far, each {'text', 'observation'}. Our formalisation of the
reference judge's three rubrics (algoprog/SLATE @09223bc, slate/rewards/llm_judge.py) on
search_qa, where every fact of the gold chain is known:
  think   0 if empty; +1 if it names the entity the next unresolved hop starts from (the
          answer once every hop is resolved); 0 if it names another entity of the question or
          of what was retrieved; -1 if it names none (irrelevant).
  query   -1 if malformed, not a search call, or one the tool would refuse; +1 if its top-k
          hits hold a fact of the gold chain not yet retrieved (progress); -1 if the chain
          facts it hits were all retrieved already (redundant, the rubric's -1); 0 if it hits
          no chain fact but names a known entity (targeted, not productive); -1 otherwise.
  answer  +1 if the environment's verifier accepts it; 0 if the gold answer occurs in it
          (ambiguous or padded); -1 otherwise.
Host-side like the rest of envs/: no JAX. Not here: the step reward and its early-answer
bonus (rollout/slate.py).
"""

import re
from typing import Any, Sequence

import numpy as np

from rlreason.envs import search

NAME = re.compile(r'[A-Z][a-z]+')  # An entity-name word of the generated corpus.


def _names(text: str) -> set[str]:
  return set(NAME.findall(text))


class SearchRuleJudge:
  """The rule judge of search_qa (module docstring); `verify` is the environment's verifier."""

  def __init__(self, *, verify):
    self.verify = verify
    self._facts: dict[str, tuple[list[str], list[str]]] = {}

  def facts(self, example) -> tuple[list[str], list[str]]:
    """(the gold chain's fact passages, each hop's subject), from the gold queries' top hits."""
    if example.id not in self._facts:
      index = search.TOOL.new_session(example.meta)
      queries = [c['arguments']['query'] for c in example.meta['gold_calls']]
      self._facts[example.id] = ([index.search(q, 1)[0][0] for q in queries],
                                 [q.rsplit(' ', 1)[0] for q in queries])
    return self._facts[example.id]

  def score(self, examples: Sequence[Any], histories: Sequence[Sequence[dict]],
            candidates: Sequence[Sequence[Any]], *, params=None) -> list[np.ndarray]:
    del params  # No model.
    return [np.array([self.score_step(ex, hist, c) for c in cands], np.float32).reshape(-1, 2)
            for ex, hist, cands in zip(examples, histories, candidates)]

  def score_step(self, example, history: Sequence[dict], step) -> tuple[float, float]:
    facts, subjects = self.facts(example)
    seen = '\n'.join(h.get('observation') or '' for h in history)
    known = _names(example.prompt) | _names(seen)
    todo = [i for i, f in enumerate(facts) if f not in seen]
    next_name = subjects[todo[0]] if todo else example.answer
    r_think = 0.0
    if step.thinking:
      if next_name in step.thinking:
        r_think = 1.0
      elif not _names(step.thinking) & known:
        r_think = -1.0
    if step.kind == 'answer':
      return r_think, self._answer(example, step)
    return r_think, self._query(example, step, facts, seen, known)

  def _answer(self, example, step) -> float:
    verdict = self.verify({'completion': step.content, 'answer': example.answer})
    if not verdict.failed and verdict.reward > 0:
      return 1.0
    return 0.0 if example.answer and example.answer in step.content else -1.0

  def _query(self, example, step, facts, seen: str, known: set[str]) -> float:
    if step.errors or not step.calls or any(c.name != 'search' for c in step.calls):
      return -1.0
    index = search.TOOL.new_session(example.meta)
    hits, named = set(), False
    for call in step.calls:
      query, k = call.arguments.get('query'), call.arguments.get('k', search.DEFAULT_K)
      if not isinstance(query, str) or not query.strip() or not isinstance(k, int) or not (
          1 <= k <= search.MAX_K):
        return -1.0  # The tool would refuse it (base.BAD_ARGUMENTS).
      hits |= {p for p, _ in index.search(query, k)}
      named |= bool(_names(query) & known)
    chain_hits = hits & set(facts)
    if any(f not in seen for f in chain_hits):
      return 1.0
    if chain_hits:
      return -1.0
    return 0.0 if named else -1.0
