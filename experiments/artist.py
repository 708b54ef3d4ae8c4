"""ARTIST: a controller role selects a time-series segment with the timeseries tool, a reasoner
role answers from it; advantages per role.

  python -m rlreason.main --config experiments/artist.py --workdir /tmp/artist          # roles
  python -m rlreason.main --config experiments/artist.py:episode --workdir /tmp/artist_ep
  python -m experiments.dynamics.artist_roles   # the study: roles vs episode, colab/16_*.ipynb

Task (envs/artist.py): ts_rare_event at difficulty 2, 6 segments of 8 integers in [2, 7] with
one spike (12-15) or dip (0); the question asks when (its index) or what (its kind). One
policy, two rows per episode (rollout/roles.py): the controller, prompted with the question
and each segment's range, writes 'seg k' (the timeseries tool's window over segment k); the
reasoner, prompted with the question and that window alone, answers (the index, the kind,
or 'none'). Rewards per role (our formalisation; the abstract is all there is): the
controller 1 if its segment holds the event, the reasoner 1 if its answer is right for the
segment it saw; credit 'roles' (the default, '' or 'roles') normalises each role's rewards in
its own GRPO group, 'episode' is plain GRPO on the episode's success (the answer equals the
gold one) over both rows.

Model: 2 layers, d=64, character tokenizer; warm start: 2000 SFT steps on a flawed scripted
teacher (gold segment w.p. 0.8, right answer w.p. 0.8), then 20 GRPO steps of 16 prompts x
G=8 (256 rows a step). Measured numbers: experiments/dynamics/artist_roles.py's docstring
(its make_config holds the settings).
"""

from experiments.dynamics import artist_roles


def get_config(arg: str = ''):
  """'' or 'roles': per-role advantages; 'episode': plain GRPO on the episode's success; a
  'runlocal' / '_runlocal' suffix shrinks either to seconds. The settings live in the study
  (make_config), so the config and the study cannot drift apart."""
  known = ('', 'roles', 'episode', 'runlocal', 'roles_runlocal', 'episode_runlocal')
  if arg not in known:
    raise ValueError(f'experiments/artist.py: arg {arg!r}; known: {", ".join(known[1:])}')
  credit = 'episode' if arg.startswith('episode') else 'roles'
  return artist_roles.make_config(credit, smoke=arg.endswith('runlocal'))
