"""The `judge` reward: a model run by rlreason's sampler gives each step a ternary score.

  j = judge.Judge(cfg=cfg, tok=tok, params=params, split='lines', aggregate='mean')
  result = j.score(problems, completions)  # result.rewards_N, result.step_scores, metrics()
  rewards, metrics = judge.combine(mix, verifier_rewards=..., judge_rewards=result.rewards_N,
                                   progress=step / total)

A completion is cut into steps (`SPLITTERS`: non-empty lines, blank-line paragraphs, or
"Step k:" markers). Each step gets a rubric prompt (the problem, the steps before it, the
step under judgement), rendered through the tokenizer's chat template when it has one. Its
score is read from the judge's next-token distribution after that prompt restricted to three
label tokens (scores -1, 0, +1) and renormalised: 'greedy' takes the likeliest label,
'expected' the expected score. A completion's reward aggregates its step scores (`AGGREGATES`:
mean, min or last). `combine` meets these rewards and the verifiers' in
`verifiers.composition.RewardComposition` as the components 'verifier' and 'judge'.

Provenance. Ternary step scores {-1, 0, +1} from an LLM judge are SLATE's [S: 2602.23440
abstract]; SLATE keeps them per step (for step-level advantages from truncated sampling) and
decomposes them into rubric dimensions (reasoning, query, answer) with weights, so it needs no
per-completion aggregation (algorithms.md §16). SCRIBE's skill-conditioned rubrics are known
here from its abstract only, which states neither a scale nor an aggregation. Reading the score
from label-token probabilities (instead of parsing a generated verdict), the step splitters,
the mean/min/last aggregations and the prompt truncation are our formalisation [I].

How the model runs: `sampler.generate` with G = 3 rows per prompt whose one-token prefixes are
the three labels, greedy, max_new_tokens = 1. The sampler records each prefix token's log-prob
under the distribution after the prompt, which is log p(label | prompt) exactly; prefill runs
once per prompt. Prompts are grouped by length bucket into calls of `batch_size` rows (the last
call padded by repetition), so a run compiles once per bucket and never across steps.

Deliberately not here: generated critiques (chain-of-thought judging), several rubric
dimensions per step, step-level advantages, multi-host judging (`from_config` refuses it),
verifiers (verifiers/ never imports JAX).
"""

import dataclasses
import re
import string
from typing import Any, Callable, Mapping, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from rlreason.model import sharding
from rlreason.model import tokenizer as tokenizer_lib
from rlreason.model import transformer
from rlreason.rollout import sampler
from rlreason.structs import Prefixes
from rlreason.verifiers import composition

LABEL_SCORES = (-1.0, 0.0, 1.0)  # labels[i] scores LABEL_SCORES[i].
LABEL_NAMES = ('minus', 'zero', 'plus')  # For metrics, whatever the label strings are.

DEFAULT_TEMPLATE = (
    'You are checking one step of a solution to a problem.\n\n'
    'Problem:\n{problem}\n\n'
    'Earlier steps:\n{previous}\n\n'
    'Step {index}:\n{step}\n\n'
    'Is step {index} correct and useful? Answer with one character: "+" if it is correct '
    'and useful, "0" if it is neutral or unclear, "-" if it is wrong.')
_NO_PREVIOUS = '(none)'

# A line that starts a step: "Step 3:", "step 3.", "**Step 3)**" (case-insensitive).
_STEP_MARKER = re.compile(r'^[ \t]*(?:[*#]+[ \t]*)?step[ \t]*\d+[ \t]*[:.)]',
                          re.IGNORECASE | re.MULTILINE)


def split_lines(text: str) -> list[str]:
  """Each non-blank line, stripped."""
  return [line.strip() for line in text.splitlines() if line.strip()]


def split_paragraphs(text: str) -> list[str]:
  """Blocks separated by one or more blank lines, stripped."""
  return [p.strip() for p in re.split(r'\n[ \t]*\n', text) if p.strip()]


def split_markers(text: str) -> list[str]:
  """From each "Step k:" line to the next; text before the first marker is a step of its own
  when not blank; without any marker the whole text is one step."""
  starts = [m.start() for m in _STEP_MARKER.finditer(text)]
  if not starts or starts[0] > 0:
    starts = [0] + starts
  pieces = (text[a:b].strip() for a, b in zip(starts, starts[1:] + [len(text)]))
  return [p for p in pieces if p]


