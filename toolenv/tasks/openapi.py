"""Task generation on the OpenAPI catalog (real operations, value flow by name).

    cat = toolenv.load_catalog("openapi")
    gen = toolenv.TaskGenerator(cat, seed=0)       # an OpenAPITaskGenerator
    tasks = gen.generate(100, split="test", kinds=("chain", "fanout"))
    gen.stats                                      # pools, pairs, exclusions

The same five kinds as the procedural generator, drawn from real operations:

    single    one operation with every required argument given
    parallel  2..4 operations of different providers
    chain     list/search/create -> get-by-id (-> a third call): the id field of
              one response (``[].id``, ``items[].id``, ``id``) feeds the id
              parameter of the next operation of the same provider
    fanout    a list operation, then the get-by-id call for 2..3 of its items
    mixed     a chain or fanout plus independent operations of other providers

Pairs come from `toolenv.catalog.valueflow` (``meta["produces"]`` /
``meta["consumes"]``, same tag, same JSON type). Argument values are drawn
from the parameter's schema and name (enums, ids, dates, emails, limits...),
so the simulator accepts them; instructions are rendered from the
operation's summary and parameter names and state every value (both in
`toolenv.tasks.openapi_args`). The gold
answer is resolved by running the gold DAG through the `Executor`
(`BaseTaskGenerator._finish`). Operations that cannot make solvable tasks are
left out with a counted reason (``stats["excluded"]``): too many required
arguments, required object arguments, binary bodies; operations whose
response has no scalar field to ask about can still start a chain.
Splits are by provider, as for the procedural catalog (`split_of`).
"""

from __future__ import annotations

import collections
import json
import random
import re
from typing import Any

from toolenv.catalog.valueflow import id_resource, singular
from toolenv.schema import Tool
from toolenv.tasks.base import SPLITS, WRITE_PROB, BaseTaskGenerator, Task, plural
from toolenv.tasks.openapi_args import action_phrase, arg_value, args_text, words
from toolenv.validation import canonical_call

MAX_REQUIRED = 6            # longer instructions read like forms, not requests
MAX_FANOUT = 3              # the simulator returns 3 items per array
CHAIN3_PROB = 0.35
OPTIONAL_PROB = 0.25        # also set one optional enum parameter
_SCALARS = ("string", "integer", "number")
_BINARY_MEDIA = re.compile(r"octet-stream|image/|audio/|video/|zip|pdf|^\*/\*$|^$")
_RANGE_LO = re.compile(r"(?:^|_)(?i:start|from|since|begin|min)(?![a-z])|"
                       r"(?<=[a-z])(?:Start|From|Since|Begin|Min)(?![a-z])")
_RANGE_HI = re.compile(r"(?:^|_)(?i:end|until|to|max)(?![a-z])|"
                       r"(?<=[a-z])(?:End|Until|To|Max)(?![a-z])")
_GENERIC_KEYS = ("items", "data", "results", "value", "values", "records",
                 "embedded", "content", "entries")


def is_openapi_catalog(catalog) -> bool:
  """Whether ``catalog`` holds OpenAPI operations (by name or first tool)."""
  name = getattr(catalog, "name", "")
  if name == "openapi":
    return True
  if name == "procedural" or not len(catalog):
    return False
  return catalog[0].source == "openapi"



def _iter_uncached(catalog):
  """Every tool of ``catalog`` without keeping the decoded `Tool`s.

  The index needs one pass over all 50,011 operations; going through
  ``catalog[i]`` would keep every decoded tool in the store (+0.5 GiB).
  The store keeps undecoded tools as JSON lines (``_rows``): read those.
  """
  rows = getattr(catalog, "_rows", None)
  decoded = getattr(catalog, "_tools", None)
  if rows is None or decoded is None or len(rows) != len(catalog):
    yield from catalog
    return
  for i in range(len(catalog)):
    t = decoded[i]
    yield t if t is not None else Tool.from_dict(json.loads(rows[i]))


# ---------------------------------------------------------------- schemas

