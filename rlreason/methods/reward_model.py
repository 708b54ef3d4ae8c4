"""Reward models: a scalar head on the transformer, trained from labelled answers or preference
pairs, then used by the RL loop as a device-side batched reward.

  python -m rlreason.main --config experiments/reward_model.py --workdir /tmp/rm   # train one
  --config.reward_model.path=/tmp/rm/reward_model                                  # use it

The model is the policy's architecture (`config.model`, a random init or a HF checkpoint)
with the critic's Dense D -> 1 head (`transformer.init_value_head`) on the final hidden state
of each sequence's last real token (its EOS): one score per (prompt, answer).

Training data, for tasks whose true reward is known (our setup, for studying learned rewards
against it): per problem of the task's training stream, `traces_per_problem` answers of the
SFT teacher (`config.sft.teacher`; the demo's flawed arithmetic teacher is right in a minority
of traces), each labelled by the task's verifier (`config.verifier.name`). 'pointwise' trains
on every (prompt, answer, label) with reward_losses.pointwise (BCE: sigmoid(score) estimates
P(right)); 'pairwise' on (right, wrong) pairs of one problem with reward_losses.bradley_terry.
Held-out problems (the task's hash-disjoint split) give the accuracy the run reports:
'eval/rm_accuracy' (pointwise: sign of the score = label; pairwise: right above wrong) and,
for both, 'eval/rm_pair_accuracy' on held-out (right, wrong) pairs.

Saved as `workdir/reward_model/`: the backbone as a HF checkpoint (model/weights.py), the head
as `reward_head.safetensors`, and `reward_model.json` (mode, vocabulary size, tokenizer kind
and task) which `load` checks against the RL run's tokenizer.

In the RL loop (rl_batch.score): reward = verifier_weight x verifier + weight x RM, where RM
is sigmoid(score) ('sigmoid', pointwise models) or the raw score ('raw').

Not here: process reward models and rePIRL, judges (rollout/judge.py).
"""

import dataclasses
import json
import logging
import pathlib
import tempfile
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax
from safetensors import numpy as safetensors_np

from rlreason import workdir_paths
from rlreason.model import transformer
from rlreason.model import weights
from rlreason.objectives import reward_losses
from rlreason.rl import metrics as metrics_lib
from rlreason.rollout import sampler
from rlreason.tasks import data
from rlreason.tasks import example as example_lib
from rlreason.verifiers import registry

MODES = ('pointwise', 'pairwise')
TRANSFORMS = ('sigmoid', 'raw')
HEAD_FILE, META_FILE = 'reward_head.safetensors', 'reward_model.json'


def last_token_index(mask_NxT):
  """Index of each row's last real token (rows with none: 0)."""
  t = mask_NxT.shape[1]
  return jnp.where(mask_NxT.any(1), t - 1 - jnp.argmax(mask_NxT[:, ::-1], axis=1), 0)


def sequence_scores(params, head, tokens_NxT, mask_NxT, *, cfg: transformer.ModelConfig):
  """One fp32 score per row: the head on the final hidden state of the last real token."""
  h_NxTxD, _ = transformer.apply(params, tokens_NxT, cfg=cfg, mask_NxT=mask_NxT, return_hidden=True)
  last_N = last_token_index(mask_NxT)
  h_Nx1xD = jnp.take_along_axis(h_NxTxD, last_N[:, None, None], axis=1)
  return transformer.values_from_hidden(head, h_Nx1xD)[:, 0]


@dataclasses.dataclass
class RewardModel:
  """A loaded reward model; `score(tokens_NxT, mask_NxT)` -> fp32 scores (N,), on device."""
  cfg: transformer.ModelConfig
  params: Any
  head: Any
  meta: dict

  def __post_init__(self):
    self._fn = jax.jit(lambda p, h, t, m: sequence_scores(p, h, t, m, cfg=self.cfg))

  def score(self, tokens_NxT, mask_NxT):
    return self._fn(self.params, self.head, tokens_NxT, mask_NxT)


def labelled_traces(examples, teacher, verifier_name: str, rng, *, per_problem: int):
  """[(example, answer text, reward)]: `per_problem` teacher answers each, scored in process by
  the verifier (the true reward)."""
  verify = registry.get_verifier(verifier_name)
  out = []
  for ex in examples:
    for _ in range(per_problem):
      text = teacher(ex, rng)
      if text is None:
        continue
      item = example_lib.verifier_item(ex, text, num_tokens=0, max_len=0, cache_len=0,
                                       penalty_factor=0.0)
      out.append((ex, text, float(verify(item).reward)))
  return out


def preference_pairs(traces):
  """[(example, chosen, rejected)]: each problem's highest-reward answer against each answer
  with a strictly lower reward (problems whose answers all tie give none)."""
  by_problem: dict[str, list] = {}
  for ex, text, reward in traces:
    by_problem.setdefault(ex.id, []).append((ex, text, reward))
  pairs = []
  for items in by_problem.values():
    best = max(items, key=lambda x: x[2])
    pairs += [(best[0], best[1], text) for _, text, r in items if r < best[2]]
  return pairs


