"""A flawed SFT teacher for prolog_arith episodes: derive, or state a number from the head.

  segments = prolog_trace(example, rng, protocol='agentic', tries=3)  # [[text, trained], ...]

A tiny model from scratch cannot write Prolog, let alone GSM8K's (it would get accuracy 0 and
no reward signal); the paper starts from Qwen2.5-3B-Instruct. This teacher stands in for the
instruct model's habits (our formalisation [I]): with probability `derive_prob` it writes the
derivation (prolog_tasks.program: a fact per quantity, solve/1 a constraint over them, always
right), otherwise it hard-codes a number computed "in its head" (prolog_tasks.hardcoded),
right with probability `head_right_prob`, else with one digit changed. Either program first
comes out, with probability `slip_prob`, with the facts left out of solve/1's body
("solve(X) :- {X = A+B}.": X stays unbound, no number; a hard-coded slip drops the number's
final period, a syntax error). Under 'multi_try' or 'agentic' with tries >= 2 the slip is
followed by the environment's observation (RETRY, or what running it gives: SLIP_OBSERVATIONS,
checked against the environment by the tests) and the clean program; under 'single' the slip is the episode.

Correctness-only RL has a reason to prefer derivations only where hard-coded numbers are
wrong; the structure reward prefers them always: that is the study's trade-off
(experiments/dynamics/prolog_protocols.py). Not here: the filter (sft.filter), GSM8K.
"""

from rlreason.envs import prolog_protocols
from rlreason.envs import prolog_tasks
from rlreason.envs import render
from rlreason.tasks import example as example_lib


# The agentic observation of a slip: hard-coded (no final period), derivation (X unbound).
SLIP_OBSERVATIONS = {False: 'syntax error; no solve/1', True: 'X unbound'}


def _head_number(answer: str, rng, right_prob: float) -> str:
  if rng.random() < right_prob:
    return answer
  digits = list(answer.lstrip('-'))
  i = int(rng.integers(len(digits)))
  digits[i] = str((int(digits[i]) + int(rng.integers(1, 10))) % 10)
  if len(digits) > 1 and digits[0] == '0':
    digits[0] = str(int(rng.integers(1, 10)))
  wrong = ('-' if answer.startswith('-') else '') + ''.join(digits)
  return wrong if wrong != answer else answer + '1'


def _slipped(program: str) -> str:
  """The program with solve/1's body reduced to its constraint (derivation: X unbound), or
  its final period left out (hard-coded: a syntax error)."""
  head, _, body = program.rpartition('solve(X) :- ')
  if not head:
    return program.removesuffix('.')
  return f'{head}solve(X) :- {body[body.index("{"):]}'


def prolog_trace(example: example_lib.Example, rng, *, protocol: str = 'single', tries: int = 1,
                 derive_prob: float = 0.5, head_right_prob: float = 0.5,
                 slip_prob: float = 0.0) -> list[list]:
  """One episode as [text, trained] segments in the 'tags' text format: each try a program
  in <answer>...</answer> (trained), each observation <result>...</result> (not trained)."""
  for name, p in (('derive_prob', derive_prob), ('head_right_prob', head_right_prob),
                  ('slip_prob', slip_prob)):
    if not 0 <= p <= 1:
      raise ValueError(f'prolog_trace: {name}={p} must be in [0, 1]')
  env = prolog_protocols.PrologEnvironment(protocol=protocol, tries=tries)  # checks both
  if rng.random() < derive_prob:
    program = prolog_tasks.program(example.meta)
  else:
    program = prolog_tasks.hardcoded(_head_number(example.answer, rng, head_right_prob))
  if rng.random() >= slip_prob:
    return [[prolog_protocols.answer_text(program), True]]
  slip = prolog_protocols.answer_text(_slipped(program))
  if tries == 1:
    return [[slip, True]]
  # What the environment answers (tests/prolog_episodes_test.py replays the traces in it);
  # written out rather than run, so that SFT batches start no swipl process.
  derivation = program.startswith(tuple(f'{name}(' for name, _ in example.meta['facts']))
  observation = (prolog_protocols.RETRY if env.protocol == 'multi_try' else
                 SLIP_OBSERVATIONS[derivation])
  return [[slip, True], [f'{render.RESULT_OPEN}{observation}{render.RESULT_CLOSE}', False],
          [prolog_protocols.answer_text(program), True]]
