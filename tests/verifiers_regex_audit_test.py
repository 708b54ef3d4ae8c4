"""Every regex that rlreason applies to model output runs in linear time: a complexity guard.

A completion is up to V.MAX_COMPLETION_CHARS (200k) characters of whatever the policy
wrote. A backtracking pattern that is quadratic there takes minutes per item (an
exponential one, forever), which the pool then reports as a timeout of a well-formed
answer. Each audited pattern, and each public function that applies one, gets 200k-character
adversarial inputs (runs of its own markers, of spaces, digits, newlines, backticks,
`\\boxed{`, each also behind the pattern's opening marker) and must answer each in under
0.5 s of CPU time; linear ones take milliseconds, quadratic ones tens of seconds, so this is
not a benchmark. A call still running after 2 s of CPU is interrupted (SIGVTALRM; Python's
regex engine checks for signals) and fails the test instead of hanging it.

The audit list is explicit: test_audit_list_is_complete fails on a new `re.` call anywhere
in rlreason/, or a module-level pattern in the files that make them, that it does not cover. Not audited: patterns
that come with the data (the `regex` and `format` verifiers' `answer` / `pattern`,
policy_recall's `id_pattern`); a pathological one is the pool's item timeout's problem.
"""

import importlib
import itertools
import pathlib
import re
import signal
import time

import pytest

from rlreason import verifiers
from rlreason import workdir_paths
from rlreason.envs import artist
from rlreason.envs import base as env_base
from rlreason.envs import calculator
from rlreason.envs import formats
from rlreason.envs import patient
from rlreason.envs import slate_rules
from rlreason.envs import tasks as env_tasks
from rlreason.model import tokenizer
from rlreason.rollout import judge
from rlreason.rollout import scribe
from rlreason.rollout import slate_judge
from rlreason.tasks import chat_arithmetic
from rlreason.tasks import arithmetic as arithmetic_task
from rlreason.tasks import policy_recall as policy_task
from rlreason.verifiers import answer_extraction as ae
from rlreason.verifiers import math_answer
from rlreason.verifiers import policy_recall
from rlreason.verifiers import prolog
from rlreason.verifiers import python_tests
from rlreason.verifiers import registry
from rlreason.verifiers import synthetic_tasks as st
from rlreason.verifiers import text_answer
from rlreason.verifiers import verdict as V

N = V.MAX_COMPLETION_CHARS
LIMIT_S = 0.5
GUARD_S = 2.0
GENERIC = (' ', '1', '\n', '\t', '`', '```', '\\boxed{', '{', '(', '[', 'a', '.')
SPECIALS = ('<|im_start|>', '<|im_end|>', '<|endoftext|>', '<start_of_turn>', '<s>', '</s>')
THINK = ('<think>', '</think><answer>', '</think> <answer>', '<answer>', '</answer>', '</think>')
REASONING = ('<reasoning>', '<reasoning>\n', '</reasoning><answer>', '</reasoning> <answer>',
             '\n</reasoning>\n<answer>\n', '\n</answer>\n', '</answer>')
FENCES = ('```', '```python', '```python \t', '```\n', '``', '``` ', ' \t', '```py\n')


def _fn(pattern, method, **kwargs):
  return lambda text: getattr(pattern, method)(text, **kwargs)


def _fmt(name):
  return lambda text: re.fullmatch(text_answer.FORMATS[name], text, re.DOTALL)


