"""SCRIBE: each step of a completion is routed to a skill prototype and judged with its rubric.

  j = ScribeJudge(judge=judge.Judge(...), library=LIBRARIES['tools'], unrouted='skip')
  result = j.score(problems, completions)    # a judge.JudgeResult, plus each step's route
  route('<call>calculator: {"expression": "3*4"}</call>', TOOLS)   # -> 0 ('tool_call')

A library is an ordered tuple of `SkillPrototype`s: a name, regular expressions that claim a
step, and a rubric (a judge template with {problem}, {previous}, {step}, {index}). A step
goes to the prototype with the most distinct matching patterns, ties to the earlier one in
the library: a pure function of the step's text and the library, so routing is
deterministic. A step no pattern claims is handled as `unrouted` says: 'skip' (counted in
scribe/unrouted and left out of its completion's reward), 'generic' (the wrapped judge's own
template), or 'error' (ValueError naming the step, raised before the model runs, so a
library that misses a step never stalls a run). All routed prompts of a batch go through one
call of the judge's label scoring (judge.Judge.label_logprobs), the same buckets and label
tokens as the generic judge.

Libraries. 'tools': planning, tool calls, reading a tool's result, calculation, the final
answer, for the tags / qwen tool formats (envs/formats.py). 'clinmpo': ClinMPO's
evidence-guided strategy reward as a rubric set for the simulated consultation of
data.task='patient_dx' (envs/patient.py: `ask <finding>` / `dx <condition>` turns): symptom
inquiry, evidence synthesis, differential diagnosis, diagnostic decision.

Provenance. SCRIBE (Skill-Conditioned Reward with Intermediate Behavioral Evaluation) is known
from its abstract [S]: a curated library of skill prototypes, each subgoal routed to one,
the judge given that prototype's structured rubric, which is said to reduce reward variance.
ClinMPO (its abstract [S]) rewards reasoning by the psychiatrist-defined Clinical Psychiatry
Thinking Strategy (CPTS), whose criteria we could not read. The routing rule (distinct
pattern matches, library order breaks ties), the prototypes, their patterns and rubric texts,
and the unrouted policies are our formalisation [F].

Deliberately not here: learned routers (embeddings), several rubric dimensions per step
(slate_judge.py), generated critiques.
"""

import dataclasses
import re
from typing import Sequence

import numpy as np

from rlreason.rollout import judge as judge_lib

UNROUTED = ('skip', 'generic', 'error')
_FIELDS = dict(problem='', previous='', step='', index=1)


@dataclasses.dataclass(frozen=True)
class SkillPrototype:
  """A skill: its name, the patterns (case-insensitive regexes) that claim a step, its rubric."""
  name: str
  patterns: tuple[str, ...]
  rubric: str

  def __post_init__(self):
    if not self.name or not self.patterns:
      raise ValueError(f'SkillPrototype {self.name!r}: needs a name and at least one pattern.')
    for p in self.patterns:
      try:
        re.compile(p)
      except re.error as e:
        raise ValueError(f'SkillPrototype {self.name!r}: pattern {p!r} is not a regular '
                         f'expression ({e}).') from None
    try:
      self.rubric.format(**_FIELDS)
    except (KeyError, IndexError, ValueError) as e:
      raise ValueError(f'SkillPrototype {self.name!r}: rubric {e!r}; it may use {{problem}}, '
                       '{previous}, {step} and {index} (literal braces as {{ and }}).') from None
    object.__setattr__(self, 'patterns', tuple(self.patterns))

  def matches(self, step: str) -> int:
    """How many of the patterns occur in the step."""
    return sum(re.search(p, step, re.IGNORECASE | re.MULTILINE) is not None
               for p in self.patterns)


def check_library(library: Sequence[SkillPrototype]) -> tuple[SkillPrototype, ...]:
  library = tuple(library)
  if not library:
    raise ValueError('SCRIBE: the rubric library is empty.')
  names = [p.name for p in library]
  if len(set(names)) != len(names):
    raise ValueError(f'SCRIBE: prototype names repeat in the library: {names}.')
  return library


