"""An SFT teacher for calc_multiply that sometimes writes a broken calculator call first.

  c.sft.teacher = 'rlreason.envs.cleaner_traces:broken_call_trace'
  c.sft.teacher_options = {'call_prob': 0.6, 'broken_prob': 0.5}

A warm-started tiny model that makes tool syntax errors, for CLEANER's rollback study
(experiments/dynamics/cleaner_rollback.py): with probability `call_prob` the trace calls the
calculator; such a call is first written broken with probability `broken_prob` (the operator
doubled, '1234 * * 5678', which the calculator cannot parse: its 'SyntaxError' class), the
environment's error is shown (base.run_tool's message, exactly), and the right call follows;
otherwise the answer is guessed from the head (the product with one digit changed, never right;
envs.tasks.calculator_trace's guess). The 'tags' format, an episode as [text, trained] segments
(observations untrained), answers after `answer_prefix`, right-aligned to 2 x difficulty
characters as calculator_trace's right_align (why: its docstring).

Not here: the rollback itself (rollout/rollback.py).
"""

from rlreason.envs import base
from rlreason.envs import registry
from rlreason.tasks import example as example_lib


def broken_expression(expression: str) -> str:
  """'a * b' -> 'a * * b': a call the calculator refuses with its SyntaxError class."""
  return expression.replace('*', '* *', 1)


def _call(expression: str) -> str:
  return f'<call>calculator: {{"expression": "{expression}"}}</call>'


def _result(example: example_lib.Example, expression: str) -> str:
  tools = registry.get_tools(['calculator'])
  return base.run_tool(tools, {}, base.ToolCall('calculator', {'expression': expression}),
                       context=example.meta, deadline_s=None).content


def broken_call_trace(example: example_lib.Example, rng, *, call_prob: float = 0.6,
                      broken_prob: float = 0.5, answer_prefix: str = '#### ') -> list[list]:
  """[text, trained] segments of one teacher episode (see the module docstring)."""
  expression = example.meta['gold_calls'][0]['arguments']['expression']
  width = 2 * example.difficulty
  answer = answer_prefix + example.answer.rjust(width)
  if rng.random() >= call_prob:
    digits = list(example.answer)
    i = int(rng.integers(len(digits)))
    digits[i] = str((int(digits[i]) + int(rng.integers(1, 10))) % 10)
    digits[0] = digits[0] if digits[0] != '0' else '1'
    guess = ''.join(digits)
    guess = guess if guess != example.answer else guess + '0'
    return [[answer_prefix + guess.rjust(width), True]]
  segments = []
  if rng.random() < broken_prob:
    broken = broken_expression(expression)
    segments += [[_call(broken), True], [f'<result>{_result(example, broken)}</result>', False]]
  segments += [[_call(expression), True],
               [f'<result>{_result(example, expression)}</result>', False], [answer, True]]
  return segments
