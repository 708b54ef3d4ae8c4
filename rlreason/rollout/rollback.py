"""CLEANER's rollback during episode collection: a failed tool call is replaced by its correction.

  episodes.run_episodes(..., rollback=Settings(error_classes=(('python', CLASSES),)))
  # per turn: save(state) before decoding, copy_state before env.step, Tracker.retry after

When a turn's tool call fails with a configured error class (each tool declares its own,
`tool.rollback_errors`: the Python exception names ImportError, ModuleNotFoundError,
SyntaxError, IndentationError, NameError for `python`; 'SyntaxError' for an expression the
calculator cannot parse), the environment's state is restored to before the turn, the error is
appended as a masked feedback turn (the reference code's user message), the model regenerates
the turn with the error in context, and then the row is rewound to before the failed call: the
cache slots written since the turn began are masked out, the RoPE position and the completion
columns go back to the turn's start, and the regenerated turn is prefilled there (as `observe`
prefills observations, the shapes fixed). The kept trajectory is exactly
[context][corrected call][tool result]...; the regenerated call then runs. A position (turn) is
retried at most `max_retries` times; past that the model is told (the reference's notice
replaces the tool's answer) and rollback is off for the rest of that episode. Errors outside the
configured classes are ordinary observations. No rollback at the last turn (the episode ends
there whatever the call returns).

Off-policy, explicitly: the corrected call's tokens were sampled with the error in context, so
the purified trajectory was never sampled as a whole. Those tokens keep their behaviour
log-probs (behaviour_logprobs_NxL: the sampler's, in the error context), their logprobs_NxL are
recomputed in the purified context by the prefill, and they carry VERSION_ROLLBACK in
version_NxL; the trainer's objective.correction (objectives/offpolicy.py) weights them by
π_prox/μ like any off-policy token. `metrics` logs rollbacks per episode, exhausted retries and
the mean |behaviour − purified| log-prob on those tokens.

Provenance: the mechanism (error classes, feedback and notice texts, 3 retries per position,
rollback off after the notice) as in the reference code of github Tianshi-Xu/Open-AgentRL
@85606f8, verl/verl/experimental/agent_loop/tool_agent_loop.py (`RollbackManager`,
`_handle_rollback`, `_handle_max_retry_exceeded`), the first author's; CLEANER is arXiv
2601.15141 (algorithms.md §21). Departures, each deliberate: (1) that code checkpoints after the
failed response was appended, so its restored trajectory keeps the failed call's tokens and
drops the corrected call's; here the corrected call replaces the failed one, as the paper
describes; (2) it matches the error patterns as substrings of the tool's text, here the tool's
declared error class is compared; (3) a regenerated turn without a call ends its episode there,
here it stands as the kept turn (an answer is scored). SAAR's similarity switch
(`replacement='saar'`) is our formalisation (the paper's abstract names difflib's ratio and
shallow vs deep replacement; no threshold was found, and the code has no switch): with
ratio(failed code, corrected code) >= `saar_threshold` the failed turn's reasoning (the text
before its call) is kept and only the call is swapped (shallow); otherwise the whole
regenerated turn replaces it (deep, the default and CLEANER's behaviour).

Not here: the episode loop (episodes.py calls in), the correction itself (offpolicy.py).
"""

import copy
import dataclasses
import difflib
import functools
from typing import Callable, Sequence

import flax
import jax
import jax.numpy as jnp
import numpy as np

from rlreason.model import transformer
from rlreason.structs import VERSION_ROLLBACK  # a corrected call's tokens' provenance mark

# The reference code's texts (RollbackManager.format_error_feedback, _handle_max_retry_exceeded).
FEEDBACK = ('The previous tool call(s) failed with the following error(s):\n{errors}\n'
            'Please correct the error and generate a new tool call.')
NOTICE = ('Tool call failure happened after {retries} attempts. The last error was:\n\n'
          "Tool '{tool}' error: {error}\n\nThe current approach may have technical limitations. "
          'Consider: (1) breaking into smaller steps, or(2) using alternative methods.')
