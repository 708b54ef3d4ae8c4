"""The restricted loader both SWI-Prolog drivers share: a model's program in its own module.

  driver = (':- module(rlr_x_driver, []).\n' +
            prolog_loader.loader(time_limit_s=2.0, inferences=10**7) + main_clauses)
  result, nonce = prolog_loader.run(swipl, driver, files={'program.pl': code}, limits=...)

verifiers/prolog.py (solve/1) and envs/prolog_tool.py (consult/query) load model-written
Prolog this way. swipl's own loader would run the program's directives and expansion hooks
and put its clauses beside the driver's, where a clause, `multifile`, `asserta`,
`term_expansion` or `user:message_hook` can redefine a driver helper that then runs outside
safe_goal/1. Here the driver is a module of its own that exports nothing, and
rlr_load(File, M, ...) reads the program term by term into module PROGRAM_MODULE (default
import module `system`, not `user`), never through swipl's loader:

  clause / DCG rule  assertz'ed into M (no term or goal expansion runs); a head qualified
                     with a module, or one of swipl's hooks (HOOKS), is a violation.
  :- use_module / ensure_loaded of library(L), L in LIBRARIES: imported into M; another
                     library (or consult ... of one) is not loaded, autoloading still
                     finds its predicates; include/1, or any file not a library(...), is
                     a violation.
  :- op(P, T, Names) defined in M only (Names qualified with a module: a violation).
  :- dynamic / table declarations in M; discontiguous, multifile, public, meta_predicate,
                     non_terminal, style_check and module/2 are accepted and do nothing
                     (the program is already its own module). Qualified specs: a violation.
  :- initialization(G[, When])  G runs after the last term, as any other directive goal.
  any other directive goal: run in M only if library(sandbox)'s safe_goal/1 accepts it
                     (redefine_system_predicate, shell/2, open/3, set_prolog_flag with an
                     unsafe flag, '$set_source_module' ... are a violation), under the same
                     time and inference limits as solve/1 or a query.
  quasi quotations   not evaluated (a violation).

Two holes of library(sandbox) (SWI-Prolog 9.0) are closed here too: safe_goal/1 approves
print_message/2, whose printer runs the ~@ goals of a `format(F, Args)` message, so every
message is written as a plain term instead (user:message_hook/3, which the program cannot
extend); and it approves at_halt/1 (its goal would run at exit, unchecked) through the
body, so DENIED goals are refused by a sandbox:safe_meta/2 hook asked before the body.

The report nonce reaches the driver on stdin (its first line, read before the program loads;
safe_goal refuses every read of stdin anyway) and lives only in the driver's local
variables: it is in no file and no clause the program could read, and driver.pl is deleted
before the program loads.
Not here: what the drivers report (prolog.py, prolog_tool.py); the OS layer (sandbox.py).
"""

import secrets
from typing import Mapping

from rlreason.verifiers import sandbox

PROGRAM_MODULE = 'rlr_program'
LIBRARIES = ('aggregate', 'apply', 'assoc', 'clpb', 'clpfd', 'clpq', 'clpr', 'dcg/basics',
             'dcg/high_order', 'error', 'heaps', 'lists', 'occurs', 'ordsets', 'pairs',
             'random', 'rbtrees', 'solution_sequences', 'tabling', 'ugraphs', 'when', 'yall')
DENIED = ('at_halt/1', 'cancel_halt/1', 'term_expansion/2', 'term_expansion/4',
          'goal_expansion/2', 'goal_expansion/4')
HOOKS = ('term_expansion/2', 'term_expansion/4', 'goal_expansion/2', 'goal_expansion/4',
         'message_hook/3', 'portray/1', 'exception/3', 'prolog_load_file/2',
         'prolog_exception_hook/4', 'prolog_exception_hook/5')

