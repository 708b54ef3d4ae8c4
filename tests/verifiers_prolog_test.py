"""The `prolog` verifier against a real SWI-Prolog (apt: swi-prolog-nox)."""

import shutil

import pytest

from rlreason.verifiers import composition
from rlreason.verifiers import prolog
from rlreason.verifiers import verdict as V

pytestmark = pytest.mark.skipif(shutil.which('swipl') is None,
                                reason='swipl not installed (apt-get install swi-prolog-nox)')

GOOD = """<reasoning>
Four apples at 3 each.
</reasoning>
<answer>
:- use_module(library(clpq)).
price(apple, 3).
total(N, T) :- price(apple, P), {T = N * P}.
solve(X) :- total(4, X).
</answer>
"""


def run(completion, answer='12', **extra):
  return prolog.verify_prolog({'completion': completion, 'answer': answer, **extra})


def test_correct_program_scores_every_component():
  v = run(GOOD, reference='price(a, 1). total(N, T) :- price(a, P), T is N * P. solve(X) :- total(4, X).')
  assert (v.status, v.reward) == (V.CORRECT, 1.0)
  # structure: 2 non-solve clauses -> min(0.6, 1) + 1 clause with {} -> min(0.5, .5) = 1.1.
  # syntax: ':-' x3, 'solve(' x1, 'use_module' x1, 'clpq' x1, '.'-ended lines x4 -> capped 1.0.
  # format: strict 0.5 + soft 0.5 + four tags 0.5 = 1.5. overlap: {price, total, solve} / 3.
  assert v.components == pytest.approx({'correctness': 2.0, 'syntax': 1.0, 'parses': 1.0,
                                        'structure': 1.1, 'format': 1.5,
                                        'predicate_overlap': 1.0})


@pytest.mark.parametrize('code, answer, status, correctness, detail', [
    ('solve(X) :- X is 6 * 7.', '42', V.CORRECT, 2.0, 'number 42'),
    ('solve(X) :- {X = 25 / 2}.', '12.5', V.CORRECT, 2.0, 'number 12.5'),  # clpq rational.
    ('solve(X) :- X is 6 * 7.', '41', V.WRONG, 1.0, 'number'),
    ('solve(_).', '1', V.WRONG, 0.5, 'unbound'),
    ('solve(_) :- fail.', '1', V.WRONG, 0.5, 'failed'),
    ('solve(hello).', '1', V.WRONG, 0.5, 'non_numeric'),
    ('solve(X) :- X is foo + 1.', '1', V.WRONG, 0.5, 'error'),
    ('solve(X :- .\nbroken(.', '1', V.WRONG, 0.5, 'no_solve'),
])
def test_outcomes(code, answer, status, correctness, detail):
  v = run(f'<answer>\n{code}\n</answer>', answer)
  assert v.status == status and v.components['correctness'] == correctness
  assert v.detail.startswith(detail)


def test_syntax_errors_are_counted():
  v = run('<answer>\nsolve(42).\nbroken(.\n</answer>', '42')
  assert v.status == V.CORRECT and v.components['parses'] == 0.0


@pytest.mark.parametrize('code, status', [
    ('solve(X) :- loop(0, X).\nloop(N, X) :- M is N + 1, loop(M, X).', V.TIMEOUT),
    ("solve(1) :- shell('touch /tmp/rlreason-prolog-owned').", V.SANDBOX_VIOLATION),
    (":- shell('touch /tmp/rlreason-prolog-owned').\nsolve(1).", V.SANDBOX_VIOLATION),
    ("solve(1) :- open('/tmp/rlreason-prolog-owned', write, S), close(S).", V.SANDBOX_VIOLATION),
    ("solve(1) :- tcp_connect(localhost:80, _, []).", V.SANDBOX_VIOLATION),
])
def test_limits_and_sandbox(code, status):
  assert run(f'<answer>\n{code}\n</answer>', '1').status == status
  assert not __import__('os').path.exists('/tmp/rlreason-prolog-owned')


def test_missing_code_is_unparseable_not_half_credit():
  # The released code gives correctness 0.5 here; rlreason gives the default reward.
  assert run('The answer is 12.').status == V.PARSE_FAILURE
  assert run('<answer></answer>').status == V.PARSE_FAILURE
  assert run(GOOD, answer='twelve').status == V.INVALID_INPUT


def test_scoring_helpers_match_the_released_code():
  assert prolog.syntax_score(':- a. :- b. solve( solve( use_module clpq') == 1.0  # 6 hits, capped.
  assert prolog.syntax_score('solve(x)') == pytest.approx(0.2)
  # Hard-coded answer: 1 clause, 1 constraint -> (0.3 + 0.5) * 0.2 = 0.16.
  assert prolog.structure_score('solve(X) :- {X = 12}.', 1, 1) == pytest.approx(0.16)
  assert prolog.xml_count('<reasoning>\nr\n</reasoning>\n<answer>\na\n</answer>\n') == 0.5
  assert prolog.xml_count('<reasoning>\nr\n</reasoning>\n<answer>\na\n</answer>\nxyz') == \
      pytest.approx(0.5 - 0.003 - 0.003)


def test_curriculum_combines_prolog_components():
  v = run(GOOD)
  rewards, metrics = composition.PROLOG_CURRICULUM.combine(
      [{**v.components, 'semantic': 1.0}], progress=1.0)
  # At progress 1 the sigmoid is 1/(1+e^-6) = 0.99753; weights ~ late ones. Normalised:
  # semantic .5, format min(1, .67*1.5) = 1, syntax 1, correctness 1, structure .55.
  s = 1 / (1 + 2.718281828459045**-6)
  w = {k: early + (late - early) * s for k, early, late in [('semantic', .35, .10), ('format', .25, .10),
                                           ('syntax', .10, .10), ('correctness', .15, .45),
                                           ('structure', .15, .25)]}
  expected = 2 * (w['semantic'] * .5 + w['format'] + w['syntax'] + w['correctness'] +
                  w['structure'] * .55)
  assert rewards[0] == pytest.approx(expected)
  assert metrics['correctness/weight'] == pytest.approx(w['correctness'])