def _leaves(sch: Any, path: str = "", keys: tuple = (), depth: int = 0,
            in_list: str | None = None):
  """Scalar leaves ``(path, type, keys, list key)`` of a response schema."""
  if not isinstance(sch, dict) or depth > 3:
    return
  t = sch.get("type")
  if t in _SCALARS or t == "boolean":
    yield path, t, keys, in_list
  elif t == "object":
    for k in sorted(sch.get("properties") or {}):
      yield from _leaves(sch["properties"][k], f"{path}.{k}" if path else k,
                         keys + (k,), depth + 1, in_list)
  elif t == "array" and in_list is None:
    yield from _leaves(sch.get("items"), f"{path}[0]", keys, depth + 1,
                       keys[-1] if keys else "")


def _path_type(response: dict[str, Any], produced: str) -> str | None:
  """The JSON type at a ``produces`` path (``[].id``, ``items[].id``, ``id``)."""
  head, _, field = produced.rpartition(".")
  node = response
  if head:
    key = head[:-2]
    if key:
      node = (node.get("properties") or {}).get(key) or {}
    node = node.get("items") or {}
  node = (node.get("properties") or {}).get(field or produced)
  return node.get("type") if isinstance(node, dict) else None


def _ref_path(produced: str, i: int) -> str:
  return produced.replace("[]", f"[{i}]")


def _param_problem(tool, media: str) -> str | None:
  """Why ``tool``'s required arguments cannot be generated, or None."""
  if len(tool.required) > MAX_REQUIRED:
    return "too_many_required"
  for p in tool.required:
    sch = tool.properties.get(p)
    sch = sch if isinstance(sch, dict) else {}
    t = sch.get("type", "string")
    if t == "object" or (t == "array" and (sch.get("items") or {}).get("type", "string")
                         not in _SCALARS + ("boolean",)):
      return "required_object_param"
    if p == "body" and tool.meta.get("param_in", {}).get(p) == "body" and (
        _BINARY_MEDIA.search(media.lower())):
      return "binary_body"
  return None


# ---------------------------------------------------------------- generator

