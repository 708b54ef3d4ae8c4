"""SLATE's step judges: a ternary score per step dimension (think, query, answer).

  judge = SearchRuleJudge(verify=env.verify)           # search_qa, no model
  judge = ModelStepJudge(judge_lib.Judge(...))        # any task, a model judge
  scores_Kx2 = judge.score(examples, histories, candidates, params=...)[b]
  # column 0: r_think, column 1: r_query (a search step) or r_answer (an answer step)

A step is one assistant turn (`parse_step`): a turn with a tool call (or a malformed one) is a
search step, a turn without one is an answer step (as envs.environment reads it). Its
reasoning is the text inside <think>...</think>, or else, in a search step, the text before
the call. `histories[b]` holds the chosen steps so far, each {'text', 'observation'}.

Provenance. Three dimensions on {-1, 0, +1}, judged separately, the search step scored on
thinking and query, the answer step on thinking and answer: reference code (algoprog/SLATE
@09223bc, slate/rewards/llm_judge.py, `evaluate_candidates_batch`). The model judge's rubrics
restate that file's three criteria lists in our words, and ask for one label token, read as
judge.py reads it (label log-probs, not a generated verdict): our formalisation. The rule judge
is our formalisation of those rubrics on search_qa, where the facts are known:
  think   0 if empty; +1 if it names the entity the next unresolved hop starts from (the
          answer once every hop is resolved); 0 if it names another entity of the question or
          of what was retrieved; -1 if it names none (irrelevant).
  query   -1 if malformed, not a search call, or failing in the tool; +1 if its top-k hits
          hold a fact of the gold chain not yet retrieved (progress); -1 if the chain facts it
          hits were all retrieved already (redundant, the rubric's -1); 0 if it hits no chain
          fact but names a known entity (targeted, not productive); -1 otherwise.
  answer  +1 if the environment's verifier accepts it; 0 if the gold answer occurs in it
          (ambiguous or padded); -1 otherwise.
Deliberately not here: the early-answer bonus and the step reward (slate.py), generated
critiques.
"""

import dataclasses
import re
from typing import Any, Sequence

import numpy as np

from rlreason.envs import base
from rlreason.envs import search
from rlreason.rollout import judge as judge_lib

# What opens a call in each format's text (llama3: the whole turn is the call).
CALL_OPENERS = {'tags': '<call>', 'qwen': '<tool_call>', 'llama3': ''}
_THINK = re.compile(r'<think>(.*?)(?:</think>|\Z)', re.DOTALL)
_NAME = re.compile(r'[A-Z][a-z]+')


@dataclasses.dataclass(frozen=True)
class Step:
  """One candidate step as the judges read it."""
  text: str
  thinking: str
  kind: str  # 'search' | 'answer'
  content: str  # the answer's text, or the search step's queries
  calls: tuple[base.ToolCall, ...] = ()
  errors: tuple[str, ...] = ()


def parse_step(text: str, fmt) -> Step:
  """Splits a turn into reasoning and action, with `fmt` (envs.formats.Format)'s calls."""
  calls, errors = fmt.parse_calls(text)
  match = _THINK.search(text)
  after = text[match.end():] if match else text
  kind = 'search' if calls or errors else 'answer'
  if match:
    thinking = match.group(1)
  elif kind == 'search':
    opener = CALL_OPENERS.get(fmt.family, '')
    thinking = text.split(opener, 1)[0] if opener and opener in text else ''
  else:
    thinking = ''
  # A search step's content is its queries (what the query rubric judges), else the call text.
  content = ('; '.join(str(c.arguments.get('query', '')) for c in calls) or after
             if kind == 'search' else after)
  return Step(text=text, thinking=thinking.strip(), kind=kind, content=content.strip(),
              calls=tuple(calls), errors=tuple(errors))


