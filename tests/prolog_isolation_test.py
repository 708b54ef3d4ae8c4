"""Hostile Prolog programs against verifiers/prolog_loader.py's isolation, through the direct
verifier call, the verifier pool, the CLI and the prolog tool: each gets reward 0 for the
right reason (the Prolog layer refuses it, not only the OS layer below), writes nothing on
the host, and a good item afterwards still scores 1. Needs swipl."""

import json
import os
import pathlib
import shutil
import subprocess
import sys
import tempfile
import uuid

import pytest

from rlreason.envs import base
from rlreason.envs import prolog_tool
from rlreason.verifiers import pool as pool_lib
from rlreason.verifiers import prolog
from rlreason.verifiers import prolog_loader
from rlreason.verifiers import sandbox
from rlreason.verifiers import verdict as V

pytestmark = pytest.mark.skipif(shutil.which('swipl') is None,
                                reason='swipl not installed (make system-deps, or apt-get '
                                       'install swi-prolog-nox)')

REPO = pathlib.Path(__file__).resolve().parents[1]
OUTSIDE = pathlib.Path(tempfile.gettempdir()) / f'rlreason-prolog-escape-{uuid.uuid4().hex}'
DRIVER = 'rlr_verifier_driver'  # the verifier driver's module (prolog.py)
VIOLATION = (V.SANDBOX_VIOLATION, 'violation: ')  # refused by the Prolog layer, with a reason
GOOD = {'completion': '<answer>\nsolve(X) :- X is 6 * 7.\n</answer>', 'answer': '42'}

# name: (program, expected status, the verdict detail's start). Every program is scored
# against the answer 12: a forgery that worked would score 1.
ATTACKS = {
    # The program's clauses land in its own module: the driver's rlr_value/2 stays intact.
    'redefine_driver_helper': ('rlr_value(_, 12).\nsolve(foo).', V.WRONG, 'non_numeric'),
    'module_directive': (f':- module({DRIVER}, []).\nrlr_value(_, 12).\nsolve(foo).',
                         V.WRONG, 'non_numeric'),
    'switch_source_module': (f":- '$set_source_module'(_, {DRIVER}).\nrlr_value(_, 12).\n"
                             'solve(foo).', *VIOLATION),
    'asserta_driver_helper': (f':- asserta({DRIVER}:rlr_value(_, 12)).\nsolve(foo).',
                              *VIOLATION),
    'dynamic_driver_helper': (f':- dynamic {DRIVER}:rlr_value/2.\nsolve(foo).', *VIOLATION),
    'clause_for_driver': (f'{DRIVER}:rlr_value(_, 12).\nsolve(foo).', *VIOLATION),
    'prolog_load_context': (':- prolog_load_context(module, M), assertz(M:rlr_value(_, 12)).\n'
                            'solve(foo).', *VIOLATION),
    'redefine_system_predicate': (":- redefine_system_predicate(format(_, _, _)).\n"
                                  f"format(_, _, _) :- shell('touch {OUTSIDE}').\nsolve(12).",
                                  *VIOLATION),
    'term_expansion': ('term_expansion(solve(_), solve(12)).\nsolve(foo).', *VIOLATION),
    'goal_expansion': ('goal_expansion(rlr_value(_, V), V = 12).\nsolve(foo).', *VIOLATION),
    'message_hook': (':- multifile user:message_hook/3.\nuser:message_hook(_, _, _) :- '
                     f"open('{OUTSIDE}', write, S), close(S).\nsolve(X) :- X is foo + 1.",
                     *VIOLATION),
    'initialization': (f":- initialization(shell('touch {OUTSIDE}')).\nsolve(12).", *VIOLATION),
    'initialization_main': (f":- initialization((open('{OUTSIDE}', write, S), close(S)), main)."
                            '\nsolve(12).', *VIOLATION),
    'operator_in_driver': (f':- op(700, xfx, {DRIVER}:(===>)).\nsolve(12).', *VIOLATION),
    'set_prolog_flag': (':- set_prolog_flag(unknown, fail).\nsolve(12).', *VIOLATION),
    'include_driver_file': (":- include('driver.pl').\nsolve(12).", *VIOLATION),
    'consult_host_file': (":- consult('/etc/passwd').\nsolve(12).", *VIOLATION),
    'read_stdin': ('solve(X) :- read_term(user_input, T, []), atom_length(T, X).', *VIOLATION),
    'shell': (f"solve(12) :- shell('touch {OUTSIDE}', _).", *VIOLATION),
    'open_write': (f"solve(12) :- open('{OUTSIDE}', write, S), close(S).", *VIOLATION),
    # library(sandbox) approves at_halt/1 (its goal would run at exit, unchecked) ...
    'at_halt': (f"solve(12) :- system:at_halt(open('{OUTSIDE}', write, _)).", *VIOLATION),
    # ... and print_message/2, whose printer runs a format's ~@ goal: the driver writes
    # messages as plain terms, so halt(0) never runs and the (right) answer is reported.
    'message_format_goal': ("solve(12) :- print_message(error, format('~@', [halt(0)])).",
                            V.CORRECT, 'number 12'),
}


