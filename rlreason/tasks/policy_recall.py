"""A toy policy-recall task: which rules of a fixed catalogue apply to a customer request?

The setting of PA³ (algorithms.md §19, arXiv 2603.14602): an assistant should recall the
relevant business policies from memory instead of reading the whole catalogue in context.
`POLICIES` is a fixed catalogue of 16 rules, each "If <condition>, <action>." over the facts of
a request. A query states `difficulty` facts (the request type always, then others drawn at
random); a policy is relevant iff its condition holds on the stated facts (a condition on an
unstated fact does not hold). More facts make more policies relevant, and harder to recall.

Formats (difficulty 3):
  prompt    'Customer request: exchange. Item: furniture. Order total: $1250. Which policies
             apply? List their ids in <policies></policies>.'                   (one line)
  solution  'POL-8: If furniture is returned or exchanged, book a pickup and charge $50.
             POL-13: If the order total is over $1000, verify the identity of the customer
             first.
             <policies>POL-8, POL-13</policies>'     one line per recalled policy, then the ids
  answer    'POL-8, POL-13'   ids in catalogue order joined by ', '; '' when none applies
  meta      {'catalogue': ['POL-1', ..., 'POL-16'], 'facts': {'request': 'refund', ...}}

These are the id pattern, the <policies> block and the item fields (answer = gold ids,
catalogue = P_all for the hallucination penalty) of rlreason.verifiers' `policy_recall`
checker. With include_catalogue=True the prompt lists every policy first (the in-context
baseline).

Behaviour mode (`behaviour_mode`, IFPO's input, algorithms.md §13): 1 when a completion
consulted the rules, i.e. recites at least one as a line 'POL-k: rule text' as the reference
solutions do, 0 when it answered with ids alone. Our formalisation of ASCL's consult /
no-consult modes (the paper's are tool calls; algorithms.md §13 [I]).

Not here: the reward (verifiers/), tool use, any multi-turn dialogue.
"""

import re

from rlreason.tasks import example as example_lib

NAME = 'policy_recall'
DEFAULT_DIFFICULTY = 4
REQUESTS = ('refund', 'exchange', 'cancellation', 'address change', 'warranty claim')
ITEMS = ('electronics', 'clothing', 'groceries', 'gift card', 'furniture')
REGIONS = ('US', 'EU', 'UK', 'Canada')
STATUSES = ('processing', 'shipped', 'delivered')
MEMBERSHIPS = ('standard', 'gold')
RETURN = ('refund', 'exchange')

# id -> (rule text, condition on the stated facts). Missing facts read as None and fail.
_CATALOGUE = {
    'POL-1': ('If a refund is asked more than 30 days after purchase, decline it.',
            lambda f: f['request'] == 'refund' and (f['days'] or 0) > 30),
    'POL-2': ('If a refund is over $500, a manager must approve it.',
            lambda f: f['request'] == 'refund' and (f['amount'] or 0) > 500),
    'POL-3': ('If the item is groceries, it cannot be returned or exchanged.',
            lambda f: f['item'] == 'groceries' and f['request'] in RETURN),
    'POL-4': ('If the item is a gift card, it is never refunded or exchanged.',
            lambda f: f['item'] == 'gift card' and f['request'] in RETURN),
    'POL-5': ('If electronics are exchanged more than 14 days after purchase, charge a 15% '
            'restocking fee.',
            lambda f: f['item'] == 'electronics' and f['request'] == 'exchange'
            and (f['days'] or 0) > 14),
    'POL-6': ('If a customer in the EU cancels or asks for a refund within 14 days of purchase, '
            'grant it without questions.',
            lambda f: f['region'] == 'EU' and f['request'] in ('refund', 'cancellation')
            and f['days'] is not None and f['days'] <= 14),
    'POL-7': ('If a gold member returns or exchanges an item, waive the return shipping cost.',
            lambda f: f['membership'] == 'gold' and f['request'] in RETURN),
    'POL-8': ('If furniture is returned or exchanged, book a pickup and charge $50.',
            lambda f: f['item'] == 'furniture' and f['request'] in RETURN),
    'POL-9': ('If the order has shipped, its delivery address cannot be changed.',
            lambda f: f['request'] == 'address change'
            and f['status'] in ('shipped', 'delivered')),
    'POL-10': ('If the order has shipped, it cannot be cancelled; offer a return instead.',
            lambda f: f['request'] == 'cancellation' and f['status'] in ('shipped', 'delivered')),
    'POL-11': ('If a warranty claim comes within 365 days of purchase, repair or replace the '
            'item for free.',
            lambda f: f['request'] == 'warranty claim' and f['days'] is not None
            and f['days'] <= 365),
    'POL-12': ('If a warranty claim comes after 365 days, offer a paid repair.',
            lambda f: f['request'] == 'warranty claim' and (f['days'] or 0) > 365),
    'POL-13': ('If the order total is over $1000, verify the identity of the customer first.',
            lambda f: (f['amount'] or 0) > 1000),
    'POL-14': ('If a customer in the UK gets a refund, pay it in pounds sterling.',
            lambda f: f['region'] == 'UK' and f['request'] == 'refund'),
    'POL-15': ('If an order that is still processing is cancelled, cancel it at once at no cost.',
            lambda f: f['request'] == 'cancellation' and f['status'] == 'processing'),
    'POL-16': ('If clothing is exchanged, the first exchange is free.',
            lambda f: f['item'] == 'clothing' and f['request'] == 'exchange'),
}
POLICIES = {pid: text for pid, (text, _) in _CATALOGUE.items()}

