"""OpenAPI specs -> ToolEnv `Tool`s, one per operation.

Each operation becomes one `Tool`:

* name: ``<provider>_<operationId>`` (or ``<provider>_<method>_<path>`` when the
  operationId is missing), snake_cased, made unique by a numeric suffix;
* parameters: path/query/header(-non-auth)/formData/body parameters with every
  ``$ref`` resolved, ``allOf`` merged, cycles cut, nesting depth bounded so that
  50,011 tools load in well under a second's worth of JSON;
* response: the JSON schema of the first 2xx response;
* effect: ``read`` for GET/HEAD/OPTIONS, ``write`` otherwise;
* meta: ``method``, ``path``, ``spec``, ``param_in`` and the value-flow keys
  of `toolenv.catalog.valueflow` (same as the procedural catalog): ``kind``
  (list/search/get/create/update/delete/other), ``entity``, ``id_field``,
  ``produces`` {response path: tag}, ``consumes`` {param: tag}, with tags
  ``"<provider>/<resource>_id"`` (``GET /pets`` produces ``[].id`` and
  ``GET /pets/{petId}`` consumes ``petId``, both ``petstore/pet_id``).
"""

from __future__ import annotations

import dataclasses
import os
import re
from typing import Any

from toolenv.catalog.openapi_source import SpecError, iter_spec_sources, load_spec_text
from toolenv.catalog.valueflow import value_flow
from toolenv.schema import Tool

_METHODS = ("get", "put", "post", "delete", "patch", "head", "options")
_READ_METHODS = ("get", "head", "options")
# Bounds that keep one tool's schemas small; real specs nest 10+ levels deep.
_MAX_DEPTH = 3
_MAX_PROPS = 16
_MAX_PARAMS = 24
_MAX_DESC = 300
_MAX_NAME = 64
# Headers that carry transport or credentials, not task content.
_SKIP_HEADERS = re.compile(
    r"^(authorization|accept|accept-.*|content-.*|user-agent|x-api-key|"
    r"api[-_]?key|x-.*(token|key|auth|signature|date|request-id).*|"
    r"cookie|if-.*|host|x-amz-.*|x-ms-.*|x-goog-.*)$", re.I)
_JSON_MEDIA = re.compile(r"json", re.I)
# Google's discovery-converted specs repeat these transport knobs on every
# operation; they say nothing about the task and would dominate the index.
_SKIP_QUERY = frozenset((
    "$.xgafv", "access_token", "alt", "callback", "fields", "key",
    "oauth_token", "prettyPrint", "quotaUser", "upload_protocol", "uploadType"))


@dataclasses.dataclass
class ParseStats:
  """Counters of one parse run, printed in the build summary."""
  specs: int = 0
  corrupt: int = 0
  operations: int = 0
  no_description: int = 0
  corrupt_files: list[str] = dataclasses.field(default_factory=list)



# ---------------------------------------------------------------- schemas

