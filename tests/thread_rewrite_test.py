"""Two-stage rewrite of sequential solutions into threads (tasks/thread_rewrite.py)."""

import types

import numpy as np

from rlreason.tasks import parallel_sums
from rlreason.tasks import thread_rewrite as tr

MARKERS = parallel_sums.THREAD_MARKERS


def _toy_parser():
  """Solutions like 'a=2 b=a+3=5 c=7 s=b+c=12 #### 12': a step 'L=R' is a constant from the
  problem (example.meta), 'L=X+Y=R' reads the results of X and Y."""

  def parse(example, text):
    body, _, answer = text.partition(' #### ')
    steps = []
    for part in body.split(' '):
      fields = part.split('=')
      inputs = tuple(fields[1].split('+')) if len(fields) == 3 else ()
      steps.append(tr.Step(fields[0], fields[-1], inputs, part))
    return steps, ' #### ' + answer

  def check(example, step, results):
    if not step.inputs:
      return step.result == str(example.meta[step.label])
    return int(step.result) == sum(int(results.get(x, x)) for x in step.inputs)

  def verify(example, text):
    return text.rsplit(' #### ', 1)[-1] == example.answer

  return tr.StepParser(parse=parse, check=check, verify=verify, markers=MARKERS)


TOY = types.SimpleNamespace(meta={'a': 2, 'c': 7}, answer='12')


def test_independent_steps_become_threads_dependent_steps_stay_in_the_parent():
  out = tr.rewrite(TOY, 'a=2 b=a+3=5 c=7 s=b+c=12 #### 12', _toy_parser())
  assert out.status == 'kept'
  assert out.workers == (('a', '2'), ('c', '7'))  # b reads a, s reads b and c: sequential
  assert out.ending == 'b=a+3=5 s=b+c=12 #### 12'
  assert out.parent_text() == '<a,c>[2,7]b=a+3=5 s=b+c=12 #### 12'
  indep, dep = tr.split(_toy_parser().parse(TOY, 'a=2 b=a+3=5 c=7 s=b+c=12 #### 12')[0])
  assert [s.label for s in indep] == ['a', 'c'] and [s.label for s in dep] == ['b', 's']
  # A chain has one independent step: nothing to run in parallel.
  chain = types.SimpleNamespace(meta={'a': 2}, answer='9')
  assert tr.rewrite(chain, 'a=2 b=a+a=4 s=b+a=6 #### 9', _toy_parser()).status == 'sequential'


def test_parallel_sums_rewrite_is_the_hand_written_threaded_teacher():
  for i in range(5):
    ex = parallel_sums.generate(3, i, difficulty=4, groups=3)
    out = tr.rewrite(ex, ex.solution, parallel_sums.STEP_PARSER)
    assert out.kept
    assert out.parent_text() == parallel_sums.threaded_text(ex)
    spawn, workers, ending = parallel_sums.threaded_solution(ex)
    assert (out.spawn_block(), list(out.workers), out.ending) == (spawn, workers, ending)
    # The SFT teacher draws its thread as the hand-written teacher does.
    assert (tr.teacher(ex, np.random.default_rng(i))
            == parallel_sums.threaded_teacher(ex, np.random.default_rng(i)))


def test_slipped_and_malformed_traces_are_dropped():
  ex = parallel_sums.generate(0, 1, difficulty=4, groups=3)
  assert ex.solution == 'a:7392 b:5307 c:2536 +295 #### 5'
  parser = parallel_sums.STEP_PARSER
  assert tr.rewrite(ex, 'a:7392 b:5317 c:2536 +295 #### 5', parser).status == 'wrong_step'
  assert tr.rewrite(ex, 'a:7392 b:5307 c:2536 +285 #### 5', parser).status == 'wrong_step'
  assert tr.rewrite(ex, 'a:7392 b:5307 c:2536 +295 #### 4', parser).status == 'wrong_answer'
  assert tr.rewrite(ex, 'a:7392 c:2536 +295 #### 5', parser).status == 'unparsed'
  assert tr.rewrite(ex, 'the answer is 5', parser).status == 'unparsed'
  toy = _toy_parser()  # A slip in a dependent step of the toy task.
  assert tr.rewrite(TOY, 'a=2 b=a+3=6 c=7 s=b+c=12 #### 12', toy).status == 'wrong_step'


def test_noisy_sources_every_slip_dropped_and_deterministic():
  examples = [parallel_sums.generate(5, i, difficulty=3, groups=4) for i in range(60)]
  stats = tr.kept_fraction(examples, slip_rate=0.5, seed=1)
  assert stats == tr.kept_fraction(examples, slip_rate=0.5, seed=1)
  assert stats['kept_clean'] == 1.0 and stats['kept_slipped'] == 0.0
  assert 0.2 < stats['slipped'] < 0.8
  assert abs(stats['kept'] - (1.0 - stats['slipped'])) < 1e-12
  rows = [tr.teacher(ex, np.random.default_rng(7), slip_rate=0.5) for ex in examples[:10]]
  assert rows == [tr.teacher(ex, np.random.default_rng(7), slip_rate=0.5) for ex in examples[:10]]
  assert tr.slip('a:12', np.random.default_rng(0)) != 'a:12' and tr.slip('ab', None) == 'ab'
