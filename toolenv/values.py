"""Deterministic values: canonical JSON, stable hashes, values drawn from schemas.

Everything the simulator answers is a pure function of a key: `digest` hashes
it, `Draw` turns it into a stream of uniforms (no global RNG), `gen_scalar` and
`gen_from_schema` turn draws into values a JSON Schema accepts. The record
plans (`record_plan`, `plan_value`) are `gen_scalar` compiled once per schema,
for the executor's hot path; they give the same values from the same draws.
"""

from __future__ import annotations

import hashlib
import json
import math
from typing import Any

from toolenv.catalog import vocab

_INT_TYPES = ("integer",)
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


class Draw:
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
    return hash_at(self._h, self._n) / 2.0**64

  def int(self, lo: int, hi: int) -> int:
    return lo + int(self.u() * (hi - lo + 1))

  def choice(self, seq):
    return seq[min(len(seq) - 1, int(self.u() * len(seq)))]

  @property
  def key(self) -> tuple:
    """The key the draws are made from."""
    return self._key

  @property
  def prefix(self) -> Any:
    """The blake2b state of the key's prefix (for `hash_at` and `uniforms`)."""
    return self._h


def make_id(prefix: str, *key: Any) -> str:
  """An entity id such as ``sta-3f2a1c`` derived from ``key``."""
  return f"{prefix}-{digest(prefix, *key) % 16**6:06x}"


def gen_scalar(sch: dict[str, Any], d: Draw, field: str) -> Any:
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
    return make_id(field[:3] or "id", *d.key)
  return d.choice(vocab.WORDS)


_COUNTERS = tuple(str(i).encode() for i in range(256))


def hash_at(h: Any, i: int) -> int:
  """``digest(*key, i)`` given ``h``, the blake2b state of the key's prefix."""
  c = h.copy()
  c.update(_COUNTERS[i] if 0 <= i < 256 else str(i).encode())
  return int.from_bytes(c.digest(), "little")


def uniforms(h: Any, start: int, n: int) -> list[float]:
  """Draws ``start+1 .. start+n`` of the `Draw` whose prefix hash is ``h``."""
  out = []
  for i in range(start + 1, start + n + 1):
    c = h.copy()
    c.update(_COUNTERS[i] if i < 256 else str(i).encode())
    out.append(int.from_bytes(c.digest(), "little") / 2.0**64)
  return out


def _pick(seq: Any, u: float) -> Any:
  """`Draw.choice` on a given uniform."""
  return seq[min(len(seq) - 1, int(u * len(seq)))]


# Plan codes of `_scalar_plan` (what `gen_scalar` does for a schema).
(_P_CHOICE, _P_PERSON, _P_WORD, _P_TITLE, _P_CODE, _P_DATE, _P_INT, _P_NUM, _P_BOOL,
 _P_FK, _P_ID) = range(11)
_PLAN_DRAWS = (1, 2, 1, 2, 2, 2, 1, 1, 1, 0, 0)


def _scalar_plan(sch: dict[str, Any], field: str) -> tuple[int, Any, Any]:
  """`gen_scalar` compiled for one schema: ``(code, a, b)`` for `plan_value`.

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


def plan_value(code: int, a: Any, b: Any, us: list[float], i: int, key: tuple) -> Any:
  """The value of plan ``(code, a, b)`` from draws ``us[i:]`` (key: the `Draw` key)."""
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


def record_plan(schema: dict[str, Any], id_field: str) -> tuple[int, tuple]:
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


def gen_from_schema(sch: Any, d: Draw, field: str = "", depth: int = 0) -> Any:
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
    # is a function of its draw's key, see `gen_scalar`), so a fanout over
    # a list's ids gets k different records, not one id k times.
    return [gen_from_schema(sch.get("items", {}), Draw(*d.key, "[]", i), field,
                            depth + 1)
            for i in range(n)]
  return gen_scalar(sch, d, field)
