"""`prolog`: run a model-written Prolog program in SWI-Prolog and score it as Prolog-as-a-Tool.

Prolog-as-a-Tool (arXiv 2512.07407; aisilab/Prolog-as-a-Tool rewards/reward_suite_*.py)
has the model write a program defining solve(X) inside <answer>...</answer>; SWI-Prolog
runs solve(X) and prints X. Components, ported from the released code:

  correctness  2.0 numeric output within 1e-6 of the gold number; 1.0 numeric but wrong;
               0.5 otherwise (unbound, failure, error, non-numeric).
  syntax       min(0.2 * #regex hits of {":-", "solve(", "use_module", "clpq", a line
               ending in "."}, 1.0), counted over the whole completion.
  structure    min(0.3 * #clauses other than solve/1, 1) + min(0.5 * #clauses holding a
               {}/1 constraint, 0.5), x0.2 if solve hard-codes a number; in [0, 2].
  format       strict 0.5 + soft 0.5 + XML tag count up to 0.5 (suite 3, floored at 0).
  predicate_overlap  (only with a `reference` program) the non-embedding half of suite
               3's semantic reward: |preds ∩ ref| / max(1, |ref|).
  parses       1.0 if SWI-Prolog read the program without syntax errors (rlreason's).

Differences from the released code, on purpose: no extracted code is a parse_failure (the
paper gives correctness 0.5); a non-integer result such as clpq's 25r2 is evaluated to a
number (the paper's float() rejects it); suite 2/3's sentence-embedding similarity needs a
model and is left to the caller as one more named component (composition.py). The
verdict's reward is 1.0 if correct else 0.0; composition.PROLOG_CURRICULUM combines the
components as suite 3 does.

Isolation: swipl runs in the sandbox (sandbox.py: namespaces, throwaway uid, rlimits) with
a stack limit; prolog_loader.py reads the program into a module of its own (not the
driver's: no clause, directive or hook of it can redefine a driver helper), runs a
directive only if library(sandbox)'s safe_goal/1 accepts it, and solve/1 must pass
safe_goal/1 too, so shell/1, file and network predicates are a sandbox_violation; directives
and solve/1 run under call_with_time_limit and an inference limit (exceeding either is a
timeout). Not here: multi-try or agentic loops from the paper.
"""

import re
import shutil
from typing import Any, Mapping

from rlreason.verifiers import prolog_loader
from rlreason.verifiers import sandbox
from rlreason.verifiers import verdict as V

TIME_LIMIT_S = 2.0
INFERENCE_LIMIT = 10_000_000
LIMITS = sandbox.Limits(cpu_s=4, wall_s=6.0, memory_bytes=1 << 30)
# Completion patterns, linear-time rewrites of the released ones (a model can write a
# completion full of "solve(" or "</reasoning><answer>"): `[^()]`/`[^{}]` instead of
# `[^)]`/`[^}]` stop each try at the next "solve(" (only unbalanced code matches
# differently); `(?>...)` commits to the first marker, the most permissive choice, so
# _STRICT and _SOFT (used with match) accept the same texts as the released `.*?`;
# `\b` makes a word that is not a call cost one try, not one per character.
_SYNTAX = re.compile(r'(?::-|solve\s*\(|use_module|clpq|\.\s*$)', re.MULTILINE)
_HARDCODED = re.compile(r'solve\([^()]*\)\s*:-\s*\{[^{}]*=\s*\d+\s*\}')
_STRICT = re.compile(r'\A<reasoning>\n(?>.*?\n</reasoning>\n<answer>\n).*?\n</answer>\n$', re.DOTALL)
_SOFT = re.compile(r'\A(?>.*?<reasoning>)(?>.*?</reasoning>\s*<answer>).*?</answer>', re.DOTALL)
_PREDICATE = re.compile(r'\b(\w+)\(')

# The driver's own part; prolog_loader.loader() puts the program into its own module. The
# nonce that tags its report lines (so a program printing look-alikes is ignored) comes on
# stdin and stays in rlr_main's variables.
_MAIN = r'''
:- use_module(library(clpq)).
:- initialization(rlr_main, main).

rlr_say(N, Key, Value) :- format(user_output, "~n~w ~w ~q~n", [N, Key, Value]).

rlr_clause_head((H :- _), H) :- !.
rlr_clause_head(H, H).
rlr_counts_as_predicate(T) :-
  T \= (:- _), rlr_clause_head(T, H), nonvar(H), H =.. [F|_], F \== solve.
rlr_has_constraint(T) :- nonvar(T), ( T = {_} -> true ; T =.. [_|Args], member(A, Args),
                                      rlr_has_constraint(A) ).

rlr_value(X, V) :- number(X), !, ( integer(X) -> V = X ; V is float(X) ).
rlr_value(X, V) :- ground(X), catch(V is float(X), _, fail).

rlr_main :-
  read_line_to_string(user_input, N), catch(delete_file('driver.pl'), _, true),
  rlr_program_module(M), M:use_module(library(clpq)),  /* {}/1 without a use_module */
  rlr_load('program.pl', M, Terms, Errors, Load),
  include(rlr_counts_as_predicate, Terms, Preds), length(Preds, NPreds),
  include(rlr_has_constraint, Terms, Cons), length(Cons, NCons),
  rlr_say(N, syntax_errors, Errors), rlr_say(N, predicates, NPreds),
  rlr_say(N, constraints, NCons),
  (   Load = violation(Why) -> rlr_say(N, why, Why), rlr_say(N, outcome, violation)
  ;   Load = limit(Limit) -> rlr_say(N, outcome, Limit)
  ;   \+ current_predicate(M:solve/1) -> rlr_say(N, outcome, no_solve)
  ;   catch((safe_goal(M:solve(_)), U = none), U, true), U \== none ->
      rlr_why(U, solve(_), Why), rlr_say(N, why, Why), rlr_say(N, outcome, violation)
  ;   rlr_limited(M:solve(X), R),
      (   R = exception(E) -> rlr_warn(error, E), rlr_say(N, outcome, error)
      ;   R == failed -> rlr_say(N, outcome, failed)
      ;   R \== true -> rlr_say(N, outcome, R)
      ;   rlr_value(X, V) -> rlr_say(N, outcome, number), rlr_say(N, value, V)
      ;   var(X) -> rlr_say(N, outcome, unbound)
      ;   rlr_say(N, outcome, non_numeric)
      )
  ),
  halt(0).
'''
_DRIVER = (':- module(rlr_verifier_driver, []).\n' +
           prolog_loader.loader(time_limit_s=TIME_LIMIT_S, inferences=INFERENCE_LIMIT) + _MAIN)


