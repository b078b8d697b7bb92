"""Task generator on the procedural catalog (value flow from `Tool.meta`).

A task is drawn from the procedural catalog's value flow:

    single    one call                         (look up a record, convert, create, ...)
    parallel  k = 2..4 independent calls       (different providers)
    chain     search -> get (-> stats)         (each call uses the previous output)
    fanout    search top-k -> k gets           (one call, then k that use its output)
    mixed     a chain or fanout plus independent calls

The instruction says what the user needs without naming tools (it names the
provider brand, as a user would say "on Expedia"). Tools are grouped by
(provider, entity) with their operations; splits are by provider
(`BaseTaskGenerator.split_of`).
"""

from __future__ import annotations

import random
from typing import Any, Iterable

from toolenv.tasks.base import (QUERY_WORDS, SPLITS, WRITE_PROB, BaseTaskGenerator, Task, fmt_value,
                                plural)
from toolenv.values import Draw, gen_scalar, make_id


def _words(s: str) -> str:
  return s.replace("_", " ")


class ProceduralTaskGenerator(BaseTaskGenerator):
  """Draws tasks from a procedural catalog's value flow, deterministically from ``seed``."""

  def _index(self) -> None:
    """Groups procedural tools by (provider, entity) with their operations."""
    groups: dict[tuple[str, str], dict[str, Any]] = {}
    convs: dict[str, Any] = {}
    self._by_split: dict[str, list[dict[str, Any]]] = {s: [] for s in SPLITS}
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
      q = rng.choice(QUERY_WORDS)
      return {"calls": [(tool, {"query": q})],
              "answers": [(0, f"results[0].{idf}", "top match id")],
              "text": f"Search {p} for {plural(noun)} matching '{q}' and give me the id of the top match.",
              "queries": [f"{p} search {plural(noun)}"]}
    if op == "list":
      ff = tool.meta["filter_field"]
      val = rng.choice(tool.properties[ff]["enum"])
      return {"calls": [(tool, {ff: val})], "answers": [(0, "items[0].name", "first name")],
              "text": f"List the {plural(noun)} on {p} whose {_words(ff)} is {val}, and tell me the name of the first one.",
              "queries": [f"{p} list {plural(noun)} by {_words(ff)}"]}
    if op == "convert":
      units = tool.meta["units"]
      a, b = rng.sample(units, 2)
      amount = rng.randint(2, 900)
      return {"calls": [(tool, {"amount": amount, "from_unit": a, "to_unit": b})],
              "answers": [(0, "result", f"{b} amount")],
              "text": f"With {p}'s converter, convert {amount} {a} to {b}.",
              "queries": [f"{p} convert {_words(tool.meta['quantity'])}"]}
    upd = tool.meta["update_field"]
    val = gen_scalar(ops["get"].response["properties"][upd], Draw("v", rng.random()), upd)
    if op == "create":
      name = f"{rng.choice(QUERY_WORDS).capitalize()} {rng.randint(10, 99)}"
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
    q = rng.choice(QUERY_WORDS)
    calls = [(ops["search"], {"query": q}),
             (ops["get"], {idf: ("$ref", 0, f"results[0].{idf}")})]
    queries = [f"{p} search {plural(noun)}", f"{p} {noun} details by id"]
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
    q, k = rng.choice(QUERY_WORDS), rng.choice((2, 3, 3, 4))
    f = self._field(rng, g)
    calls = [(ops["search"], {"query": q, "limit": k})]
    calls += [(ops["get"], {idf: ("$ref", 0, f"results[{i}].{idf}")}) for i in range(k)]
    return {"calls": calls, "late": late,
            "answers": [(1 + i, f, f"{_words(f)} of match {i + 1}") for i in range(k)],
            "text": f"Search {p} for the top {k} {plural(noun)} matching '{q}' and tell me "
                    f"the {_words(f)} of each.",
            "queries": [f"{p} search {plural(noun)}", f"{p} {noun} details by id"]}