SPLITTERS: dict[str, Callable[[str], list[str]]] = {
    'lines': split_lines, 'paragraphs': split_paragraphs, 'markers': split_markers}

AGGREGATES: dict[str, Callable[[np.ndarray], float]] = {
    'mean': lambda s: float(np.mean(s)),
    'min': lambda s: float(np.min(s)),
    'last': lambda s: float(s[-1]),
}

SCORE_MODES = ('greedy', 'expected')


def split_steps(text: str, *, split: str, max_steps: int = 0) -> list[str]:
  """The steps of `text`; beyond `max_steps` (> 0) the rest is merged into the last step,
  so the whole completion is judged with a bounded number of prompts."""
  if split not in SPLITTERS:
    raise ValueError(f'split={split!r}; known: {sorted(SPLITTERS)}.')
  steps = SPLITTERS[split](text)
  if max_steps and len(steps) > max_steps:
    steps = steps[:max_steps - 1] + ['\n'.join(steps[max_steps - 1:])]
  return steps


def renormalised(logprobs_Mx3: np.ndarray) -> np.ndarray:
  """p(label | prompt, label is one of the three), from log p(label | prompt)."""
  lp_Mx3 = np.asarray(logprobs_Mx3, np.float64).reshape(-1, 3)
  p_Mx3 = np.exp(lp_Mx3 - lp_Mx3.max(axis=-1, keepdims=True, initial=-np.inf))
  return p_Mx3 / p_Mx3.sum(axis=-1, keepdims=True)


def step_scores(logprobs_Mx3: np.ndarray, *, mode: str) -> np.ndarray:
  """Ternary scores from log p(label) of the (-1, 0, +1) labels, renormalised over the three.

  greedy: LABEL_SCORES[argmax] (ties go to the lower score); expected: Σ_i p_i · score_i.
  """
  if mode not in SCORE_MODES:
    raise ValueError(f'score={mode!r}; known: {SCORE_MODES}.')
  scores_3 = np.asarray(LABEL_SCORES)
  if mode == 'greedy':
    return scores_3[np.argmax(np.asarray(logprobs_Mx3).reshape(-1, 3), axis=-1)].astype(
        np.float32)
  return (renormalised(logprobs_Mx3) @ scores_3).astype(np.float32)


def label_token_ids(tok: tokenizer_lib.Tokenizer, labels: Sequence[str], *,
                    vocab_size: int) -> tuple[int, int, int]:
  """The one token id of each label; ValueError naming the label otherwise."""
  if len(labels) != 3:
    raise ValueError(f'labels: need 3 strings (scores -1, 0, +1), got {list(labels)}.')
  ids = []
  for label in labels:
    enc = tok.encode(label)
    if len(enc) != 1:
      raise ValueError(f'label {label!r} encodes to {len(enc)} tokens {enc}, not one; '
                       'pick a label string that is a single token of the judge tokenizer.')
    if tok.decode(enc) != label:  # e.g. a character outside a char vocabulary -> unk.
      raise ValueError(f'label {label!r} is not a token of the judge tokenizer (it encodes '
                       f'to {enc}, which decodes to {tok.decode(enc)!r}).')
    if not 0 <= enc[0] < vocab_size:
      raise ValueError(f'label {label!r} has id {enc[0]}, outside the judge model\'s '
                       f'vocabulary of {vocab_size}.')
    ids.append(enc[0])
  if len(set(ids)) != 3:
    raise ValueError(f'labels {list(labels)} must be three different tokens, got ids {ids}.')
  return tuple(ids)


