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
a stack limit; the program is loaded with `sandboxed(true)` and solve/1 must pass
library(sandbox)'s safe_goal/1, so shell/1, file and network predicates are a
sandbox_violation; solve/1 runs under call_with_time_limit and an inference limit
(exceeding either is a timeout). Not here: multi-try or agentic loops from the paper.
"""

import re
import secrets
import shutil
from typing import Any, Mapping

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

# %(nonce)s tags the driver's report lines, so a program that prints look-alikes is ignored.
_DRIVER = r'''
:- use_module(library(sandbox)).
:- use_module(library(clpq)).
:- use_module(library(lists)).
:- use_module(library(apply)).
:- use_module(library(aggregate)).
:- dynamic rlr_violation/0.
:- initialization(rlr_main, main).

user:message_hook(error(permission_error(_, sandboxed, _), _), _, _) :-
  assertz(rlr_violation), fail.

rlr_say(Key, Value) :- format(user_output, "~n%(nonce)s ~w ~q~n", [Key, Value]).

rlr_read_all(S, Terms, Errors) :-
  catch(read_term(S, T, [syntax_errors(error)]), _, T = '$rlr_syntax_error'),
  (   T == end_of_file -> Terms = [], Errors = 0
  ;   T == '$rlr_syntax_error' -> rlr_read_all(S, Terms, E0), Errors is E0 + 1
  ;   Terms = [T|Rest], rlr_read_all(S, Rest, Errors)
  ).

rlr_clause_head((H :- _), H) :- !.
rlr_clause_head(H, H).
rlr_counts_as_predicate(T) :-
  T \= (:- _), rlr_clause_head(T, H), nonvar(H), H =.. [F|_], F \== solve.
rlr_has_constraint(T) :- nonvar(T), ( T = {_} -> true ; T =.. [_|Args], member(A, Args),
                                      rlr_has_constraint(A) ).

rlr_value(X, V) :- number(X), !, ( integer(X) -> V = X ; V is float(X) ).
rlr_value(X, V) :- ground(X), catch(V is float(X), _, fail).

rlr_main :-
  open('program.pl', read, S), rlr_read_all(S, Terms, Errors), close(S),
  include(rlr_counts_as_predicate, Terms, Preds), length(Preds, NPreds),
  include(rlr_has_constraint, Terms, Cons), length(Cons, NCons),
  rlr_say(syntax_errors, Errors), rlr_say(predicates, NPreds), rlr_say(constraints, NCons),
  catch(load_files(user:'program.pl', [sandboxed(true), silent(true)]), E,
        print_message(error, E)),
  (   rlr_violation -> rlr_say(outcome, violation)
  ;   \+ current_predicate(user:solve/1) -> rlr_say(outcome, no_solve)
  ;   \+ catch(safe_goal(user:solve(_)), _, fail) -> rlr_say(outcome, violation)
  ;   (   catch(call_with_time_limit(%(time_limit)s,
                    call_with_inference_limit(user:solve(X), %(inferences)s, R)), E2, true)
      ->  true
      ;   R = '$rlr_failed'
      ),
      (   nonvar(E2), E2 = time_limit_exceeded -> rlr_say(outcome, time_limit)
      ;   nonvar(E2) -> print_message(error, E2), rlr_say(outcome, error)
      ;   R == '$rlr_failed' -> rlr_say(outcome, failed)
      ;   R == inference_limit_exceeded -> rlr_say(outcome, inference_limit)
      ;   rlr_value(X, V) -> rlr_say(outcome, number), rlr_say(value, V)
      ;   var(X) -> rlr_say(outcome, unbound)
      ;   rlr_say(outcome, non_numeric)
      )
  ),
  halt(0).
'''


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
  nonce = 'RLR' + secrets.token_hex(8)
  driver = _DRIVER % {'nonce': nonce, 'time_limit': TIME_LIMIT_S, 'inferences': INFERENCE_LIMIT}
  result = sandbox.run([swipl, '-q', '--no-packs', '--tty=false', '--stack-limit=256m',
                        'driver.pl'], files={'driver.pl': driver, 'program.pl': code},
                       limits=LIMITS)
  report = _report(result.stdout, nonce)
  outcome = report.get('outcome')
  if result.status in ('timeout',) or outcome in ('time_limit', 'inference_limit'):
    return V.failure(V.TIMEOUT, outcome or result.detail)
  if outcome == 'violation' or result.status in ('violation', 'memory'):
    return V.failure(V.SANDBOX_VIOLATION, outcome or result.detail)
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
