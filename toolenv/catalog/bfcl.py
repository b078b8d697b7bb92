"""Berkeley Function Calling Leaderboard data -> function docs and tasks.

The data ships in the PyPI package ``bfcl-eval`` (pinned below) as JSON-lines
files ``bfcl_eval/data/BFCL_v4_<category>.json`` with the answers in
``bfcl_eval/data/possible_answer/``. The package's own dependencies clash with
ours, so it is never installed here: this module reads the wheel (a zip) or an
unpacked data directory directly.

    pip download --no-deps bfcl-eval==2026.3.23 -d ~/.cache/toolenv

Entry format (one JSON object per line)::

    {"id": "parallel_0", "question": [[{"role": "user", "content": "..."}]],
     "function": [{"name": "spotify.play", "description": "...",
                   "parameters": {"type": "dict", "properties": {...},
                                  "required": [...]}}]}
    {"id": "parallel_0", "ground_truth": [{"spotify.play": {"artist": ["Taylor Swift"],
                                           "duration": [20]}}, ...]}
"""

from __future__ import annotations

import dataclasses
import glob
import hashlib
import json
import os
import zipfile
from typing import Any

from toolenv.schema import Tool

BFCL_PACKAGE = "bfcl-eval"
BFCL_VERSION = "2026.3.23"
CATEGORIES: tuple[str, ...] = (
    "simple_python", "multiple", "parallel", "parallel_multiple",
    "live_simple", "live_multiple", "live_parallel", "live_parallel_multiple")
# BFCL's Python type names -> JSON Schema types.
_TYPE_MAP = {"dict": "object", "float": "number", "tuple": "array",
             "any": "string", "integer": "integer", "boolean": "boolean",
             "array": "array", "string": "string", "object": "object",
             "number": "number"}


@dataclasses.dataclass
class BFCLEntry:
  """One BFCL test case with its possible answers."""
  id: str
  category: str
  question: list[Any]
  functions: list[dict[str, Any]]
  ground_truth: list[dict[str, dict[str, list[Any]]]]

  @property
  def instruction(self) -> str:
    """The user turns joined (BFCL single-turn entries have one)."""
    turns = self.question[0] if self.question and isinstance(
        self.question[0], list) else self.question
    return "\n".join(m.get("content", "") for m in turns
                     if isinstance(m, dict) and m.get("role") == "user")


def default_source() -> str:
  """The cached wheel, or a clear error saying how to fetch it."""
  d = os.environ.get("TOOLENV_CACHE") or os.path.join(
      os.path.expanduser("~"), ".cache", "toolenv")
  pattern = f"bfcl_eval-{BFCL_VERSION}-*.whl"
  for where in (d, "/tmp/bfcl"):
    hits = sorted(glob.glob(os.path.join(where, pattern)))
    if hits:
      return hits[0]
  raise FileNotFoundError(
      f"No BFCL data. Fetch it with `pip download --no-deps "
      f"{BFCL_PACKAGE}=={BFCL_VERSION} -d {d}`, or pass the path of an "
      "unpacked bfcl_eval/data directory.")


class _Reader:
  """Reads ``data/...`` files from a wheel or a directory."""

  def __init__(self, source: str):
    self.source = source
    self.zip = None
    if os.path.isfile(source) and zipfile.is_zipfile(source):
      self.zip = zipfile.ZipFile(source)
      self.prefix = next((n[:-len("BFCL_v4_simple_python.json")]
                          for n in self.zip.namelist()
                          if n.endswith("data/BFCL_v4_simple_python.json")), None)
      if self.prefix is None:
        names = [n for n in self.zip.namelist() if "/data/BFCL_" in n]
        self.prefix = names[0].rsplit("/", 1)[0] + "/" if names else "data/"
    elif os.path.isdir(source):
      sub = os.path.join(source, "bfcl_eval", "data")
      self.prefix = sub if os.path.isdir(sub) else source
    else:
      raise FileNotFoundError(f"BFCL source {source!r} does not exist.")

  def read(self, rel: str) -> str | None:
    if self.zip is not None:
      try:
        return self.zip.read(self.prefix + rel).decode("utf-8")
      except KeyError:
        return None
    path = os.path.join(self.prefix, rel)
    if not os.path.isfile(path):
      return None
    with open(path, encoding="utf-8") as f:
      return f.read()