def encode(run, examples, answers, length: int):
  """Right-padded prompt+answer+EOS tokens and their mask (as the SFT batch writes them)."""
  from rlreason.rl import sft
  tokens, trained = sft.sft_batch(run, examples, answers, length)
  last_N = last_token_index(trained)  # The answer's EOS closes every row.
  return tokens, jnp.arange(length)[None, :] <= last_N[:, None]


def _batches(items, batch_size: int, rng):
  order = rng.permutation(len(items))
  for i in range(0, len(order) - batch_size + 1, batch_size):
    yield [items[j] for j in order[i:i + batch_size]]


def train(config, workdir) -> dict[str, float]:
  """Trains a reward model as `config.reward_model.train` says; writes workdir/reward_model."""
  from rlreason.rl import run_setup, sft
  run = run_setup.build(config, workdir)
  workdir = run.workdir  # An epath: local or gs:// (workdir_paths.py).
  try:
    return _train(run, config, workdir, sft.teacher_fn(config.sft.teacher,
                                                       config.sft.teacher_options))
  finally:
    run.close()


def _train(run, config, workdir, teacher):
  t, d = config.reward_model.train, config.data
  rng = np.random.default_rng([config.seed, 17])
  stream = iter(data.synthetic_stream(d.task, seed=config.seed + 1, difficulty=d.difficulty,
                                      options=dict(d.task_options),
                                      held_out_fraction=d.held_out_fraction))
  train_examples = [next(stream) for _ in range(t.problems)]  # The training split only.
  held_out = run.eval_examples[:t.eval_problems]
  traces = labelled_traces(train_examples, teacher, config.verifier.name, rng,
                           per_problem=t.traces_per_problem)
  eval_traces = labelled_traces(held_out, teacher, config.verifier.name, rng,
                                per_problem=t.traces_per_problem)
  pos = sum(r > 0.5 for *_, r in traces)
  logging.info('reward model: %d labelled traces (%d right), %d held-out', len(traces), pos,
               len(eval_traces))
  items = traces if t.mode == 'pointwise' else preference_pairs(traces)
  if len(items) < t.batch_size:
    raise ValueError(f'reward_model.train: {len(items)} {t.mode} training items from '
                     f'{t.problems} problems, fewer than batch_size={t.batch_size}; raise '
                     'reward_model.train.problems or traces_per_problem.')
  length = max(d.prompt_buckets) + config.rl.max_new_tokens + 1
  cfg = run.cfg
  state = {'params': run.policy(run.init_params), 'head': transformer.init_value_head(cfg)}
  optimizer = optax.chain(optax.clip_by_global_norm(1.0), optax.adam(t.lr))
  opt_state = optimizer.init(state)

  def loss_fn(state, batch):
    scores = lambda tok, m: sequence_scores(state['params'], state['head'], tok, m, cfg=cfg)
    if t.mode == 'pointwise':
      tokens, mask, labels = batch
      return reward_losses.pointwise(scores(tokens, mask), labels)
    (ct, cm), (rt, rm_) = batch
    return reward_losses.bradley_terry(scores(ct, cm), scores(rt, rm_))

  @jax.jit
  def step(state, opt_state, batch):
    (_, metrics), grads = jax.value_and_grad(loss_fn, has_aux=True)(state, batch)
    updates, opt_state = optimizer.update(grads, opt_state, state)
    return optax.apply_updates(state, updates), opt_state, metrics

  def make_batch(chunk):
    if t.mode == 'pointwise':
      tokens, mask = encode(run, [c[0] for c in chunk], [c[1] for c in chunk], length)
      return tokens, mask, jnp.asarray([c[2] > 0.5 for c in chunk], jnp.float32)
    ex = [c[0] for c in chunk]
    return encode(run, ex, [c[1] for c in chunk], length), encode(run, ex, [c[2] for c in chunk],
                                                                  length)

  writer = metrics_lib.Writer(workdir, total_steps=t.steps)
  done, metrics = 0, {}
  while done < t.steps:
    for chunk in _batches(items, t.batch_size, rng):
      state, opt_state, metrics = step(state, opt_state, make_batch(chunk))
      done += 1
      if done % 50 == 0 or done == t.steps:
        writer.progress(done, writer.write(done, metrics), keys=('rm/loss', 'rm/accuracy'))
      if done == t.steps:
        break
  scorer = RewardModel(cfg=cfg, params=state['params'], head=state['head'], meta={})
  result = evaluate(scorer, run, eval_traces, length, mode=t.mode)
  writer.write(t.steps, result)
  writer.close()
  save(workdir / 'reward_model', scorer, mode=t.mode, config=config,
       vocab_size=run.tok.vocab_size)
  logging.info('reward model: %s', result)
  return result