REPLACEMENTS = ('deep', 'saar')
_CALL_START = {'tags': '<call>', 'qwen': '<tool_call>', 'llama3': ''}


@dataclasses.dataclass(frozen=True)
class Settings:
  """error_classes: (tool, classes) pairs; feedback: the feedback text, with '{errors}' (the
  failures' messages, numbered as the reference code does) or '{error}' (the last one's)."""
  error_classes: tuple[tuple[str, tuple[str, ...]], ...]
  max_retries: int = 3
  replacement: str = 'deep'
  saar_threshold: float = 0.5
  feedback: str = FEEDBACK

  def classes(self, tool: str) -> tuple[str, ...]:
    return dict(self.error_classes).get(tool, ())


def default_classes(tool_names: Sequence[str]) -> dict[str, tuple[str, ...]]:
  """Each tool's declared classes (`rollback_errors`; none if it declares none)."""
  from rlreason.envs import registry
  return {name: tuple(getattr(registry.get_tool(name), 'rollback_errors', ()))
          for name in tool_names}


def config_errors(r, *, tools: Sequence[str], max_turns: int) -> list[str]:
  """What is wrong with an env.rollback block, as sentences naming the field."""
  errors = []
  if not (isinstance(r.max_retries, int) and r.max_retries >= 1):
    errors.append(f'env.rollback.max_retries={r.max_retries!r} must be an integer >= 1.')
  if r.replacement not in REPLACEMENTS:
    errors.append(f'env.rollback.replacement={r.replacement!r}; known: {list(REPLACEMENTS)}.')
  if not 0.0 <= r.saar_threshold <= 1.0:
    errors.append(f'env.rollback.saar_threshold={r.saar_threshold} must be in [0, 1] '
                  '(a difflib ratio).')
  if r.feedback and '{errors}' not in r.feedback and '{error}' not in r.feedback:
    errors.append("env.rollback.feedback must contain '{errors}' (the numbered errors) or "
                  "'{error}' (the last one's message).")
  if max_turns < 2:
    errors.append(f'env.rollback needs env.max_turns >= 2 (got {max_turns}): there is no rollback '
                  'at the last turn.')
  unknown = [t for t in r.error_classes if t not in tools]
  if unknown:
    errors.append(f'env.rollback.error_classes names tool(s) {unknown} not in '
                  f'env.tools={list(tools)}.')
  for tool, classes in r.error_classes.items():
    if isinstance(classes, str) or not all(isinstance(c, str) and c.isidentifier()
                                           for c in classes):
      errors.append(f'env.rollback.error_classes.{tool}={classes!r} must be a list of class '
                    "names, e.g. ['SyntaxError'].")
  try:
    merged = {**default_classes([t for t in tools]), **dict(r.error_classes)}
  except ValueError:
    return errors  # An unknown tool: env.tools's own check names it.
  if not any(merged.get(t) for t in tools):
    errors.append(f'env.rollback.enabled, but no tool of env.tools={list(tools)} has error '
                  'classes: set env.rollback.error_classes, e.g. {"calculator": ["SyntaxError"]}.')
  return errors


def from_config(e) -> Settings | None:
  """Settings from config.env (None unless env.rollback.enabled)."""
  r = e.rollback
  if not r.enabled:
    return None
  classes = {**default_classes(tuple(e.tools)), **{k: tuple(v) for k, v in r.error_classes.items()}}
  return Settings(error_classes=tuple(sorted(classes.items())), max_retries=int(r.max_retries),
                  replacement=r.replacement, saar_threshold=float(r.saar_threshold),
                  feedback=r.feedback or FEEDBACK)


def extra_slots(settings: Settings, *, max_turns: int, max_turn_tokens: int,
                max_observation_tokens: int) -> int:
  """Cache slots rollback rounds may take: per turn but the last, `max_retries` rounds of a
  feedback observation, a regenerated turn and its prefill."""
  return ((max_turns - 1) * settings.max_retries *
          (max_observation_tokens + 2 * max_turn_tokens))