# name -> (text -> anything, the pattern's own markers). Compiled patterns are applied the
# way their module applies them (search, match, findall...).
PATTERNS = {
    'answer_extraction._BOXED': (lambda t: list(ae._BOXED.finditer(t)),
                                 ('\\boxed', '\\boxed ', '\\fbox', '\\boxed{')),
    'answer_extraction._ANSWER_IS': (lambda t: list(ae._ANSWER_IS.finditer(t)),
                                     ('answer', 'answer ', 'answer is', 'answer: =')),
    'answer_extraction._THOUSANDS': (_fn(ae._THOUSANDS, 'match'), ('1', ',123', '123,', '-1,')),
    'math_answer._PLAIN_NUMBER': (_fn(math_answer._PLAIN_NUMBER, 'fullmatch'), ('1', '1.', '.1')),
    'synthetic_tasks._INTEGER': (_fn(st._INTEGER, 'findall'), ('1', '+', '-1', '+-')),
    'synthetic_tasks._PERMUTATION': (_fn(st._PERMUTATION, 'findall'),
                                     ('[', '(', '[1', '(1', '1 ', '1,', ' , ', '(1)', '[1 2')),
    'synthetic_tasks.parse_permutation': (lambda t: _permutation(t),
                                          ('(', '(1', '(1 2', ')', '[1', '(1)')),
    'prolog._SYNTAX': (_fn(prolog._SYNTAX, 'findall'), (':-', 'solve', 'solve ', '. ', '.\n')),
    'prolog._HARDCODED': (_fn(prolog._HARDCODED, 'search'),
                          ('solve(', 'solve()', 'solve():-{', 'solve() :- {X=', '= 1', ' ')),
    'prolog._STRICT': (_fn(prolog._STRICT, 'match'), REASONING),
    'prolog._SOFT': (_fn(prolog._SOFT, 'match'), REASONING),
    'prolog._PREDICATE': (_fn(prolog._PREDICATE, 'findall'), ('a', 'a(', 'solve', '_')),
    'policy_recall.DEFAULT_ID_PATTERN': (
        lambda t: re.findall(policy_recall.DEFAULT_ID_PATTERN, t), ('A', 'A1', 'AB-', 'A-1', '-1')),
    'text_answer.FORMATS[think_answer]': (_fmt('think_answer'), THINK),
    'text_answer.FORMATS[reasoning_answer_strict]': (_fmt('reasoning_answer_strict'), REASONING),
    'text_answer.FORMATS[reasoning_answer]': (_fmt('reasoning_answer'), REASONING),
    'text_answer.FORMATS[answer_tag]': (_fmt('answer_tag'), THINK),
    'text_answer.FORMATS[boxed]': (_fmt('boxed'), ('\\boxed', '\\boxed ', '\\box')),
    'rollout.judge._STEP_MARKER': (lambda t: list(judge._STEP_MARKER.finditer(t)),
                                   ('step', 'step 1', '*', '* ', '**step 1', '# step ', 'step 1 ')),
    'judge.split_paragraphs': (judge.split_paragraphs, ('\n', '\n ', '\n \t', ' \n')),
    'tokenizer._specials_regex': (
        lambda t: list(tokenizer._specials_regex(SPECIALS).finditer(t)), ('<|im_sta', '<|', '<s')),
    'python_tests.extract_code': (python_tests.extract_code, FENCES),
    'tasks.arithmetic._COLUMN': (_fn(arithmetic_task._COLUMN, 'fullmatch'), ('1,', '1,1', ',')),
    'tasks.policy_recall._RECITED_RULE': (_fn(policy_task._RECITED_RULE, 'search'),
                                          ('POL-', 'POL-1', ' POL-1 ', '\n ', '\nPOL-1 ')),
    'tasks.chat_arithmetic._FINAL_NUMBER': (chat_arithmetic.final_number,
                                           ('1', '1,', ' 1', '1 .', '-1**', '$1')),
    'envs.formats._TAGS_CALL': (lambda t: list(formats._TAGS_CALL.finditer(t)),
                                ('<call>', '</call>', '<call>a:')),
    'envs.formats._TAGS_BODY': (_fn(formats._TAGS_BODY, 'fullmatch'), ('a', ' a', 'a:', 'a.')),
    # A --workdir's scheme (the user's flag, not model output): anchored, one class run.
    'workdir_paths._SCHEME': (workdir_paths.scheme, ('gs:/', 'a+b.c-d', 'a')),
    'envs.calculator._DECIMAL': (_fn(calculator._DECIMAL, 'fullmatch'), ('1', '.', '1.', 'e1')),
    'envs.tasks._REF': (_fn(env_tasks._REF, 'fullmatch'), ('$1', '$', '[0]')),
    'envs.patient._ACTION': (_fn(patient._ACTION, 'fullmatch'),
                             ('ask', 'ask ', 'dx a', ' dx ', 'ask a b')),
    'envs.slate_rules.NAME': (_fn(slate_rules.NAME, 'findall'), ('A', 'Ab', 'AB', 'aB')),
    'rollout.slate_judge._THINK': (_fn(slate_judge._THINK, 'search'),
                                   ('<think>', '</think>', '<think></think>', '<think')),
    'envs.artist._SELECT': (_fn(artist._SELECT, 'fullmatch'), ('seg', 'seg ', ' seg 1', 'seg 1 ')),
    # SCRIBE's routing: every shipped library's claim patterns over a judged step.
    'rollout.scribe.route': (lambda t: [scribe.route(t, lib) for lib in scribe.LIBRARIES.values()],
                             ('search', 'query', 'answer', 'calculator', 'evidence', 'because ')),
}


