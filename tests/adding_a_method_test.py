"""docs/adding_a_method.md runs: its code blocks, written out as the files they name, with a
tiny config (one RL step of experiments/demo.py's runlocal model)."""

import importlib
import pathlib
import re
import sys

import numpy as np
import pytest

from rlreason import config as config_lib
from rlreason.rl import extensions
from rlreason.rl import metrics
from rlreason.rl import train
from rlreason.tasks import data
from rlreason.tasks import example as example_lib
from rlreason.verifiers import pool as pool_lib

DOC = pathlib.Path(__file__).parent.parent / 'docs' / 'adding_a_method.md'


def doc_files() -> dict[str, str]:
  """{file name: code} of the page's python blocks (each starts with '# file: <name>')."""
  blocks = re.findall(r'```python\n(.*?)```', DOC.read_text(), flags=re.S)
  files = {}
  for block in blocks:
    first, _, rest = block.partition('\n')
    name = re.fullmatch(r'# file: (\S+\.py)', first)
    assert name, f'{DOC}: a python block must start with "# file: <name>.py", not {first!r}'
    files[name.group(1)] = rest
  return files


@pytest.fixture
def doc_modules(tmp_path, monkeypatch):
  for name, code in doc_files().items():
    (tmp_path / name).write_text(code)
  monkeypatch.syspath_prepend(str(tmp_path))
  from rlreason.objectives import advantages  # pylint: disable=g-import-not-at-top
  estimators = dict(advantages.ESTIMATORS)
  yield tmp_path
  extensions.unregister('shortest_bonus')
  # The page's estimator leaves the registry (every_option_test checks the registry's cases).
  advantages.ESTIMATORS.clear()
  advantages.ESTIMATORS.update(estimators)
  for name in doc_files():
    sys.modules.pop(name[:-3], None)


def test_the_page_has_the_three_examples():
  assert {'my_estimators.py', 'my_rewards.py', 'my_source.py'} <= set(doc_files())


def test_the_estimator_scores_by_wins_and_ties_give_zero(doc_modules):
  my_estimators = importlib.import_module('my_estimators')
  from rlreason.objectives import advantages
  assert advantages.get_estimator('pairwise_sign') is my_estimators.pairwise_sign
  adv = np.asarray(my_estimators.pairwise_sign(np.array([[0., 1., 1., 2.], [3., 3., 3., 3.]])))
  np.testing.assert_allclose(adv, [[-0.75, 0., 0., 0.75], [0., 0., 0., 0.]])


def test_the_reward_function_scores_a_jsonl_dataset_through_the_pool(doc_modules):
  jsonl_config = importlib.import_module('jsonl_config')
  path = jsonl_config.write_dataset(doc_modules / 'train.jsonl')
  examples = data.load_jsonl(path, data.GSM8K)
  c = jsonl_config.configure(config_lib.default(), train_path=path, eval_path=path,
                             reward_file=doc_modules / 'my_rewards.py')
  completions = ['12 + 30 = 42', 'about 15.01', 'I do not know', '10']
  items = [example_lib.verifier_item(ex, text, num_tokens=1, max_len=8, cache_len=2,
                                     penalty_factor=1.0)
           for ex, text in zip(examples, completions)]
  with pool_lib.VerifierPool(num_workers=1, spare_workers=0) as pool:
    verdicts = pool.score(items, verifier=c.verifier.name, deadline_s=60.0)
  assert [v.reward for v in verdicts] == [1.0, 0.5, 0.0, 1.0]


def test_a_run_with_the_estimator_and_the_rollout_source(doc_modules, tmp_path):
  estimator_config = importlib.import_module('estimator_config')
  source_config = importlib.import_module('source_config')
  c = importlib.import_module('experiments.demo').get_config('runlocal')
  c.rl.steps, c.eval.every, c.eval.num_prompts = 1, 0, 4
  c = source_config.configure(estimator_config.configure(c))
  train.train(c, str(tmp_path / 'run'))
  (row,) = [r for r in metrics.read_jsonl(tmp_path / 'run' / 'metrics.jsonl') if r['step'] == 1]
  assert 0.0 <= row['shortest/bonus_frac'] <= 1.0
  assert np.isfinite(row['loss'])