def _names(text: str) -> set[str]:
  return set(_NAME.findall(text))


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
            candidates: Sequence[Sequence[Step]], *, params=None) -> list[np.ndarray]:
    del params  # No model.
    return [np.array([self.score_step(ex, hist, c) for c in cands], np.float32).reshape(-1, 2)
            for ex, hist, cands in zip(examples, histories, candidates)]

  def score_step(self, example, history: Sequence[dict], step: Step) -> tuple[float, float]:
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

  def _answer(self, example, step: Step) -> float:
    verdict = self.verify({'completion': step.content, 'answer': example.answer})
    if not verdict.failed and verdict.reward > 0:
      return 1.0
    return 0.0 if example.answer and example.answer in step.content else -1.0

  def _query(self, example, step: Step, facts, seen: str, known: set[str]) -> float:
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


THINK_RUBRIC = (
    'You are grading one reasoning step of an agent that answers a question with a search '
    'engine.\n\nQuestion and what it has found so far:\n{context}\n\nReasoning step:\n{step}\n\n'
    'Is it relevant, clear, specific about the information still missing, making progress, and '
    'faithful to the context (nothing invented)? Answer with one character: "+" good, "0" '
    'vague or minimal progress, "-" irrelevant or misleading.')
QUERY_RUBRIC = (
    'You are grading one search query of an agent that answers a question in several '
    'searches.\n\nQuestion and what it has found so far:\n{context}\n\nReasoning before the '
    'query:\n{thinking}\n\nQuery:\n{step}\n\nWill it retrieve new information that makes '
    'progress (an intermediate fact counts), with specific keywords, consistent with the '
    'reasoning and not redundant with the context? Answer with one character: "+" good, "0" '
    'could be more specific, "-" generic, irrelevant, redundant or malformed.')
ANSWER_RUBRIC = (
    'You are grading the final answer of an agent.\n\nQuestion and what it has found:\n'
    '{context}\n\nGround truth: {truth}\n\nPredicted answer:\n{step}\n\nDoes the prediction '
    'convey the ground truth? Answer with one character: "+" correct, "0" partly correct or '
    'ambiguous, "-" wrong.')


class ModelStepJudge:
  """SLATE's three rubrics scored by a judge.py model (its labels, buckets, score mode)."""

  def __init__(self, judge: judge_lib.Judge):
    self.judge = judge

  def _render(self, text: str) -> list[int]:
    j = self.judge
    if j.use_chat_template and j.tok.chat_template is not None:
      text = j.tok.apply_chat_template([{'role': 'user', 'content': text}],
                                       add_generation_prompt=True, **dict(j.chat_kwargs))
    ids = j.tok.encode(text + j.response_prefix)
    longest = j.prompt_buckets[-1]
    # As judge.prompt_ids: keep the first quarter and the end, where the label follows.
    return ids if len(ids) <= longest else ids[:longest // 4] + ids[len(ids) - (
        longest - longest // 4):]

  def score(self, examples, histories, candidates, *, params=None) -> list[np.ndarray]:
    prompts = []
    for ex, hist, cands in zip(examples, histories, candidates):
      context = '\n'.join([f'Question: {ex.prompt}'] + [
          f'Step: {h["text"]}\nRetrieved: {h.get("observation") or ""}' for h in hist])
      for c in cands:
        prompts.append(THINK_RUBRIC.format(context=context, step=c.thinking or '(none)'))
        prompts.append(QUERY_RUBRIC.format(context=context, thinking=c.thinking or '(none)',
                                           step=c.content) if c.kind == 'search' else
                       ANSWER_RUBRIC.format(context=context, truth=ex.answer, step=c.content))
    params = self.judge.params if self.judge.params is not None else params
    lp_Mx3 = self.judge.label_logprobs([self._render(p) for p in prompts], params=params)
    scores = judge_lib.step_scores(lp_Mx3, mode=self.judge.score_mode).reshape(-1, 2)
    out, at = [], 0
    for cands in candidates:
      out.append(scores[at:at + len(cands)])
      at += len(cands)
    return out
