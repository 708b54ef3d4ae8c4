"""A noisy SFT teacher for kb_qa: the gold action sequence, or a plausible wrong procedure.

  segments = kb_trace(example, rng, gold_prob=0.3)   # [[text, trained], ...], 'tags' format

KBQA-R1 (arXiv 2512.10999) synthesises its cold-start traces with a model and keeps only
those whose actions match the ground-truth logical form (Referenced Rejection Sampling,
methods/rejection_sampling.py) [S: abstract and project page]. This teacher stands in for that
model (our formalisation): with probability `gold_prob` it runs the example's gold calls
(envs.tasks.resolved_gold_calls); otherwise a wrong procedure of the kind a model that has
not grounded the question writes, one per kb_qa question kind:

  question                              gold actions                     wrong procedure
  In which city is the employer of P    neighbours(P, employer),         neighbours(P, lives_in),
  located?                              neighbours(C, located_in)        its city
  How many people work for C?           neighbours(C, employer^-1),      ... then count([C]) = 1
                                        count(those)
  Who works for C and lives in X?       neighbours(C, employer^-1),      neighbours(C, employer^-1),
                                        neighbours(X, lives_in^-1),      its first person
                                        intersection

Each wrong procedure is sometimes right by luck (the person lives where the employer is; one
employee; the first employee is the one), so a filter on the final answer alone keeps some of
them, and only a filter on the action sequence rejects them all. Every observation is the kb
tool's output, run through base.run_tool, in TextRenderer's `<result>...</result>`: exactly
what the environment shows (tests/kbqa_r1_test.py replays the traces).

Not here: the filter (methods/rejection_sampling.py), other tools' teachers (tasks.calculator_trace).
"""

import json
from typing import Callable

from rlreason.envs import base
from rlreason.envs import registry
from rlreason.envs import render
from rlreason.envs import tasks as env_tasks
from rlreason.tasks import example as example_lib

KINDS = ('hop', 'count', 'both')


def question_kind(gold_calls) -> str:
  """'hop' (employer's city), 'count' (employees) or 'both' (employer and city), from the
  shape of kb_qa's gold calls."""
  actions = [c.arguments['action'] for c in gold_calls]
  if actions == ['neighbours', 'neighbours']:
    return 'hop'
  if actions == ['neighbours', 'count']:
    return 'count'
  if actions == ['neighbours', 'neighbours', 'intersection']:
    return 'both'
  raise ValueError(f'kb_trace: gold calls {actions} are not a kb_qa question kind')


def call_text(call: base.ToolCall) -> str:
  """The tags format's call, its JSON without spaces (fewer tokens for a character model)."""
  return f'<call>{call.name}: {json.dumps(dict(call.arguments), separators=(",", ":"))}</call>'


def _wrong_procedure(kind: str, gold) -> tuple[list[base.ToolCall], Callable]:
  """The wrong calls and how their outputs give the answer."""
  first = gold[0].arguments['entity']
  neighbours = lambda entity, relation: base.ToolCall(
      'kb', {'action': 'neighbours', 'entity': entity, 'relation': relation})
  if kind == 'hop':
    return [neighbours(first, 'lives_in')], lambda outs: json.loads(outs[-1])[0]
  if kind == 'count':
    return ([gold[0], base.ToolCall('kb', {'action': 'count', 'entities': [first]})],
            lambda outs: outs[-1])
  return [gold[0]], lambda outs: json.loads(outs[-1])[0]


def kb_trace(example: example_lib.Example, rng, *, gold_prob: float = 0.5,
             answer_prefix: str = '#### ') -> list[list]:
  """One episode as [text, trained] segments: a turn per call, its observation (never
  trained), the final answer after `answer_prefix` (the exact verifier reads what follows)."""
  if not 0 <= gold_prob <= 1:
    raise ValueError(f'kb_trace: gold_prob={gold_prob} must be in [0, 1]')
  gold = env_tasks.resolved_gold_calls(example)
  kind = question_kind(gold)
  if rng.random() < gold_prob:
    calls, answer_of = gold, lambda outs: example.answer
  else:
    calls, answer_of = _wrong_procedure(kind, gold)
  tools, sessions = registry.get_tools(example.meta['tools']), {}
  segments, outputs = [], []
  for call in calls:
    result = base.run_tool(tools, sessions, call, context=example.meta, deadline_s=None)
    outputs.append(result.content)
    segments += [[call_text(call), True],
                 [f'{render.RESULT_OPEN}{result.content}{render.RESULT_CLOSE}', False]]
  return segments + [[answer_prefix + str(answer_of(outputs)), True]]
