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
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import math
from typing import Any

from toolenv.catalog import vocab
from toolenv.schema import Tool

_INT_TYPES = ("integer",)
MAX_ARG_CHARS = 2_000      # longer arguments are refused, not simulated
_RECORD_CACHE = 200_000    # memoised base records per executor
# One encoder object instead of json.dumps(..., options): dumps builds a new
# JSONEncoder on every call when options are given; the output is the same.
_CANONICAL = json.JSONEncoder(sort_keys=True, separators=(",", ":"), default=str,
                              ensure_ascii=False)
_blake2b = hashlib.blake2b
# How observations write a tool's JSON output (`ToolEnv`): the answerer's
# "json" answers echo a field exactly as the observation shows it.
OBS_JSON = json.JSONEncoder(ensure_ascii=False, separators=(", ", ": "), default=str).encode


def canonical_json(obj: Any) -> str:
  """Compact, key-sorted JSON (``str`` for what JSON cannot hold)."""
  try:
    return _CANONICAL.encode(obj)
  except (TypeError, ValueError, RecursionError):
    # Keys JSON cannot sort or hold (mixed int/str, tuples), cycles: the env
    # must answer such arguments with an error, not crash on them.
    return repr(obj)


def digest(*parts: Any) -> int:
  """A stable 64-bit integer hash of ``parts``."""
  h = _blake2b("\x1f".join(map(str, parts)).encode("utf-8", "replace"), digest_size=8)
  return int.from_bytes(h.digest(), "little")


class _Draw:
  """A tiny deterministic value source keyed by a string (no global RNG).

  Draw ``n`` is ``digest(*key, n)``. The hash of the key prefix is computed
  once and copied per draw (blake2b is a stream: same bytes, same digest),
  which is what makes record generation cheap.
  """

  def __init__(self, *key: Any):
    self._key = key
    self._n = 0
    prefix = ("\x1f".join(map(str, key)) + "\x1f") if key else ""
    self._h = _blake2b(prefix.encode("utf-8", "replace"), digest_size=8)

  def u(self) -> float:
    self._n += 1
    return _hash_at(self._h, self._n) / 2.0**64

  def int(self, lo: int, hi: int) -> int:
    return lo + int(self.u() * (hi - lo + 1))

  def choice(self, seq):
    return seq[min(len(seq) - 1, int(self.u() * len(seq)))]


def make_id(prefix: str, *key: Any) -> str:
  """An entity id such as ``sta-3f2a1c`` derived from ``key``."""
  return f"{prefix}-{digest(prefix, *key) % 16**6:06x}"


def _gen_scalar(sch: dict[str, Any], d: _Draw, field: str) -> Any:
  """One value for a JSON Schema leaf (uses the procedural ``x-gen`` hints)."""
  if "enum" in sch and sch["enum"]:
    return d.choice(list(sch["enum"]))
  gen = sch.get("x-gen")
  t = sch.get("type", "string")
  if gen == "city":
    return d.choice(vocab.CITIES)
  if gen == "country":
    return d.choice(vocab.COUNTRIES)
  if gen == "person":
    return f"{d.choice(vocab.FIRST)} {d.choice(vocab.LAST)}"
  if gen in ("word", "title"):
    w = d.choice(vocab.WORDS)
    return w.capitalize() + (f" {d.choice(vocab.WORDS)}" if gen == "title" else "")
  if gen == "code":
    return f"{d.choice(vocab.WORDS)[:3].upper()}{d.int(10, 99)}"
  if sch.get("format") == "date" or gen == "date":
    return f"2026-{d.int(1, 12):02d}-{d.int(1, 28):02d}"
  lo = sch.get("minimum", 0)
  hi = sch.get("maximum", 1000)
  if not isinstance(lo, (int, float)) or not isinstance(hi, (int, float)) or hi < lo:
    lo, hi = 0, 1000
  if t in _INT_TYPES:
    return d.int(int(math.ceil(lo)), int(math.floor(hi)))
  if t == "number":
    return round(lo + d.u() * (hi - lo), 2)
  if t == "boolean":
    return d.u() < 0.5
  if field.endswith("id"):
    return make_id(field[:3] or "id", *d._key)  # pylint: disable=protected-access
  return d.choice(vocab.WORDS)