def item(program):
  return {'completion': f'<answer>\n{program}\n</answer>', 'answer': '12'}


def check(verdict, name):
  _, status, detail = ATTACKS[name]
  assert verdict.status == status and verdict.detail.startswith(detail), (name, verdict)
  assert verdict.reward == (1.0 if status == V.CORRECT else 0.0), (name, verdict)
  assert not OUTSIDE.exists(), name


def own_sandbox_dirs():
  return sorted(pathlib.Path(tempfile.gettempdir()).glob(f'rlreason-sandbox-{os.getpid()}-*'))


@pytest.mark.parametrize('name', sorted(ATTACKS))
def test_direct_call(name):
  before = own_sandbox_dirs()
  check(prolog.verify_prolog(item(ATTACKS[name][0])), name)
  assert own_sandbox_dirs() == before


def test_direct_call_scores_a_good_item_after_the_attacks():
  assert prolog.verify_prolog(GOOD).reward == 1.0


def test_through_the_pool():
  names = sorted(ATTACKS)
  with pool_lib.VerifierPool(num_workers=2, spare_workers=0, item_timeout_s=20,
                             default_reward=0.0, preload=('rlreason.verifiers.registry',),
                             warmup=False) as pool:
    verdicts = pool.score([item(ATTACKS[n][0]) for n in names] + [GOOD], verifier='prolog',
                          deadline_s=120)
    for name, verdict in zip(names, verdicts):
      check(verdict, name)
    assert verdicts[-1].reward == 1.0
    assert pool.score([GOOD], verifier='prolog', deadline_s=30)[0].reward == 1.0


def test_through_the_cli(tmp_path):
  names = sorted(ATTACKS)
  src, out = tmp_path / 'in.jsonl', tmp_path / 'out.jsonl'
  src.write_text(''.join(json.dumps(x) + '\n' for x in
                         [item(ATTACKS[n][0]) for n in names] + [GOOD]))
  run = subprocess.run([sys.executable, '-m', 'rlreason.verifiers', 'score', '--verifier',
                        'prolog', '--input', str(src), '--output', str(out), '--workers', '2',
                        '--item-timeout-s', '20'], cwd=REPO, capture_output=True, text=True,
                       timeout=300)
  assert run.returncode == 0, run.stderr
  rows = [json.loads(line) for line in out.read_text().splitlines()]
  for name, row in zip(names, rows):
    check(V.Verdict(status=row['status'], reward=row['reward'], detail=row['detail'],
                    components=row['components']), name)
  assert rows[-1]['reward'] == 1.0 and len(rows) == len(names) + 1


BENIGN = {  # what the loader still accepts: each program's solve(X) gives 12.
    'module_file': ':- module(arith, [solve/1]).\nsolve(12).',
    'operator': ':- op(700, xfx, ===>).\nA ===> B :- B is A * 2.\nsolve(X) :- 6 ===> X.',
    'dynamic': ':- dynamic seen/1.\nsolve(X) :- assertz(seen(12)), seen(X).',
    'dcg': 'digits([D|T]) --> [D], { code_type(D, digit) }, digits(T).\ndigits([]) --> [].\n'
           'solve(X) :- phrase(digits(Ds), `12`), number_codes(X, Ds).',
    'table_and_clpfd': ':- use_module(library(clpfd)).\n:- table f/2.\nf(0, 0).\n'
                       'f(N, F) :- N #> 0, M #= N - 1, f(M, G), F #= G + 2.\nsolve(X) :- f(6, X).',
    'initialization': ':- initialization(assertz(n(12))).\n:- dynamic n/1.\nsolve(X) :- n(X).',
    # Not loaded (a library outside prolog_loader.LIBRARIES); autoloading finds sum_list/2.
    'other_library': ':- use_module(library(readutil)).\nsolve(X) :- sum_list([5, 7], X).',
}


def test_benign_programs_still_load():
  for name, program in BENIGN.items():
    verdict = prolog.verify_prolog(item(program))
    assert (verdict.status, verdict.detail) == (V.CORRECT, 'number 12'), (name, verdict)


