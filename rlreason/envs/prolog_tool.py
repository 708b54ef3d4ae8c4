"""`prolog`: a per-episode SWI-Prolog knowledge base: consult clauses, then query goals.

The session holds the program text consulted so far; nothing runs in this process. Each
call is one swipl run in the sandbox (verifiers/sandbox.py), isolated as verifiers/prolog.py
is: verifiers/prolog_loader.py reads the accumulated program into a module of its own (no
clause, directive or hook of it can redefine a driver helper; a directive runs only if
library(sandbox)'s safe_goal/1 accepts it), a goal is read and run in that module and must
pass safe_goal/1 (shell/1, open/3 and friends are a sandbox_violation), and it runs under
call_with_time_limit and an inference limit (either is a timeout).

  consult(program)  checks the new clauses for syntax errors (tool_failed, nothing kept),
                    loads old + new, and keeps them. Consulting adds clauses, as if the
                    file grew; it never retracts.
  query(goal)       returns the first MAX_SOLUTIONS solutions' bindings like the toplevel
                    ("X = 1 ;" ... "."), "true." for a solution without named variables,
                    "false." for none; what the goal prints comes first.

Errors raised by the goal are shown as their Prolog term (e.g. existence_error(...)), not as
the toplevel's prose. Not here: retract across calls, stdin, the toplevel's residual goals.
"""

import shutil
from typing import Any, Mapping

from rlreason.envs import base
from rlreason.verifiers import prolog_loader
from rlreason.verifiers import sandbox

MAX_SOLUTIONS = 10
MAX_PROGRAM_CHARS = 50_000
TIME_LIMIT_S = 2.0
INFERENCE_LIMIT = 10_000_000
LIMITS = sandbox.Limits(cpu_s=4, wall_s=6.0, memory_bytes=1 << 30, output_bytes=32 << 10)

