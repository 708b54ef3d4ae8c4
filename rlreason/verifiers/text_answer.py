"""`exact`, `regex` and `format`: string-level checks of a completion.

  exact   the final answer equals the gold answer (or one of a list of them) after
          normalisation: surrounding whitespace, `$`, `**` and a trailing period stripped,
          inner whitespace collapsed, case folded unless `case_sensitive`.
  regex   `answer` is a regular expression that must match the whole final answer, or,
          with `search: true`, occur anywhere in the completion.
  format  the completion follows a named layout (FORMATS) or matches `pattern`.

The final answer is the last <answer>...</answer> block, else the last \\boxed{}, else the
`####` line, else the rest of the line after "answer is", else the whole completion.
Patterns come from the dataset, not the model; a pathological one is the pool's deadline's
problem. Not here: any mathematical equivalence (math_answer.py does that).
"""

import re
from typing import Any, Mapping

from rlreason.verifiers import answer_extraction
from rlreason.verifiers import verdict as V

# Layouts seen in RL recipes; the two `reasoning_*` ones are Prolog-as-a-Tool's strict and
# soft format rewards (aisilab/Prolog-as-a-Tool rewards/reward_suite_3.py). Each `(?>...)`
# (atomic: no backtracking into it) commits to the first occurrence of a marker, which is
# the most permissive choice for what follows, so it matches the same texts as the plain
# `.*?` but in linear time: `.*?</think>\s*<answer>.*?</answer>` retried the rest of the
# text after every "</think><answer>", quadratic on a text full of them.
FORMATS = {
    'think_answer': r'\s*<think>(?>.*?</think>\s*<answer>).*?</answer>\s*',
    'reasoning_answer_strict': r'<reasoning>\n(?>.*?\n</reasoning>\n<answer>\n).*?\n</answer>\n',
    'reasoning_answer': r'(?>.*?<reasoning>)(?>.*?</reasoning>\s*<answer>).*?</answer>.*',
    'answer_tag': r'(?>.*?<answer>).*?</answer>.*',
    'boxed': r'.*\\boxed\s*\{.*',
}


def normalize(text: str, *, case_sensitive: bool = False) -> str:
  text = ' '.join(text.split()).strip(' $*.').strip()
  return text if case_sensitive else text.casefold()


def _final_answer(text: str) -> str:
  answer, _ = answer_extraction.final_answer(text)
  return text if answer is None else answer


def _golds(item: Mapping[str, Any]) -> list[str]:
  value = item.get('answer')
  if isinstance(value, list):
    if not value:
      raise V.ItemError(V.INVALID_INPUT, 'answer: empty list')
    return [V.gold_text({'answer': v}) for v in value]
  return [V.gold_text(item)]


@V.verifier
def verify_exact(item: Mapping[str, Any]) -> V.Verdict:
  """Item: completion, answer (text or a list of accepted texts); optional case_sensitive."""
  text = V.completion_text(item)
  case = V.option(item, 'case_sensitive', False, bool)
  got = normalize(_final_answer(text), case_sensitive=case)
  ok = any(got == normalize(g, case_sensitive=case) for g in _golds(item))
  return V.judged(ok, detail=got[:80])


@V.verifier
def verify_regex(item: Mapping[str, Any]) -> V.Verdict:
  """Item: completion, answer (a pattern); optional search (bool), ignore_case (bool)."""
  text = V.completion_text(item)
  flags = re.DOTALL | (re.IGNORECASE if V.option(item, 'ignore_case', False, bool) else 0)
  try:
    pattern = re.compile(V.gold_text(item), flags)
  except re.error as e:
    return V.failure(V.INVALID_INPUT, f'answer is not a valid pattern: {e}')
  if V.option(item, 'search', False, bool):
    return V.judged(pattern.search(text) is not None)
  return V.judged(pattern.fullmatch(_final_answer(text).strip()) is not None)


@V.verifier
def verify_format(item: Mapping[str, Any]) -> V.Verdict:
  """Item: completion, and `format` (a FORMATS name) or `pattern` (must match the whole text)."""
  text = V.completion_text(item)
  pattern = item.get('pattern')
  if pattern is None:
    name = V.option(item, 'format', 'think_answer', str)
    if name not in FORMATS:
      return V.failure(V.INVALID_INPUT, f'unknown format {name!r}; known: {", ".join(FORMATS)}')
    pattern = FORMATS[name]
  try:
    ok = re.fullmatch(pattern, text, re.DOTALL) is not None
  except (re.error, TypeError) as e:
    return V.failure(V.INVALID_INPUT, f'pattern is not valid: {e}')
  return V.judged(ok)
