"""Task generator: a gold DAG of calls, an instruction, and the gold answer.

A task is drawn from the procedural catalog's value flow (`Tool.meta`):

    single    one call                         (look up a record, convert, create, ...)
    parallel  k = 2..4 independent calls       (different providers)
    chain     search -> get (-> stats)         (each call uses the previous output)
    fanout    search top-k -> k gets           (one call, then k that use its output)
    mixed     a chain or fanout plus independent calls

The instruction says what the user needs without naming tools (it names the
provider brand, as a user would say "on Expedia"). Gold argument values are
resolved by running the gold DAG through the `Executor`, so the gold answer
values are exactly what a correct episode observes. Write calls (create,
update) make the final episode state part of the gold.

Splits: providers are split by a hash (``TEST_FRACTION`` of them are test-only),
so test tasks use tools and whole providers that no train task uses.
"""

from __future__ import annotations

import dataclasses
import random
import re
from typing import Any, Iterable, Sequence

from toolenv.executor import (OBS_JSON, Executor, canonical_json, digest, is_error, lookup, make_id,
                              state_key)

KINDS: tuple[str, ...] = ("single", "parallel", "chain", "fanout", "mixed")
MULTI_TOOL_KINDS: tuple[str, ...] = ("parallel", "fanout", "mixed")
SPLITS: tuple[str, ...] = ("train", "test")
TEST_FRACTION = 0.2
WRITE_PROB = 0.15


@dataclasses.dataclass
class Task:
  """One task: instruction, gold DAG, gold answer values and gold state.

  ``nodes`` are dicts ``{"id", "tool", "arguments", "deps", "level", "query",
  "late"}``: ``arguments`` are concrete (refs resolved), ``deps`` the ids of
  nodes whose outputs they use, ``query`` what an explorer would search for,
  ``late`` whether the need only appears after earlier results (the oracle
  then explores it after executing them). ``answers`` are ``{"label",
  "value"}`` dicts; success needs every value in the final answer.
  """

  id: str
  kind: str
  split: str
  instruction: str
  nodes: list[dict[str, Any]]
  answers: list[dict[str, str]]
  gold_state: str = ""          # `executor.state_key` of the gold final state
  writes: bool = False
  max_turns: int = 16
  seed: int = 0

  @property
  def gold_tools(self) -> list[str]:
    """Distinct tools of the gold DAG, in node order."""
    return list(dict.fromkeys(n["tool"] for n in self.nodes))

  @property
  def depth(self) -> int:
    return 1 + max(n["level"] for n in self.nodes)

  def to_dict(self) -> dict[str, Any]:
    return dataclasses.asdict(self)

  @classmethod
  def from_dict(cls, d: dict[str, Any]) -> "Task":
    return cls(**d)


def fmt_value(v: Any) -> str:
  """How an answer value is written (as it appears in the JSON observation)."""
  if isinstance(v, str):
    return v
  return canonical_json(v)


def answer_key(path: str) -> str:
  """The response field an answer path ends in: ``items[0].name`` -> ``name``."""
  return re.sub(r"\[\d*\]", "", path.split(".")[-1])


def _words(s: str) -> str:
  return s.replace("_", " ")