class _Resolver:
  """Resolves local ``$ref``s into compact JSON Schemas of our supported types."""

  def __init__(self, spec: dict[str, Any]):
    self.spec = spec

  def deref(self, node: Any, seen: tuple[str, ...] = ()) -> tuple[Any, tuple]:
    """Follows a ``$ref`` chain; returns (target, refs seen). Cycles -> {}."""
    hops = 0
    while isinstance(node, dict) and isinstance(node.get("$ref"), str):
      ref = node["$ref"]
      if ref in seen or hops > 32 or not ref.startswith("#/"):
        return {}, seen
      seen = seen + (ref,)
      target: Any = self.spec
      for part in ref[2:].split("/"):
        part = part.replace("~1", "/").replace("~0", "~")
        if not isinstance(target, dict) or part not in target:
          return {}, seen
        target = target[part]
      node = target
      hops += 1
    return node, seen

  def schema(self, node: Any, depth: int = 0,
             seen: tuple[str, ...] = ()) -> dict[str, Any]:
    """Returns a compact schema: type, description, enum, items, properties."""
    node, seen = self.deref(node, seen)
    if not isinstance(node, dict):
      return {"type": "string"}
    for key in ("allOf", "oneOf", "anyOf"):
      if isinstance(node.get(key), list) and node[key]:
        parts = node[key] if key == "allOf" else node[key][:1]
        merged: dict[str, Any] = {k: v for k, v in node.items() if k != key}
        props: dict[str, Any] = dict(merged.get("properties") or {})
        required = list(merged.get("required") or [])
        for part in parts:
          # Recursing flattens nested allOf and bounds the depth; a part
          # already on the ref stack (a cycle) comes back as a bare string.
          sub = self.schema(part, depth, seen)
          props.update(sub.get("properties") or {})
          required += [r for r in sub.get("required") or [] if r not in required]
          for k in ("type", "description", "enum", "items"):
            if k in sub and k not in merged:
              merged[k] = sub[k]
        if props:
          merged["properties"] = props
          merged.setdefault("type", "object")
        merged["required"] = required
        node = merged
        break
    out: dict[str, Any] = {"type": _json_type(node)}
    desc = node.get("description") or node.get("title")
    if isinstance(desc, str) and desc.strip():
      out["description"] = clean_text(desc, 160)
    enum = node.get("enum")
    if isinstance(enum, list) and enum and out["type"] in ("string", "integer"):
      vals = [v for v in enum if isinstance(v, (str, int))
              and not isinstance(v, bool)][:20]
      if out["type"] == "integer":
        vals = [v for v in vals if isinstance(v, int)]
      else:
        vals = [str(v) for v in vals]
      if vals:
        out["enum"] = vals
    if out["type"] == "array":
      out["items"] = (self.schema(node.get("items"), depth + 1, seen)
                      if depth < _MAX_DEPTH else {"type": "string"})
    elif out["type"] == "object":
      props = node.get("properties")
      out["properties"] = {}
      if isinstance(props, dict) and depth < _MAX_DEPTH:
        for pname in list(props)[:_MAX_PROPS]:
          out["properties"][safe_name(pname)] = self.schema(
              props[pname], depth + 1, seen)
      req = node.get("required")
      out["required"] = [safe_name(r) for r in req if isinstance(r, str)
                         and safe_name(r) in out["properties"]] if isinstance(
                             req, list) else []
    return out


def _json_type(node: dict[str, Any]) -> str:
  t = node.get("type")
  if isinstance(t, list):  # OpenAPI 3.1: ["string", "null"].
    t = next((x for x in t if x != "null"), "string")
  if t in ("string", "integer", "number", "boolean", "array", "object"):
    return t
  if "properties" in node or "additionalProperties" in node:
    return "object"
  if "items" in node:
    return "array"
  return "string"


def clean_text(text: str, limit: int = _MAX_DESC) -> str:
  """Strips HTML tags, markdown links and whitespace runs; truncates."""
  text = re.sub(r"<[^>]+>", " ", text)
  text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", text)
  text = re.sub(r"[`*#]+", "", text)
  text = re.sub(r"\s+", " ", text).strip()
  if len(text) > limit:
    cut = text[:limit].rsplit(" ", 1)[0]
    text = cut.rstrip(",.;:") + "..."
  return text


def safe_name(name: str) -> str:
  """An identifier-safe version of a parameter or field name."""
  s = re.sub(r"[^0-9A-Za-z_]+", "_", str(name)).strip("_")
  if not s:
    s = "param"
  if s[0].isdigit():
    s = "p_" + s
  return s


def snake(text: str) -> str:
  """``getPetById`` / ``pets.{id}`` -> ``get_pet_by_id`` / ``pets_id``."""
  s = re.sub(r"([a-z0-9])([A-Z])", r"\1_\2", str(text))
  s = re.sub(r"([A-Z]+)([A-Z][a-z])", r"\1_\2", s)
  s = re.sub(r"[^0-9A-Za-z]+", "_", s).strip("_").lower()
  return re.sub(r"_+", "_", s)


# ---------------------------------------------------------------- operations

def _provider_of(spec: dict[str, Any], name: str) -> tuple[str, str]:
  info = spec.get("info") if isinstance(spec.get("info"), dict) else {}
  provider = info.get("x-providerName")
  service = info.get("x-serviceName") or ""
  if not isinstance(provider, str) or not provider:
    parts = name.replace("\\", "/").split("/")
    # npm: package/api/<provider>[/<service>].json; GitHub: APIs/<p>[/<s>]/<v>/x.
    anchor = next((i for i, p in enumerate(parts) if p in ("api", "APIs")), -1)
    rest = parts[anchor + 1:] if anchor >= 0 else parts[-1:]
    provider = os.path.splitext(rest[0])[0] if rest else "unknown"
  return provider, service if isinstance(service, str) else ""


def _category_of(spec: dict[str, Any]) -> str:
  info = spec.get("info") if isinstance(spec.get("info"), dict) else {}
  cats = info.get("x-apisguru-categories")
  if isinstance(cats, str):
    cats = [cats]
  if isinstance(cats, list) and cats and all(isinstance(c, str) for c in cats):
    # Some specs spell one category as a list of letters (threatjammer.com:
    # ["s", "e", "c", ...]): join those back instead of taking "s".
    if all(len(c) == 1 for c in cats):
      return "".join(cats)
    return next((c for c in cats if len(c) > 1), "uncategorized")
  return "uncategorized"


