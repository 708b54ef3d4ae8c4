"""MIND: a consultation policy on a typed evidence state, with an information-gain reward.

  python -m rlreason.main --config experiments/mind.py --workdir /tmp/mind          # typed
  python -m rlreason.main --config experiments/mind.py:raw --workdir /tmp/mind_raw  # raw
  python -m experiments.dynamics.mind_state     # the study: typed vs raw, colab/13_*.ipynb

Task (envs/patient.py): patient_dx at difficulty 2, a bank of 6 conditions (A-F) over 8
findings (a-h); the prompt states the complaint, the policy asks ('ask c\\n') until it
concludes ('dx B\\n'); 20% of the findings are ones the patient is unsure of. Reward: 1 for
the right diagnosis, plus 0.2 x the entropy reduction of the posterior over the consistent
conditions, normalised by log2 6 (envs/patient.py defines it; our formalisation). Typed mode
(the default, 'arg' '' or 'typed') prompts each turn with the five-line state alone, a row per
turn (rollout/typed_episodes.py); 'raw' appends each answer to the conversation
(rollout/episodes.py), plain GRPO on the same episodes. Both condition on at most 96 prompt
tokens (characters): the typed state's bucket, and the raw conversation's budget (a 12-token
complaint + 92 completion tokens, less the last turn's 8).

Model: 2 layers, d=64, character tokenizer; warm start: 800 SFT steps on the scripted teacher
(most informative question, then the diagnosis), then 30 GRPO steps of 16 prompts x G=8.
Measured numbers: experiments/dynamics/mind_state.py's docstring (its make_config holds the
settings).
"""

from experiments.dynamics import mind_state


def get_config(arg: str = ''):
  """'' or 'typed': MIND; 'raw': the raw-history baseline; a '_runlocal' / 'runlocal' suffix
  shrinks either to seconds. The settings live in the study (make_config), so the config and
  the study cannot drift apart."""
  mode = 'raw' if arg.startswith('raw') else 'typed'
  if arg not in ('', 'typed', 'raw', 'runlocal', 'typed_runlocal', 'raw_runlocal'):
    raise ValueError(f'experiments/mind.py: arg {arg!r}; known: typed, raw, runlocal, '
                     'typed_runlocal, raw_runlocal')
  return mind_state.make_config(mode, 0.2, smoke=arg.endswith('runlocal'))