_COUNTERS = tuple(str(i).encode() for i in range(256))


def _hash_at(h: Any, i: int) -> int:
  """``digest(*key, i)`` given ``h``, the blake2b state of the key's prefix."""
  c = h.copy()
  c.update(_COUNTERS[i] if 0 <= i < 256 else str(i).encode())
  return int.from_bytes(c.digest(), "little")


def _uniforms(h: Any, start: int, n: int) -> list[float]:
  """Draws ``start+1 .. start+n`` of the `_Draw` whose prefix hash is ``h``."""
  out = []
  for i in range(start + 1, start + n + 1):
    c = h.copy()
    c.update(_COUNTERS[i] if i < 256 else str(i).encode())
    out.append(int.from_bytes(c.digest(), "little") / 2.0**64)
  return out


def _pick(seq: Any, u: float) -> Any:
  """`_Draw.choice` on a given uniform."""
  return seq[min(len(seq) - 1, int(u * len(seq)))]


# Plan codes of `_scalar_plan` (what `_gen_scalar` does for a schema).
(_P_CHOICE, _P_PERSON, _P_WORD, _P_TITLE, _P_CODE, _P_DATE, _P_INT, _P_NUM, _P_BOOL,
 _P_FK, _P_ID) = range(11)
_PLAN_DRAWS = (1, 2, 1, 2, 2, 2, 1, 1, 1, 0, 0)


def _scalar_plan(sch: dict[str, Any], field: str) -> tuple[int, Any, Any]:
  """`_gen_scalar` compiled for one schema: ``(code, a, b)`` for `_plan_value`.

  Same branches in the same order, same arithmetic (tested against it). Plans
  are plain tuples, not closures: a catalog's worth of them adds nothing for
  the cyclic garbage collector to scan.
  """
  if "enum" in sch and sch["enum"]:
    return _P_CHOICE, tuple(sch["enum"]), None
  gen = sch.get("x-gen")
  t = sch.get("type", "string")
  if gen in ("city", "country"):
    return _P_CHOICE, vocab.CITIES if gen == "city" else vocab.COUNTRIES, None
  if gen == "person":
    return _P_PERSON, None, None
  if gen in ("word", "title"):
    return (_P_WORD if gen == "word" else _P_TITLE), None, None
  if gen == "code":
    return _P_CODE, None, None
  if sch.get("format") == "date" or gen == "date":
    return _P_DATE, None, None
  lo = sch.get("minimum", 0)
  hi = sch.get("maximum", 1000)
  if not isinstance(lo, (int, float)) or not isinstance(hi, (int, float)) or hi < lo:
    lo, hi = 0, 1000
  if t in _INT_TYPES:
    ilo = int(math.ceil(lo))
    return _P_INT, ilo, int(math.floor(hi)) - ilo + 1
  if t == "number":
    return _P_NUM, lo, hi - lo
  if t == "boolean":
    return _P_BOOL, None, None
  if field.endswith("id"):
    return _P_FK, field[:3] or "id", None
  return _P_CHOICE, vocab.WORDS, None


