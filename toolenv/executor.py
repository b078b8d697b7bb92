"""The tool simulator: validates calls and answers them deterministically.

A response is a pure function of (catalog seed, tool, canonical arguments,
episode state): values are drawn from a hash of those, never from a global
RNG, so the same call gives the same answer in any episode, order or process.

Procedural tools (``Tool.meta["kind"]`` set) get semantics: search/list return
records of one entity, get/stats read a record by id, create/update/delete
write the episode state, which later reads reflect. A record's fields depend
only on (provider tag, id), so a search hit and a get of the same id agree.
Other tools (OpenAPI, ToolBench) get a response drawn from their response
schema. Ids carry their entity's prefix (``sta-3f2a1c``); an id with a wrong
prefix is "not found", as a real API would say.

Errors are structured observations, never exceptions:
``{"error": "missing_argument", "message": "...", "tool": "..."}``.

This module runs calls (`Executor`); validation and structured errors live
in `toolenv.validation`, the deterministic value draws in `toolenv.values`.
Their public names are re-exported here, where callers have always found them.
"""

from __future__ import annotations

import contextlib
from typing import Any

from toolenv.schema import Tool
from toolenv.validation import (MAX_ARG_CHARS, ErrorResponse, ToolSpec, canonical_call, error,
                                is_error, validate, with_defaults)
from toolenv.values import (OBS_JSON, Draw, canonical_json, digest, gen_from_schema, gen_scalar,
                            hash_at, make_id, plan_value, record_plan, uniforms)

__all__ = ["Executor", "state_key", "lookup", "MAX_ARG_CHARS", "ErrorResponse", "ToolSpec",
           "canonical_call", "error", "is_error", "validate", "with_defaults", "OBS_JSON",
           "Draw", "canonical_json", "digest", "gen_from_schema", "gen_scalar", "make_id"]

_RECORD_CACHE = 200_000    # memoised base records per executor


def _schema_memo(catalog) -> dict[str, dict]:
  """Memos that depend only on the catalog's tools, shared by its executors.

  Tool specs and compiled record plans are functions of the schemas alone
  (not of the seed or an episode), so every `Executor` over one catalog can
  share them: a rollout that makes a fresh env per iteration then compiles
  each schema once per process, not once per env. Keyed by the catalog's
  size, so a catalog that grows gets fresh memos (`spec` also checks the
  tool's identity). Catalogs that take no attributes get private memos.
  """
  try:
    size = len(catalog)
  except TypeError:
    size = None
  cached = getattr(catalog, "_executor_memo", None)
  if cached is not None and size is not None and cached[0] == size:
    return cached[1]
  memo = {"specs": {}, "record_schemas": {}, "record_plans": {}}
  if size is not None:
    with contextlib.suppress(AttributeError):   # e.g. a catalog with __slots__
      catalog._executor_memo = (size, memo)  # pylint: disable=protected-access
  return memo