class TaskGenerator:
  """Draws tasks from a catalog's value flow, deterministically from ``seed``."""

  def __new__(cls, catalog, seed: int = 0, executor: Executor | None = None):
    # OpenAPI catalogs get their own generator (toolenv.tasks_openapi), same API.
    del seed, executor
    if cls is TaskGenerator:
      from toolenv import tasks_openapi  # pylint: disable=g-import-not-at-top
      if tasks_openapi.is_openapi_catalog(catalog):
        return super().__new__(tasks_openapi.OpenAPITaskGenerator)
    return super().__new__(cls)

  def __init__(self, catalog, seed: int = 0, executor: Executor | None = None):
    self.catalog = catalog
    self.seed = seed
    self.executor = executor or Executor(catalog, seed=catalog.info.get("seed", 0))
    self._by_split: dict[str, list[dict[str, Any]]] = {s: [] for s in SPLITS}
    self._index()

  def split_of(self, provider: str) -> str:
    """Which split a provider belongs to (stable for a given generator seed)."""
    return "test" if digest("split", self.seed, provider) % 1000 < TEST_FRACTION * 1000 else "train"

  def _index(self) -> None:
    """Groups procedural tools by (provider, entity) with their operations."""
    groups: dict[tuple[str, str], dict[str, Any]] = {}
    convs: dict[str, Any] = {}
    for tool in self.catalog:
      kind = tool.meta.get("kind")
      if tool.source != "procedural" or kind is None:
        continue
      if kind == "convert":
        convs[tool.provider] = tool
        continue
      g = groups.setdefault((tool.provider, tool.meta["entity"]),
                            {"provider": tool.provider, "category": tool.category,
                             "entity": tool.meta["entity"], "ops": {}})
      g["ops"][kind] = tool
    if not groups:
      raise ValueError(f"catalog {self.catalog.name!r} has no tools with value-flow "
                       "metadata (Tool.meta kind/entity); cannot generate tasks")
    for g in groups.values():
      g["convert"] = convs.get(g["provider"])
      if "get" in g["ops"]:
        self._by_split[self.split_of(g["provider"])].append(g)

  # ---- public ------------------------------------------------------------
  def generate(self, n: int, split: str = "train",
               kinds: Sequence[str] = KINDS) -> list[Task]:
    """``n`` tasks of ``split``, kinds dealt round-robin (stable prefixes)."""
    if split not in SPLITS:
      raise ValueError(f"split must be one of {SPLITS}, got {split!r}")
    bad = [k for k in kinds if k not in KINDS]
    if bad or not kinds:
      raise ValueError(f"kinds must be a non-empty subset of {KINDS}, got {kinds!r}")
    return [self.task(i, split, kinds[i % len(kinds)]) for i in range(n)]

  def task(self, index: int, split: str, kind: str) -> Task:
    """Task number ``index`` of ``kind`` in ``split`` (a pure function of them)."""
    for attempt in range(50):
      rng = random.Random(f"task-{self.seed}-{split}-{kind}-{index}-{attempt}")
      parts = self._draw(rng, split, kind)
      if parts is not None:
        return self._finish(parts, f"{split}-{kind}-{self.seed}-{index}", kind, split)
    raise RuntimeError(f"could not draw a {kind} task (index {index})")

  # ---- drawing -------------------------------------------------------------
  def _groups(self, rng: random.Random, split: str, k: int,
              need: Iterable[str] = ()) -> list[dict[str, Any]] | None:
    pool = self._by_split[split]
    need = tuple(need)
    out, seen = [], set()
    for _ in range(40 * k):
      g = pool[rng.randrange(len(pool))]
      if g["provider"] in seen or any(op not in g["ops"] for op in need):
        continue
      out.append(g)
      seen.add(g["provider"])
      if len(out) == k:
        return out
    return None

  def _draw(self, rng, split, kind):
    if kind == "single":
      g = self._groups(rng, split, 1)
      return g and [self._leaf(rng, g[0])]
    if kind == "parallel":
      gs = self._groups(rng, split, rng.choice((2, 3, 3, 4)))
      return gs and [self._leaf(rng, g) for g in gs]
    if kind == "chain":
      g = self._groups(rng, split, 1, need=("search",))
      return g and [self._chain(rng, g[0])]
    if kind == "fanout":
      g = self._groups(rng, split, 1, need=("search",))
      return g and [self._fanout(rng, g[0])]
    gs = self._groups(rng, split, rng.choice((2, 3)), need=("search",))
    if not gs:
      return None
    first = self._chain(rng, gs[0], late=True) if rng.random() < 0.6 else (
        self._fanout(rng, gs[0], late=True))
    return [first] + [self._leaf(rng, g) for g in gs[1:]]

  def _field(self, rng, g) -> str:
    tool = g["ops"]["get"]
    skip = {tool.meta["id_field"], "name"}
    return rng.choice([f for f in tool.response["properties"] if f not in skip])

  def _leaf(self, rng, g) -> dict[str, Any]:
    """One independent need: a list of (tool, args-with-refs) and answer specs."""
    ops, p, noun = g["ops"], g["provider"], _words(g["entity"])
    prefix = ops["get"].meta["id_prefix"]
    rid = make_id(prefix, "task", rng.random())
    idf = ops["get"].meta["id_field"]
    options = ["get", "get"]
    options += [o for o in ("stats", "search", "list") if o in ops]
    if g["convert"] is not None:
      options.append("convert")
    if rng.random() < WRITE_PROB:
      options = [o for o in ("create", "update") if o in ops] or options
    op = rng.choice(options)
    tool = ops.get(op) or g["convert"]
    if op == "get":
      f = self._field(rng, g)
      return {"calls": [(tool, {idf: rid})], "answers": [(0, f, _words(f))],
              "text": f"On {p}, look up the {noun} {rid} and tell me its {_words(f)}.",
              "queries": [f"{p} {noun} details by id"]}
    if op == "stats":
      period = rng.choice(("day", "week", "month", "year"))
      return {"calls": [(tool, {idf: rid, "period": period})],
              "answers": [(0, "count", f"{period} count")],
              "text": f"Using {p}, get the {period} statistics of {noun} {rid}; I need the count.",
              "queries": [f"{p} {noun} statistics"]}
    if op == "search":
      q = rng.choice(_QUERY_WORDS)
      return {"calls": [(tool, {"query": q})],
              "answers": [(0, f"results[0].{idf}", "top match id")],
              "text": f"Search {p} for {_plural(noun)} matching '{q}' and give me the id of the top match.",
              "queries": [f"{p} search {_plural(noun)}"]}
    if op == "list":
      ff = tool.meta["filter_field"]
      val = rng.choice(tool.properties[ff]["enum"])
      return {"calls": [(tool, {ff: val})], "answers": [(0, "items[0].name", "first name")],
              "text": f"List the {_plural(noun)} on {p} whose {_words(ff)} is {val}, and tell me the name of the first one.",
              "queries": [f"{p} list {_plural(noun)} by {_words(ff)}"]}
    if op == "convert":
      units = tool.meta["units"]
      a, b = rng.sample(units, 2)
      amount = rng.randint(2, 900)
      return {"calls": [(tool, {"amount": amount, "from_unit": a, "to_unit": b})],
              "answers": [(0, "result", f"{b} amount")],
              "text": f"With {p}'s converter, convert {amount} {a} to {b}.",
              "queries": [f"{p} convert {_words(tool.meta['quantity'])}"]}
    upd = tool.meta["update_field"]
    from toolenv.executor import _Draw, _gen_scalar  # pylint: disable=g-import-not-at-top
    val = _gen_scalar(ops["get"].response["properties"][upd], _Draw("v", rng.random()), upd)
    if op == "create":
      name = f"{rng.choice(_QUERY_WORDS).capitalize()} {rng.randint(10, 99)}"
      return {"calls": [(tool, {"name": name, upd: val})],
              "answers": [(0, idf, "new id")],
              "text": f"Create a new {noun} on {p} named '{name}' with {_words(upd)} {fmt_value(val)}, and tell me its id.",
              "queries": [f"{p} create {noun}"]}
    return {"calls": [(tool, {idf: rid, upd: val})], "answers": [(0, upd, f"new {_words(upd)}")],
            "text": f"On {p}, change the {_words(upd)} of {noun} {rid} to {fmt_value(val)} and confirm the new value.",
            "queries": [f"{p} change {noun} {_words(upd)}"]}

  def _chain(self, rng, g, late=False) -> dict[str, Any]:
    ops, p, noun = g["ops"], g["provider"], _words(g["entity"])
    idf = ops["get"].meta["id_field"]
    q = rng.choice(_QUERY_WORDS)
    calls = [(ops["search"], {"query": q}),
             (ops["get"], {idf: ("$ref", 0, f"results[0].{idf}")})]
    queries = [f"{p} search {_plural(noun)}", f"{p} {noun} details by id"]
    if "stats" in ops and rng.random() < 0.35:
      period = rng.choice(("week", "month"))
      calls.append((ops["stats"], {idf: ("$ref", 1, idf), "period": period}))
      queries.append(f"{p} {noun} statistics")
      return {"calls": calls, "answers": [(2, "count", f"{period} count")], "late": late,
              "text": f"On {p}, find the {noun} that best matches '{q}', open its details, "
                      f"then get its {period} statistics; I need the count.",
              "queries": queries}
    f = self._field(rng, g)
    return {"calls": calls, "answers": [(1, f, _words(f))], "late": late, "queries": queries,
            "text": f"On {p}, find the {noun} that best matches '{q}', then tell me its {_words(f)}."}

  def _fanout(self, rng, g, late=False) -> dict[str, Any]:
    ops, p, noun = g["ops"], g["provider"], _words(g["entity"])
    idf = ops["get"].meta["id_field"]
    q, k = rng.choice(_QUERY_WORDS), rng.choice((2, 3, 3, 4))
    f = self._field(rng, g)
    calls = [(ops["search"], {"query": q, "limit": k})]
    calls += [(ops["get"], {idf: ("$ref", 0, f"results[{i}].{idf}")}) for i in range(k)]
    return {"calls": calls, "late": late,
            "answers": [(1 + i, f, f"{_words(f)} of match {i + 1}") for i in range(k)],
            "text": f"Search {p} for the top {k} {_plural(noun)} matching '{q}' and tell me "
                    f"the {_words(f)} of each.",
            "queries": [f"{p} search {_plural(noun)}", f"{p} {noun} details by id"]}

  # ---- resolving -------------------------------------------------------------
  def _finish(self, parts, task_id: str, kind: str, split: str) -> Task:
    """Runs the gold DAG, resolving refs, and builds the `Task`."""
    state = self.executor.new_state()
    nodes, answers, texts = [], [], []
    for part in parts:
      base = len(nodes)
      outs = []
      for j, (tool, args) in enumerate(part["calls"]):
        deps, concrete = [], {}
        for k, v in args.items():
          if isinstance(v, tuple) and v and v[0] == "$ref":
            deps.append(nodes[base + v[1]]["id"])
            concrete[k] = lookup(outs[v[1]], v[2])
          else:
            concrete[k] = v
        out = self.executor.run(tool.name, concrete, state)
        if is_error(out):
          raise RuntimeError(f"gold call failed: {tool.name}({concrete}): {out}")
        outs.append(out)
        level = 1 + max((nodes[int(d[1:])]["level"] for d in deps), default=-1)
        q = part["queries"][min(j, len(part["queries"]) - 1)]
        nodes.append({"id": f"n{len(nodes)}", "tool": tool.name, "arguments": concrete,
                      "deps": sorted(set(deps)), "level": level, "query": q,
                      "late": bool(part.get("late")) and level > 0})
      for j, path, label in part["answers"]:
        v = lookup(outs[j], path)
        answers.append({"label": label, "value": fmt_value(v),
                        "key": answer_key(path), "json": OBS_JSON(v)})
      texts.append(part["text"])
    writes = any(self.catalog[n["tool"]].effect == "write" for n in nodes)
    instruction = " ".join(texts) if len(texts) == 1 else " Also: ".join(texts)
    return Task(id=task_id, kind=kind, split=split, instruction=instruction,
                nodes=nodes, answers=answers,
                gold_state=state_key(state) if writes else "", writes=writes,
                max_turns=min(40, 2 * len(nodes) + 6), seed=self.seed)


def _plural(w: str) -> str:
  if w.endswith("y") and w[-2:-1] not in "aeiou":
    return w[:-1] + "ies"
  if w.endswith(("s", "x", "ch", "sh")):
    return w + "es"
  return w + "s"


_QUERY_WORDS = ("amber", "birch", "cobalt", "delta", "ember", "fjord", "garnet",
                "harbor", "indigo", "juniper", "kestrel", "lotus", "meadow",
                "nimbus", "onyx", "pebble", "quartz", "raven", "sierra", "tundra")