def _plan_value(code: int, a: Any, b: Any, us: list[float], i: int, key: tuple) -> Any:
  """The value of plan ``(code, a, b)`` from draws ``us[i:]`` (key: the `_Draw` key)."""
  if code == _P_CHOICE:
    return a[min(len(a) - 1, int(us[i] * len(a)))]
  if code == _P_INT:
    return a + int(us[i] * b)
  if code == _P_NUM:
    return round(a + us[i] * b, 2)
  if code == _P_TITLE:
    return _pick(vocab.WORDS, us[i]).capitalize() + f" {_pick(vocab.WORDS, us[i + 1])}"
  if code == _P_DATE:
    return f"2026-{1 + int(us[i] * 12):02d}-{1 + int(us[i + 1] * 28):02d}"
  if code == _P_BOOL:
    return us[i] < 0.5
  if code == _P_PERSON:
    return f"{_pick(vocab.FIRST, us[i])} {_pick(vocab.LAST, us[i + 1])}"
  if code == _P_WORD:
    return _pick(vocab.WORDS, us[i]).capitalize()
  if code == _P_CODE:
    return f"{_pick(vocab.WORDS, us[i])[:3].upper()}{10 + int(us[i + 1] * 90)}"
  if code == _P_FK:
    return make_id(a, *key)
  return key[2]   # _P_ID: the record's own id


def _record_plan(schema: dict[str, Any], id_field: str) -> tuple[int, tuple]:
  """An entity's record schema compiled: ``(draws, ((field, offset, code, a, b), ...))``.

  Each plan's draw count depends only on the schema, never on the values
  drawn, so a record's draws can all be made first, in one loop.
  """
  fields, n = [], 0
  for k, v in schema.items():
    code, a, b = (_P_ID, None, None) if k == id_field else _scalar_plan(v, k)
    fields.append((k, n, code, a, b))
    n += _PLAN_DRAWS[code]
  return n, tuple(fields)


def gen_from_schema(sch: Any, d: _Draw, field: str = "", depth: int = 0) -> Any:
  """A value that conforms to ``sch`` (objects and arrays recursively)."""
  if not isinstance(sch, dict) or depth > 6:
    return None
  t = sch.get("type")
  if t == "object" or "properties" in sch:
    return {k: gen_from_schema(v, d, k, depth + 1)
            for k, v in sorted(sch.get("properties", {}).items())}
  if t == "array":
    n = min(int(sch.get("maxItems", 3) or 3), 3)
    # Each item draws from its own key: items differ, ids included (an id
    # is a function of its draw's key, see `_gen_scalar`), so a fanout over
    # a list's ids gets k different records, not one id k times.
    return [gen_from_schema(sch.get("items", {}), _Draw(*d._key, "[]", i), field,  # pylint: disable=protected-access
                            depth + 1)
            for i in range(n)]
  return _gen_scalar(sch, d, field)


def _type_ok(value: Any, sch: dict[str, Any]) -> bool:
  t = sch.get("type")
  if t == "string":
    return isinstance(value, str)
  if t == "integer":
    return isinstance(value, int) and not isinstance(value, bool)
  if t == "number":
    return isinstance(value, (int, float)) and not isinstance(value, bool) and (
        math.isfinite(value))
  if t == "boolean":
    return isinstance(value, bool)
  if t == "array":
    return isinstance(value, list)
  if t == "object":
    return isinstance(value, dict)
  return True


class ErrorResponse(dict):
  """A structured error: a plain dict (same JSON) that says it is an error.

  The env and the task generator test `is_error`, not ``"error" in out``: a
  real API's response may be a bare scalar or have a top-level ``error``
  field of its own, and neither is a failed call.
  """

  __slots__ = ()


def is_error(out: Any) -> bool:
  """Whether ``out`` is an error made by `error` (not a simulated response)."""
  return isinstance(out, ErrorResponse)


def error(kind: str, message: str, tool: Any = None) -> dict[str, Any]:
  """A structured error response (an `ErrorResponse`)."""
  out = ErrorResponse(error=kind, message=message)
  if isinstance(tool, str):
    out["tool"] = tool[:80]
  return out


