"""Train a reward model on the demo's task, with the true reward known (methods/reward_model.py).

  python -m rlreason.main --config experiments/reward_model.py --workdir /tmp/rm
  python -m rlreason.main --config experiments/demo.py --workdir /tmp/demo_rm \\
      --config.reward_model.path=/tmp/rm/reward_model     # the demo rewarded by it
  python -m rlreason.main --config experiments/reward_model.py:runlocal --workdir /tmp/x

The demo's arithmetic task and model (experiments/demo.py). Answers come from its flawed
teacher (a dropped carry in 75% of traces), labelled by the task's verifier: the RM learns to
tell a right column addition from one with a dropped carry. 'pointwise' (BCE) by default;
`--config.reward_model.train.mode=pairwise` for Bradley-Terry on (right, wrong) pairs of one
problem. Reports eval/rm_accuracy and eval/rm_pair_accuracy on held-out problems.
"""

from experiments import demo


def get_config(arg: str = ''):
  c = demo.get_config('' if arg == 'runlocal' else arg)
  c.reward_model.train.enabled = True
  c.reward_model.train.update(mode='pointwise', steps=600, batch_size=32, lr=3e-4,
                              problems=2048, traces_per_problem=4, eval_problems=256)
  if arg == 'runlocal':
    demo.shrink_for_runlocal(c)
    c.reward_model.train.update(steps=4, batch_size=8, problems=16, traces_per_problem=2,
                                eval_problems=4)
  return c