# %% is a literal % (the drivers fill %(time_limit)s and %(inferences)s): no % comments here.
LOADER = r'''
:- use_module(library(sandbox)).
:- use_module(library(lists)).
:- use_module(library(apply)).
:- use_module(library(readutil)).

/* Messages are written here as plain terms, never through swipl's printer, which runs the
   ~@ goals of a message's format: rlr_warn(error, format("~@", [G])) passes safe_goal. */
:- multifile user:message_hook/3.
user:message_hook(Term, Kind, _) :- rlr_warn(Kind, Term).
rlr_warn(Kind, Term) :-
  (   memberchk(Kind, [error, warning])
  ->  catch(format(user_error, "~w: ~q~n", [Kind, Term]), _, true)
  ;   true
  ).

/* library(sandbox) approves these through their bodies, yet they run a goal later, out of
   safe_goal's sight (at_halt/1 at exit): refused. The hook is asked before their bodies. */
:- multifile sandbox:safe_meta/2.
sandbox:safe_meta(G, _) :-
  ( G = _:P -> true ; P = G ), callable(P), functor(P, N, A),
  memberchk(N/A, [%(denied)s]),
  throw(error(permission_error(call, sandboxed, P), _)).

rlr_library(L) :- memberchk(L, [%(libraries)s]).
rlr_hook(PI) :- memberchk(PI, [%(hooks)s]).

/* A fresh module for the program: it sees system's predicates and the libraries it
   imports, not user's and not the driver's. */
rlr_program_module(M) :-
  M = %(module)s, set_module(M:base(system)).

/* rlr_load(+File, +M, -Terms, -Errors, -Result): File's terms into module M, one by one.
   Terms: every term read; Errors: syntax errors (such terms are skipped, as consult does);
   Result: ok, violation(Why) or limit(time_limit|inference_limit) (a directive's goal). */
rlr_load(File, M, Terms, Errors, Result) :-
  setup_call_cleanup(open(File, read, S), rlr_terms(S, M, Terms, Errors, Inits, Result0),
                     close(S)),
  (   Result0 == ok -> rlr_inits(Inits, M, Result) ; Result = Result0 ).

rlr_terms(S, M, Terms, Errors, Inits, Result) :-
  character_count(S, C0),
  catch(read_term(S, T, [module(M), syntax_errors(error), quasi_quotations(Q)]), E, true),
  (   nonvar(E)
  ->  rlr_warn(error, E), character_count(S, C1),
      (   C1 > C0
      ->  rlr_terms(S, M, Terms, Errors0, Inits, Result), Errors is Errors0 + 1
      ;   Terms = [], Errors = 1, Inits = [], Result = ok
      )
  ;   T == end_of_file -> Terms = [], Errors = 0, Inits = [], Result = ok
  ;   Q \== [] -> Terms = [T], Errors = 0, Inits = [], Result = violation(quasi_quotation)
  ;   rlr_term(T, M, Action),
      (   Action = stop(Result) -> Terms = [T], Errors = 0, Inits = []
      ;   ( Action = init(G) -> Inits = [G|Inits1] ; Inits = Inits1 ),
          Terms = [T|Terms1], rlr_terms(S, M, Terms1, Errors, Inits1, Result)
      )
  ).

rlr_inits([], _, ok).
rlr_inits([G|Gs], M, Result) :-
  rlr_goal(G, M, R0), ( R0 == ok -> rlr_inits(Gs, M, Result) ; Result = R0 ).

/* rlr_term(+Term, +M, -Action): Action is ok, init(Goal) or stop(Result). */
rlr_term(T, _, ok) :- var(T), !, rlr_warn(error, error(instantiation_error, _)).
rlr_term((:- D), M, A) :- !, rlr_directive(D, M, A).
rlr_term((?- D), M, A) :- !, rlr_directive(D, M, A).
rlr_term((H --> B), M, A) :- !,
  (   catch(dcg_translate_rule((H --> B), C), E, (rlr_warn(error, E), fail))
  ->  rlr_clause(C, M, A)
  ;   A = ok
  ).
rlr_term(C, M, A) :- rlr_clause(C, M, A).

rlr_clause(C, M, A) :-
  ( C = (H :- _) -> true ; H = C ),
  (   ( C = _:_ ; nonvar(H), H = _:_ ) -> A = stop(violation(clause_for_another_module))
  ;   callable(H), functor(H, N, Ar), rlr_hook(N/Ar) -> A = stop(violation(hook(N/Ar)))
  ;   catch(assertz(M:C), E, rlr_warn(error, E)) -> A = ok
  ;   A = ok
  ).

rlr_directive(D, _, ok) :- var(D), !, rlr_warn(error, error(instantiation_error, _)).
rlr_directive(initialization(G), _, init(G)) :- !.
rlr_directive(initialization(G, _), _, init(G)) :- !.
rlr_directive(D, _, ok) :- rlr_no_op(D), !.
rlr_directive(D, M, A) :- rlr_loads(D, Spec), !,
  (   ( \+ ground(Spec) ; Spec \= library(_) ; D = include(_) )
  ->  A = stop(violation(loads(Spec)))
  ;   Spec = library(L), rlr_library(L), memberchk(D, [use_module(_), use_module(_, _),
                                                      ensure_loaded(_)])
  ->  catch(M:D, E, rlr_warn(error, E)), A = ok
  ;   rlr_warn(warning, not_loaded(Spec)), A = ok
  ).
rlr_directive(op(P, T, Names), M, A) :- !,
  (   ( atom(Names) ; is_list(Names), maplist(atom, Names) )
  ->  catch(op(P, T, M:Names), E, rlr_warn(error, E)), A = ok
  ;   A = stop(violation(op_for_another_module))
  ).
rlr_directive(D, M, A) :- compound(D), D =.. [Decl, Specs], rlr_declaration(Decl), !,
  (   sub_term(Q, Specs), nonvar(Q), Q = _:_ -> A = stop(violation(Decl/1))
  ;   Decl == (dynamic) -> catch(dynamic(M:Specs), E, rlr_warn(error, E)), A = ok
  ;   Decl == (table) -> catch(M:table(Specs), E, rlr_warn(error, E)), A = ok
  ;   A = ok
  ).
rlr_directive(G, M, A) :- rlr_goal(G, M, R), ( R == ok -> A = ok ; A = stop(R) ).

rlr_no_op(module(_, _)).
rlr_no_op(style_check(_)).
rlr_loads(use_module(S), S).
rlr_loads(use_module(S, _), S).
rlr_loads(ensure_loaded(S), S).
rlr_loads(consult(S), S).
rlr_loads(include(S), S).
rlr_loads(load_files(S, _), S).
rlr_loads(reexport(S), S).
rlr_loads(reexport(S, _), S).
rlr_loads(autoload(S), S).
rlr_loads(autoload(S, _), S).
rlr_loads([S|_], S).
rlr_declaration(D) :-
  memberchk(D, [(dynamic), (table), (discontiguous), (multifile), (public), (meta_predicate),
                (non_terminal)]).

/* rlr_goal(+G, +M, -Result): a directive's goal, run in M if safe_goal/1 accepts it. */
rlr_goal(G, M, Result) :-
  catch((safe_goal(M:G), Unsafe = none), Unsafe, true),
  (   Unsafe == none
  ->  rlr_limited(M:G, R),
      (   R = exception(E) -> rlr_warn(error, E), Result = ok
      ;   R == failed -> rlr_warn(warning, goal_failed(directive, M:G)), Result = ok
      ;   R == true -> Result = ok
      ;   Result = limit(R)
      )
  ;   Unsafe = error(existence_error(procedure, _), _) -> rlr_warn(error, Unsafe),
      Result = ok
  ;   rlr_why(Unsafe, G, Why), Result = violation(Why)
  ).

/* rlr_why(+Error, +G, -Why): what safe_goal/1 refused in G, as unsafe(Name/Arity). */
rlr_why(error(permission_error(_, _, What), _), _, unsafe(PI)) :- callable(What), !,
  rlr_indicator(What, PI).
rlr_why(_, G, unsafe(PI)) :- callable(G), !, rlr_indicator(G, PI).
rlr_why(_, _, unsafe(variable)).

rlr_indicator(Q:G, Q:N/A) :- callable(G), !, functor(G, N, A).
rlr_indicator(G, N/A) :- functor(G, N, A).

/* rlr_limited(+G, -R): once(G) under the time and inference limits; R is true, failed,
   exception(E), time_limit or inference_limit. */
rlr_limited(G, R) :-
  (   catch(call_with_time_limit(%(time_limit)s,
                call_with_inference_limit(G, %(inferences)s, R0)), E, true)
  ->  true
  ;   R0 = failed
  ),
  (   nonvar(E) -> ( E == time_limit_exceeded -> R = time_limit ; R = exception(E) )
  ;   R0 == inference_limit_exceeded -> R = inference_limit
  ;   R0 == failed -> R = failed
  ;   R = true
  ).
'''


def loader(*, time_limit_s: float, inferences: int) -> str:
  """LOADER with its limits and lists filled in."""
  return LOADER % {'libraries': ', '.join(f'({lib})' for lib in LIBRARIES),
                   'hooks': ', '.join(HOOKS), 'denied': ', '.join(DENIED), 'module': PROGRAM_MODULE,
                   'time_limit': time_limit_s, 'inferences': inferences}


def run(swipl: str, driver: str, *, files: Mapping[str, str],
        limits: sandbox.Limits) -> tuple[sandbox.SandboxResult, str]:
  """swipl runs `driver` (driver.pl) in the sandbox beside `files`; the report nonce goes
  to it on stdin. Returns the result and the nonce its report lines start with."""
  nonce = 'RLR' + secrets.token_hex(8)
  result = sandbox.run([swipl, '-q', '--no-packs', '--tty=false', '--stack-limit=256m',
                        'driver.pl'], files={**files, 'driver.pl': driver},
                       stdin=nonce + '\n', limits=limits)
  return result, nonce