# The driver's own part; prolog_loader.loader() puts the program into its own module. The
# nonce that tags its report lines (so a program printing look-alikes is ignored) comes on
# stdin and stays in rlr_main's variables; %(mode)s is consult or query.
_MAIN = r'''
:- initialization(rlr_main, main).

rlr_say(N, Key, Value) :- format(user_output, "~n~w ~w ~w~n", [N, Key, Value]).

rlr_read_errors(S, Errors) :-
  catch((read_term(S, T, [syntax_errors(error), quasi_quotations(_)]), E = none), E, true),
  (   E = error(syntax_error(What), Where) -> rlr_line(Where, L), Errors = [L-What|Rest],
      rlr_read_errors(S, Rest)
  ;   E \== none -> Errors = ['?'-E]
  ;   T == end_of_file -> Errors = []
  ;   rlr_read_errors(S, Errors)
  ).
rlr_line(stream(_, L, _, _), L) :- !.
rlr_line(file(_, L, _, _), L) :- !.
rlr_line(_, '?').

rlr_main :-
  read_line_to_string(user_input, N), catch(delete_file('driver.pl'), _, true),
  open('new.pl', read, S), rlr_read_errors(S, Errors), close(S),
  (   Errors \== []
  ->  forall(member(L-W, Errors), (format(atom(A), "line ~w: ~q", [L, W]),
                                   rlr_say(N, syntax_error, A)))
  ;   rlr_program_module(M), rlr_load('program.pl', M, _, _, Load),
      (   Load = violation(Why) -> rlr_say(N, why, Why), rlr_say(N, outcome, violation)
      ;   Load = limit(Limit) -> rlr_say(N, outcome, Limit)
      ;   %(mode)s == consult -> rlr_say(N, outcome, loaded)
      ;   rlr_query(N, M)
      )
  ),
  halt(0).

rlr_named(Name=_) :- \+ sub_atom(Name, 0, _, _, '_').
rlr_binding(Name=Value, Text) :-
  format(atom(Text), "~w = ~W", [Name, Value, [quoted(true), portray(true), max_depth(30)]]).
rlr_solution(N, []) :- !, rlr_say(N, solution, true).
rlr_solution(N, Bindings) :-
  maplist(rlr_binding, Bindings, Texts), atomic_list_concat(Texts, ', ', Line),
  rlr_say(N, solution, Line).

rlr_query(N, M) :-
  open('goal.pl', read, S),
  catch(read_term(S, G, [module(M), variable_names(Vs), syntax_errors(error),
                         quasi_quotations(Q)]), E, true), close(S),
  (   nonvar(E) -> format(atom(A), "~q", [E]), rlr_say(N, goal_error, A)
  ;   var(G) -> rlr_say(N, goal_error, 'the goal is a variable')
  ;   Q \== [] -> rlr_say(N, why, quasi_quotation), rlr_say(N, outcome, violation)
  ;   catch((safe_goal(M:G), Unsafe = none), Unsafe, true), Unsafe \== none
  ->  (   Unsafe = error(existence_error(procedure, _), _)
      ->  format(atom(A), "~q", [Unsafe]), rlr_say(N, error, A)
      ;   rlr_why(Unsafe, G, Why), rlr_say(N, why, Why), rlr_say(N, outcome, violation)
      )
  ;   include(rlr_named, Vs, Named),
      catch(with_output_to(string(Out),
              call_with_time_limit(%(time_limit)s, call_with_inference_limit(
                  once(findnsols(%(solutions)d, Named, M:G, Sols)), %(inferences)d, R))),
            E2, true),
      (   string(Out) -> format(user_output, "~n~w output~n~w~n~w end~n", [N, Out, N])
      ;   true
      ),
      (   E2 == time_limit_exceeded -> rlr_say(N, outcome, time_limit)
      ;   nonvar(E2) -> format(atom(A), "~q", [E2]), rlr_say(N, error, A)
      ;   R == inference_limit_exceeded -> rlr_say(N, outcome, inference_limit)
      ;   maplist(rlr_solution(N), Sols), rlr_say(N, outcome, done)
      )
  ).
'''
_LOADER = prolog_loader.loader(time_limit_s=TIME_LIMIT_S, inferences=INFERENCE_LIMIT)


class Session:
  """The program text consulted so far in this episode."""

  def __init__(self):
    self.program = ''


def _run(mode: str, program: str, new: str, goal: str) -> tuple[sandbox.SandboxResult, str]:
  swipl = shutil.which('swipl')
  if swipl is None:
    raise base.ToolError(base.CRASH, 'prolog: swipl not found (apt-get install swi-prolog-nox)')
  driver = (':- module(rlr_tool_driver, []).\n' + _LOADER +
            _MAIN % {'mode': mode, 'time_limit': TIME_LIMIT_S, 'solutions': MAX_SOLUTIONS,
                     'inferences': INFERENCE_LIMIT})
  result, nonce = prolog_loader.run(swipl, driver, limits=LIMITS,
                                    files={'program.pl': program, 'new.pl': new, 'goal.pl': goal})
  if result.status == 'timeout':
    raise base.ToolError(base.TIMEOUT, f'prolog: {result.detail}')
  if result.status in ('violation', 'memory'):
    raise base.ToolError(base.SANDBOX_VIOLATION, f'prolog: {result.detail}')
  if result.status == 'refused':
    raise base.ToolError(base.CRASH, f'prolog: sandbox refused: {result.detail}')
  return result, nonce


def _report(stdout: str, nonce: str) -> tuple[list[tuple[str, str]], str]:
  """The driver's (key, value) lines in order, and what the goal printed."""
  lines, output, inside = [], [], False
  for line in stdout.splitlines():
    if line == f'{nonce} output':
      inside = True
    elif line == f'{nonce} end':
      inside = False
    elif inside:
      output.append(line)
    elif line.startswith(nonce + ' '):
      key, _, value = line[len(nonce) + 1:].partition(' ')
      lines.append((key, value))
  return lines, '\n'.join(output).strip('\n')


