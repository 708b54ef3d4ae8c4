"""Tests of rlreason.dynamics.seed_stats: hand-computed Student-t intervals over seeds."""

import matplotlib
matplotlib.use('Agg')
import matplotlib.pyplot as plt
import numpy as np
import pytest

from rlreason.dynamics import seed_stats


def test_t_interval_hand_values():
  # Seeds [1, 2, 3, 4, 5]: mean 3, sample sd sqrt(10/4) = 1.581139, se = 0.707107,
  # t_{0.975, 4} = 2.776445 (tables), half-width 1.963243. Second column: the same shifted
  # by 10 and scaled by 2 (half-width 3.926486); third column constant (half-width 0).
  y_SxI = np.array([[1.0, 12, 7], [2, 14, 7], [3, 16, 7], [4, 18, 7], [5, 20, 7]])
  mean_I, lo_I, hi_I = seed_stats.t_interval(y_SxI)
  np.testing.assert_allclose(mean_I, [3, 16, 7])
  np.testing.assert_allclose(hi_I - mean_I, [1.963243, 3.926486, 0], rtol=1e-6)
  np.testing.assert_allclose(mean_I - lo_I, hi_I - mean_I)
  # 90%: t_{0.95, 4} = 2.131847, half-width 1.507443.
  _, lo, hi = seed_stats.t_interval(y_SxI[:, :1], level=0.9)
  np.testing.assert_allclose(hi - 3, [1.507443], rtol=1e-6)
  assert seed_stats.format_ci([1, 2, 3, 4, 5]) == '3.000 ± 1.963'


def test_t_interval_one_seed_and_bad_input():
  mean_I, lo_I, hi_I = seed_stats.t_interval([[0.5, 0.25]])
  np.testing.assert_array_equal([mean_I, lo_I, hi_I], [[0.5, 0.25]] * 3)
  with pytest.raises(ValueError, match='y_SxI'):
    seed_stats.t_interval(np.zeros((0, 3)))
  with pytest.raises(ValueError, match='level'):
    seed_stats.t_interval([[1.0], [2.0]], level=95)


def test_plot_ci_draws_mean_line():
  fig, ax = plt.subplots()
  line = seed_stats.plot_ci(ax, [0, 1], [[0.0, 1.0], [1.0, 3.0]], label='m', ls='--')
  np.testing.assert_allclose(line.get_ydata(), [0.5, 2.0])
  assert line.get_label() == 'm' and line.get_linestyle() == '--'
  plt.close(fig)


def test_block_mean():
  np.testing.assert_allclose(seed_stats.block_mean([[1, 3, 5, 7], [0, 0, 2, 2]], 2),
                             [[2, 6], [0, 2]])
  with pytest.raises(ValueError, match='every=3'):
    seed_stats.block_mean(np.zeros((1, 4)), 3)