def _permutation(text):
  try:
    return st.parse_permutation(text, 5)
  except ValueError:
    return None


def _item(name, **fields):
  verify = registry.get_verifier(name)
  return lambda t: verify({'completion': t, **fields})


# Public functions that apply the patterns above to a completion.
PUBLIC = {
    'math': (_item('math', answer='1'), ('#### ', 'answer is ', '\\boxed{1}')),
    'arithmetic': (_item('arithmetic', answer='12'), ('1', '#### 1', '1,')),
    'group_composition': (_item('group_composition', answer='(1 2)', n=5),
                          ('[1', '(1', '(1 2)', '1 ', '<answer>(1 2)')),
    'group_composition_Z': (_item('group_composition', answer='3', n=5, group='Z'), ('1', '+1')),
    'exact': (_item('exact', answer='x'), ('<answer>', '\\boxed{', 'answer is ')),
    'policy_recall': (_item('policy_recall', answer=['A-1'], catalogue=['A-1']),
                      ('A-1 ', 'A', '<policies>')),
    **{f'format:{name}': (_item('format', format=name), THINK + REASONING)
       for name in text_answer.FORMATS},
    'prolog.format_score': (prolog.format_score, REASONING),
    'prolog.syntax_score': (prolog.syntax_score, (':-', 'solve', '. ')),
    'prolog.structure_score': (lambda t: prolog.structure_score(t, 1, 1),
                               ('solve(', 'solve():-{', 'solve() :- {X=')),
    'judge.split_steps:markers': (lambda t: judge.split_steps(t, split='markers'),
                                  ('step', 'step 1', '**step 1', '\n')),
    'judge.split_steps:paragraphs': (lambda t: judge.split_steps(t, split='paragraphs'),
                                     ('\n', '\n ')),
    'tasks.arithmetic:verify_carry_chain': (
        _item('rlreason.tasks.arithmetic:verify_carry_chain', answer='12', operands=[5, 7]),
        ('1,0 ', '1,', ',1')),
    'tasks.policy_recall.behaviour_mode': (policy_task.behaviour_mode, ('POL-1', '\n POL-1 ')),
    **{f'envs.formats:{family}': (formats.get(family).parse_calls,
                                  ('<tool_call>', '<call>', '{"name": ', '{', '</think>'))
       for family in formats.FORMATS},
    'envs.calculator': (lambda t: env_base.run_tool({'calculator': calculator.TOOL}, {},
                                                    env_base.ToolCall('calculator',
                                                                      {'expression': t}),
                                                    context={}),
                        ('1', '1+', '(', '1.', '9**')),
}