def route(step: str, library: Sequence[SkillPrototype]) -> int | None:
  """The index of the prototype with the most distinct matching patterns (ties: the first);
  None when no pattern of any prototype occurs in the step."""
  counts = [p.matches(step) for p in library]
  best = max(counts, default=0)
  return counts.index(best) if best > 0 else None


def rubric(skill: str, criteria: Sequence[str]) -> str:
  """A rubric template in judge.DEFAULT_TEMPLATE's shape, with the skill's criteria listed."""
  points = '\n'.join(f'- {c}' for c in criteria)
  return ('You are checking one step of a solution. The step is a ' + skill + ' step; judge it '
          'only against the rubric below.\n\nProblem:\n{problem}\n\nEarlier steps:\n{previous}'
          '\n\nStep {index}:\n{step}\n\nRubric:\n' + points.replace('{', '{{').replace('}', '}}')
          + '\n\nDoes step {index} meet every point of the rubric? Answer with one character: "+" '
          'if it meets them all, "0" if some point is unclear, "-" if it fails one.')


# Line-anchored patterns use [ \t], never \s: under MULTILINE \s crosses newlines, and a run of
# newlines took seconds (tests/verifiers_regex_audit_test.py).
TOOLS = (
    SkillPrototype('tool_call', (r'<call>', r'<tool_call>', r'"arguments"'), rubric('tool call', (
        'the tool is one that can answer the question the step needs answered',
        'the arguments are well formed and copied correctly from the problem or earlier steps',
        'the call is not a repeat of an earlier call whose result is already known'))),
    SkillPrototype('result_use', (r'<result>', r'\bresult\b', r'\baccording to\b'),
                   rubric('reading a tool result', (
                       'the value used is the one the tool returned, copied exactly',
                       'an error message is recognised as an error, not used as a value'))),
    SkillPrototype('calculation', (r'\d\s*[-+*/x×]\s*\d', r'=\s*-?\d', r'\bcarry\b'),
                   rubric('calculation', (
                       'every operation is carried out correctly',
                       'the operands are the right ones from the problem or earlier steps'))),
    SkillPrototype('planning', (r'\b(first|then|next|plan|need to|let me|we need)\b',
                                r'\bsubgoal|\bstrategy\b'), rubric('planning', (
                                    'the plan splits the problem into steps that solve it',
                                    'no step of the plan is impossible or unnecessary'))),
    SkillPrototype('answer', (r'####', r'\banswer\b', r'\\boxed', r'^[ \t]*-?\d[\d ,.]*[ \t]*$'),
                   rubric('final answer', (
                       'the answer follows from the earlier steps',
                       'it answers exactly what the problem asks, in the asked form'))),
)

# ClinMPO's evidence-guided strategy (CPTS) as rubrics for envs/patient.py's consultation.
CLINMPO = (
    SkillPrototype('symptom_inquiry', (r'^[ \t]*ask[ \t]+\S+', r'\bask about\b', r'\bsymptom'),
                   rubric('symptom inquiry', (
                       'the finding asked about separates the conditions still possible',
                       'it was not asked or answered before',
                       'it is asked before committing to a diagnosis, when evidence is thin'))),
    SkillPrototype('evidence_synthesis', (r'\bevidence\b', r'\bfindings?\b', r'\bpresent\b',
                                          r'\babsent\b'), rubric('evidence synthesis', (
                                              'it states only findings the patient reported',
                                              'unsure answers are treated as unresolved'))),
    SkillPrototype('differential', (r'\bdifferential\b', r'\bruled? out\b', r'\bvs\.?\b',
                                    r'\bcandidates?\b'), rubric('differential diagnosis', (
                                        'every condition consistent with the evidence is kept',
                                        'conditions are ruled out only by a reported finding'))),
    SkillPrototype('diagnosis', (r'^[ \t]*dx[ \t]+\S+', r'\bdiagnos[ei]s\b', r'\bICD'),
                   rubric('diagnostic decision', (
                       'the diagnosis meets the criteria of the condition by the evidence found',
                       'no remaining differential fits the evidence equally well'))),
)

LIBRARIES = {'tools': TOOLS, 'clinmpo': CLINMPO}