def _raise_failures(report: list[tuple[str, str]], result: sandbox.SandboxResult) -> None:
  keys = {k: v for k, v in report}
  errors = [v for k, v in report if k == 'syntax_error']
  if errors:
    raise base.ToolError(base.TOOL_FAILED, 'prolog: syntax error(s) in the program, nothing '
                         'consulted:\n' + '\n'.join(errors[:5]))
  if keys.get('outcome') == 'violation':
    raise base.ToolError(base.SANDBOX_VIOLATION, 'prolog: not allowed in the sandbox (files, '
                         f'shell, network, hooks, other modules ...): {keys.get("why", "?")}')
  if keys.get('outcome') in ('time_limit', 'inference_limit'):
    raise base.ToolError(base.TIMEOUT, f'prolog: {keys["outcome"].replace("_", " ")} exceeded '
                         f'({TIME_LIMIT_S:g}s, {INFERENCE_LIMIT} inferences)')
  for key, what in (('goal_error', 'cannot read the goal'), ('error', 'the goal raised')):
    if key in keys:
      raise base.ToolError(base.TOOL_FAILED, f'prolog: {what}: {keys[key]}')
  if 'outcome' not in keys:
    raise base.ToolError(base.CRASH, f'prolog: swipl gave no report ({result.detail}): '
                         f'{result.stderr[-300:].strip()}')


class PrologTool:
  """consult adds clauses to the episode's program; query runs a goal against it."""

  spec = base.ToolSpec(
      name='prolog',
      description='A SWI-Prolog knowledge base for this episode. action "consult" adds the '
                  'clauses in `program`; action "query" runs `goal` and returns up to '
                  f'{MAX_SOLUTIONS} solutions\' variable bindings, or "false.".',
      parameters={'type': 'object', 'properties': {
          'action': {'type': 'string', 'enum': ['consult', 'query']},
          'program': {'type': 'string', 'description': 'clauses to add (for consult)'},
          'goal': {'type': 'string', 'description': 'a goal, e.g. "parent(X, bob)" (for query)'}},
                  'required': ['action']})

  def new_session(self, context: Mapping[str, Any]) -> Session:
    del context  # every episode starts from an empty program.
    return Session()

  def call(self, session: Session, arguments: Mapping[str, Any]) -> str:
    action = arguments['action']
    if action == 'consult':
      new = arguments.get('program', '')
      if not new.strip():
        raise base.ToolError(base.BAD_ARGUMENTS, 'prolog: consult needs a non-empty program')
      program = session.program + '\n' + new
      if len(program) > MAX_PROGRAM_CHARS:
        raise base.ToolError(base.BAD_ARGUMENTS,
                             f'prolog: the program would exceed {MAX_PROGRAM_CHARS} characters')
      result, nonce = _run('consult', program, new, '')
      report, _ = _report(result.stdout, nonce)
      _raise_failures(report, result)
      session.program = program
      return 'true.'
    if action != 'query':
      raise base.ToolError(base.BAD_ARGUMENTS,
                           f'prolog: action must be consult or query, got {action!r}')
    goal = arguments.get('goal', '').strip()
    if not goal.rstrip('.').strip():
      raise base.ToolError(base.BAD_ARGUMENTS, 'prolog: query needs a non-empty goal')
    if not goal.endswith('.'):
      goal += ' .'
    result, nonce = _run('query', session.program, '', goal + '\n')
    report, output = _report(result.stdout, nonce)
    _raise_failures(report, result)
    solutions = [v for k, v in report if k == 'solution']
    answer = ' ;\n'.join(solutions) + '.' if solutions else 'false.'
    if len(solutions) == MAX_SOLUTIONS:
      answer += f'\n(first {MAX_SOLUTIONS} solutions; there may be more)'
    return f'{output}\n{answer}' if output else answer


TOOL = PrologTool()