class Executor:
  """Simulates the tools of one catalog; ``state`` is per episode.

  Episode state: ``{"records": {tag: {id: {field: value} | None}}}`` where
  None marks a deleted record. ``copy_state`` and `state_key` let the task
  generator compute gold states and the env compare them.
  """

  def __init__(self, catalog, seed: int = 0):
    self.catalog = catalog
    self.seed = seed
    self._records: dict[tuple[str, str], dict[str, Any]] = {}
    memo = _schema_memo(catalog)
    self._specs: dict[str, ToolSpec] = memo["specs"]
    self._rec_cache: dict[tuple[str, str], dict[str, Any]] = memo["record_schemas"]
    self._plan_cache: dict[tuple[str, str], tuple] = memo["record_plans"]

  def spec(self, tool: Tool) -> ToolSpec:
    """The `ToolSpec` of ``tool``, memoised by name (checked by identity)."""
    spec = self._specs.get(tool.name)
    if spec is None or spec.tool is not tool:
      spec = self._specs[tool.name] = ToolSpec(tool)
    return spec

  @staticmethod
  def new_state() -> dict[str, Any]:
    return {"records": {}}

  def record(self, tool: Tool, rid: str, state: dict[str, Any]) -> dict[str, Any] | None:
    """The record ``rid`` of ``tool``'s entity, with the episode's writes."""
    meta = tool.meta
    tag = f"{tool.provider}/{meta['id_field']}"
    written = state["records"].get(tag, {})
    if rid in written and written[rid] is None:
      return None
    if not rid.startswith(meta["id_prefix"] + "-") and rid not in written:
      return None
    # The base record is a pure function of (seed, tag, id): memoised, since a
    # GRPO group replays the same task and reads the same records many times.
    base = self._records.get((tag, rid))
    if base is None:
      draws, plan = self._record_plan(tool)
      key = (self.seed, tag, rid)
      us = uniforms(Draw(*key).prefix, 0, draws)
      base = {k: plan_value(code, a, b, us, off, key) for k, off, code, a, b in plan}
      if len(self._records) >= _RECORD_CACHE:
        self._records.clear()
      self._records[(tag, rid)] = base
    rec = dict(base)
    rec.update(written.get(rid) or {})
    return rec

  def _record_schema(self, tool: Tool) -> dict[str, Any]:
    """Field schemas of the entity, from the provider's get tool if it exists."""
    cache = self._rec_cache
    key = (tool.provider, tool.meta["entity"])
    if key not in cache:
      brand = tool.name.split("_", 1)[0]
      get = self.catalog.get(f"{brand}_get_{tool.meta['entity']}")
      cache[key] = dict((get or tool).response.get("properties", {}))
    return cache[key]

  def _record_plan(self, tool: Tool) -> tuple[int, tuple]:
    """The `toolenv.values.record_plan` of ``tool``'s entity (memoised)."""
    cache = self._plan_cache
    key = (tool.provider, tool.meta["entity"])
    plan = cache.get(key)
    if plan is None:
      plan = cache[key] = record_plan(self._record_schema(tool), tool.meta["id_field"])
    return plan

  def call(self, tool: Tool, arguments: dict[str, Any],
           state: dict[str, Any]) -> dict[str, Any]:
    """Runs one validated call; write tools change ``state`` in place."""
    args = with_defaults(tool, arguments, self.spec(tool))
    return self._simulate(tool, args, canonical_json(args), state)

  def _simulate(self, tool: Tool, args: dict[str, Any], cj: str,
                state: dict[str, Any]) -> dict[str, Any]:
    """`call` on arguments with defaults filled; ``cj`` is their canonical JSON."""
    kind = tool.meta.get("kind")
    # Real catalogs' tools are simulated from their schemas (value flow by
    # field names); only procedural tools carry the entity semantics below.
    if tool.source != "procedural" or kind is None:
      return gen_from_schema(tool.response, Draw(self.seed, tool.name + cj))
    if kind == "convert":
      d = Draw(self.seed, tool.name, args["from_unit"], args["to_unit"])
      rate = 1.0 if args["from_unit"] == args["to_unit"] else round(0.2 + 4 * d.u(), 4)
      return {"result": round(args["amount"] * rate, int(args.get("precision", 2))),
              "to_unit": args["to_unit"], "rate": rate}
    meta = tool.meta
    idf, prefix = meta["id_field"], meta["id_prefix"]
    tag = f"{tool.provider}/{idf}"
    if kind in ("search", "list"):
      key = "results" if kind == "search" else "items"
      n = int(args.get("limit", 3))
      fval = args.get(meta["filter_field"]) if kind == "list" else None
      # = [make_id(prefix, seed, name, query_json, i) for i < n], with the
      # JSON and the hash of the common prefix computed once.
      h = Draw(prefix, self.seed, tool.name, canonical_json(
          {k: v for k, v in args.items() if k != "limit"})).prefix
      ids = [f"{prefix}-{hash_at(h, i) % 16**6:06x}" for i in range(n)]
      items = []
      for rid in ids:
        rec = self.record(tool, rid, state) or {}
        item = {idf: rid, "name": rec.get("name"),
                meta["filter_field"]: fval or rec.get(meta["filter_field"])}
        items.append(item)
      count = digest(self.seed, tool.name, "count", cj) % 400 + n
      return {key: items, "count": count}
    if kind == "create":
      rid = make_id(prefix, self.seed, "new", cj)
      fields = {"name": args["name"], meta["update_field"]: args[meta["update_field"]]}
      state["records"].setdefault(tag, {})[rid] = fields
      return {idf: rid, "status": "created"}
    rid = args[idf]
    rec = self.record(tool, rid, state)
    if rec is None:
      return error("not_found", f"no {meta['entity'].replace('_', ' ')} with id "
                   f"{rid[:40]!r}", tool.name)
    if kind == "get":
      return rec
    if kind == "stats":
      d = Draw(self.seed, tag, rid, args["period"])
      return {idf: rid, "period": args["period"], "count": d.int(0, 900),
              "average": round(100 * d.u(), 2)}
    recs = state["records"].setdefault(tag, {})
    if kind == "update":
      upd = meta["update_field"]
      recs[rid] = {**(recs.get(rid) or {}), upd: args[upd]}
      return {idf: rid, upd: args[upd], "status": "updated"}
    if kind == "delete":
      recs[rid] = None
      return {idf: rid, "status": "deleted"}
    return gen_from_schema(tool.response, Draw(self.seed, tool.name + cj))

  def run(self, name: Any, arguments: Any, state: dict[str, Any]) -> dict[str, Any]:
    """Validates then runs a call by name; unknown tools are an error response."""
    return self.run_keyed(name, arguments, state)[0]

  def run_keyed(self, name: Any, arguments: Any,
                state: dict[str, Any]) -> tuple[dict[str, Any], str | None]:
    """`run`, plus the call's `canonical_call` key (None if the call was invalid).

    The env needs the key (duplicates, gold nodes); computing it here reuses
    the defaults and the canonical JSON the simulation needs anyway.
    """
    tool = self.catalog.get(name) if isinstance(name, str) else None
    if tool is None:
      shown = name[:60] if isinstance(name, str) else type(name).__name__
      return error("unknown_tool", f"no tool named {shown!r}; use search_tools to "
                   "find tools", name), None
    spec = self.spec(tool)
    err = validate(tool, arguments, spec)
    if err is not None:
      return err, None
    args = with_defaults(tool, arguments, spec)
    cj = canonical_json(args)
    return self._simulate(tool, args, cj, state), tool.name + cj


def state_key(state: dict[str, Any]) -> str:
  """A canonical string of an episode state (for gold-state comparison)."""
  return canonical_json(state["records"])


def lookup(obj: Any, path: str) -> Any:
  """Reads ``results[0].station_id`` style paths from a response."""
  cur = obj
  for part in path.replace("]", "").split("."):
    name, _, idx = part.partition("[")
    if name:
      if not isinstance(cur, dict) or name not in cur:
        return None
      cur = cur[name]
    if idx:
      if not isinstance(cur, list) or int(idx) >= len(cur):
        return None
      cur = cur[int(idx)]
  return cur
