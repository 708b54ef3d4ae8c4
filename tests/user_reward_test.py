"""A user's reward as 'module:function' or 'file.py:function': loaded, checked, run in the pool."""

import sys
import textwrap

import pytest

from rlreason.verifiers import pool as pool_lib
from rlreason.verifiers import registry
from rlreason.verifiers import verdict as V

REWARD = textwrap.dedent('''
    import re

    def last_int(item):
      found = re.findall(r'-?\\d+', item['completion'])
      return float(bool(found) and found[-1] == item['answer'])

    def broken(item):
      return item['no_such_field']

    def text(item):
      return 'yes'
''')


@pytest.fixture
def reward_file(tmp_path):
  path = tmp_path / 'myreward.py'
  path.write_text(REWARD)
  return path


def test_a_file_path_reward_returns_numbers_as_verdicts(reward_file):
  fn = registry.get_verifier(f'{reward_file}:last_int')
  assert fn({'completion': 'so 12 then 148', 'answer': '148'}) == V.judged(True, reward=1.0)
  assert fn({'completion': 'no idea', 'answer': '148'}).status == V.WRONG


def test_an_unimportable_reward_is_a_start_up_error_naming_it(reward_file):
  with pytest.raises(ValueError, match=r"'myreward_absent:last_int' cannot be loaded: "
                     r"ModuleNotFoundError.*PYTHONPATH"):
    registry.check_importable('myreward_absent:last_int')
  with pytest.raises(ValueError, match=r'has no function .nope.'):
    registry.check_importable(f'{reward_file}:nope')
  with pytest.raises(ValueError, match=r'reward file .*absent.py does not exist'):
    registry.check_importable(f'{reward_file.parent}/absent.py:last_int')


def test_probe_runs_the_reward_on_one_example_and_shows_its_traceback(reward_file):
  item = {'completion': '148', 'answer': '148'}
  registry.probe(f'{reward_file}:last_int', item)
  with pytest.raises(ValueError, match=r"fails on the first example \(KeyError: 'no_such_field'\)"
                     r"(.|\n)*myreward.py"):
    registry.probe(f'{reward_file}:broken', item)
  with pytest.raises(ValueError, match=r'returned str; return a number or a Verdict'):
    registry.probe(f'{reward_file}:text', item)


def test_a_module_reward_scores_in_the_pool(reward_file, monkeypatch):
  monkeypatch.syspath_prepend(str(reward_file.parent))
  sys.modules.pop('myreward', None)
  items = [{'completion': 'it is 148', 'answer': '148'}, {'completion': '7', 'answer': '148'}]
  with pool_lib.VerifierPool(num_workers=1, spare_workers=0, warmup=False) as pool:
    for name in ('myreward:last_int', f'{reward_file}:last_int'):
      verdicts = pool.score(items, verifier=name, deadline_s=60.0)
      assert [(v.reward, v.status) for v in verdicts] == [(1.0, V.CORRECT), (0.0, V.WRONG)]


def test_a_crashing_reward_in_the_pool_names_the_line_that_raised(reward_file):
  with pool_lib.VerifierPool(num_workers=1, spare_workers=0, warmup=False) as pool:
    [verdict] = pool.score([{'completion': '1', 'answer': '1'}],
                           verifier=f'{reward_file}:broken', deadline_s=60.0)
  assert verdict.status == V.CRASH and verdict.detail.startswith("KeyError: 'no_such_field'")
  assert verdict.detail.endswith('myreward.py:9 in broken]'), verdict.detail