@dataclasses.dataclass(frozen=True)
class JudgeResult:
  """Scores of one batch: per-completion rewards and per-step scores, plus counts.

  rewards_N: aggregated step scores per completion (`empty_reward` where no step).
  step_scores: per completion, its steps' scores (float32, possibly empty).
  label_probs_Mx3: renormalised (-1, 0, +1) label probabilities of all M judged steps.
  truncated_prompts: rubric prompts cut to the largest bucket.
  """
  rewards_N: np.ndarray
  step_scores: tuple[np.ndarray, ...]
  label_probs_Mx3: np.ndarray
  truncated_prompts: int = 0

  def metrics(self) -> dict[str, float]:
    m = self.label_probs_Mx3.shape[0]
    counts_3 = np.bincount(np.argmax(self.label_probs_Mx3, axis=-1), minlength=3) if m else (
        np.zeros(3))
    lengths = [len(s) for s in self.step_scores]
    out = {
        'judge/steps_judged': float(m),
        'judge/steps_per_completion': float(np.mean(lengths)) if lengths else 0.0,
        'judge/empty_frac': float(np.mean([n == 0 for n in lengths])) if lengths else 0.0,
        'judge/step_score_mean': float(np.mean(np.concatenate(self.step_scores))) if m else 0.0,
        'judge/truncated_prompts': float(self.truncated_prompts),
    }
    for name, count in zip(LABEL_NAMES, counts_3):
      out[f'judge/label_{name}_frac'] = float(count) / max(m, 1)
    return out


