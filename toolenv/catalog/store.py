"""The catalog store: a set of `Tool`s, independent of where they came from.

Every builder (procedural, OpenAPI, BFCL, ToolBench) fills a `Catalog`; the
search index, executor, task generator and oracle only ever read one.

On disk a catalog is a directory of three files:

    tools.jsonl     one `Tool.to_dict()` per line (compact JSON)
    columns.json    names, categories, providers, descriptions, effects: what
                    search and listing need without decoding every tool
    manifest.json   format version, size, fingerprint, builder info; written
                    last, so a directory without it is an unfinished build

Each file is written to a temporary name and renamed into place (atomic on
POSIX). Loading reads the columns and keeps each tool's JSON line as bytes;
a `Tool` is decoded the first time it is looked up. That keeps a warm load of
50,011 tools well under a second and the resident size small.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from collections.abc import Iterable, Iterator
from typing import Any

from toolenv.schema import Tool

STORE_FORMAT = 1
_COLUMNS = ("category", "provider", "description", "effect")
_TOOL_FIELDS = ("name", "category", "provider", "description", "parameters",
                "response", "effect", "source", "meta")


def atomic_write(path: str, data: bytes) -> None:
  """Writes ``data`` to ``path`` through a temporary file and a rename."""
  d = os.path.dirname(os.path.abspath(path))
  os.makedirs(d, exist_ok=True)
  fd, tmp = tempfile.mkstemp(prefix=".tmp_", dir=d)
  try:
    with os.fdopen(fd, "wb") as f:
      f.write(data)
    os.replace(tmp, path)
  except BaseException:
    if os.path.exists(tmp):
      os.unlink(tmp)
    raise


def _dumps(obj: Any) -> str:
  return json.dumps(obj, separators=(",", ":"), ensure_ascii=False)


class Catalog:
  """An ordered, name-unique collection of tools.

  Attributes:
    name: the catalog's name (``procedural``, ``openapi``, ...).
    info: builder details (seed, sizes, source versions); JSON-serialisable.
  """

  def __init__(self, tools: Iterable[Tool] = (), name: str = "custom",
               info: dict[str, Any] | None = None):
    self.name = name
    self.info: dict[str, Any] = dict(info or {})
    self._names: list[str] = []
    self._index: dict[str, int] = {}
    self._cols: dict[str, list[str]] = {c: [] for c in _COLUMNS}
    self._rows: list[bytes | None] = []     # raw JSON lines (lazy decoding)
    self._tools: list[Tool | None] = []     # decoded tools
    self._fingerprint: str | None = None
    self.extend(tools)

  # ---- building ---------------------------------------------------------
  def add(self, tool: Tool) -> None:
    """Adds one tool; its name must be new."""
    if not isinstance(tool, Tool):
      raise TypeError(f"Catalog.add expects a Tool, got {type(tool).__name__}")
    if tool.name in self._index:
      raise ValueError(f"Duplicate tool name {tool.name!r}")
    self._index[tool.name] = len(self._names)
    self._names.append(tool.name)
    for c in _COLUMNS:
      self._cols[c].append(getattr(tool, c))
    self._rows.append(None)
    self._tools.append(tool)
    self._fingerprint = None

  def extend(self, tools: Iterable[Tool]) -> None:
    """Adds several tools in order."""
    for t in tools:
      self.add(t)

  # ---- reading ----------------------------------------------------------
  def __len__(self) -> int:
    return len(self._names)

  def __contains__(self, name: object) -> bool:
    return isinstance(name, str) and name in self._index

  def __getitem__(self, key: str | int) -> Tool:
    """The tool of that name (or position); KeyError / IndexError if absent."""
    i = key if isinstance(key, int) else self._index[key]
    t = self._tools[i]
    if t is None:
      t = Tool.from_dict(json.loads(self._rows[i]))
      self._tools[i] = t
      self._rows[i] = None
    return t

  def get(self, name: Any, default: Tool | None = None) -> Tool | None:
    """The tool called ``name``, or ``default``; never raises."""
    if not isinstance(name, str):
      return default
    i = self._index.get(name)
    return default if i is None else self[i]

  def __iter__(self) -> Iterator[Tool]:
    for i in range(len(self._names)):
      yield self[i]

  def index_of(self, name: str) -> int:
    """Position of a tool (stable: the search index uses it)."""
    return self._index[name]

  @property
  def names(self) -> list[str]:
    """Tool names in catalog order (do not mutate)."""
    return self._names

  def column(self, field: str) -> list[str]:
    """One of category / provider / description / effect for every tool, without decoding."""
    return self._cols[field]

  def providers(self) -> dict[str, list[str]]:
    """Provider -> its tool names, in catalog order."""
    out: dict[str, list[str]] = {}
    for n, p in zip(self._names, self._cols["provider"]):
      out.setdefault(p, []).append(n)
    return out

  def categories(self) -> list[str]:
    """Distinct categories, sorted."""
    return sorted(set(self._cols["category"]))

  def _row(self, i: int) -> str:
    t = self._tools[i]
    if t is not None:
      # Not dataclasses.asdict: its deep copy is 10x slower than this.
      return _dumps({f: getattr(t, f) for f in _TOOL_FIELDS})
    return self._rows[i].decode("utf-8")

  @property
  def fingerprint(self) -> str:
    """A content hash (sha256 of the rows in order): same tools, same print."""
    if self._fingerprint is None:
      h = hashlib.sha256()
      for i in range(len(self)):
        h.update(self._row(i).encode("utf-8"))
        h.update(b"\n")
      self._fingerprint = h.hexdigest()[:16]
    return self._fingerprint

  # ---- disk ---------------------------------------------------------------
  def save(self, path: str) -> None:
    """Writes the catalog directory at ``path`` (atomic per file, manifest last)."""
    os.makedirs(path, exist_ok=True)
    manifest = os.path.join(path, "manifest.json")
    if os.path.exists(manifest):  # An older build: invalidate it first.
      os.unlink(manifest)
    lines = [self._row(i) for i in range(len(self))]
    h = hashlib.sha256()
    for ln in lines:
      h.update(ln.encode("utf-8"))
      h.update(b"\n")
    self._fingerprint = h.hexdigest()[:16]
    body = ("\n".join(lines) + ("\n" if lines else "")).encode("utf-8")
    atomic_write(os.path.join(path, "tools.jsonl"), body)
    cols = {"names": self._names, **{c: self._cols[c] for c in _COLUMNS}}
    atomic_write(os.path.join(path, "columns.json"), _dumps(cols).encode())
    atomic_write(manifest, _dumps({
        "format": STORE_FORMAT, "name": self.name, "size": len(self),
        "fingerprint": self._fingerprint, "info": self.info}).encode())

  @classmethod
  def load(cls, path: str) -> "Catalog":
    """Reads a directory written by `save`.

    Raises:
      FileNotFoundError: no finished catalog at ``path``.
      ValueError: the files disagree (format, size) -- rebuild it.
    """
    manifest = os.path.join(path, "manifest.json")
    if not os.path.isfile(manifest):
      raise FileNotFoundError(f"No finished catalog at {path}")
    with open(manifest, "rb") as f:
      man = json.loads(f.read())
    if man.get("format") != STORE_FORMAT:
      raise ValueError(f"{path}: store format {man.get('format')!r}, "
                       f"expected {STORE_FORMAT}")
    with open(os.path.join(path, "columns.json"), "rb") as f:
      cols = json.loads(f.read())
    with open(os.path.join(path, "tools.jsonl"), "rb") as f:
      rows = f.read().split(b"\n")
    if rows and not rows[-1]:
      rows.pop()
    n = man["size"]
    if len(rows) != n or len(cols["names"]) != n:
      raise ValueError(f"{path}: {len(rows)} rows, {len(cols['names'])} names, "
                       f"manifest says {n}")
    cat = cls(name=man.get("name", "custom"), info=man.get("info", {}))
    cat._names = cols["names"]
    cat._index = {nm: i for i, nm in enumerate(cat._names)}
    if len(cat._index) != n:
      raise ValueError(f"{path}: duplicate tool names")
    cat._cols = {c: cols[c] for c in _COLUMNS}
    cat._rows = rows
    cat._tools = [None] * n
    cat._fingerprint = man.get("fingerprint")
    return cat

  def __repr__(self) -> str:
    return f"Catalog(name={self.name!r}, size={len(self)})"