@dataclasses.dataclass(frozen=True)
class ScribeResult(judge_lib.JudgeResult):
  """A JudgeResult plus, per completion, each step's prototype index (-1: unrouted)."""
  routes: tuple[np.ndarray, ...] = ()
  names: tuple[str, ...] = ()
  unrouted_steps: int = 0

  def metrics(self) -> dict[str, float]:
    out = super().metrics()
    flat = np.concatenate(self.routes) if self.routes else np.zeros(0, np.int64)
    total = max(flat.size, 1)
    out['scribe/unrouted'] = float(self.unrouted_steps)
    out['scribe/unrouted_frac'] = float(np.sum(flat < 0)) / total
    for i, name in enumerate(self.names):
      out[f'scribe/route_{name}_frac'] = float(np.sum(flat == i)) / total
    return out


@dataclasses.dataclass(frozen=True, eq=False)
class ScribeJudge:
  """The wrapped judge's model, labels, splitter and aggregation, with routed rubrics."""
  judge: judge_lib.Judge
  library: tuple[SkillPrototype, ...]
  unrouted: str = 'skip'
  judges: tuple[judge_lib.Judge, ...] = dataclasses.field(init=False)

  def __post_init__(self):
    if self.unrouted not in UNROUTED:
      raise ValueError(f'ScribeJudge.unrouted={self.unrouted!r}; known: {list(UNROUTED)}.')
    object.__setattr__(self, 'library', check_library(self.library))
    object.__setattr__(self, 'judges', tuple(dataclasses.replace(self.judge, template=p.rubric)
                                             for p in self.library))

  def routes(self, steps: Sequence[str]) -> list[int | None]:
    return [route(s, self.library) for s in steps]

  def score(self, problems: Sequence[str], completions: Sequence[str], *,
            params=None) -> ScribeResult:
    """Judges completion n (an answer to problems[n]) step by step, each with its rubric."""
    if len(problems) != len(completions):
      raise ValueError(f'{len(problems)} problems for {len(completions)} completions.')
    j = self.judge
    params = j.params if j.params is not None else params
    if params is None:
      raise ValueError('ScribeJudge: the judge\'s params are None (the policy judges itself): '
                       'pass params=.')
    texts, owners, routes, unrouted = [], [], [], 0
    for n, (problem, text) in enumerate(zip(problems, completions)):
      steps = judge_lib.split_steps(text, split=j.split, max_steps=j.max_steps)
      row = []
      for k, (step, r) in enumerate(zip(steps, self.routes(steps))):
        row.append(-1 if r is None else r)
        if r is None:
          unrouted += 1
          if self.unrouted == 'error':
            names = [p.name for p in self.library]
            raise ValueError(f'judge.unrouted=error: step {k + 1} of completion {n} routes to no '
                             f'prototype of the library {names}: {step[:120]!r}.')
          if self.unrouted == 'skip':
            continue
        texts.append((j if r is None else self.judges[r]).render(problem, steps[:k], step, k + 1))
        owners.append(n)
      routes.append(np.asarray(row, np.int64))
    token_lists, truncated = j.encode_prompts(texts)
    lp_Mx3 = j.label_logprobs(token_lists, params=params)
    scores_M = judge_lib.step_scores(lp_Mx3, mode=j.score_mode)
    owners_M = np.asarray(owners, np.int64)
    per_completion = tuple(scores_M[owners_M == n] for n in range(len(completions)))
    aggregate = judge_lib.AGGREGATES[j.aggregate]
    rewards_N = np.array([aggregate(s) if s.size else j.empty_reward for s in per_completion],
                         np.float32)
    return ScribeResult(rewards_N=rewards_N, step_scores=per_completion,
                        label_probs_Mx3=judge_lib.renormalised(lp_Mx3).astype(np.float32),
                        truncated_prompts=truncated, routes=tuple(routes),
                        names=tuple(p.name for p in self.library), unrouted_steps=unrouted)


def wrap(c, judge: judge_lib.Judge) -> ScribeJudge:
  """The config's `judge` block's rubric library (c.rubrics, c.unrouted) around `judge`."""
  if c.rubrics not in LIBRARIES:
    raise ValueError(f'judge.rubrics={c.rubrics!r}; known libraries: {sorted(LIBRARIES)}.')
  return ScribeJudge(judge=judge, library=LIBRARIES[c.rubrics], unrouted=c.unrouted)