@flax.struct.dataclass
class Saved:
  """A batch's device state at a turn's start: what a rolled-back row returns to."""
  pos_N: jax.Array
  logits_NxV: jax.Array
  count_N: jax.Array
  end: jax.Array


def save(state) -> Saved:
  return Saved(pos_N=state.cache.pos_N, logits_NxV=state.logits_NxV, count_N=state.count_N,
               end=state.cache.end)


def copy_state(state):
  """A deep copy of an environment's episode state that shares the example (read-only)."""
  example = getattr(state, 'example', None)
  return copy.deepcopy(state, memo={id(example): example} if example is not None else None)


def similarity(failed_code: str, corrected_code: str) -> float:
  """SAAR's code similarity: difflib.SequenceMatcher's ratio (2·matches / total length)."""
  return difflib.SequenceMatcher(None, failed_code, corrected_code).ratio()


def split_at_call(tok, ids: Sequence[int], family: str) -> int:
  """How many of a turn's tokens come before its call (its reasoning): the first token whose
  text reaches the call's opening marker starts the call. len(ids) if there is no call."""
  marker = _CALL_START.get(family, '')
  text = tok.decode(list(ids), skip_special_tokens=True)
  at = text.find(marker) if marker else 0
  if at < 0:
    return len(ids)
  for i in range(len(ids)):
    if len(tok.decode(list(ids[:i + 1]), skip_special_tokens=True)) > at:
      return i
  return len(ids)


def kept_turn(tok, family: str, failed_ids, failed_blogp, new_ids, new_blogp, *,
              settings: Settings, width: int):
  """(ids, behaviour log-probs, first off-policy index, mode) of the turn that stands.

  deep: the regenerated turn (all of it off-policy). saar: shallow when the calls' similarity
  reaches the threshold and both turns have reasoning before the call: the failed turn's
  reasoning (sampled in the purified context: on-policy) + the regenerated call; deep otherwise,
  and when the two would not fit in `width` tokens.
  """
  deep = (list(new_ids), list(new_blogp), 0, 'deep')
  if settings.replacement == 'deep':
    return deep
  i, j = split_at_call(tok, failed_ids, family), split_at_call(tok, new_ids, family)
  if i == 0 or i == len(failed_ids) or j == len(new_ids) or i + len(new_ids) - j > width:
    return deep
  code = lambda ids: tok.decode(list(ids), skip_special_tokens=True)
  if similarity(code(failed_ids[i:]), code(new_ids[j:])) < settings.saar_threshold:
    return deep
  return (list(failed_ids[:i]) + list(new_ids[j:]), list(failed_blogp[:i]) + list(new_blogp[j:]),
          i, 'shallow')


