"""search, python and prolog tools, always called through base.run_tool (which never raises)."""

import json
import os
import shutil
import subprocess
import sys

import pytest

from rlreason.envs import base
from rlreason.envs import prolog_tool
from rlreason.envs import python_tool
from rlreason.envs import search

CORPUS = [
    'The cat sat on the mat and purred.',
    'Paris is the capital and largest city of France.',
    'Berlin is the capital of Germany; its river is the Spree.',
    'Photosynthesis turns light, water and carbon dioxide into sugar.',
]


def _call(tool, sessions, context=None, **arguments):
  return base.run_tool({tool.spec.name: tool}, sessions, base.ToolCall(tool.spec.name, arguments),
                       context=context or {})


# --- search -------------------------------------------------------------------------------


def test_search_ranks_the_passage_with_the_rare_terms_first():
  # "capital" is in passages 1 and 2, "france" only in 1: passage 1 matches both terms and
  # the rarer one, so it leads; passage 2 matches "capital" only; 0 and 3 match nothing
  # and are left out (score 0), so k=3 still gives two lines.
  sessions = {}
  result = _call(search.TOOL, sessions, {'corpus': CORPUS}, query='capital of France')
  assert result.error is None
  assert result.content.splitlines() == [f'[1] {CORPUS[1]}', f'[2] {CORPUS[2]}']
  result = _call(search.TOOL, sessions, {'corpus': CORPUS}, query='capital of France', k=1)
  assert result.content == f'[1] {CORPUS[1]}'


def test_search_truncates_long_passages_and_reports_no_match():
  corpus = ['zebra ' * 200, 'a horse']
  result = _call(search.TOOL, {}, {'corpus': corpus}, query='zebra')
  assert result.content.startswith('[1] zebra zebra')
  assert result.content.endswith('...') and len(result.content) <= 4 + search.PASSAGE_CHARS + 3
  assert _call(search.TOOL, {}, {'corpus': corpus}, query='giraffe').content == (
      "No passage matches 'giraffe'.")


def test_search_rejects_empty_query_and_bad_k():
  for arguments, message in (({'query': '  '}, 'query is empty'),
                             ({'query': 'cat', 'k': 0}, 'k must be in 1..10'),
                             ({'query': 'cat', 'k': 11}, 'k must be in 1..10'),
                             ({'query': 'cat', 'k': '2'}, 'k must be integer')):
    result = _call(search.TOOL, {}, {'corpus': CORPUS}, **arguments)
    assert result.error == base.BAD_ARGUMENTS and message in result.content, result


def test_search_reads_a_jsonl_corpus_and_names_a_missing_file(tmp_path):
  path = tmp_path / 'corpus.jsonl'
  path.write_text(''.join(json.dumps({'text': t}) + '\n' for t in CORPUS))
  result = _call(search.TOOL, {}, {'corpus_path': str(path)}, query='photosynthesis sugar')
  assert result.content.splitlines()[0] == f'[1] {CORPUS[3]}'
  missing = str(tmp_path / 'missing.jsonl')
  result = _call(search.TOOL, {}, {'corpus_path': missing}, query='cat')
  assert result.error == base.CRASH and missing in result.content
  with pytest.raises(ValueError, match='missing.jsonl'):
    search.check_context({'corpus_path': missing})
  search.check_context({'corpus_path': str(path)})


def test_search_builds_one_index_per_corpus():
  first = search.TOOL.new_session({'corpus': list(CORPUS)})
  assert search.TOOL.new_session({'corpus': list(CORPUS)}) is first
  assert search.TOOL.new_session({'corpus': CORPUS[:2]}) is not first


def test_search_leaves_jax_unimported():
  # bm25s imports jax when it can; envs/ must stay host-side (see search._without_jax).
  code = ('import sys; from rlreason.envs import search; s = search.TOOL.new_session('
          '{"corpus": ["a cat", "a dog"]}); print(search.TOOL.call(s, {"query": "dog"})); '
          'print(sorted(m for m in sys.modules if m.split(".")[0] in ("jax", "jaxlib")))')
  run = subprocess.run([sys.executable, '-c', code], capture_output=True, text=True,
                       timeout=120, check=True, cwd=os.path.dirname(os.path.dirname(__file__)))
  assert run.stdout.splitlines() == ['[1] a dog', '[]'], run.stdout


# --- python -------------------------------------------------------------------------------