class OpenAPITaskGenerator(BaseTaskGenerator):
  """Task generator for OpenAPI catalogs (``toolenv.TaskGenerator(cat)`` picks it)."""

  # ---- index ---------------------------------------------------------------
  def _index(self) -> None:
    """Callable operations, leaf / chain / fanout pools by split, and `stats`."""
    excluded: collections.Counter = collections.Counter()
    ops: dict[str, dict[str, Any]] = {}
    producers: dict[str, list[tuple[str, str, str]]] = collections.defaultdict(list)
    consumers: dict[str, list[tuple[str, str, str]]] = collections.defaultdict(list)
    for tool in _iter_uncached(self.catalog):
      if tool.source != "openapi":
        excluded["not_openapi"] += 1
        continue
      problem = _param_problem(tool, tool.meta.get("body_media", "") or "")
      if problem is None and tool.response.get("type") not in ("object", "array"):
        # Env and task resolution test a response with ``"error" in out``: a
        # number raises there, a string is searched for the substring.
        problem = "scalar_response"
      if problem is None and "error" in (tool.response.get("properties") or {}):
        # ... and a top-level "error" key reads as a failed call
        # (`executor.error`); a response schema that has one cannot be gold.
        problem = "error_field_in_response"
      if problem:
        excluded[problem] += 1
        continue
      leaves = [lf for lf in _leaves(tool.response) if lf[1] != "boolean"] or [
          lf for lf in _leaves(tool.response)]
      consumes = tool.meta.get("consumes") or {}
      ops[tool.name] = {"provider": tool.provider, "effect": tool.effect, "leaves": leaves}
      if not leaves:
        excluded["no_answer_field"] += 1
      for param, tag in consumes.items():
        if param in tool.required:
          consumers[tag].append((tool.name, param, tool.properties[param].get("type")))
      for path, tag in (tool.meta.get("produces") or {}).items():
        # A get-by-id whose response repeats the id would hand back a fresh
        # simulated id for the one it was given: no chain starts there.
        if tag in consumes.values():
          continue
        # Reads start chains; a write only through the id of what it made
        # (create -> get), never by listing (a POST that "clears" a list).
        if tool.effect != "read" and not (tool.meta.get("kind") == "create"
                                          and "[]" not in path):
          continue
        t = _path_type(tool.response, path)
        if t in ("string", "integer"):
          producers[tag].append((tool.name, path, t))
    self._ops, self._consumers = ops, consumers
    leaf: dict[str, dict[str, list[str]]] = {s: collections.defaultdict(list) for s in SPLITS}
    chain: dict[str, dict[str, list]] = {s: collections.defaultdict(list) for s in SPLITS}
    fan: dict[str, dict[str, list]] = {s: collections.defaultdict(list) for s in SPLITS}
    for name, op in ops.items():
      if op["leaves"]:
        leaf[self.split_of(op["provider"])][op["provider"]].append(name)
    for tag in sorted(producers):
      for pname, path, ptype in producers[tag]:
        prov = ops[pname]["provider"]
        for cname, param, ctype in consumers.get(tag, ()):
          if cname == pname or ctype != ptype or not ops[cname]["leaves"]:
            continue
          pair = (pname, path, cname, param)
          chain[self.split_of(prov)][prov].append(pair)
          if "[]" not in path:
            continue
          fan[self.split_of(prov)][prov].append(pair)
    self._pools = {"leaf": leaf, "chain": chain, "fanout": fan}
    self._providers = {k: {s: sorted(v[s]) for s in SPLITS} for k, v in self._pools.items()}
    self.stats = {
        "tools": len(self.catalog), "callable": len(ops),
        "answerable": sum(1 for o in ops.values() if o["leaves"]),
        "chain_pairs": sum(len(v) for s in SPLITS for v in chain[s].values()),
        "fanout_pairs": sum(len(v) for s in SPLITS for v in fan[s].values()),
        "providers": {k: {s: len(p[s]) for s in SPLITS} for k, p in self._providers.items()},
        "excluded": dict(sorted(excluded.items()))}
    if not any(self._providers["leaf"][s] for s in SPLITS):
      raise ValueError(f"catalog {self.catalog.name!r} has no OpenAPI operation that can "
                       f"make a task (excluded: {self.stats['excluded']})")

  def _pick(self, rng: random.Random, pool: str, split: str, avoid: set[str]):
    """A provider (uniformly, not in ``avoid``) and one item of its pool."""
    provs = [p for p in self._providers[pool][split] if p not in avoid]
    if not provs:
      return None, None
    prov = provs[rng.randrange(len(provs))]
    items = self._pools[pool][split][prov]
    if pool == "leaf":
      reads = [n for n in items if self._ops[n]["effect"] == "read"]
      writes = [n for n in items if self._ops[n]["effect"] != "read"]
      items = writes if writes and (not reads or rng.random() < WRITE_PROB) else reads
    return prov, items[rng.randrange(len(items))]

  # ---- public (see BaseTaskGenerator) ---------------------------------------
  def task(self, index: int, split: str, kind: str) -> Task:
    """Task number ``index`` of ``kind`` in ``split`` (a pure function of them)."""
    for attempt in range(50):
      rng = random.Random(f"openapi-task-{self.seed}-{split}-{kind}-{index}-{attempt}")
      parts = self._draw(rng, split, kind)
      if parts is None:
        continue
      task = self._finish(parts, f"{split}-{kind}-{self.seed}-{index}", kind, split)
      if self._sound(task):
        return task
    raise RuntimeError(f"could not draw a {kind} task in split {split!r} (index "
                       f"{index}); pools: {self.stats['providers']}")

  def _sound(self, task: Task) -> bool:
    """Distinct gold calls (a fanout over two equal ids would merge) and answers."""
    keys = [canonical_call(self.catalog[n["tool"]], n["arguments"]) for n in task.nodes]
    return len(set(keys)) == len(keys) and all(
        a["value"] not in ("", "null") for a in task.answers)

  # ---- drawing ---------------------------------------------------------------
  def _draw(self, rng, split, kind):
    if kind == "single":
      _, name = self._pick(rng, "leaf", split, set())
      return name and [self._leaf(rng, name)]
    if kind == "parallel":
      return self._leaves_parts(rng, split, rng.choice((2, 3, 3, 4)), set())
    if kind in ("chain", "fanout"):
      _, pair = self._pick(rng, kind, split, set())
      return pair and [self._chain(rng, pair) if kind == "chain" else self._fanout(rng, pair)]
    pool = "chain" if rng.random() < 0.6 else "fanout"
    if not self._providers["fanout"][split]:
      pool = "chain"
    prov, pair = self._pick(rng, pool, split, set())
    if pair is None:
      return None
    first = self._chain(rng, pair, late=True) if pool == "chain" else self._fanout(rng, pair, late=True)
    rest = self._leaves_parts(rng, split, rng.choice((1, 2)), {prov})
    return rest and [first] + rest

  def _leaves_parts(self, rng, split, k, avoid):
    out = []
    for _ in range(k):
      prov, name = self._pick(rng, "leaf", split, avoid)
      if name is None:
        return None
      avoid = avoid | {prov}
      out.append(self._leaf(rng, name))
    return out

  def _args(self, rng, tool, skip=(), same: dict[str, Any] | None = None) -> dict[str, Any]:
    """Every required argument (but ``skip``), sometimes one optional enum.

    A parameter named as one of ``same`` (the previous call's arguments)
    keeps that value, as a user means the same org or repo in both calls.
    """
    ent = tool.meta.get("entity", "")
    same = same or {}
    args = {}
    for p in tool.required:
      if p in skip:
        continue
      sch = tool.properties[p]
      v = arg_value(p, sch, rng, ent)
      if p in same and type(same[p]) is type(v) and same[p] in sch.get("enum", [same[p]]):
        v = same[p]
      args[p] = v
    # A range the user states in order: start/from before end/to.
    lo = [p for p in args if _RANGE_LO.search(p)]
    hi = [p for p in args if _RANGE_HI.search(p) and p not in lo]
    if len(lo) == 1 and len(hi) == 1 and type(args[lo[0]]) is type(args[hi[0]]) and isinstance(
        args[lo[0]], (str, int, float)) and not isinstance(args[lo[0]], bool) and (
            args[lo[0]] > args[hi[0]]) and not (
                tool.properties[lo[0]].get("enum") or tool.properties[hi[0]].get("enum")):
      args[lo[0]], args[hi[0]] = args[hi[0]], args[lo[0]]
    opt = [p for p, s in tool.properties.items() if p not in tool.required
           and isinstance(s, dict) and s.get("enum")]
    if opt and rng.random() < OPTIONAL_PROB:
      p = opt[rng.randrange(len(opt))]
      args[p] = arg_value(p, tool.properties[p], rng, ent)
    return args

  def _answer(self, rng, name: str, prefer_id: bool = False):
    """(path, label) of one scalar response field to ask about."""
    leaves = self._ops[name]["leaves"]
    # Top-level fields (2 keys deep at most) read best; lists, deep nesting
    # only when the response has nothing else.
    leaves = [lf for lf in leaves if lf[3] is None and len(lf[2]) <= 2] or [
        lf for lf in leaves if len(lf[2]) <= 2] or leaves
    plain = [lf for lf in leaves if id_resource(lf[2][-1] if lf[2] else "x") is None]
    ids = [lf for lf in leaves if lf not in plain]
    pool = (ids if prefer_id and ids else plain) or leaves
    path, _, keys, list_key = pool[rng.randrange(len(pool))]
    label = " ".join(words(k) for k in keys) or "result"
    if list_key is not None:
      label += f" of the first {self._noun(name, list_key)}"
    return path, label

  def _noun(self, name: str, key: str) -> str:
    if key and key.lower() not in _GENERIC_KEYS:
      return words(singular(key))
    return words(self.catalog[name].meta.get("entity") or "result")

  def _where(self, tool) -> str:
    svc = tool.meta.get("service")
    return f"{tool.provider} ({words(svc)})" if svc else tool.provider

  def _query(self, tool) -> str:
    return f"{self._where(tool)} {tool.description}"[:200]

  def _leaf(self, rng, name: str) -> dict[str, Any]:
    tool = self.catalog[name]
    args = self._args(rng, tool)
    path, label = self._answer(rng, name, prefer_id=tool.meta.get("kind") == "create")
    act = action_phrase(tool.description) + args_text(args)
    text = rng.choice((
        f"On {self._where(tool)}, {act}, and tell me the {label}.",
        f"Using the {self._where(tool)} API, {act}. What is the {label}?",
        f"I need {self._where(tool)} to {act}; report the {label}."))
    return {"calls": [(tool, args)], "answers": [(0, path, label)], "text": text,
            "queries": [self._query(tool)]}

  def _chain(self, rng, pair, late=False) -> dict[str, Any]:
    pname, path, cname, param = pair
    prod, cons = self.catalog[pname], self.catalog[cname]
    pargs = self._args(rng, prod)
    cargs = self._args(rng, cons, skip=(param,), same=pargs)
    calls = [(prod, pargs), (cons, {param: ("$ref", 0, _ref_path(path, 0)), **cargs})]
    queries = [self._query(prod), self._query(cons)]
    text = (f"On {self._where(prod)}, {action_phrase(prod.description)}{args_text(pargs)}; "
            f"then {self._link(pname, path, param)} and {action_phrase(cons.description)}"
            f"{args_text(cargs)}")
    last = cname
    nxt = self._next(rng, cname, {pname, cname})
    if nxt is not None and rng.random() < CHAIN3_PROB:
      path2, dname, param2 = nxt
      dtool = self.catalog[dname]
      dargs = self._args(rng, dtool, skip=(param2,), same={**pargs, **cargs})
      calls.append((dtool, {param2: ("$ref", 1, _ref_path(path2, 0)), **dargs}))
      queries.append(self._query(dtool))
      text += (f"; after that, {self._link(cname, path2, param2)} and "
               f"{action_phrase(dtool.description)}{args_text(dargs)}")
      last = dname
    apath, label = self._answer(rng, last)
    return {"calls": calls, "answers": [(len(calls) - 1, apath, label)], "late": late,
            "queries": queries, "text": text + f". Tell me the {label}."}

  def _next(self, rng, name: str, used: set[str]):
    """A third step: a field of ``name``'s response feeding another operation."""
    tool = self.catalog[name]
    consumed = set((tool.meta.get("consumes") or {}).values())
    options = []
    for path, tag in sorted((tool.meta.get("produces") or {}).items()):
      t = _path_type(tool.response, path)
      if tag in consumed or t not in ("string", "integer"):
        continue
      options += [(path, c, p) for c, p, ct in self._consumers.get(tag, ())
                  if c not in used and ct == t and self._ops[c]["leaves"]]
    return options[rng.randrange(len(options))] if options else None

  def _link(self, name: str, path: str, param: str) -> str:
    """How the instruction hands one result to the next call."""
    head, _, field = path.rpartition(".")
    if "[]" in head:
      return f"for the first {self._noun(name, head[:-2])} it returns, use its {words(field)} as the {words(param)}"
    return f"use the {words(field or path)} it returns as the {words(param)}"

  def _fanout(self, rng, pair, late=False) -> dict[str, Any]:
    pname, path, cname, param = pair
    prod, cons = self.catalog[pname], self.catalog[cname]
    k = rng.choice((2, 3, 3))
    k = min(k, MAX_FANOUT)
    pargs = self._args(rng, prod)
    cargs = self._args(rng, cons, skip=(param,), same=pargs)
    calls = [(prod, pargs)]
    calls += [(cons, {param: ("$ref", 0, _ref_path(path, i)), **cargs}) for i in range(k)]
    apath, label = self._answer(rng, cname)
    head, _, field = path.rpartition(".")
    noun = plural(self._noun(pname, head[:-2]))
    text = (f"On {self._where(prod)}, {action_phrase(prod.description)}{args_text(pargs)}; "
            f"for each of the first {k} {noun} it returns, use its {words(field)} as the "
            f"{words(param)} and {action_phrase(cons.description)}{args_text(cargs)}. "
            f"Tell me the {label} of each.")
    return {"calls": calls, "late": late, "text": text,
            "answers": [(1 + i, apath, f"{label} of {noun} {i + 1}") for i in range(k)],
            "queries": [self._query(prod), self._query(cons)]}