def evaluate(model: RewardModel, run, traces, length: int, *, mode: str,
             batch_size: int = 64) -> dict[str, float]:
  """Held-out accuracy: pointwise (sign vs label, for every trace) and on (right, wrong) pairs."""
  scores = []
  for i in range(0, len(traces), batch_size):
    chunk = traces[i:i + batch_size]
    chunk = chunk + [chunk[-1]] * (batch_size - len(chunk))  # One compiled shape.
    tokens, mask = encode(run, [c[0] for c in chunk], [c[1] for c in chunk], length)
    scores += list(np.asarray(model.score(tokens, mask)))
  scores = np.asarray(scores[:len(traces)])
  labels = np.asarray([r > 0.5 for *_, r in traces])
  by_id: dict[str, list] = {}
  for (ex, _, r), s in zip(traces, scores):
    by_id.setdefault(ex.id, []).append((r, s))
  pairs = [(s1 > s2) for items in by_id.values() for r1, s1 in items for r2, s2 in items
           if r1 > r2]
  out = {'eval/rm_pair_accuracy': float(np.mean(pairs)) if pairs else float('nan'),
         'eval/rm_pairs': float(len(pairs)), 'eval/rm_traces': float(len(traces))}
  if mode == 'pointwise':
    out['eval/rm_accuracy'] = float(np.mean((scores > 0) == labels))
  else:
    out['eval/rm_accuracy'] = out['eval/rm_pair_accuracy']
  return out


def save(path, model: RewardModel, *, mode: str, config, vocab_size: int):
  if not workdir_paths.is_local(path):  # weights.save writes local files: stage, then upload.
    with tempfile.TemporaryDirectory() as local:
      save(local, model, mode=mode, config=config, vocab_size=vocab_size)
      return workdir_paths.upload_tree(local, path)
  path = pathlib.Path(path)
  weights.save(path, model.cfg, model.params)
  safetensors_np.save_file({k: np.asarray(v) for k, v in model.head.items()}, path / HEAD_FILE)
  meta = {'mode': mode, 'vocab_size': int(vocab_size), 'tokenizer': config.tokenizer.kind,
          'tokenizer_path': config.tokenizer.path, 'task': config.data.task}
  (path / META_FILE).write_text(json.dumps(meta, indent=2))
  return path


def load(path, *, vocab_size: int | None = None) -> RewardModel:
  """A saved reward model; with `vocab_size` (the RL run's tokenizer), checks they agree."""
  path = pathlib.Path(path)
  for name in ('config.json', HEAD_FILE, META_FILE):
    if not (path / name).exists():
      raise FileNotFoundError(f'reward_model.path={str(path)!r} has no {name}: not a directory '
                              'written by rlreason.methods.reward_model (train one with '
                              'reward_model.train.enabled).')
  meta = json.loads((path / META_FILE).read_text())
  if vocab_size is not None and meta['vocab_size'] != vocab_size:
    raise ValueError(f'reward_model.path={str(path)!r} was trained with a {meta["vocab_size"]}-id '
                     f'tokenizer ({meta["tokenizer"]}); this run\'s has {vocab_size}: the RM '
                     'would read other tokens.')
  cfg, params = weights.load(path)
  head = {k: jnp.asarray(v) for k, v in safetensors_np.load_file(path / HEAD_FILE).items()}
  return RewardModel(cfg=cfg, params=params, head=head, meta=meta)


def learned_rewards(run, model, rollout, rewards_BxG):
  """verifier_weight x rewards + weight x the reward model `model`'s (config.reward_model), and metrics:
  the RM's mean and how often its sign agrees with the verifier's verdict (reward > 0.5)."""
  r = run.config.reward_model
  tokens_NxT, mask_NxT = sampler.sequences(rollout)
  scores_N = np.asarray(jax.device_get(model.score(tokens_NxT, mask_NxT)), np.float32)
  rm_N = 1.0 / (1.0 + np.exp(-scores_N)) if r.transform == 'sigmoid' else scores_N
  agree = float(np.mean((scores_N > 0) == (rewards_BxG.reshape(-1) > 0.5)))
  mixed = r.verifier_weight * rewards_BxG + r.weight * rm_N.reshape(rewards_BxG.shape)
  return mixed.astype(np.float32), {'reward_model/mean': float(rm_N.mean()),
                                    'reward_model/agreement': agree}




def build(run):
  """The loaded reward model under reward_model.path (rl/extensions.py: it mixes the training
  rewards, scored on device), or None."""
  if not run.config.reward_model.path:
    return None
  if jax.process_count() > 1:
    raise ValueError('reward_model.path: the reward model scores the whole batch on one host; '
                     'multi-host runs are not supported yet.')
  return RewardMixing(load(run.config.reward_model.path, vocab_size=run.tok.vocab_size))


class RewardMixing:

  def __init__(self, model):
    self.model = model

  def mix_rewards(self, run, rollout, rewards_BxG):
    return learned_rewards(run, self.model, rollout, rewards_BxG)