# Fact name -> (how it is drawn, how it is written in the query).
_FACTS = {
    'item': (lambda rng: ITEMS[rng.integers(len(ITEMS))], 'Item: {}.'),
    'days': (lambda rng: int(rng.integers(1, 501)), 'Bought {} days ago.'),
    'amount': (lambda rng: int(rng.integers(5, 2001)), 'Order total: ${}.'),
    'membership': (lambda rng: MEMBERSHIPS[rng.integers(len(MEMBERSHIPS))], 'Member tier: {}.'),
    'region': (lambda rng: REGIONS[rng.integers(len(REGIONS))], 'Region: {}.'),
    'status': (lambda rng: STATUSES[rng.integers(len(STATUSES))], 'Order status: {}.'),
}
_QUESTION = 'Which policies apply? List their ids in <policies></policies>.'
CHARS = ''.join(sorted(set(
    'Customer request: . Policies:\n' + _QUESTION + ''.join(REQUESTS + ITEMS + REGIONS)
    + ''.join(STATUSES + MEMBERSHIPS) + ''.join(t for _, t in _FACTS.values())
    + ''.join(f'{pid}: {text}\n' for pid, text in POLICIES.items()) + ', 0123456789')))
MAX_DIFFICULTY = 1 + len(_FACTS)


def relevant_policies(facts: dict) -> list[str]:
  """Ids of the policies whose condition holds on `facts`, in catalogue order (unstated: None)."""
  full = {name: None for name in ('request', *_FACTS)} | facts
  return [pid for pid, (_, condition) in _CATALOGUE.items() if condition(full)]


def generate(seed: int, index: int, *, difficulty: int = DEFAULT_DIFFICULTY,
             include_catalogue: bool = False) -> example_lib.Example:
  """The (seed, index)-th query stating `difficulty` facts (1 = the request type only)."""
  if not 1 <= difficulty <= MAX_DIFFICULTY:
    raise ValueError(f'policy_recall difficulty (facts) must be in [1, {MAX_DIFFICULTY}], '
                     f'got {difficulty}.')
  rng = example_lib.example_rng(NAME, seed, index, difficulty)
  facts = {'request': REQUESTS[rng.integers(len(REQUESTS))]}
  names = list(_FACTS)
  for k in sorted(rng.choice(len(names), size=difficulty - 1, replace=False).tolist()):
    facts[names[k]] = _FACTS[names[k]][0](rng)
  query = ' '.join([f'Customer request: {facts["request"]}.'] +
                   [_FACTS[name][1].format(facts[name]) for name in names if name in facts])
  catalogue = ''.join(f'{pid}: {text}\n' for pid, text in POLICIES.items())
  relevant = relevant_policies(facts)
  answer = ', '.join(relevant)
  recalled = ''.join(f'{pid}: {POLICIES[pid]}\n' for pid in relevant)
  return example_lib.Example(
      id=example_lib.example_id(NAME, seed, index, difficulty),
      prompt=(f'Policies:\n{catalogue}' if include_catalogue else '') + f'{query} {_QUESTION}',
      answer=answer,
      solution=f'{recalled}<policies>{answer}</policies>',
      task=NAME,
      difficulty=difficulty,
      meta={'catalogue': list(POLICIES), 'facts': facts},
  )


def problem_key(example: example_lib.Example) -> str:
  # The stated facts are the problem; the catalogue is fixed and the wording follows from them.
  return repr(sorted(example.meta['facts'].items()))


_RECITED_RULE = re.compile(r'(?m)^[ \t]*POL-\d+[ \t]*:')
NUM_MODES = 2  # 0 = answered with ids alone, 1 = consulted (recited) the rules.


def behaviour_mode(completion: str) -> int:
  """1 if some line of the completion recites a rule ('POL-8: If furniture ...'), else 0."""
  return int(_RECITED_RULE.search(completion) is not None)
