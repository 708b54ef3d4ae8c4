"""The result every verifier returns, the outcome vocabulary, and safe field access.

A verifier is a plain function `item -> Verdict`, where an item is a mapping of JSON-able
fields: `completion` (the model's text), `answer` (the gold answer) and fields specific to
the verifier. Statuses:

  correct, wrong       the verifier judged the completion (wrong may carry partial credit);
  parse_failure        no answer could be extracted or parsed ("unparseable", not "wrong");
  invalid_input        the item itself is malformed (missing or ill-typed gold fields);
  timeout, crash       the pool gave up on the item, or the verifier raised;
  sandbox_violation    model-written code broke a sandbox rule or a resource limit.

Every status in `FAILURES` gets the caller's default reward: the pool overwrites the reward,
so a verifier can never hand out credit for an item it could not judge.

Not here: any verifier, batching, or reward composition.
"""

import dataclasses
import functools
import math
from typing import Any, Callable, Mapping

CORRECT = 'correct'
WRONG = 'wrong'
PARSE_FAILURE = 'parse_failure'
INVALID_INPUT = 'invalid_input'
TIMEOUT = 'timeout'
CRASH = 'crash'
SANDBOX_VIOLATION = 'sandbox_violation'
STATUSES = (CORRECT, WRONG, PARSE_FAILURE, INVALID_INPUT, TIMEOUT, CRASH, SANDBOX_VIOLATION)
FAILURES = frozenset((PARSE_FAILURE, INVALID_INPUT, TIMEOUT, CRASH, SANDBOX_VIOLATION))

# Long CoT completions run to ~100k characters (DAPO's 20k-token cap); far beyond that a
# completion is degenerate and scanning it only costs time.
MAX_COMPLETION_CHARS = 200_000
_MAX_DETAIL_CHARS = 300


@dataclasses.dataclass(frozen=True)
class Verdict:
  """One judged item: the reward, why, and named sub-scores for metrics and composition."""
  reward: float
  status: str
  components: Mapping[str, float] = dataclasses.field(default_factory=dict)
  detail: str = ''
  latency_s: float = 0.0

  def __post_init__(self):
    if self.status not in STATUSES:
      raise ValueError(f'Verdict.status={self.status!r}; known: {", ".join(STATUSES)}.')

  @property
  def failed(self) -> bool:
    return self.status in FAILURES


def failure(status: str, detail: str, *, reward: float = 0.0) -> Verdict:
  return Verdict(reward=reward, status=status, detail=detail[:_MAX_DETAIL_CHARS])


def judged(correct: bool, *, reward: float | None = None,
           components: Mapping[str, float] | None = None, detail: str = '') -> Verdict:
  """A correct/wrong verdict; reward defaults to 1/0."""
  if reward is None:
    reward = 1.0 if correct else 0.0
  return Verdict(reward=float(reward), status=CORRECT if correct else WRONG,
                 components=dict(components or {}), detail=detail[:_MAX_DETAIL_CHARS])


class ItemError(Exception):
  """Raised while reading an item; `verifier` turns it into a failure verdict."""

  def __init__(self, status: str, detail: str):
    super().__init__(detail)
    self.status = status
    self.detail = detail


def verifier(fn: Callable[[Mapping[str, Any]], Verdict]) -> Callable[[Mapping[str, Any]], Verdict]:
  """Marks `fn` as a verifier: malformed items become failure verdicts instead of raising."""

  @functools.wraps(fn)
  def wrapped(item: Mapping[str, Any]) -> Verdict:
    if not isinstance(item, Mapping):
      return failure(INVALID_INPUT, f'item is a {type(item).__name__}, not a mapping')
    try:
      return fn(item)
    except ItemError as e:
      return failure(e.status, e.detail)
    except RecursionError:
      # Deeply nested input that slipped past the guards: the completion is unparseable.
      return failure(PARSE_FAILURE, 'recursion limit while parsing')

  return wrapped


def _checked_text(value: Any, name: str, bad_text_status: str) -> str:
  if isinstance(value, (bytes, bytearray)):
    try:
      value = bytes(value).decode('utf-8')
    except UnicodeDecodeError as e:
      raise ItemError(bad_text_status,
                      f'{name}: invalid UTF-8 ({e.reason} at byte {e.start})') from None
  if not isinstance(value, str):
    raise ItemError(INVALID_INPUT, f'{name}: expected text, got {type(value).__name__}')
  try:
    # Lone surrogates (e.g. from a JSON "\udcff" or surrogateescape decoding) cannot be
    # written to a file or a subprocess; reject them here rather than deep inside a checker.
    value.encode('utf-8')
  except UnicodeEncodeError as e:
    raise ItemError(bad_text_status, f'{name}: invalid UTF-8 ({e.reason} at {e.start})') from None
  return value


def completion_text(item: Mapping[str, Any], *, max_chars: int = MAX_COMPLETION_CHARS) -> str:
  """The model's completion; missing is invalid input, bad or empty text is unparseable."""
  if 'completion' not in item or item['completion'] is None:
    raise ItemError(INVALID_INPUT, 'missing field: completion')
  text = _checked_text(item['completion'], 'completion', PARSE_FAILURE)
  if not text.strip():
    raise ItemError(PARSE_FAILURE, 'empty completion')
  if len(text) > max_chars:
    raise ItemError(PARSE_FAILURE, f'completion too long ({len(text)} > {max_chars} chars)')
  return text


def gold_text(item: Mapping[str, Any], name: str = 'answer') -> str:
  """A gold field as text (numbers are formatted); any problem is invalid input."""
  value = item.get(name)
  if value is None:
    raise ItemError(INVALID_INPUT, f'missing field: {name}')
  if isinstance(value, bool):
    raise ItemError(INVALID_INPUT, f'{name}: expected text or number, got bool')
  if isinstance(value, (int, float)):
    return repr(value) if isinstance(value, float) else str(value)
  text = _checked_text(value, name, INVALID_INPUT)
  if not text.strip():
    raise ItemError(INVALID_INPUT, f'empty field: {name}')
  return text


def option(item: Mapping[str, Any], name: str, default: Any, kind: type | tuple[type, ...]) -> Any:
  """An optional verifier-specific field, type-checked."""
  value = item.get(name, default)
  if value is None:
    return default
  if kind is float and isinstance(value, int) and not isinstance(value, bool):
    value = float(value)
  if not isinstance(value, kind) or (isinstance(value, bool) and kind is not bool):
    raise ItemError(INVALID_INPUT, f'{name}: expected {kind}, got {type(value).__name__}')
  return value


def positive_option(item: Mapping[str, Any], name: str, default: Any,
                    kind: type | tuple[type, ...]) -> Any:
  """`option` for a budget or a size: zero, negative, NaN or infinite is invalid input.

  A CPU budget of 0 would otherwise mean "no limit" to setitimer and setrlimit alike.
  """
  value = option(item, name, default, kind)
  if not (isinstance(value, (int, float)) and math.isfinite(value) and value > 0):
    raise ItemError(INVALID_INPUT, f'{name}: expected a positive finite number, got {value!r}')
  return value