@dataclasses.dataclass(frozen=True, eq=False)
class Judge:
  """A model, its tokenizer and the rubric; `score` judges completions step by step.

  Attributes:
    cfg: the judge model's architecture.
    tok: its tokenizer (labels must be single tokens of it).
    params: its parameters; None means the caller passes them to `score` (the policy judging
      its own samples with its current parameters).
    labels: the strings whose tokens score -1, 0 and +1, in that order.
    split: a `SPLITTERS` name.
    max_steps: steps judged per completion (0: no limit); the rest joins the last step.
    aggregate: an `AGGREGATES` name: how step scores make a completion's reward.
    score_mode: 'greedy' or 'expected' (see `step_scores`).
    template: rubric with {problem}, {previous}, {step}, {index} (1-based step number).
    response_prefix: text after the (chat-rendered) prompt, just before the label token.
    use_chat_template: render the rubric as one user turn when the tokenizer has a template.
    chat_kwargs: template variables, e.g. {'enable_thinking': False} for Qwen3.
    prompt_buckets: prompt lengths compiled for; longer prompts lose their middle.
    batch_size: prompts per sampler call.
    empty_reward: the reward of a completion with no step.
    mesh: run the sampler with rows sharded over this mesh.
  """
  cfg: transformer.ModelConfig
  tok: tokenizer_lib.Tokenizer
  params: Any = None
  labels: tuple[str, str, str] = ('-', '0', '+')
  split: str = 'lines'
  max_steps: int = 16
  aggregate: str = 'mean'
  score_mode: str = 'greedy'
  template: str = DEFAULT_TEMPLATE
  response_prefix: str = ''
  use_chat_template: bool = True
  chat_kwargs: Mapping[str, Any] = dataclasses.field(default_factory=dict)
  prompt_buckets: tuple[int, ...] = (256, 512, 1024, 2048)
  batch_size: int = 32
  empty_reward: float = 0.0
  mesh: jax.sharding.Mesh | None = None
  label_ids: tuple[int, int, int] = dataclasses.field(init=False)

  def __post_init__(self):
    if self.split not in SPLITTERS:
      raise ValueError(f'Judge.split={self.split!r}; known: {sorted(SPLITTERS)}.')
    if self.aggregate not in AGGREGATES:
      raise ValueError(f'Judge.aggregate={self.aggregate!r}; known: {sorted(AGGREGATES)}.')
    if self.score_mode not in SCORE_MODES:
      raise ValueError(f'Judge.score_mode={self.score_mode!r}; known: {SCORE_MODES}.')
    if self.batch_size < 1 or self.max_steps < 0:
      raise ValueError(f'Judge.batch_size={self.batch_size} must be >= 1 and '
                       f'Judge.max_steps={self.max_steps} >= 0.')
    if not self.prompt_buckets or min(self.prompt_buckets) < 2:
      raise ValueError(f'Judge.prompt_buckets={self.prompt_buckets} need lengths >= 2.')
    try:
      self.template.format(problem='', previous='', step='', index=1)
    except (KeyError, IndexError, ValueError) as e:
      raise ValueError(f'Judge.template: {e!r}; it may use {{problem}}, {{previous}}, '
                       '{step} and {index} (write literal braces as {{ and }}).') from None
    object.__setattr__(self, 'labels', tuple(self.labels))
    object.__setattr__(self, 'prompt_buckets', tuple(sorted(self.prompt_buckets)))
    object.__setattr__(self, 'label_ids',
                       label_token_ids(self.tok, self.labels, vocab_size=self.cfg.vocab_size))

  def render(self, problem: str, previous: Sequence[str], step: str, index: int) -> str:
    """The rubric prompt for step `index` (1-based), as text ending where the label goes."""
    text = self.template.format(problem=problem, previous='\n'.join(previous) or _NO_PREVIOUS,
                                step=step, index=index)
    if self.use_chat_template and self.tok.chat_template is not None:
      text = self.tok.apply_chat_template([{'role': 'user', 'content': text}],
                                          add_generation_prompt=True, **dict(self.chat_kwargs))
    return text + self.response_prefix

  def prompt_ids(self, problem: str, steps: Sequence[str]) -> tuple[list[list[int]], int]:
    """Token ids of each step's rubric prompt, and how many were cut to the largest bucket.

    A cut keeps the first quarter (instructions, the problem's start) and the end (the step
    under judgement and the question), so the label still follows the rubric's last words.
    """
    return self.encode_prompts([self.render(problem, steps[:j], step, j + 1)
                                for j, step in enumerate(steps)])

  def encode_prompts(self, texts: Sequence[str]) -> tuple[list[list[int]], int]:
    """Token ids of rendered rubric prompts, cut as `prompt_ids` says, and how many were cut."""
    longest, head, out, cut = self.prompt_buckets[-1], self.prompt_buckets[-1] // 4, [], 0
    for ids in self.tok.encode_batch(texts) if texts else []:
      if len(ids) > longest:
        ids, cut = ids[:head] + ids[len(ids) - (longest - head):], cut + 1
      out.append(ids)
    return out, cut

  def label_logprobs(self, token_lists: Sequence[Sequence[int]], *, params) -> np.ndarray:
    """log p(label | prompt) for the three labels of each prompt: float32 [M, 3]."""
    m, bs = len(token_lists), self.batch_size
    out_Mx3 = np.zeros((m, 3), np.float32)
    if not m:
      return out_Mx3
    pad_id = self.tok.pad_id if self.tok.pad_id is not None else 0
    # Row b*3 + g of every call continues prompt b with label g.
    prefixes = Prefixes(tokens_NxQ=jnp.asarray(np.tile(self.label_ids, bs)[:, None], jnp.int32),
                        mask_NxQ=jnp.ones((3 * bs, 1), bool))
    rng = jax.random.key(0)  # Unused: greedy decoding.
    width_M = [next(w for w in self.prompt_buckets if w >= len(ids)) for ids in token_lists]
    pending = []
    for width in sorted(set(width_M)):
      rows = [i for i, w in enumerate(width_M) if w == width]
      for start in range(0, len(rows), bs):
        chunk = rows[start:start + bs]
        seqs = [token_lists[i] for i in chunk]
        seqs += [seqs[-1]] * (bs - len(seqs))  # One shape per bucket.
        prompts = sampler.prepare_prompts(seqs, buckets=(width,), pad_id=pad_id)
        rollout = sampler.generate(params, prompts, cfg=self.cfg, group_size=3, max_new_tokens=1,
                                   temperature=0.0, prefixes=prefixes, pad_id=pad_id, rng=rng,
                                   mesh=self.mesh)
        pending.append((chunk, rollout.logprobs_NxL[:, 0]))
    for chunk, lp_N in pending:  # Every call is dispatched before the first read.
      out_Mx3[chunk] = np.asarray(jax.device_get(lp_N)).reshape(bs, 3)[:len(chunk)]
    return out_Mx3

  def score(self, problems: Sequence[str], completions: Sequence[str], *,
            params=None) -> JudgeResult:
    """Judges completion n (an answer to problems[n]) step by step."""
    if len(problems) != len(completions):
      raise ValueError(f'{len(problems)} problems for {len(completions)} completions.')
    params = self.params if self.params is not None else params
    if params is None:
      raise ValueError('Judge.params is None (the policy judges itself): pass params=.')
    owners, token_lists, truncated = [], [], 0
    for n, (problem, text) in enumerate(zip(problems, completions)):
      ids, cut = self.prompt_ids(problem, split_steps(text, split=self.split,
                                                      max_steps=self.max_steps))
      owners += [n] * len(ids)
      token_lists += ids
      truncated += cut
    lp_Mx3 = self.label_logprobs(token_lists, params=params)
    scores_M = step_scores(lp_Mx3, mode=self.score_mode)
    owners_M = np.asarray(owners, np.int64)
    per_completion = tuple(scores_M[owners_M == n] for n in range(len(completions)))
    aggregate = AGGREGATES[self.aggregate]
    rewards_N = np.array([aggregate(s) if s.size else self.empty_reward for s in per_completion],
                         np.float32)
    return JudgeResult(rewards_N=rewards_N, step_scores=per_completion,
                       label_probs_Mx3=renormalised(lp_Mx3).astype(np.float32),
                       truncated_prompts=truncated)


