"""Value-flow hints for real API operations (OpenAPI, ToolBench).

The task generator chains tools by value flow: a field one tool returns feeds
a parameter of another tool of the same API. The procedural catalog records
that in ``Tool.meta``; this module derives the same keys for real operations
from their path, parameters and response schema:

    meta = {"kind": "get", "entity": "pet", "id_field": "petId",
            "produces": {"items[].id": "petstore/pet_id"},
            "consumes": {"petId": "petstore/pet_id"}}

Tags are ``"<provider>/<resource>_id"``; the resource of an id is found by
name (``petId``, ``pet_id``, ``pet-id`` -> ``pet``) or, for a bare ``id``, by
the collection around it (``/pets/{id}`` -> ``pet``; an ``id`` field of the
items of ``GET /pets`` -> ``pet``). Plural and singular meet through
`singular`. Kinds: list, search, get, create, update, delete, other.
"""

from __future__ import annotations

import re
from typing import Any

# ``petId``, ``pet_id``, ``pet-id``, ``PetID``; not ``valid``, ``paid``.
_ID_NAME = re.compile(
    r"^(?P<res>[A-Za-z][A-Za-z0-9]*?)(?:[_\-.](?:id|Id|ID)|(?<=[a-z0-9])(?:Id|ID))$")
_SEARCH = re.compile(r"^(q|query|search|keyword|keywords|term|text)$", re.I)
KINDS = ("list", "search", "get", "create", "update", "delete", "other")


def singular(word: str) -> str:
  """``pets`` -> ``pet``, ``categories`` -> ``category``, ``boxes`` -> ``box``."""
  w = word.lower()
  if len(w) > 4 and w.endswith("ies"):
    return w[:-3] + "y"
  if len(w) > 4 and w.endswith(("ses", "xes", "ches", "shes")):
    return w[:-2]
  if len(w) > 3 and w.endswith("s") and not w.endswith("ss"):
    return w[:-1]
  return w


def _norm(word: str) -> str:
  s = re.sub(r"([a-z0-9])([A-Z])", r"\1_\2", word)
  return singular(re.sub(r"[^0-9a-zA-Z]+", "_", s).strip("_").lower())


def id_resource(name: str) -> str | None:
  """The resource an id-like name refers to (``petId`` -> ``pet``), else None.

  A bare ``id`` returns ``""`` (the caller supplies the resource from context).
  """
  if name.lower() in ("id", "uuid", "_id"):
    return ""
  m = _ID_NAME.match(name)
  if not m or len(m.group("res")) < 2:
    return None
  return _norm(m.group("res"))


def _segments(path: str) -> list[str]:
  return [s for s in path.strip("/").split("/") if s]


def path_entity(path: str) -> str:
  """The resource a path is about: the last literal segment, singular."""
  lits = [s for s in _segments(path) if not s.startswith("{")]
  for s in reversed(lits):
    if re.fullmatch(r"v\d+(\.\d+)*|api", s, re.I) is None:
      return _norm(s)
  return ""


def _param_resource(path: str, param: str) -> str:
  """For ``/pets/{id}``, the literal segment before ``{id}``."""
  segs = _segments(path)
  for i, s in enumerate(segs):
    if s.strip("{}") == param and i > 0 and not segs[i - 1].startswith("{"):
      return _norm(segs[i - 1])
  return ""


def op_kind(method: str, path: str, op_id: str, params: dict[str, Any],
            response: dict[str, Any]) -> str:
  """list / search / get / create / update / delete / other."""
  method = method.lower()
  last = _segments(path)[-1] if _segments(path) else ""
  ends_param = last.startswith("{")
  words = set(re.split(r"[_\W]+", re.sub(r"([a-z])([A-Z])", r"\1_\2", op_id)
                       .lower())) | {last.lower()}
  if method == "get":
    if "search" in words or any(_SEARCH.match(p) for p in params):
      return "search"
    if ends_param:
      return "get"
    if response.get("type") == "array" or any(
        v.get("type") == "array" for v in response.get("properties", {}).values()):
      return "list"
    return "get"
  if method == "delete":
    return "delete"
  if method in ("put", "patch"):
    return "update"
  if method == "post":
    if "search" in words or "query" in words:
      return "search"
    return "create" if not ends_param else "other"
  return "other"


def _id_fields(obj: dict[str, Any], entity: str) -> dict[str, str]:
  """Id-like fields of an object schema -> resource (bare ``id`` -> entity)."""
  out = {}
  for f in (obj.get("properties") or {}):
    res = id_resource(f)
    if res is None:
      continue
    res = res or entity
    if res and (obj["properties"][f].get("type") in ("string", "integer")):
      out[f] = res
  return out


def value_flow(provider: str, method: str, path: str, op_id: str, kind: str,
               params: dict[str, Any], param_in: dict[str, str],
               response: dict[str, Any]) -> dict[str, Any]:
  """The meta keys kind, entity, id_field, produces, consumes of one operation."""
  kind = op_kind(method, path, op_id, params, response)
  entity = path_entity(path)
  tag = lambda res: f"{provider}/{res}_id"
  consumes: dict[str, str] = {}
  for p, where in param_in.items():
    if where not in ("path", "query") or p not in params:
      continue
    if params[p].get("type") not in ("string", "integer"):
      continue
    res = id_resource(p)
    if res is None:
      continue
    res = res or _param_resource(path, p) or (entity if where == "path" else "")
    if res:
      consumes[p] = tag(res)
  produces: dict[str, str] = {}
  if response.get("type") == "array" and isinstance(response.get("items"), dict):
    for f, res in _id_fields(response["items"], entity).items():
      produces[f"[].{f}"] = tag(res)
  for key, sub in (response.get("properties") or {}).items():
    if sub.get("type") == "array" and isinstance(sub.get("items"), dict):
      for f, res in _id_fields(sub["items"], singular(key) if key not in (
          "items", "data", "results", "value", "values", "records") else entity
                               ).items():
        produces[f"{key}[].{f}"] = tag(res)
  for f, res in _id_fields(response, entity).items():
    produces[f] = tag(res)
  id_field = next(iter(consumes), None) or next(
      (k.rsplit(".", 1)[-1] for k in produces), None)
  return {"kind": kind, "entity": entity, "id_field": id_field or "",
          "produces": produces, "consumes": consumes}


def count_chains(tools) -> dict[str, int]:
  """Producer -> consumer pairs (distinct tools, same tag) in ``tools``.

  Returns ``{"chains": pairs, "tags": tags with both a producer and a
  consumer, "producers": ..., "consumers": ...}``.
  """
  prod: dict[str, int] = {}
  cons: dict[str, int] = {}
  both: dict[str, int] = {}  # Tools that produce and consume the same tag.
  for t in tools:
    meta = t.meta if hasattr(t, "meta") else t
    ptags = set(meta.get("produces", {}).values())
    ctags = set(meta.get("consumes", {}).values())
    for g in ptags:
      prod[g] = prod.get(g, 0) + 1
    for g in ctags:
      cons[g] = cons.get(g, 0) + 1
    for g in ptags & ctags:
      both[g] = both.get(g, 0) + 1
  tags = set(prod) & set(cons)
  pairs = sum(prod[g] * cons[g] - both.get(g, 0) for g in tags)
  return {"chains": pairs, "tags": len(tags),
          "producers": sum(1 for t in tools if (t.meta if hasattr(t, "meta")
                                                else t).get("produces")),
          "consumers": sum(1 for t in tools if (t.meta if hasattr(t, "meta")
                                                else t).get("consumes"))}