def test_python_state_persists_and_a_raising_cell_is_not_kept():
  sessions = {}
  assert _call(python_tool.TOOL, sessions, code='x = 1') == base.ToolResult('(no output)')
  assert _call(python_tool.TOOL, sessions, code='print(x + 1)') == base.ToolResult('2\n')
  # The REPL echo: a final expression prints its repr (None prints nothing).
  assert _call(python_tool.TOOL, sessions, code='y = [x] * 2\ny') == base.ToolResult('[1, 1]\n')
  failed = _call(python_tool.TOOL, sessions, code='print("before")\nx = 100\n1 / 0')
  assert failed.error == base.TOOL_FAILED
  assert failed.content.startswith('Error: before\nTraceback')
  assert failed.content.endswith('ZeroDivisionError: division by zero')
  # The failed cell's x = 100 did not stick: the history is the three good cells.
  assert _call(python_tool.TOOL, sessions, code='x').content == '1\n'
  assert sessions['python'].history == ['x = 1', 'print(x + 1)', 'y = [x] * 2\ny', 'x']


def test_python_syntax_error_is_a_tool_failure():
  result = _call(python_tool.TOOL, {}, code='def f(:\n  pass')
  assert result.error == base.TOOL_FAILED and 'SyntaxError' in result.content


def test_python_fork_and_writes_outside_are_violations(tmp_path):
  outside = tmp_path / 'escaped.txt'
  sessions = {}
  for code in ('import os\nos.fork()', f'open({str(outside)!r}, "w").write("x")',
               'import subprocess\nsubprocess.run(["id"])'):
    result = _call(python_tool.TOOL, sessions, code=code)
    assert result.error == base.SANDBOX_VIOLATION, (code, result)
  assert not outside.exists()
  assert sessions['python'].history == []


def test_python_sleeping_forever_times_out():
  result = _call(python_tool.TOOL, {}, code='import time\ntime.sleep(1000)')
  assert result.error == base.TIMEOUT, result


def test_python_huge_output_is_cut():
  result = _call(python_tool.TOOL, {}, code='print("x" * 10_000_000)')
  assert result.error == base.OVERSIZED
  assert len(result.content) < base.MAX_OBSERVATION_CHARS + 100


# --- prolog -------------------------------------------------------------------------------

needs_swipl = pytest.mark.skipif(shutil.which('swipl') is None, reason='swipl not installed')
FAMILY = ('parent(tom, bob).\nparent(bob, ann).\nparent(bob, pat).\n'
          'grandparent(X, Z) :- parent(X, Y), parent(Y, Z).\n')


@needs_swipl
def test_prolog_consult_then_query():
  sessions = {}
  assert _call(prolog_tool.TOOL, sessions, action='consult', program=FAMILY).content == 'true.'
  result = _call(prolog_tool.TOOL, sessions, action='query', goal='grandparent(tom, W)')
  assert result == base.ToolResult('W = ann ;\nW = pat.')
  assert _call(prolog_tool.TOOL, sessions, action='query', goal='parent(tom, bob).').content == (
      'true.')
  assert _call(prolog_tool.TOOL, sessions, action='query', goal='parent(ann, _)').content == (
      'false.')
  # A second consult adds clauses to the first.
  _call(prolog_tool.TOOL, sessions, action='consult', program='parent(ann, joe).')
  result = _call(prolog_tool.TOOL, sessions, action='query', goal='grandparent(bob, G)')
  assert result.content == 'G = joe.'


@needs_swipl
def test_prolog_syntax_error_keeps_nothing():
  sessions = {}
  result = _call(prolog_tool.TOOL, sessions, action='consult', program='ok(1).\nfoo(X :- .')
  assert result.error == base.TOOL_FAILED and 'line 2' in result.content, result
  assert _call(prolog_tool.TOOL, sessions, action='query', goal='ok(X)').error == (
      base.TOOL_FAILED)  # ok/1 was not consulted: existence error.


@needs_swipl
def test_prolog_unsafe_goals_are_violations():
  sessions = {}
  for goal in ("shell('id')", "open('/etc/passwd', read, S)"):
    result = _call(prolog_tool.TOOL, sessions, action='query', goal=goal)
    assert result.error == base.SANDBOX_VIOLATION, (goal, result)
  result = _call(prolog_tool.TOOL, sessions, action='consult', program=':- shell(id).')
  assert result.error == base.SANDBOX_VIOLATION
  assert sessions['prolog'].program == ''


@needs_swipl
def test_prolog_infinite_loop_times_out():
  sessions = {}
  _call(prolog_tool.TOOL, sessions, action='consult', program='loop :- loop.')
  result = _call(prolog_tool.TOOL, sessions, action='query', goal='loop')
  assert result.error == base.TIMEOUT, result


def test_prolog_needs_the_right_argument_for_its_action():
  result = _call(prolog_tool.TOOL, {}, action='query')
  assert result.error == base.BAD_ARGUMENTS
  result = _call(prolog_tool.TOOL, {}, action='retract', goal='x')
  assert result.error == base.BAD_ARGUMENTS
