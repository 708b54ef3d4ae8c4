"""Pulling the final answer out of a completion: \\boxed{}, <tag>...</tag>, `####`, "answer is".

Every function is linear in the completion length and bounded in what it returns, so a
megabyte of `\\boxed{\\boxed{...` costs a scan, not a parse. Each returns None when its
format is absent; which formats a verifier accepts, and in what order, is the verifier's
choice.

Not here: parsing or judging the extracted text.
"""

import re

MAX_ANSWER_CHARS = 1000  # MATH's longest gold answer is ~100 chars; beyond 1000 is junk.
_BOXED = re.compile(r'\\(?:boxed|fbox)\s*\{')
_ANSWER_IS = re.compile(r'answer\s*(?:is|:)\s*[:=]?\s*', re.IGNORECASE)
_THOUSANDS = re.compile(r'^-?\d{1,3}(?:,\d{3})+(?:\.\d+)?$')
_TRIM = ' \t\r\n.$*`'


def _balanced(text: str, start: int) -> str | None:
  """The brace group opening at text[start - 1] == '{', or None if it never closes.

  Stops after MAX_ANSWER_CHARS + 1 characters and returns those, so callers see an
  over-long answer as such instead of scanning on.
  """
  depth = 1
  end = min(len(text), start + MAX_ANSWER_CHARS + 1)
  for i in range(start, end):
    c = text[i]
    if c == '{':
      depth += 1
    elif c == '}':
      depth -= 1
      if depth == 0:
        return text[start:i]
  return text[start:end] if end < len(text) else None


def last_boxed(text: str, *, tries: int = 3) -> str | None:
  """Content of the last closed \\boxed{...} (or \\fbox{...}).

  A truncated completion often ends in an unclosed box; the last few earlier boxes are
  tried before giving up, but only a few, so a flood of `\\boxed{` stays linear.
  """
  positions = [m.end() for m in _BOXED.finditer(text)]
  for start in reversed(positions[-tries:]):
    content = _balanced(text, start)
    if content is not None:
      return content.strip()
  return None


def last_tag(text: str, tag: str) -> str | None:
  """Content of the last complete <tag>...</tag> block."""
  close = text.rfind(f'</{tag}>')
  if close < 0:
    return None
  open_ = text.rfind(f'<{tag}>', 0, close)
  if open_ < 0:
    return None
  return text[open_ + len(tag) + 2:close].strip()


def after_hashes(text: str) -> str | None:
  """GSM8K's final line: the text after the last `####`, up to the end of that line."""
  i = text.rfind('####')
  if i < 0:
    return None
  line = text[i + 4:].split('\n', 1)[0].strip(_TRIM)
  return line[:MAX_ANSWER_CHARS + 1] or None


def after_answer_is(text: str) -> str | None:
  """The rest of the line after the last "answer is" / "answer:" (case-insensitive)."""
  tail = text[-4 * MAX_ANSWER_CHARS:]
  matches = list(_ANSWER_IS.finditer(tail))
  if not matches:
    return None
  line = tail[matches[-1].end():].split('\n', 1)[0].strip(_TRIM)
  return line or None


def strip_thousands(answer: str) -> str:
  """'1,234,567' -> '1234567'; other text unchanged (a comma may separate tuple entries)."""
  return answer.replace(',', '') if _THOUSANDS.match(answer.strip()) else answer


def final_answer(text: str, *, tags: tuple[str, ...] = ('answer',)) -> tuple[str | None, str]:
  """The final answer and which format held it, trying tags, boxed, ####, "answer is"."""
  for tag in tags:
    found = last_tag(text, tag)
    if found:
      boxed = last_boxed(found)
      return (boxed if boxed is not None else found), f'<{tag}>'
  for name, extract in (('boxed', last_boxed), ('####', after_hashes),
                        ('answer is', after_answer_is)):
    found = extract(text)
    if found:
      return found, name
  return None, 'none'