@functools.lru_cache(maxsize=16)
def replace_fn(*, cfg, length: int, pad_id: int, width: int, greedy: bool):
  """jit(replace): rewinds `rolling_N` rows to `saved` and prefills their kept turn there.

  replace(params, state, saved, kept_NxW, behaviour_NxW, kept_len_N, rolling_N, turn,
  temperature) -> state. The cache slots written since the turn began are masked out for those
  rows (the failed call, the feedback, the regenerated turn: attention skips masked slots, so
  the row's keys are those of its kept tokens only) and pos_N is reset, so the prefill's RoPE
  positions continue the context; the completion columns from the turn's start are cleared and
  the kept turn written there, with log-probs recomputed in the purified context (the tempered
  softmax the decode records) and the given behaviour log-probs. Other rows: unchanged (their
  slots of this call are masked).
  """

  def replace(params, state, saved: Saved, kept_NxW, behaviour_NxW, kept_len_N, rolling_N, turn,
              temperature):
    cache = state.cache
    n, s = cache.mask_NxS.shape
    slot_S = jnp.arange(s)
    stale_NxS = (rolling_N[:, None] & (slot_S[None] >= saved.end) & (slot_S[None] < cache.end))
    cache = cache.replace(mask_NxS=cache.mask_NxS & ~stale_NxS,
                          pos_N=jnp.where(rolling_N, saved.pos_N, cache.pos_N))
    mask_NxW = rolling_N[:, None] & (jnp.arange(width)[None] < kept_len_N[:, None])
    h_NxWxD, cache = transformer.apply(params, kept_NxW, cfg=cfg, mask_NxT=mask_NxW, cache=cache,
                                       return_hidden=True)
    logits_NxWxV = transformer.logits_from_hidden(params, h_NxWxD, cfg=cfg)
    prev_NxWxV = jnp.concatenate([saved.logits_NxV[:, None].astype(jnp.float32),
                                  logits_NxWxV[:, :-1]], axis=1)
    if not greedy:
      prev_NxWxV = prev_NxWxV / temperature
    logp_NxW = jnp.take_along_axis(jax.nn.log_softmax(prev_NxWxV, -1), kept_NxW[..., None],
                                   -1)[..., 0]
    last_N = jnp.maximum(kept_len_N - 1, 0)
    last_NxV = jnp.take_along_axis(logits_NxWxV, last_N[:, None, None], axis=1)[:, 0]
    start_N = saved.count_N
    clear_NxL = rolling_N[:, None] & (jnp.arange(length)[None] >= start_N[:, None])
    cols_NxW = jnp.where(mask_NxW, start_N[:, None] + jnp.arange(width)[None], length)

    def put(buf, x_NxW, fill):
      buf = jnp.where(clear_NxL, jnp.asarray(fill, buf.dtype), buf)
      return buf.at[jnp.arange(n)[:, None], cols_NxW].set(x_NxW.astype(buf.dtype), mode='drop')

    return state.replace(
        cache=cache, logits_NxV=jnp.where(rolling_N[:, None], last_NxV, state.logits_NxV),
        tokens_NxL=put(state.tokens_NxL, kept_NxW, pad_id),
        logp_NxL=put(state.logp_NxL, logp_NxW, 0.0),
        blogp_NxL=put(state.blogp_NxL, behaviour_NxW, 0.0),
        sampled_NxL=put(state.sampled_NxL, jnp.ones_like(mask_NxW), False),
        turn_NxL=put(state.turn_NxL, jnp.broadcast_to(turn, kept_NxW.shape), 0),
        count_N=jnp.where(rolling_N, start_N + kept_len_N, state.count_N))

  return jax.jit(replace)


@dataclasses.dataclass
class Stats:
  """Per episode: rollback rounds, whether retries ran out (the notice was given), sampled
  tokens that were discarded (failed calls, replaced reasoning), and the off-policy mask."""
  rollbacks_N: np.ndarray
  exhausted_N: np.ndarray
  discarded_tokens_N: np.ndarray
  offpolicy_NxL: np.ndarray  # bool: a corrected call's token (VERSION_ROLLBACK)


