"""Episode transcripts: one JSON line per episode, and a readable print of them.

  records = transcripts.records(tok, tokens_NxL, loss_mask_NxL, lengths_N, episode_turns, ...)
  transcripts.write(workdir / 'episodes' / 'train_step000020.jsonl', records)
  python -m rlreason.episodes show WORKDIR [--step N] [--kind train|eval] [--limit K]

A record holds the prompt, each turn as the environment saw it (the turn's text, its calls'
observation, its reward, the verifier's status for a final answer), the episode's reward and
counters, and `segments`: the completion as [text, trained] runs cut where the loss mask
changes, so the printout marks exactly the tokens that received loss (the sampled ones)
apart from the observations. Host side: token ids and masks arrive as numpy arrays. The
workdir may be local or gs:// (workdir_paths.py); a file is written whole or not at all.
"""

import json
from typing import Any, Iterable, Sequence

from etils import epath
import numpy as np

from rlreason import workdir_paths

DIR = 'episodes'


def segments(tok, tokens: Sequence[int], trained: Sequence[bool]) -> list[list]:
  """[[text, trained], ...]: runs of consecutive tokens with the same loss mask, decoded."""
  out, start = [], 0
  for i in range(1, len(tokens) + 1):
    if i == len(tokens) or bool(trained[i]) != bool(trained[start]):
      out.append([tok.decode([int(t) for t in tokens[start:i]]), bool(trained[start])])
      start = i
  return out


def records(tok, *, prompts: Sequence[str], tokens_NxL, loss_mask_NxL, lengths_N, rewards_N,
            turns: Sequence[Sequence[dict]], truncated_N, tool_calls_N, errors_N: dict,
            step: int, kind: str, limit: int) -> list[dict[str, Any]]:
  """The first `limit` episodes as JSON-able dicts (prompts: one per episode)."""
  tokens_NxL, loss_mask_NxL = np.asarray(tokens_NxL), np.asarray(loss_mask_NxL)
  out = []
  for n in range(min(limit, len(prompts))):
    length = int(lengths_N[n])
    out.append({
        'step': step, 'kind': kind, 'episode': n, 'prompt': prompts[n],
        'reward': float(rewards_N[n]), 'truncated': bool(truncated_N[n]),
        'tool_calls': int(tool_calls_N[n]),
        'errors': {k: int(v[n]) for k, v in errors_N.items() if v[n]},
        'turns': [_plain(t) for t in turns[n]],
        'segments': segments(tok, tokens_NxL[n, :length], loss_mask_NxL[n, :length]),
    })
  return out


def _plain(entry: dict) -> dict:
  return {k: v if isinstance(v, (str, int, float, bool, type(None))) else str(v)
          for k, v in entry.items()}


def path_for(workdir, step: int, kind: str) -> epath.Path:
  return workdir_paths.as_path(workdir) / DIR / f'{kind}_step{step:06d}.jsonl'


def write(path, items: Iterable[dict]) -> epath.Path:
  # A reader never sees half a file (a rename locally, a single put on an object store).
  return workdir_paths.write_atomic(
      path, ''.join(json.dumps(item, ensure_ascii=False) + '\n' for item in items))


def read(path) -> list[dict]:
  with workdir_paths.as_path(path).open() as f:
    return [json.loads(line) for line in f if line.strip()]


def available(workdir, kind: str = 'train') -> list[int]:
  """Steps with a transcript file of this kind, ascending."""
  directory = workdir_paths.as_path(workdir) / DIR
  steps = []
  for p in directory.glob(f'{kind}_step*.jsonl') if directory.exists() else ():
    digits = p.stem[len(kind) + len('_step'):]
    if digits.isdigit():
      steps.append(int(digits))
  return sorted(steps)


def format_record(record: dict, *, color: bool = False) -> str:
  """A readable episode: header, prompt, then the completion with observations set apart.

  Trained (sampled) text is shown as written; observation text is wrapped in
  `<<obs ... obs>>` (or dimmed with color), so what received loss is unambiguous.
  """
  errors = ', '.join(f'{k}={v}' for k, v in record['errors'].items()) or 'none'
  lines = [f"=== step {record['step']} {record['kind']} episode {record['episode']}: reward "
           f"{record['reward']:g}, {len(record['turns'])} turn(s), {record['tool_calls']} "
           f"tool call(s), errors: {errors}{', TRUNCATED' if record['truncated'] else ''}",
           f"--- prompt\n{record['prompt']}", '--- completion (observations in <<obs ... obs>>)']
  body = []
  for text, trained in record['segments']:
    if trained:
      body.append(text)
    else:
      body.append(f'\x1b[2m{text}\x1b[0m' if color else f'<<obs {text} obs>>')
  lines.append(''.join(body))
  for t in record['turns']:
    status = f", status {t['status']}" if t.get('status') else ''
    lines.append(f"  turn {t['turn']}: {t.get('tokens', '?')} sampled tokens, reward "
                 f"{t.get('reward', 0):g}{status}")
  return '\n'.join(lines)