def flood(piece, head=''):
  """head, then `piece` repeated, to N characters; the last one never completes a match."""
  size = N - len(head) - 1
  return head + (piece * (size // len(piece) + 1))[:size] + '\x00'


def adversarial(markers):
  yield from (flood(p) for p in (*GENERIC, *markers))
  for head, piece in itertools.product(markers, (*markers, ' ', '1', '\n')):
    yield flood(piece, head)


class _TooSlow(BaseException):  # not an Exception: verifiers' `except Exception` lets it by.
  pass


def cpu_seconds(fn, text) -> float:
  def expire(signum, frame):
    del signum, frame
    raise _TooSlow()

  previous = signal.signal(signal.SIGVTALRM, expire)
  signal.setitimer(signal.ITIMER_VIRTUAL, GUARD_S)
  start = time.process_time()
  try:
    fn(text)
  except _TooSlow:
    pass
  finally:
    signal.setitimer(signal.ITIMER_VIRTUAL, 0)
    signal.signal(signal.SIGVTALRM, previous)
  return time.process_time() - start


@pytest.mark.parametrize('name', sorted({**PATTERNS, **PUBLIC}))
def test_linear_time_on_adversarial_input(name):
  fn, markers = {**PATTERNS, **PUBLIC}[name]
  fn('warm up: ' + markers[0])  # first calls load grammars (math-verify) and caches.
  for text in adversarial(markers):
    seconds = cpu_seconds(fn, text)
    if seconds >= LIMIT_S:  # load only ever adds time: the best of three is the cost.
      seconds = min(seconds, cpu_seconds(fn, text), cpu_seconds(fn, text))
    assert seconds < LIMIT_S, f'{name} took {seconds:.2f}s+ CPU on {text[:60]!r}...'


# Where rlreason applies regexes: `re.<function>(` calls in each file's source. A new call
# must be audited above (if model output can reach it), then counted here.
SCANNED = {
    'verifiers/answer_extraction.py': 3, 'verifiers/math_answer.py': 1,
    'verifiers/synthetic_tasks.py': 6, 'verifiers/prolog.py': 5,
    'verifiers/policy_recall.py': 2,  # the item's id_pattern; a split of a gold field.
    'verifiers/text_answer.py': 2,  # the item's pattern, compiled or full-matched.
    'rollout/judge.py': 2, 'model/tokenizer.py': 1, 'tasks/arithmetic.py': 1,
    'tasks/policy_recall.py': 1, 'envs/calculator.py': 1, 'envs/formats.py': 2,
    'envs/render.py': 1,  # a split on two literal marks: linear.
    'tasks/chat_arithmetic.py': 2,  # final_number (audited); a fullmatch of the gold answer.
    'envs/tasks.py': 1,  # envs/tasks: gold call references, not model output.
    'envs/patient.py': 1, 'envs/slate_rules.py': 1, 'rollout/slate_judge.py': 1,
    'envs/artist.py': 1, 'rollout/scribe.py': 2,  # scribe: the libraries' claim patterns.
    'workdir_paths.py': 1,  # a workdir's scheme (audited above).
}
_CALL = re.compile(r'\bre\.(?:compile|search|match|fullmatch|findall|finditer|split|subn?)\(')


def test_audit_list_is_complete():
  root = pathlib.Path(verifiers.__file__).parents[1]
  calls = {str(path.relative_to(root)): len(_CALL.findall(path.read_text()))
           for path in sorted(root.rglob('*.py'))}
  assert {k: n for k, n in calls.items() if n} == SCANNED
  compiled = set()
  for path in SCANNED:
    name = path.removesuffix('.py').replace('/', '.')
    module = importlib.import_module(f'rlreason.{name}')
    compiled |= {f'{name.removeprefix("verifiers.")}.{k}' for k, v in vars(module).items()
                 if isinstance(v, re.Pattern)}
  assert compiled <= set(PATTERNS), f'not audited: {sorted(compiled - set(PATTERNS))}'