def combine(mix: composition.RewardComposition, *, verifier_rewards: Sequence[float],
            judge_rewards: Sequence[float], progress: float) -> tuple[list[float], dict]:
  """Rewards from the components 'verifier' and 'judge' of `mix`, and its metrics."""
  if len(verifier_rewards) != len(judge_rewards):
    raise ValueError(f'{len(verifier_rewards)} verifier rewards, {len(judge_rewards)} judged.')
  components = [{'verifier': float(v), 'judge': float(j)}
                for v, j in zip(verifier_rewards, judge_rewards)]
  return mix.combine(components, progress=progress)


# ----------------------------------------------------------------------------- building


def _random_tiny(seed: int):
  """A random 2-layer model over printable ASCII characters: a judge for tests only."""
  tok = tokenizer_lib.from_characters(string.printable)
  cfg = transformer.ModelConfig(vocab_size=tok.vocab_size, hidden_size=32, intermediate_size=64,
                          num_layers=2, num_heads=2, num_kv_heads=1, head_dim=16)
  return cfg, tok, transformer.init_params(cfg, jax.random.key(seed))


def from_config(c, *, policy_cfg: transformer.ModelConfig, policy_tok: tokenizer_lib.Tokenizer,
                mesh: jax.sharding.Mesh | None = None,
                seed: int = 0) -> tuple[Judge, composition.RewardComposition]:
  """(Judge, reward composition) from the config's `judge` block (the run's edge).

  c.model: 'policy' (the current policy judges, with its tokenizer), a Hugging Face
  checkpoint directory (its own weights and tokenizer), or 'random-tiny' (tests only).
  """
  if jax.process_count() > 1:
    # Each host verifies only its own rows, but the judge's sampler calls are collectives
    # that every host must make alike: it would first have to gather every row's text.
    raise ValueError('judge.enabled=True needs a single-host run (jax.process_count() == 1); '
                     'multi-host judging is not supported.')
  if c.model == 'policy':
    cfg, tok, params = policy_cfg, policy_tok, None
  elif c.model == 'random-tiny':
    cfg, tok, params = _random_tiny(seed)
    if mesh is not None:
      params = jax.device_put(params, sharding.param_shardings(cfg, mesh, sharding.SAMPLE_RULES))
  elif c.model:
    from rlreason.model import weights
    cfg, params = weights.load(c.model, mesh=mesh, rules=sharding.SAMPLE_RULES if mesh else None,
                               param_dtype=c.dtype, compute_dtype=c.dtype)
    tok = tokenizer_lib.load(c.model)
  else:
    raise ValueError("judge.model is empty; use 'policy', an HF checkpoint directory, or "
                     "'random-tiny'.")
  judge = Judge(cfg=cfg, tok=tok, params=params, labels=tuple(c.labels), split=c.split,
                max_steps=c.max_steps, aggregate=c.aggregate, score_mode=c.score,
                template=c.template or DEFAULT_TEMPLATE, response_prefix=c.response_prefix,
                use_chat_template=c.use_chat_template, chat_kwargs=dict(c.chat_kwargs),
                prompt_buckets=tuple(c.prompt_buckets), batch_size=c.batch_size,
                empty_reward=c.empty_reward, mesh=mesh)
  if c.schedule == 'linear':
    judge_weight = composition.linear(c.weight, c.weight_end)
  elif c.schedule == 'constant':
    judge_weight = c.weight
  else:
    raise ValueError(f"judge.schedule={c.schedule!r}; known: 'constant', 'linear'.")
  mix = composition.RewardComposition(weights={'verifier': c.verifier_weight,
                                               'judge': judge_weight})
  return judge, mix
