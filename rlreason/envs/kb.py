"""The 'kb' tool: KBQA-R1-style actions over a small knowledge graph given in the episode.

The graph is `context['graph']`, a list of [subject, relation, object] triples (strings). One
tool, 'kb', with an `action` and the arguments that action reads:

  action        arguments            returns (JSON text)
  relations     entity               sorted relations of the entity: outgoing 'employer', and
                                     incoming 'employer^-1' (entity is the object of 'employer')
  neighbours    entity | entities,   sorted objects reached by the relation from the entity (or
                relation             from any entity of the list); 'r^-1' walks r backwards
  intersection  sets                 sorted elements common to every list in `sets`
  count         entities             the number of distinct entities in the list

An entity that is in no triple -> ToolError(TOOL_FAILED, "no entity ..."); a relation the
entity lacks -> TOOL_FAILED naming the relations it has, since an empty list would hide the
typo. The session is the graph's index, built once per episode.

Not here: SPARQL, fuzzy entity matching, variables that name earlier results (the model copies
entity names from earlier observations, as in KBQA-R1's action format).
"""

import collections
import json
from typing import Any, Mapping

from rlreason.envs import base

ACTIONS = ('relations', 'neighbours', 'intersection', 'count')
INVERSE = '^-1'
_REQUIRED = {'relations': ('entity',), 'neighbours': ('relation',), 'intersection': ('sets',),
             'count': ('entities',)}


class Graph:
  """Outgoing and incoming edges per entity, relation names inverted with INVERSE."""

  def __init__(self, triples):
    self.edges = collections.defaultdict(lambda: collections.defaultdict(set))
    for triple in triples:
      if not isinstance(triple, (list, tuple)) or len(triple) != 3:
        raise base.ToolError(base.TOOL_FAILED, f'kb: malformed triple {triple!r} in the graph')
      s, r, o = (str(x) for x in triple)
      self.edges[s][r].add(o)
      self.edges[o][r + INVERSE].add(s)

  def relations(self, entity: str) -> list[str]:
    return sorted(self._entity(entity))

  def neighbours(self, entity: str, relation: str) -> set[str]:
    edges = self._entity(entity)
    if relation not in edges:
      raise base.ToolError(base.TOOL_FAILED,
                           f'kb: entity {entity!r} has no relation {relation!r}; it has '
                           f'{json.dumps(sorted(edges))}')
    return edges[relation]

  def _entity(self, entity: str):
    if entity not in self.edges:
      raise base.ToolError(base.TOOL_FAILED, f'kb: no entity {entity!r} in the graph')
    return self.edges[entity]


def _strings(name: str, value: Any) -> list[str]:
  if not isinstance(value, list) or not all(isinstance(x, str) for x in value):
    raise base.ToolError(base.BAD_ARGUMENTS, f'kb: {name} must be a list of strings')
  return value


def _dump(items) -> str:
  return json.dumps(sorted(items), ensure_ascii=False)


class KB:
  """One tool for the four actions; the session is a `Graph`."""

  spec = base.ToolSpec(
      name='kb',
      description=('Queries the knowledge graph. action=relations(entity): its relations '
                   "('r^-1' = incoming r); neighbours(entity or entities, relation): entities "
                   'reached by the relation; intersection(sets): entities in every list; '
                   'count(entities): how many.'),
      parameters={
          'type': 'object',
          'properties': {
              'action': {'type': 'string', 'enum': list(ACTIONS)},
              'entity': {'type': 'string', 'description': 'for relations and neighbours'},
              'relation': {'type': 'string', 'description': "for neighbours, e.g. 'employer' "
                                                            "or 'employer^-1'"},
              'entities': {'type': 'array', 'items': {'type': 'string'},
                           'description': 'for count, or neighbours of a set'},
              'sets': {'type': 'array', 'items': {'type': 'array', 'items': {'type': 'string'}},
                       'description': 'for intersection: two or more lists of entities'},
          },
          'required': ['action'],
      })

  def new_session(self, context: Mapping[str, Any]) -> Graph:
    if 'graph' not in context:
      raise base.ToolError(base.TOOL_FAILED, 'kb: this episode has no knowledge graph')
    return Graph(context['graph'])

  def call(self, session: Graph, arguments: Mapping[str, Any]) -> str:
    action = arguments['action']
    if action not in ACTIONS:
      raise base.ToolError(base.BAD_ARGUMENTS,
                           f'kb: unknown action {action!r}; actions: {", ".join(ACTIONS)}')
    missing = [k for k in _REQUIRED[action] if k not in arguments]
    if action == 'neighbours' and 'entity' not in arguments and 'entities' not in arguments:
      missing.append('entity (or entities)')
    if missing:
      raise base.ToolError(base.BAD_ARGUMENTS, f'kb: {action} needs {", ".join(missing)}')
    if action == 'relations':
      return _dump(session.relations(arguments['entity']))
    if action == 'neighbours':
      sources = ([arguments['entity']] if 'entity' in arguments else
                 _strings('entities', arguments['entities']))
      found = set()
      for entity in sources:
        found |= session.neighbours(entity, arguments['relation'])
      return _dump(found)
    if action == 'intersection':
      sets = arguments['sets']
      if not isinstance(sets, list) or len(sets) < 2:
        raise base.ToolError(base.BAD_ARGUMENTS, 'kb: intersection needs two or more lists')
      common = set(_strings('sets[0]', sets[0]))
      for i, other in enumerate(sets[1:], 1):
        common &= set(_strings(f'sets[{i}]', other))
      return _dump(common)
    return str(len(set(_strings('entities', arguments['entities']))))


TOOL = KB()