def _jsonl(text: str) -> list[dict[str, Any]]:
  return [json.loads(line) for line in text.splitlines() if line.strip()]


def load_entries(source: str, categories: tuple[str, ...] = CATEGORIES
                 ) -> list[BFCLEntry]:
  """Reads the test cases and possible answers of ``categories``."""
  reader = _Reader(source)
  out = []
  for cat in categories:
    qtext = reader.read(f"BFCL_v4_{cat}.json")
    atext = reader.read(f"possible_answer/BFCL_v4_{cat}.json")
    if qtext is None or atext is None:
      raise FileNotFoundError(
          f"{source}: BFCL_v4_{cat}.json or its possible_answer file missing.")
    answers = {a["id"]: a["ground_truth"] for a in _jsonl(atext)}
    for q in _jsonl(qtext):
      if q["id"] not in answers:
        raise ValueError(f"{cat}: no possible answer for {q['id']}")
      out.append(BFCLEntry(id=q["id"], category=cat, question=q["question"],
                           functions=q["function"],
                           ground_truth=answers[q["id"]]))
  return out


def _schema(p: dict[str, Any]) -> dict[str, Any]:
  """BFCL parameter schema -> our JSON Schema subset (recursively)."""
  out: dict[str, Any] = {"type": _TYPE_MAP.get(p.get("type", "string"),
                                               "string")}
  if p.get("description"):
    out["description"] = str(p["description"])
  if isinstance(p.get("enum"), list):
    out["enum"] = list(p["enum"])
  if "default" in p:
    out["default"] = p["default"]
  if out["type"] == "array":
    out["items"] = _schema(p.get("items") or {"type": "string"})
  if out["type"] == "object":
    props = p.get("properties") or {}
    out["properties"] = {k: _schema(v) for k, v in props.items()}
    out["required"] = [r for r in p.get("required") or [] if r in props]
  return out


def _doc_key(fn: dict[str, Any]) -> str:
  return hashlib.sha1(json.dumps(fn, sort_keys=True).encode()).hexdigest()[:8]


def function_to_tool(fn: dict[str, Any], name: str | None = None,
                     category: str = "bfcl") -> Tool:
  """One BFCL function doc as a `Tool`; the original doc stays in ``meta``."""
  params = _schema(dict(fn.get("parameters") or {}, type="dict"))
  return Tool(name=name or fn["name"], category=category, provider="bfcl",
              description=str(fn.get("description", "")),
              parameters={"type": "object", "properties": params["properties"],
                          "required": params["required"]},
              response={"type": "object", "properties": {}, "required": []},
              effect="read", source="bfcl",
              meta={"bfcl_name": fn["name"], "bfcl_function": fn,
                    "doc_key": _doc_key(fn)})


def pooled_tools(entries: list[BFCLEntry]) -> tuple[list[Tool], dict]:
  """All function docs of all entries in one catalog (open-world setting).

  The same name with different docs occurs across categories; the first keeps
  the plain name, later ones get ``__<hash>``. Returns the tools and a map
  ``(entry id, original name) -> catalog name``.
  """
  by_key: dict[str, Tool] = {}
  names: set[str] = set()
  mapping: dict[tuple[str, str], str] = {}
  for e in entries:
    for fn in e.functions:
      key = _doc_key(fn)
      if key not in by_key:
        name = fn["name"] if fn["name"] not in names else f"{fn['name']}__{key}"
        names.add(name)
        by_key[key] = function_to_tool(fn, name, e.category)
      mapping[(e.id, fn["name"])] = by_key[key].name
  return list(by_key.values()), mapping


def load_tools(source: str) -> list[Tool]:
  """The pooled function docs of the default categories (for the store)."""
  return pooled_tools(load_entries(source))[0]
