"""Structured diversity for pass@k: spread k samples over a fixed schedule of perturbations.

  variants = schedule('skeleton', example, k=32, seed=0)   # k (prompt, completion prefix)
  correct_BxK, answers_BxK, tokens = sample_verdicts(run, params, k=32, temperature=1.0,
                                                     rng=key, mode='skeleton')

The Lean-prover finding (seed abstract, /work/shared/seeds: "RL-trained Lean theorem provers
mode-collapse at inference time"; DeepSeek-Prover-V1.5-RL solves 42/244 miniF2F theorems at
both k = 32 and k = 64) [S]: a fixed schedule of 15 tactic skeletons spread over the k samples
breaks the plateau; paraphrased prompts match i.i.d. sampling; irrelevant Lean comments
degrade it. Generalised here [F] (the paper's skeleton list and schedule were not readable):

- 'iid': k samples of the plain prompt (evaluate.py's default).
- 'skeleton': sample i starts its completion with structural hint i of the task's list (a
  forced completion prefix, as a tactic skeleton is the start of the proof); the rest is
  sampled. Countdown: the first operand and operator, optionally opened with a parenthesis
  ('7*', '(7+', ...), for every given number and + - * /: the expression's top-level shape.
- 'paraphrase': sample i's prompt is the task's rewording i (same numbers and target).
- 'comment': sample i's prompt is the plain prompt plus irrelevant sentence i.
Sample i takes entry (offset + i) mod m of the task's m variants, the offset drawn from
(seed, example id): a fixed cyclic schedule, deterministic per seed, that spreads k samples
evenly (each variant ⌊k/m⌋ or ⌈k/m⌉ times).

Deliberately not here: pass@k's estimator and the i.i.d. path (evaluate.py), training.
"""

import dataclasses
import zlib

import numpy as np

from rlreason.tasks import countdown

MODES = ('iid', 'skeleton', 'paraphrase', 'comment')
MAX_PREFIX = 8  # Columns of the completion-prefix buffer (one shape for every schedule).


@dataclasses.dataclass(frozen=True)
class Variant:
  prompt: str  # The task prompt the sample sees.
  prefix: str = ''  # Forced start of its completion ('' : none).


# --------------------------------------------------------------------------- per-task lists
# Countdown's prompt alphabet is its tokenizer's (countdown.CHARS): every rewording and
# comment uses only those characters (tests/diversity_test.py checks).

_COUNTDOWN_PARAPHRASES = (
    'Use the numbers [{numbers}] to write an expression that equals {target}, each number '
    'used exactly once, with + - * / and parentheses.',
    'Using each number in [{numbers}] exactly once, and + - * / with parentheses, write an '
    'expression that equals {target}.',
    'numbers [{numbers}], target {target}. write an expression using + - * / and '
    'parentheses, each number exactly once.',
    'Using + - * / and parentheses, write an expression equal to {target} with the numbers '
    '[{numbers}], each used exactly once.',
)
_COMMENTS = (' the sun is a star.', ' a cat sat on a mat.', ' pears grow on trees.',
             ' the sea is deep and blue.', ' an apple is red.', ' numbers are nice to count.')


def countdown_skeletons(example) -> list[str]:
  """The top-level shapes of a Countdown expression: '<n><op>' and '(<n><op>' [F]."""
  out = []
  for paren in ('', '('):
    for n in dict.fromkeys(example.meta['numbers']):
      out += [f'{paren}{n}{op}' for op in '+-*/']
  return out


def countdown_paraphrases(example) -> list[str]:
  numbers = ', '.join(map(str, example.meta['numbers']))
  return [p.format(numbers=numbers, target=example.answer) for p in _COUNTDOWN_PARAPHRASES]


SKELETONS = {countdown.NAME: countdown_skeletons}
PARAPHRASES = {countdown.NAME: countdown_paraphrases}


def check_mode(mode: str, task: str) -> None:
  """Raises ValueError naming eval.diversity when `mode` is unknown or `task` has no list."""
  if mode not in MODES:
    raise ValueError(f'eval.diversity={mode!r}; known: {MODES}.')
  table = {'skeleton': SKELETONS, 'paraphrase': PARAPHRASES}.get(mode)
  if table is not None and task not in table:
    raise ValueError(f'eval.diversity={mode!r} has no schedule for data.task={task!r} '
                     f'(tasks with one: {sorted(table)}).')