class Tracker:
  """The host side of rollback for one batch of episodes (see the module docstring)."""

  def __init__(self, settings: Settings, *, n: int, length: int, env, tok, renderer,
               fit: Callable, observation_width: int, turn_width: int, eos: Sequence[int],
               pool, cfg, pad_id: int, greedy: bool):
    self.settings, self.env, self.tok, self.renderer, self.fit = settings, env, tok, renderer, fit
    self.family = getattr(getattr(env, 'format', None), 'family', 'tags')
    self.observation_width, self.turn_width, self.eos = observation_width, turn_width, set(eos)
    self.pool, self.length = pool, length
    self.replace = replace_fn(cfg=cfg, length=length, pad_id=int(pad_id), width=turn_width,
                              greedy=greedy)
    self.retries = [dict() for _ in range(n)]  # per row: turn -> retries used there
    self.disabled = np.zeros(n, bool)
    self.rollbacks = np.zeros(n, np.int32)
    self.discarded = np.zeros(n, np.int32)
    self.offpolicy = [dict() for _ in range(n)]  # per row: turn -> (first column, length)
    self.attempts = [dict() for _ in range(n)]  # per row: turn -> [{'text', 'errors'}, ...]

  def _failures(self, r: int, step) -> list[tuple[str, str, str]]:
    """The configured-class failures of a step, [] when rollback does not apply to row r."""
    if self.disabled[r] or step.done:
      return []
    return [(tool, cls, msg) for tool, cls, msg in step.info.get('error_classes', ())
            if cls is not None and cls in self.settings.classes(tool)]

  def _notice(self, step, failures):
    tool, _, message = failures[-1]
    text = NOTICE.format(retries=self.settings.max_retries, tool=tool, error=message)
    fmt = getattr(self.env, 'format', None)
    messages = [fmt.tool_message(text, _call(tool))] if fmt is not None else [
        {'role': 'tool', 'content': text}]
    return dataclasses.replace(step, info={**step.info, 'messages': messages,
                                           'rollback_notice': True})

  def retry(self, params, state, saved: Saved, *, turn: int, rows, turn_ids, texts, steps,
            snapshots, states, count, decode, observe, temperature, rng):
    """Rolls back every row whose turn failed with a configured class, up to max_retries
    rounds; returns (state, turn_ids, texts, steps) with the kept turns and their steps."""
    turn_ids, texts, steps = list(turn_ids), list(texts), list(steps)
    for round_ in range(self.settings.max_retries + 1):
      rolling, feedback = [], {}
      for i, r in enumerate(rows):
        failures = self._failures(r, steps[i])
        if not failures:
          continue
        if self.retries[r].get(turn, 0) >= self.settings.max_retries:
          steps[i] = self._notice(steps[i], failures)
          self.disabled[r] = True
          continue
        errors = ''.join(f'{k + 1}. {msg}\n' for k, (_, _, msg) in enumerate(failures))
        content = self.settings.feedback.format(errors=errors, error=failures[-1][2])
        message = {'role': 'user', 'content': content}
        ended = bool(turn_ids[i]) and turn_ids[i][-1] in self.eos
        ids = self.fit(self.tok, self.renderer, [message], ended, self.observation_width)
        now = int(count[r]) + len(turn_ids[i])  # the failed turn is in the columns
        if not ids or now + len(ids) >= self.length - 1:
          continue  # No room to regenerate: the failure stays an ordinary observation.
        rolling.append(i)
        feedback[i] = ids
        self.attempts[r].setdefault(turn, []).append(
            {'text': texts[i], 'errors': [[t, c, m] for t, c, m in failures]})
      if not rolling:
        break
      n = state.count_N.shape[0]
      obs = np.zeros((n, self.observation_width), np.int32)
      obs_mask = np.zeros((n, self.observation_width), bool)
      live = np.zeros(n, bool)
      for i in rolling:
        r = rows[i]
        self.retries[r][turn] = self.retries[r].get(turn, 0) + 1
        self.rollbacks[r] += 1
        states[r] = copy_state(snapshots[i])
        obs[r, :len(feedback[i])], obs_mask[r, :len(feedback[i])] = feedback[i], True
        live[r] = True
      state = observe(params, state, jnp.asarray(obs), jnp.asarray(obs_mask), jnp.int32(turn))
      before = np.asarray(jax.device_get(state.count_N))
      state = decode(params, state, jnp.asarray(live), jnp.int32(turn), temperature,
                     jax.random.fold_in(jax.random.fold_in(rng, turn), 1 + round_))
      tokens, blogp, after = jax.device_get((state.tokens_NxL, state.blogp_NxL, state.count_N))
      kept = np.zeros((n, self.turn_width), np.int32)
      kept_blogp = np.zeros((n, self.turn_width), np.float32)
      kept_len = np.zeros(n, np.int32)
      for i in rolling:
        r, start = rows[i], int(count[r])
        failed = slice(start, start + len(turn_ids[i]))
        new = slice(int(before[r]), int(after[r]))
        ids, bl, first, mode = kept_turn(
            self.tok, self.family, tokens[r, failed].tolist(), blogp[r, failed].tolist(),
            tokens[r, new].tolist(), blogp[r, new].tolist(), settings=self.settings,
            width=self.turn_width)
        # Every sampled token of the failed and the regenerated turn that is not kept.
        self.discarded[r] += len(turn_ids[i]) + (new.stop - new.start) - len(ids)
        kept[r, :len(ids)], kept_blogp[r, :len(ids)], kept_len[r] = ids, bl, len(ids)
        self.offpolicy[r][turn] = (start + first, len(ids) - first)
        self.attempts[r][turn][-1]['replacement'] = mode
        turn_ids[i] = ids
      state = self.replace(params, state, saved, jnp.asarray(kept), jnp.asarray(kept_blogp),
                           jnp.asarray(kept_len), jnp.asarray(live), jnp.int32(turn),
                           temperature)
      texts_now = self.tok.decode_batch([turn_ids[i] for i in rolling], skip_special_tokens=True)
      new_steps = list(self.pool.map(lambda a: self.env.step(states[rows[a[0]]], a[1]),
                                     zip(rolling, texts_now)))
      for i, text, step in zip(rolling, texts_now, new_steps):
        texts[i], steps[i] = text, step
    return state, turn_ids, texts, steps

  def stats(self) -> Stats:
    n = len(self.retries)
    mask = np.zeros((n, self.length), bool)
    for r, turns in enumerate(self.offpolicy):
      for start, size in turns.values():
        mask[r, start:start + size] = True
    return Stats(rollbacks_N=self.rollbacks.copy(), exhausted_N=self.disabled.copy(),
                 discarded_tokens_N=self.discarded.copy(), offpolicy_NxL=mask)

  def tag(self, rollout, stats: Stats):
    """The rollout with VERSION_ROLLBACK on corrected calls' tokens (0 elsewhere: the loop's
    rl_batch.tag_versions puts the step's version there and keeps the negative marks)."""
    mask = jnp.asarray(stats.offpolicy_NxL) & rollout.loss_mask_NxL
    return rollout.replace(version_NxL=jnp.where(mask, VERSION_ROLLBACK, 0).astype(jnp.int32))


