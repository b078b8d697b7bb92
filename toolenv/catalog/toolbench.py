"""ToolBench (RapidAPI) tool JSON and StableToolBench query files.

For a user who has downloaded that data (it is not fetched here). Tool files
live under ``data/toolenv/tools/<Category>/<tool>.json``::

    {"tool_name": "Weather API", "tool_description": "...",
     "api_list": [{"name": "Current weather", "description": "...",
                   "method": "GET",
                   "required_parameters": [{"name": "city", "type": "STRING",
                                            "description": "...", "default": "Paris"}],
                   "optional_parameters": [...]}]}

Query files (``solvable_queries/test_instruction/G1_instruction.json``) are a
JSON list of::

    {"query": "...", "query_id": 42,
     "api_list": [{"category_name": "Weather", "tool_name": "Weather API",
                   "api_name": "Current weather"}],
     "relevant APIs": [["Weather API", "Current weather"]]}

    tools = load_tools("data/toolenv/tools")            # list[Tool]
    queries = load_queries("G1_instruction.json")       # list[ToolBenchQuery]

A tool's response schema is the API's ``schema`` when it is a JSON Schema
object, else one inferred from its ``test_endpoint`` example, else
`DEFAULT_RESPONSE` (`response_schema`): the simulator draws responses from it.

Tool names follow ToolBench's own convention ``<api>_for_<tool>``, snake-cased
(as its function-calling prompts do), so a query's relevant APIs map to names
with `tool_name_of`.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
from typing import Any

from toolenv.catalog.valueflow import value_flow
from toolenv.schema import Tool

# RapidAPI parameter types -> JSON Schema types.
_TYPES = {"string": "string", "number": "number", "integer": "integer",
          "int": "integer", "float": "number", "boolean": "boolean",
          "bool": "boolean", "array": "array", "object": "object",
          "enum": "string", "date (yyyy-mm-dd)": "string", "time (24-hour hh:mm)":
          "string", "geopoint (latitude, longitude)": "string"}
_READ = ("GET", "HEAD", "OPTIONS")
# When an API documents no response, the simulator still answers something an
# answer can be checked against (see `toolenv.benchmarks.stabletoolbench`).
DEFAULT_RESPONSE = {"type": "object", "properties": {
    "result": {"type": "string"}, "value": {"type": "number"}},
                    "required": ["result", "value"]}
_MAX_FIELDS = 12


def _snake(text: str) -> str:
  s = re.sub(r"[^0-9A-Za-z]+", "_", str(text)).strip("_").lower()
  return re.sub(r"_+", "_", s) or "api"


def tool_name_of(tool_name: str, api_name: str) -> str:
  """ToolBench's function name for an API of a tool: ``<api>_for_<tool>``."""
  return f"{_snake(api_name)}_for_{_snake(tool_name)}"[:64]


def _param(p: dict[str, Any]) -> dict[str, Any]:
  out: dict[str, Any] = {"type": _TYPES.get(str(p.get("type", "string"))
                                            .strip().lower(), "string")}
  if p.get("description"):
    out["description"] = str(p["description"])
  default = p.get("default")
  if default not in (None, ""):
    out["default"] = default
  return out


def _example_schema(x: Any, depth: int = 0) -> dict[str, Any]:
  """A JSON Schema for an example value (ToolBench's ``test_endpoint``)."""
  if isinstance(x, bool):
    return {"type": "boolean"}
  if isinstance(x, int):
    return {"type": "integer"}
  if isinstance(x, float):
    return {"type": "number"}
  if isinstance(x, dict) and depth < 3:
    props = {str(k): _example_schema(v, depth + 1)
             for k, v in list(x.items())[:_MAX_FIELDS]}
    return {"type": "object", "properties": props, "required": list(props)}
  if isinstance(x, list) and depth < 3:
    return {"type": "array", "items": _example_schema(x[0], depth + 1) if x else
            {"type": "string"}}
  return {"type": "string"}


def response_schema(api: dict[str, Any]) -> dict[str, Any]:
  """The response schema of an API entry.

  ToolBench's ``schema`` when it is a JSON Schema object, else one inferred
  from the ``test_endpoint`` example when that is a JSON object, else
  `DEFAULT_RESPONSE` (many entries document nothing, or an error string).
  """
  sch = api.get("schema")
  if isinstance(sch, dict) and isinstance(sch.get("properties"), dict) and sch["properties"]:
    return {"type": "object", "properties": {
        str(k): (v if isinstance(v, dict) else {"type": "string"})
        for k, v in list(sch["properties"].items())[:_MAX_FIELDS]},
            "required": [r for r in sch.get("required") or [] if r in sch["properties"]]}
  ex = api.get("test_endpoint")
  if isinstance(ex, dict) and ex:
    return _example_schema(ex)
  return dict(DEFAULT_RESPONSE)


