"""SLATE's steps and its model judge: a ternary score per step dimension (think, query, answer).

  judge = envs.slate_rules.SearchRuleJudge(verify=env.verify)   # search_qa, no model
  judge = ModelStepJudge(judge_lib.Judge(...))                  # any task, a model judge
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
judge.py reads it (label log-probs, not a generated verdict): our formalisation. The rule
judge of search_qa is envs/slate_rules.py (host-side, it runs the search tool).
Deliberately not here: the early-answer bonus and the step reward (slate.py), generated
critiques.
"""

import dataclasses
import re

import numpy as np

from rlreason.rollout import judge as judge_lib

# What opens a call in each format's text (llama3: the whole turn is the call).
CALL_OPENERS = {'tags': '<call>', 'qwen': '<tool_call>', 'llama3': ''}
_THINK = re.compile(r'<think>(.*?)(?:</think>|\Z)', re.DOTALL)


@dataclasses.dataclass(frozen=True)
class Step:
  """One candidate step as the judges read it."""
  text: str
  thinking: str
  kind: str  # 'search' | 'answer'
  content: str  # the answer's text, or the search step's queries
  calls: tuple = ()  # envs.base.ToolCall
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
