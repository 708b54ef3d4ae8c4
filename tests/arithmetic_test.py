"""The demo's verifier, arithmetic.verify_carry_chain, on hand-worked chains."""

import numpy as np
import pytest

from rlreason.tasks import arithmetic

# 12345 + 67890, least significant column first:
#   5+0     =  5 -> 5,0
#   4+9     = 13 -> 3,1
#   3+8 + 1 = 12 -> 2,1
#   2+7 + 1 = 10 -> 0,1
#   1+6 + 1 =  8 -> 8,0      sum 80235
ITEM = {'answer': '80235', 'operands': [12345, 67890]}
CHAIN = '5,0 3,1 2,1 0,1 8,0'


def _verify(completion, **item):
  return arithmetic.verify_carry_chain({**ITEM, 'completion': completion, **item})


def test_the_true_chain_is_correct():
  assert _verify(CHAIN).status == 'correct'
  assert _verify(CHAIN).reward == 1.0
  assert _verify(' 5,0\n3,1 2,1  0,1 8,0\n').status == 'correct'  # Any whitespace between.
  # 99 + 99: 9+9 = 18 -> 8,1; 9+9+1 = 19 -> 9,1; the last carry is the leading 1 of 198.
  assert _verify('8,1 9,1', answer='198', operands=[99, 99]).status == 'correct'


@pytest.mark.parametrize('chain', [
    '5,0 3,0 2,1 0,1 8,0',  # Column 1 (4+9=13) carries; its digits still spell 80235.
    '5,1 3,1 2,1 0,1 8,0',  # Column 0 (5+0=5) does not carry; digits still spell 80235.
])
def test_a_wrong_intermediate_carry_is_wrong_even_when_the_digits_spell_the_sum(chain):
  v = _verify(chain)
  assert (v.status, v.reward) == ('wrong', 0.0), v


@pytest.mark.parametrize('chain', [
    '5,0 3,1 2,1 0,1 9,0',  # 90235.
    '5,0 3,1 2,1 0,1 8,1',  # 180235: a carry out of the last column.
    '5,0 3,1 2,0 9,0 7,0',  # The flawed teacher's chain: column 2's carry dropped -> 79235.
])
def test_a_wrong_final_answer_is_wrong(chain):
  assert _verify(chain).status == 'wrong'


@pytest.mark.parametrize('chain', [
    '5,0 3,1 2,1 0,1',          # Missing the last column (spells 0235).
    '3,1 2,1 0,1 8,0',          # Missing the first column.
    '5,0 3,1 2,1 0,1 8,0 0,0',  # An extra zero column (spells 080235).
    '5,0 3,1 2,1 0,1 8,0 8,0',  # An extra column.
])
def test_missing_or_extra_columns_are_wrong(chain):
  assert _verify(chain).status == 'wrong'


@pytest.mark.parametrize('chain', [
    '5,0 3,1 2,1 0,1 8,x',          # Not a carry.
    '5,0 3,2 2,1 0,1 8,0',          # A carry of 2.
    '5,0 13,1 2,1 0,1 8,0',         # Two digits in a column.
    '5,0 3;1 2,1 0,1 8,0',          # Wrong separator.
    '5,0 3,1 2,1 0,1 8,',           # No carry.
    '+5,0 3,1 2,1 0,1 8,0',         # A sign that int() would accept.
    '\u0665,0 3,1 2,1 0,1 8,0',     # Arabic-Indic five, which int() reads as 5.
    '5,0 3,1 2,1 0,1 8,0 #### 80235',  # The final_answer=True format.
    '',
    '   ',
])
def test_malformed_or_empty_chains_are_parse_failures(chain):
  v = _verify(chain)
  assert (v.status, v.reward) == ('parse_failure', 0.0), v


def test_an_item_without_consistent_operands_is_invalid_input():
  assert arithmetic.verify_carry_chain(
      {'completion': CHAIN, 'answer': '80235'}).status == 'invalid_input'
  assert _verify(CHAIN, operands=[12345, 67891]).status == 'invalid_input'
  assert _verify(CHAIN, operands=[12345]).status == 'invalid_input'
  assert _verify(CHAIN, operands=[True, 67890]).status == 'invalid_input'


def test_generated_chains_are_correct_and_any_flipped_carry_is_wrong():
  rng = np.random.default_rng(0)
  for i in range(300):
    ex = arithmetic.generate(0, i, difficulty=5, layout='columns', final_answer=False)
    item = {'answer': ex.answer, **ex.meta}
    assert arithmetic.verify_carry_chain({**item, 'completion': ex.solution}).status == 'correct'
    columns = ex.solution.split()
    n = rng.integers(len(columns))
    digit, carry = columns[n].split(',')
    columns[n] = f'{digit},{1 - int(carry)}'
    flipped = ' '.join(columns)
    assert arithmetic.verify_carry_chain({**item, 'completion': flipped}).status == 'wrong'