def _call(tool: str):
  from rlreason.envs import base
  return base.ToolCall(tool, {})


def metrics(episodes) -> dict[str, float]:
  """The fraction of kept turns whose tool calls failed (for every run) and, with rollback,
  the fraction of kept turns that were rolled back, rollbacks per episode, exhausted retries,
  discarded sampled tokens and the mean |behaviour − purified| log-prob on the corrected
  calls' tokens."""
  turns = [e for t in episodes.transcripts for e in t]
  out = {'episodes/error_turn_frac': float(np.mean([bool(e.get('failed')) for e in turns]))
         if turns else 0.0}
  stats = getattr(episodes, 'rollback', None)
  if stats is None:
    return out
  # Kept turns whose first sampled call failed with a configured class and was rolled back:
  # with error_turn_frac, the policy's own error rate before any rollback.
  out['rollback/turn_frac'] = float(np.mean([bool(e.get('rollbacks')) for e in turns]))
  r = episodes.rollout
  mask = stats.offpolicy_NxL & np.asarray(jax.device_get(r.loss_mask_NxL))
  diff = np.abs(np.asarray(jax.device_get(r.behaviour_logprobs_NxL)) -
                np.asarray(jax.device_get(r.logprobs_NxL)))
  out.update({
      'rollback/rollbacks_mean': float(stats.rollbacks_N.mean()),
      'rollback/episode_frac': float((stats.rollbacks_N > 0).mean()),
      'rollback/exhausted_frac': float(stats.exhausted_N.mean()),
      'rollback/discarded_tokens_mean': float(stats.discarded_tokens_N.mean()),
      'rollback/token_frac': float(mask.sum() / max(1, np.asarray(r.loss_mask_NxL).sum())),
      'rollback/abs_logprob_diff': float(diff[mask].mean()) if mask.any() else 0.0,
  })
  return out