def syntax_score(text: str) -> float:
  return min(0.2 * len(_SYNTAX.findall(text)), 1.0)


def xml_count(text: str) -> float:
  count = 0.0
  if text.count('<reasoning>\n') == 1:
    count += 0.125
  if text.count('\n</reasoning>\n') == 1:
    count += 0.125
  if text.count('\n<answer>\n') == 1:
    count += 0.125
    count -= min(count, len(text.split('\n</answer>\n')[-1]) * 0.001)
  if text.count('\n</answer>') == 1:
    count += 0.125
    count -= min(count, (len(text.split('\n</answer>')[-1]) - 1) * 0.001)
  return max(0.0, count)


def format_score(text: str) -> float:
  return 0.5 * bool(_STRICT.match(text)) + 0.5 * bool(_SOFT.match(text)) + xml_count(text)


def structure_score(code: str, predicates: int, constraints: int) -> float:
  score = min(0.3 * predicates, 1.0) + min(0.5 * constraints, 0.5)
  if _HARDCODED.search(code):
    score *= 0.2
  return max(0.0, min(score, 2.0))


def _first_answer(text: str) -> str | None:
  # The released code takes the FIRST complete <answer> block, cut at <|endoftext|>.
  text = text.split('<|endoftext|>', 1)[0]
  start = text.find('<answer>')
  end = text.find('</answer>', start)
  return text[start + 8:end].strip() if start >= 0 and end >= 0 else None


def _report(stdout: str, nonce: str) -> dict[str, str]:
  out = {}
  for line in stdout.splitlines():
    if line.startswith(nonce + ' '):
      _, key, value = line.split(' ', 2)
      out[key] = value
  return out


@V.verifier
def verify_prolog(item: Mapping[str, Any]) -> V.Verdict:
  """Item: completion, answer (the gold number); optional reference (a gold program)."""
  text = V.completion_text(item)
  try:
    gold = float(V.gold_text(item))
  except ValueError:
    return V.failure(V.INVALID_INPUT, f'answer is not a number: {item.get("answer")!r}')
  code = _first_answer(text)
  if not code:
    return V.failure(V.PARSE_FAILURE, 'no <answer>...</answer> program')
  swipl = shutil.which('swipl')
  if swipl is None:
    return V.failure(V.CRASH, 'swipl not found (apt-get install swi-prolog-nox)')
  result, nonce = prolog_loader.run(swipl, _DRIVER, files={'program.pl': code}, limits=LIMITS)
  report = _report(result.stdout, nonce)
  outcome = report.get('outcome')
  if result.status in ('timeout',) or outcome in ('time_limit', 'inference_limit'):
    return V.failure(V.TIMEOUT, outcome or result.detail)
  if outcome == 'violation':
    return V.failure(V.SANDBOX_VIOLATION, f'violation: {report.get("why", "?")}')
  if result.status in ('violation', 'memory'):
    return V.failure(V.SANDBOX_VIOLATION, result.detail)
  if outcome is None:
    return V.failure(V.CRASH, f'swipl gave no report ({result.detail}): {result.stderr[-200:]}')
  correctness = 0.5
  if outcome == 'number':
    correctness = 2.0 if abs(float(report['value']) - gold) < 1e-6 else 1.0
  components = {
      'correctness': correctness,
      'syntax': syntax_score(text),
      'parses': float(report.get('syntax_errors') == '0'),
      'structure': structure_score(code, int(report.get('predicates', 0)),
                                   int(report.get('constraints', 0))),
      'format': format_score(text),
  }
  if item.get('reference'):
    reference = set(_PREDICATE.findall(V.gold_text(item, 'reference')))
    components['predicate_overlap'] = (len(set(_PREDICATE.findall(code)) & reference) /
                                       max(1, len(reference)))
  return V.judged(correctness == 2.0, components=components,
                  detail=f'{outcome} {report.get("value", "")}'.strip())
