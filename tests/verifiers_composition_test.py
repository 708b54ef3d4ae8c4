"""Reward composition and weight schedules, with hand-computed values."""

import pytest

from rlreason.verifiers import composition as C


def test_schedules():
  lin = C.linear(1.0, 0.0, begin=0.2, stop=0.6)
  assert [lin(p) for p in (0.0, 0.2, 0.4, 0.6, 1.0, 7.0)] == pytest.approx([1, 1, .5, 0, 0, 0])
  st = C.step([1.0, 0.5, 0.0], [0.3, 0.7])
  assert [st(p) for p in (0.0, 0.29, 0.3, 0.69, 0.7, 1.0)] == [1, 1, .5, .5, 0, 0]
  sig = C.sigmoid(0.2, 0.6)
  assert sig(0.5) == pytest.approx(0.4)  # the midpoint is the average.
  assert sig(0.0) == pytest.approx(0.2 + 0.4 / (1 + 2.718281828459045**6))
  assert C.constant(3)(0.9) == 3.0
  with pytest.raises(ValueError):
    C.step([1.0], [0.5])


def test_weighted_sum_and_metrics():
  mix = C.RewardComposition(weights={'math': 1.0, 'overlong': 1.0, 'judge': C.linear(0.0, 0.5)},
                            transforms={'judge': lambda s: (s + 1) / 2})
  items = [{'math': 1.0, 'overlong': -0.5, 'judge': 1.0},
           {'math': 0.0, 'overlong': 0.0, 'judge': -1.0}]
  rewards, m = mix.combine(items, progress=0.5)
  # judge weight 0.25; judge transformed to 1 and 0: r0 = 1 - .5 + .25 = .75, r1 = 0.
  assert rewards == pytest.approx([0.75, 0.0])
  assert m['reward/mean'] == pytest.approx(0.375) and m['reward/std'] == pytest.approx(0.375)
  assert m['judge/weight'] == pytest.approx(0.25) and m['judge/mean'] == pytest.approx(0.5)
  assert m['overlong/min'] == -0.5 and m['overlong/contribution'] == pytest.approx(-0.25)
  assert mix.weights_at(1.0) == {'math': 1.0, 'overlong': 1.0, 'judge': 0.5}


def test_missing_components():
  strict = C.RewardComposition(weights={'a': 1.0, 'b': 2.0})
  with pytest.raises(KeyError, match="no component 'b'"):
    strict.combine([{'a': 1.0}], progress=0.0)
  lenient = C.RewardComposition(weights={'a': 1.0, 'b': 2.0}, missing='zero')
  assert lenient.combine([{'a': 1.0}], progress=0.0)[0] == [1.0]
  with pytest.raises(ValueError):
    C.RewardComposition(weights={'a': 1.0}, transforms={'b': abs})


@pytest.mark.parametrize('progress', [0.0, 0.1, 0.5, 0.77, 1.0])
def test_prolog_curriculum_weights_sum_to_one(progress):
  weights = C.PROLOG_CURRICULUM.weights_at(progress)
  assert sum(weights.values()) == pytest.approx(1.0)


def test_prolog_curriculum_midpoint_is_the_average():
  mid = C.PROLOG_CURRICULUM.weights_at(0.5)
  assert mid == pytest.approx({'semantic': .225, 'format': .175, 'syntax': .10,
                               'correctness': .30, 'structure': .20})