def _kind(method: str, path: str, response: dict[str, Any]) -> str:
  last = path.rstrip("/").split("/")[-1] if path.strip("/") else ""
  ends_with_param = last.startswith("{")
  if method == "get":
    if ends_with_param:
      return "get"
    if response.get("type") == "array" or any(
        v.get("type") == "array" for v in response.get("properties", {}).values()):
      return "list"
    return "get"
  return {"post": "create" if not ends_with_param else "action",
          "put": "update", "patch": "update", "delete": "delete"}.get(
              method, "action")


def _resource(path: str) -> str:
  """The collection a path is about: ``/pets/{petId}/toys`` -> ``pets/toys``."""
  segs = [s for s in path.strip("/").split("/") if s and not s.startswith("{")]
  return "/".join(segs[-2:]) if segs else "/"


def _body_params(res: _Resolver, op: dict[str, Any]
                 ) -> tuple[dict[str, Any], list[str], str]:
  """OpenAPI 3 requestBody -> (properties, required, media type)."""
  body, _ = res.deref(op.get("requestBody"))
  if not isinstance(body, dict) or not isinstance(body.get("content"), dict):
    return {}, [], ""
  content = body["content"]
  media = next((m for m in content if _JSON_MEDIA.search(m)), None)
  media = media or next((m for m in content if "form" in m), None)
  media = media or next(iter(content), "")
  entry = content.get(media) if isinstance(content.get(media), dict) else {}
  schema = res.schema(entry.get("schema", {"type": "string"}), 1)
  if schema.get("type") == "object" and schema.get("properties") and (
      _JSON_MEDIA.search(media) or "form" in media):
    return (schema["properties"], schema.get("required", []), media)
  # Non-JSON bodies (octet-stream, text/plain, xml) become one string 'body'.
  desc = clean_text(body.get("description") or f"Request body ({media}).", 160)
  body_schema = {"type": "string", "description": desc} if not (
      _JSON_MEDIA.search(media)) else schema | {"description": desc}
  return {"body": body_schema}, ["body"] if body.get("required") else [], media


def _strip_desc(schema: dict[str, Any]) -> dict[str, Any]:
  """Drops descriptions: the executor only needs shapes, and response field
  descriptions were a third of the cache (and of its load time)."""
  out = {k: v for k, v in schema.items() if k != "description"}
  if "items" in out:
    out["items"] = _strip_desc(out["items"])
  if "properties" in out:
    out["properties"] = {k: _strip_desc(v) for k, v in out["properties"].items()}
  return out


def _response_schema(res: _Resolver, op: dict[str, Any]) -> dict[str, Any]:
  return _strip_desc(_response_schema_full(res, op))


def _response_schema_full(res: _Resolver, op: dict[str, Any]
                          ) -> dict[str, Any]:
  responses = op.get("responses")
  if not isinstance(responses, dict):
    return {"type": "object", "properties": {}, "required": []}
  codes = sorted((str(c) for c in responses if str(c).startswith("2")))
  for code in codes + (["default"] if "default" in responses else []):
    resp, _ = res.deref(responses[code])
    if not isinstance(resp, dict):
      continue
    if "schema" in resp:  # Swagger 2.0.
      return res.schema(resp["schema"])
    content = resp.get("content")
    if isinstance(content, dict):
      media = next((m for m in content if _JSON_MEDIA.search(m)), None)
      if media and isinstance(content[media], dict) and "schema" in content[media]:
        return res.schema(content[media]["schema"])
  return {"type": "object", "properties": {}, "required": []}