def test_the_nonce_travels_on_stdin_only(monkeypatch):
  seen = {}

  def fake_run(argv, *, files, stdin, limits):
    seen.update(files=files, stdin=stdin, argv=argv, limits=limits)
    return sandbox.SandboxResult('ok', 0, '', '', False, '', 0.0, 'namespaces')

  monkeypatch.setattr(sandbox, 'run', fake_run)
  _, nonce = prolog_loader.run('/usr/bin/swipl', prolog._DRIVER, files={'program.pl': 'x.'},
                               limits=prolog.LIMITS)
  assert seen['stdin'] == nonce + '\n' and nonce.startswith('RLR')
  assert not any(nonce in text for text in seen['files'].values())
  assert seen['argv'][-1] == 'driver.pl' and not any(nonce in a for a in seen['argv'])


# --- the prolog tool ------------------------------------------------------------------------

TOOL_DRIVER = 'rlr_tool_driver'
FAMILY = 'parent(tom, bob).\nparent(bob, ann).\ngp(X, Z) :- parent(X, Y), parent(Y, Z).\n'
# name: (program to consult, goal to query after it or None); every one is a violation.
TOOL_ATTACKS = {
    'asserta_driver_helper': (f':- asserta({TOOL_DRIVER}:rlr_named(_)).', None),
    'clause_for_driver': (f'{TOOL_DRIVER}:rlr_solution(_, _).', None),
    'switch_source_module': (f":- '$set_source_module'(_, {TOOL_DRIVER}).", None),
    'prolog_load_context': (':- prolog_load_context(module, M), assertz(M:rlr_named(_)).', None),
    'redefine_system_predicate': (':- redefine_system_predicate(format(_, _, _)).', None),
    'term_expansion': ('term_expansion(a, b).', None),
    'goal_expansion': ('goal_expansion(a, b).', None),
    'message_hook': (':- multifile user:message_hook/3.\nuser:message_hook(_, _, _) :- '
                     f"open('{OUTSIDE}', write, S), close(S).", None),
    'initialization': (f":- initialization(shell('touch {OUTSIDE}')).", None),
    'operator_in_driver': (f':- op(700, xfx, {TOOL_DRIVER}:(===>)).', None),
    'set_prolog_flag': (':- set_prolog_flag(unknown, fail).', None),
    'include_driver_file': (":- include('driver.pl').", None),
    'shell': ('ok.', f"shell('touch {OUTSIDE}', _)"),
    'open_write': ('ok.', f"open('{OUTSIDE}', write, S), close(S)"),
    'at_halt': ('ok.', f"system:at_halt(open('{OUTSIDE}', write, _))"),
    'driver_helper_qualified': ('ok.', f"{TOOL_DRIVER}:rlr_say(x, outcome, done)"),
}


def _call(sessions, **arguments):
  return base.run_tool({'prolog': prolog_tool.TOOL}, sessions,
                       base.ToolCall('prolog', arguments), context={})


@pytest.mark.parametrize('name', sorted(TOOL_ATTACKS))
def test_tool(name):
  program, goal = TOOL_ATTACKS[name]
  sessions = {}
  result = _call(sessions, action='consult', program=program)
  if goal is None:
    assert result.error == base.SANDBOX_VIOLATION, (name, result)
    assert sessions['prolog'].program == ''  # nothing kept
  else:
    assert result.content == 'true.', (name, result)
    result = _call(sessions, action='query', goal=goal)
    assert result.error == base.SANDBOX_VIOLATION, (name, result)
  assert 'not allowed' in result.content and not OUTSIDE.exists()


def test_tool_episode_after_the_attacks():
  sessions = {}
  assert _call(sessions, action='consult', program=FAMILY).content == 'true.'
  assert _call(sessions, action='query', goal='gp(tom, W)').content == 'W = ann.'


def test_tool_program_cannot_redefine_driver_helpers():
  # Old drivers loaded the program beside rlr_binding/rlr_solution: these clauses replaced
  # them. Now they are the program's own predicates, and the answer is the real one.
  sessions = {}
  program = "rlr_binding(_, 'X = 42').\nrlr_solution(_, _).\nrlr_named(_) :- fail.\n"
  assert _call(sessions, action='consult', program=program).content == 'true.'
  assert _call(sessions, action='query', goal='X = 1').content == 'X = 1.'
  result = _call(sessions, action='query', goal="print_message(error, format('~@', [halt(0)]))")
  assert result.content == 'true.', result