def variants(mode: str, example) -> list[Variant]:
  """The task's m variants of `example` for `mode`, in their fixed order."""
  check_mode(mode, example.task)
  if mode == 'iid':
    return [Variant(example.prompt)]
  if mode == 'skeleton':
    return [Variant(example.prompt, s) for s in SKELETONS[example.task](example)]
  if mode == 'paraphrase':
    return [Variant(p) for p in PARAPHRASES[example.task](example)]
  return [Variant(example.prompt + c) for c in _COMMENTS]


def schedule(mode: str, example, *, k: int, seed: int) -> list[Variant]:
  """k variants: entry (offset + i) mod m for sample i, offset from (seed, example.id)."""
  options = variants(mode, example)
  offset = int(np.random.default_rng(
      [seed, zlib.crc32(example.id.encode())]).integers(len(options)))
  return [options[(offset + i) % len(options)] for i in range(k)]


# --------------------------------------------------------------------------- sampling


def sample_verdicts(run, params, *, k: int, temperature: float, rng, mode: str,
                    seed: int = 0):
  """As evaluate.sample_verdicts, with each prompt's k samples spread over `mode`'s schedule:
  (correct_BxK, answers_BxK, sampled tokens). Chunks of run.eval_chunk prompts x k rows (the
  last padded), each row its own prompt and completion prefix; one shape per run."""
  import dataclasses as dc
  import jax
  from rlreason.rl import evaluate
  from rlreason.rl.rl_batch import decode_completions, verify
  from rlreason.rl.run_setup import encode_prompts
  from rlreason.rollout import sampler
  from rlreason.structs import Prefixes
  examples, chunk = run.eval_examples, run.eval_chunk
  correct, answers, tokens = [], [], 0
  for start in range(0, len(examples), chunk):
    part = examples[start:start + chunk]
    padded = part + [part[-1]] * (chunk - len(part))
    rows = [(ex, v) for ex in padded for v in schedule(mode, ex, k=k, seed=seed)]
    prompts = encode_prompts(run, [dc.replace(ex, prompt=v.prompt) for ex, v in rows])
    prefix_ids = [run.tok.encode(v.prefix) for _, v in rows]
    if max(map(len, prefix_ids)) > MAX_PREFIX:
      raise ValueError(f'eval.diversity={mode!r}: a completion prefix is longer than '
                       f'{MAX_PREFIX} tokens.')
    tokens_NxQ = np.full((len(rows), MAX_PREFIX), run.pad_id, np.int32)
    mask_NxQ = np.zeros((len(rows), MAX_PREFIX), bool)
    for n, ids in enumerate(prefix_ids):
      tokens_NxQ[n, :len(ids)], mask_NxQ[n, :len(ids)] = ids, True
    prefixes = Prefixes(tokens_NxQ=jax.numpy.asarray(tokens_NxQ),
                        mask_NxQ=jax.numpy.asarray(mask_NxQ))
    rollout = sampler.generate(
        params, prompts, cfg=run.cfg, group_size=1, prefixes=prefixes,
        max_new_tokens=run.config.rl.max_new_tokens, temperature=temperature,
        stop_tokens=tuple(run.tok.eos_ids), pad_id=run.pad_id, rng=rng, mesh=run.mesh,
        max_chunks=run.config.rl.decode_chunks)
    _, verdicts = verify(run, rollout, [ex for ex, _ in rows], progress=1.0,
                         return_verdicts=True)
    ok_BxK = np.array([v.status == 'correct' for v in verdicts]).reshape(chunk, k)
    correct.append(ok_BxK[:len(part)])
    keys = [evaluate.answer_key(t) for t in decode_completions(run, rollout)]
    answers += [keys[b * k:(b + 1) * k] for b in range(len(part))]
    tokens += int(rollout.lengths_N[:len(part) * k].sum())
  return np.concatenate(correct), answers, tokens


def build(run):
  """The evaluation's structured-diversity schedules (rl/extensions.py: eval_verdicts for
  eval.diversity or the `diversity` argument != 'iid'); built for every run, cheap."""
  del run
  return DiversitySampling()


class DiversitySampling:

  def eval_verdicts(self, run, params, *, k: int, temperature: float, rng, diversity: str):
    if diversity == 'iid':
      return None
    return (*sample_verdicts(run, params, k=k, temperature=temperature, rng=rng, mode=diversity,
                             seed=run.config.seed), {})