class ToolSpec:
  """What validation needs of a tool, read once (``Tool.properties`` copies a dict per access)."""

  __slots__ = ("tool", "props", "required", "defaults", "param_list")

  def __init__(self, tool: Tool):
    self.tool = tool
    # The tool's own dict, not a copy: read only.
    self.props = tool.parameters.get("properties", {})
    self.required = tuple(tool.required)
    self.defaults = tuple((k, sch["default"]) for k, sch in self.props.items()
                          if isinstance(sch, dict) and "default" in sch)
    self.param_list = ", ".join(self.props) or "none"


def validate(tool: Tool, arguments: Any, spec: ToolSpec | None = None) -> dict[str, Any] | None:
  """The error of calling ``tool`` with ``arguments``, or None if valid."""
  if not isinstance(arguments, dict):
    return error("bad_arguments", "arguments must be a JSON object, got "
                 f"{type(arguments).__name__}", tool.name)
  spec = spec or ToolSpec(tool)
  props = spec.props
  for k in arguments:
    if k not in props:
      return error("unknown_argument", f"{tool.name} has no parameter {str(k)[:40]!r}; "
                   f"parameters: {spec.param_list}", tool.name)
  for k in spec.required:
    if k not in arguments:
      return error("missing_argument", f"missing required argument {k!r}", tool.name)
  for k, v in arguments.items():
    sch = props[k] if isinstance(props[k], dict) else {}
    if not _type_ok(v, sch):
      return error("wrong_type", f"argument {k!r} must be {sch.get('type')}, got "
                   f"{type(v).__name__}", tool.name)
    if "enum" in sch and v not in sch["enum"]:
      return error("bad_enum", f"argument {k!r} must be one of {sch['enum']}", tool.name)
    if isinstance(v, (int, float)) and not isinstance(v, bool):
      lo, hi = sch.get("minimum"), sch.get("maximum")
      if (isinstance(lo, (int, float)) and v < lo) or (
          isinstance(hi, (int, float)) and v > hi):
        return error("out_of_range", f"argument {k!r}={v} is outside "
                     f"[{lo}, {hi}]", tool.name)
    size = len(v) if isinstance(v, str) else (
        0 if isinstance(v, (int, float)) else len(canonical_json(v)))
    if size > MAX_ARG_CHARS:
      return error("too_long", f"argument {k!r} is longer than {MAX_ARG_CHARS} "
                   "characters", tool.name)
  return None


def with_defaults(tool: Tool, arguments: dict[str, Any],
                  spec: ToolSpec | None = None) -> dict[str, Any]:
  """``arguments`` plus the declared defaults of the omitted parameters."""
  out = dict(arguments)
  for k, default in (spec or ToolSpec(tool)).defaults:
    if k not in out:
      out[k] = default
  return out


def canonical_call(tool: Tool, arguments: dict[str, Any]) -> str:
  """The key under which two calls count as the same (defaults filled)."""
  return tool.name + canonical_json(with_defaults(tool, arguments))


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
      us = _uniforms(_Draw(*key)._h, 0, draws)  # pylint: disable=protected-access
      base = {k: _plan_value(code, a, b, us, off, key) for k, off, code, a, b in plan}
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
    """The `_record_plan` of ``tool``'s entity (memoised)."""
    cache = self._plan_cache
    key = (tool.provider, tool.meta["entity"])
    plan = cache.get(key)
    if plan is None:
      plan = cache[key] = _record_plan(self._record_schema(tool), tool.meta["id_field"])
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
      return gen_from_schema(tool.response, _Draw(self.seed, tool.name + cj))
    if kind == "convert":
      d = _Draw(self.seed, tool.name, args["from_unit"], args["to_unit"])
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
      h = _Draw(prefix, self.seed, tool.name, canonical_json(
          {k: v for k, v in args.items() if k != "limit"}))._h  # pylint: disable=protected-access
      ids = [f"{prefix}-{_hash_at(h, i) % 16**6:06x}" for i in range(n)]
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
      d = _Draw(self.seed, tag, rid, args["period"])
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
    return gen_from_schema(tool.response, _Draw(self.seed, tool.name + cj))

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
