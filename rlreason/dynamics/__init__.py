"""Toy loops for the small-scale dynamics studies in colab/.

  bandit  categorical-bandit loops, jitted and vmapped over seeds and configurations
  toy_lm  a tiny transformer on group-composition problems, trained by any estimator
  soar    SOAR's bilevel teacher-student loop on the same task (teacher rewarded by the
          student's measured improvement on a hard subset)
  seed_stats  across-seed means with Student-t confidence intervals, for the plots

Built on objectives/, model/ and rl.update; nothing in the package imports dynamics/.
"""
