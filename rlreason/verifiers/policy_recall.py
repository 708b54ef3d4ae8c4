"""PA³'s PolicyRecall reward (Jaccard) with a hallucination penalty, and a toy task on it.

PA³ (arXiv 2603.14602) teaches an assistant to recall the business policies that apply to a
request inside its chain of thought. Only "a PolicyRecall reward based on the Jaccard
score and a Hallucination Penalty" is public; the reading below is rlreason's
(algorithms.md §19, tagged [I]): with P̂ the set of policy ids the completion cites, P* the
gold set and P_all the catalogue,

  R_recall = |P̂ ∩ P*| / |P̂ ∪ P*|              (1 when both are empty)
  R_halluc = -λ_h · |P̂ \\ P_all| / max(1, |P̂|)  (cited ids that do not exist)
  policy_recall reward = w_r · R_recall + R_halluc
  policy_task reward   = R_task + w_r · R_recall + R_halluc

Cited ids: those inside the last <policies>...</policies> block if there is one, else every
match of `id_pattern` (default `[A-Z][A-Z0-9]*-\\d+`, e.g. POL-12) in the completion. Sets,
so citing an id twice changes nothing.

Toy task (`policy_task`), the format task generators should prompt for:
  a catalogue of policies with ids POL-1..POL-K, a request; the completion reasons, then
    <policies>POL-3, POL-7</policies>
    <answer>deny</answer>
  Item: completion, answer (gold decision, compared case-insensitively), policies (gold
  ids), catalogue (all ids). Correct iff the decision is right, recall is 1 and nothing is
  hallucinated; the reward is graded either way.

Not here: matching policies by recalled text rather than id (an open question in §19).
"""

import re
from typing import Any, Mapping

from rlreason.verifiers import answer_extraction
from rlreason.verifiers import verdict as V

DEFAULT_ID_PATTERN = r'\b[A-Z][A-Z0-9]*-\d+\b'


def jaccard(a: set[str], b: set[str]) -> float:
  return 1.0 if not a and not b else len(a & b) / len(a | b)


def hallucination_penalty(cited: set[str], catalogue: set[str], *, weight: float) -> float:
  return -weight * len(cited - catalogue) / max(1, len(cited))


def cited_ids(text: str, pattern: str = DEFAULT_ID_PATTERN) -> set[str]:
  block = answer_extraction.last_tag(text, 'policies')
  return set(re.findall(pattern, text if block is None else block))


def _id_set(item: Mapping[str, Any], name: str) -> set[str]:
  value = item.get(name)
  if value is None:
    raise V.ItemError(V.INVALID_INPUT, f'missing field: {name}')
  if isinstance(value, str):
    value = [v for v in re.split(r'[,\s]+', value) if v]
  if not isinstance(value, (list, tuple, set)) or not all(isinstance(v, str) for v in value):
    raise V.ItemError(V.INVALID_INPUT, f'{name}: expected a list of ids')
  return set(value)


def _recall(item: Mapping[str, Any], text: str, gold_field: str) -> dict[str, float]:
  gold = _id_set(item, gold_field)
  catalogue = _id_set(item, 'catalogue')
  pattern = V.option(item, 'id_pattern', DEFAULT_ID_PATTERN, str)
  try:
    cited = cited_ids(text, pattern)
  except re.error as e:
    raise V.ItemError(V.INVALID_INPUT, f'id_pattern: {e}') from None
  return {
      'recall': jaccard(cited, gold),
      'hallucination': hallucination_penalty(
          cited, catalogue, weight=V.option(item, 'hallucination_weight', 1.0, float)),
  }


@V.verifier
def verify_policy_recall(item: Mapping[str, Any]) -> V.Verdict:
  """Item: completion, answer (gold ids), catalogue; optional id_pattern, recall_weight,
  hallucination_weight."""
  text = V.completion_text(item)
  parts = _recall(item, text, 'answer')
  w_r = V.option(item, 'recall_weight', 1.0, float)
  ok = parts['recall'] == 1.0 and parts['hallucination'] == 0.0
  return V.judged(ok, reward=w_r * parts['recall'] + parts['hallucination'], components=parts)


@V.verifier
def verify_policy_task(item: Mapping[str, Any]) -> V.Verdict:
  """Item: completion, answer (gold decision), policies (gold ids), catalogue; options as
  verify_policy_recall."""
  text = V.completion_text(item)
  gold = V.gold_text(item).strip().casefold()
  parts = _recall(item, text, 'policies')
  decision = answer_extraction.last_tag(text, 'answer')
  if decision is None:
    return V.failure(V.PARSE_FAILURE, 'no <answer>...</answer> decision')
  parts['task'] = float(decision.strip().casefold() == gold)
  w_r = V.option(item, 'recall_weight', 1.0, float)
  reward = parts['task'] + w_r * parts['recall'] + parts['hallucination']
  ok = parts['task'] == 1.0 and parts['recall'] == 1.0 and parts['hallucination'] == 0.0
  return V.judged(ok, reward=reward, components=parts)