def tools_from_json(doc: dict[str, Any], category: str = "uncategorized"
                    ) -> list[Tool]:
  """One RapidAPI tool document -> one `Tool` per API in ``api_list``."""
  if not isinstance(doc, dict) or not isinstance(doc.get("api_list"), list):
    raise ValueError("not a ToolBench tool document (no 'api_list' list)")
  tname = str(doc.get("tool_name") or doc.get("name") or "tool")
  provider = _snake(tname)
  tdesc = str(doc.get("tool_description") or "").strip()
  out = []
  for api in doc["api_list"]:
    if not isinstance(api, dict) or not api.get("name"):
      continue
    props: dict[str, Any] = {}
    required: list[str] = []
    for group, req in (("required_parameters", True),
                       ("optional_parameters", False)):
      for p in api.get(group) or []:
        if isinstance(p, dict) and p.get("name") and p["name"] not in props:
          props[str(p["name"])] = _param(p)
          if req:
            required.append(str(p["name"]))
    method = str(api.get("method") or "GET").upper()
    desc = str(api.get("description") or "").strip() or (
        f"{api['name']} ({tname}). {tdesc}".strip())
    response = response_schema(api)
    path = "/" + _snake(api["name"])
    flow = value_flow(provider, method, path, _snake(api["name"]), "", props,
                      {k: "query" for k in props}, response)
    out.append(Tool(
        name=tool_name_of(tname, api["name"]), category=_snake(category),
        provider=provider, description=desc,
        parameters={"type": "object", "properties": props,
                    "required": required},
        response=response, effect="read" if method in _READ else "write",
        source="toolbench",
        meta={"tool_name": tname, "api_name": str(api["name"]),
              "method": method, "tool_description": tdesc, **flow}))
  return out


def load_tools(root: str) -> list[Tool]:
  """All tool JSON files under ``root`` (``<Category>/<tool>.json``), sorted.

  A file that is not a tool document raises ``ValueError`` naming the file;
  the category is the file's parent folder name.
  """
  if not os.path.exists(root):
    raise FileNotFoundError(
        f"ToolBench tools {root!r} not found: download ToolBench / "
        "StableToolBench data and pass its data/toolenv/tools directory.")
  files = []
  if os.path.isfile(root):
    files = [root]
  else:
    for d, dirs, fns in os.walk(root):
      dirs.sort()
      files += [os.path.join(d, f) for f in sorted(fns) if f.endswith(".json")]
  tools: list[Tool] = []
  seen: set[str] = set()
  for path in sorted(files):
    with open(path, encoding="utf-8") as f:
      try:
        doc = json.load(f)
      except json.JSONDecodeError as e:
        raise ValueError(f"{path}: not JSON: {e}") from e
    cat = os.path.basename(os.path.dirname(path)) or "uncategorized"
    try:
      new = tools_from_json(doc, cat)
    except ValueError as e:
      raise ValueError(f"{path}: {e}") from e
    for t in new:
      if t.name not in seen:  # Same API listed twice: keep the first.
        seen.add(t.name)
        tools.append(t)
  return tools


@dataclasses.dataclass
class ToolBenchQuery:
  """One StableToolBench query as a task-like record.

  Attributes:
    query_id: the file's id.
    instruction: the user's request.
    apis: the APIs offered with the query, as catalog tool names.
    relevant: the APIs needed to solve it (the gold tools), as tool names.
    categories: category of each offered API (same order as ``apis``).
  """
  query_id: Any
  instruction: str
  apis: list[str]
  relevant: list[str]
  categories: list[str]


def load_queries(path: str) -> list[ToolBenchQuery]:
  """Reads a StableToolBench query file (a JSON list)."""
  with open(path, encoding="utf-8") as f:
    items = json.load(f)
  if not isinstance(items, list):
    raise ValueError(f"{path}: expected a JSON list of queries")
  out = []
  for q in items:
    if not isinstance(q, dict) or "query" not in q:
      raise ValueError(f"{path}: entry without 'query': {str(q)[:80]}")
    api_list = [a for a in q.get("api_list") or [] if isinstance(a, dict)]
    out.append(ToolBenchQuery(
        query_id=q.get("query_id"), instruction=str(q["query"]),
        apis=[tool_name_of(a.get("tool_name", ""), a.get("api_name", ""))
              for a in api_list],
        relevant=[tool_name_of(t, a) for t, a in q.get("relevant APIs") or []],
        categories=[_snake(a.get("category_name", "")) for a in api_list]))
  return out