def _op_tool(res: _Resolver, provider: str, service: str, category: str,
             spec_name: str, path: str, method: str, op: dict[str, Any],
             path_params: list[Any]) -> Tool | None:
  desc = op.get("summary") or op.get("description") or ""
  desc = clean_text(desc) if isinstance(desc, str) else ""
  if len(desc.split()) < 2:
    return None
  swagger2 = "swagger" in res.spec
  merged: dict[tuple[str, str], dict[str, Any]] = {}
  for p in list(path_params) + list(op.get("parameters") or []):
    p, _ = res.deref(p)
    if isinstance(p, dict) and isinstance(p.get("name"), str):
      merged[(p["name"], p.get("in", ""))] = p  # Operation level overrides.
  props: dict[str, Any] = {}
  required: list[str] = []
  in_of: dict[str, str] = {}
  media = ""
  for (pname, where), p in merged.items():
    if where == "cookie" or (where == "header" and _SKIP_HEADERS.match(pname)
                             ) or (where == "query" and pname in _SKIP_QUERY):
      continue
    if swagger2 and where == "body":
      sch = res.schema(p.get("schema", {}), 1)
      if sch.get("type") == "object" and sch.get("properties"):
        for k, v in sch["properties"].items():
          props.setdefault(k, v)
          in_of.setdefault(k, "body")
        required += [r for r in sch.get("required", []) if r not in required]
        continue
      sch = sch | {"description": clean_text(p.get("description") or "Body.")}
      key = "body"
    else:
      sch = res.schema(p.get("schema", p), 1)
      if p.get("description") and isinstance(p["description"], str):
        sch["description"] = clean_text(p["description"], 160)
      key = safe_name(pname)
    if key in props:
      continue
    props[key] = sch
    in_of[key] = "formData" if where == "formData" else where
    if p.get("required") or where == "path":
      required.append(key)
  bprops, breq, media = _body_params(res, op)
  for k, v in bprops.items():
    if k not in props:
      props[k] = v
      in_of[k] = "body"
      if k in breq:
        required.append(k)
  if len(props) > _MAX_PARAMS:  # Keep all required ones, then the first others.
    keep = required + [k for k in props if k not in required]
    props = {k: props[k] for k in keep[:_MAX_PARAMS]}
    required = [r for r in required if r in props]
  response = _response_schema(res, op)
  op_id = op.get("operationId")
  stem = snake(op_id) if isinstance(op_id, str) and snake(op_id) else snake(
      f"{method} {path.replace('{', 'by ').replace('}', '')}")
  name = f"{snake(provider.split('.')[0])}_{stem}"[:_MAX_NAME].rstrip("_")
  kind = _kind(method, path, response)
  flow = value_flow(provider, method, path, op_id if isinstance(op_id, str)
                    else "", kind, props, in_of, response)
  return Tool(
      name=name, category=snake(category) or "uncategorized",
      provider=provider, description=desc,
      parameters={"type": "object", "properties": props,
                  "required": list(dict.fromkeys(required))},
      response=response,
      effect="read" if method in _READ_METHODS else "write",
      source="openapi",
      meta={"method": method.upper(), "path": path, "kind": kind,
            "service": service, "spec": spec_name,
            "resource": _resource(path),
            "path_params": [k for k, w in in_of.items() if w == "path"],
            "param_in": in_of, "body_media": media, **flow})


def tools_from_spec(spec: dict[str, Any], spec_name: str = "<spec>",
                    stats: ParseStats | None = None) -> list[Tool]:
  """All operations of one parsed spec as `Tool`s (names not yet unique)."""
  provider, service = _provider_of(spec, spec_name)
  category = _category_of(spec)
  res = _Resolver(spec)
  tools = []
  for path in spec["paths"]:
    item, _ = res.deref(spec["paths"][path])
    if not isinstance(item, dict):
      continue
    path_params = item.get("parameters") or []
    if not isinstance(path_params, list):
      path_params = []
    for method in _METHODS:
      op = item.get(method)
      if not isinstance(op, dict):
        continue
      if stats is not None:
        stats.operations += 1
      tool = _op_tool(res, provider, service, category, spec_name, str(path),
                      method, op, path_params)
      if tool is None:
        if stats is not None:
          stats.no_description += 1
        continue
      tools.append(tool)
  return tools


def parse_source(source: str, stats: ParseStats | None = None) -> list[Tool]:
  """Parses every spec of a source; corrupt specs are skipped and counted."""
  stats = stats if stats is not None else ParseStats()
  tools: list[Tool] = []
  for name, raw in iter_spec_sources(source):
    try:
      spec = load_spec_text(raw, name)
      tools.extend(tools_from_spec(spec, name, stats))
      stats.specs += 1
    except (SpecError, RecursionError, TypeError, AttributeError,
            KeyError) as e:
      stats.corrupt += 1
      stats.corrupt_files.append(f"{name}: {str(e)[:120]}")
  return unique_names(tools)


def unique_names(tools: list[Tool]) -> list[Tool]:
  """Makes names unique with ``_2``, ``_3``... in input order (stable)."""
  used: set[str] = set()
  out = []
  for t in tools:
    name, i = t.name, 2
    while name in used:
      suffix = f"_{i}"
      name = t.name[:_MAX_NAME - len(suffix)] + suffix
      i += 1
    used.add(name)
    out.append(t if name == t.name else dataclasses.replace(t, name=name))
  return out

