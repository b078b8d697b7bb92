"""Tool retrieval over a catalog: BM25 (bm25s) over names and descriptions.

    index = SearchIndex.for_catalog(cat)          # built once, cached on disk
    index.search("weather station details", top_k=5)   -> [(name, score), ...]
    index.search_text("...")   # what the agent reads, one line per tool:
      skyraly_get_station: Skyraly: get the details of a station by its id (...). (station_id*: str)
    get_tool_doc(cat, name)    # the full interface, compact JSON

Tokens: lower-cased words split on non-alphanumerics, underscores and
camelCase, English stop words dropped, plural endings folded (a light suffix
rule: ``stations`` -> ``station``), so queries written in natural phrasing meet
tool names written in snake_case.

Scoring: BM25 (k1 1.2, b 0.3), each query word once, except that a word of a
provider's name (``Skyraly``, see `provider_tokens`) weighs ``PROVIDER_WEIGHT``
times as much: a user who names the provider has said which API they mean,
and in a query with several needs ("On Skyraly, ... Also: list ... on Dorlien
...") the provider words keep each need's tools above another provider's
near-matches.

Several needs in one query (``clause_fusion``, on by default): a query of
several clauses (split at sentence ends, ``;`` and the word ``also``, see
`split_clauses`; a clause of under ``MIN_CLAUSE_WORDS`` known words joins
the one before it) is ranked by reciprocal-rank fusion of one
BM25 ranking per clause and the ranking of the whole query:
``sum_lists w / (RRF_K + rank)`` (rank 0 = best; weight 1 per clause,
``RRF_FULL_WEIGHT`` for the whole query; each list's top ``RRF_DEPTH``).
Without it one need's near-duplicates (four "merge request" tools of one
provider) fill the five slots; with it every clause's best tool ranks near
the top. A one-clause query keeps its plain BM25 scores. Measured with
benchmarks/toolenv_bench.py (1,000 tasks each, whole-instruction recall@5):
OpenAPI 0.772 -> 0.882, procedural 0.912 -> 0.951.
"""

from __future__ import annotations

import functools
import json
import os
import re
from typing import Any

import numpy as np

from toolenv.catalog.store import Catalog, atomic_write
from toolenv.schema import Tool

INDEX_VERSION = "2"
MAX_TOP_K = 10
# Query weight of provider-name words (1 = plain BM25). Measured with
# benchmarks/toolenv_bench.py (1,000 tasks): whole-instruction recall@5
# 0.879 -> 0.912 on the procedural catalog and 0.766 -> 0.775 on OpenAPI,
# per-need recall unchanged (1.000 / 0.99); 1.5 to 3 give about the same on
# the procedural catalog, 2 is worse on OpenAPI.
PROVIDER_WEIGHT = 1.5
# Clause fusion (see the module docstring). Chosen on the bench's 1,000
# tasks of both catalogs (k 0.5..3, full weight 0.5..3, clause words 1..4):
# a small k makes each clause's best tool count most (k 20, the usual RRF
# constant, gives 0.79 on OpenAPI); the whole query's ranking weighs 1.5
# clauses, so a chain's second tool that no clause ranks first still gets in.
RRF_K = 1.0
RRF_FULL_WEIGHT = 1.5
RRF_DEPTH = 20
MIN_CLAUSE_WORDS = 3
MAX_QUERY_CHARS = 1000
# Not at "then": "find the order ..., then tell me its city" is one need.
_CLAUSE_SPLIT = re.compile(r"(?<=[.?!;])\s+(?:also\b:?\s*)?|\s+also\b:?\s*", re.IGNORECASE)
_SPLIT = re.compile(r"[^0-9a-zA-Z]+")
_CAMEL = re.compile(r"(?<=[a-z0-9])(?=[A-Z])")
STOPWORDS = frozenset(
    "a an and are as at be by for from has have i in is it its me my of on or "
    "our please that the their then them this to was we what which with you "
    "your tell give find out also all each one".split())
_TYPE_ABBR = {"string": "str", "integer": "int", "number": "num",
              "boolean": "bool", "array": "list", "object": "obj"}


@functools.lru_cache(maxsize=200_000)
def _stem(w: str) -> str:
  if len(w) > 4 and w.endswith("ies"):
    return w[:-3] + "y"
  if len(w) > 4 and w.endswith(("ches", "shes", "xes", "sses")):
    return w[:-2]
  if len(w) > 3 and w.endswith("s") and not w.endswith(("ss", "us", "is")):
    return w[:-1]
  return w


def tokenize(text: Any) -> list[str]:
  """Search tokens of a text (see the module docstring)."""
  if not isinstance(text, str):
    return []
  out = []
  for w in _SPLIT.split(_CAMEL.sub(" ", text)):
    w = w.lower()
    if len(w) < 2 and not w.isdigit():
      continue
    if w in STOPWORDS:
      continue
    out.append(_stem(w))
  return out


def split_clauses(query: str) -> list[str]:
  """The clauses of a query: split at ``. `` / ``? `` / ``! `` / ``; `` and
  before the word ``also`` (``Also:``); empty parts dropped."""
  return [c.strip() for c in _CLAUSE_SPLIT.split(query) if c and c.strip()]


def provider_tokens(catalog: Catalog, max_providers: int = 3) -> frozenset[str]:
  """Words of provider names that name at most ``max_providers`` providers.

  ``Skyraly`` names one provider; ``com`` (``truora.com``) names hundreds and
  says nothing about which API is meant, so it is not boosted.
  """
  counts: dict[str, int] = {}
  for p in set(catalog.column("provider")):
    for t in set(tokenize(p)):
      counts[t] = counts.get(t, 0) + 1
  return frozenset(t for t, n in counts.items() if n <= max_providers)


def param_signature(tool: Tool) -> str:
  """Compact parameter list: ``(station_id*: str, units: metric|imperial = metric)``."""
  req = set(tool.required)
  parts = []
  for p, sch in tool.properties.items():
    if not isinstance(sch, dict):
      parts.append(p)
      continue
    if "enum" in sch:
      t = "|".join(str(v) for v in sch["enum"][:6])
    else:
      t = _TYPE_ABBR.get(sch.get("type"), str(sch.get("type", "any")))
    s = f"{p}{'*' if p in req else ''}: {t}"
    if "default" in sch:
      s += f" = {sch['default']}"
    parts.append(s)
  return "(" + ", ".join(parts) + ")"


def result_line(tool: Tool) -> str:
  """One search-result line: ``name: description (params)``."""
  return f"{tool.name}: {tool.description} {param_signature(tool)}"


def get_tool_doc(catalog: Catalog, name: Any) -> dict[str, Any] | None:
  """The full interface of a tool as a compact dict, or None if unknown."""
  tool = catalog.get(name)
  if tool is None:
    return None
  req = set(tool.required)
  params = {}
  for p, sch in tool.properties.items():
    sch = sch if isinstance(sch, dict) else {}
    d = {"type": sch.get("type", "any"), "required": p in req}
    for k in ("enum", "default", "minimum", "maximum", "description"):
      if k in sch:
        d[k] = sch[k]
    params[p] = d
  returns = {k: (v.get("type", "any") if isinstance(v, dict) else "any")
             for k, v in tool.response.get("properties", {}).items()}
  return {"name": tool.name, "provider": tool.provider,
          "description": tool.description, "effect": tool.effect,
          "parameters": params, "returns": returns}



@functools.cache
def _bm25s():
  """The bm25s module, imported on first use.

  Optional-at-import because bm25s runs a JAX op when imported (if JAX is
  installed), which would fix JAX's device count before a caller (the dry
  run, the 8-device tests) can set it.
  """
  # Optional heavy dependency, imported late: importing it runs a JAX op (above).
  import bm25s  # pylint: disable=g-import-not-at-top
  return bm25s


class SearchIndex:
  """BM25 over a catalog's tool names, descriptions, providers and categories.

  ``clause_fusion`` (default on): multi-clause queries ranked by
  reciprocal-rank fusion of per-clause rankings (module docstring).
  """

  def __init__(self, catalog: Catalog, retriever: Any,
               vocab: dict[str, int], clause_fusion: bool = True):
    self.catalog = catalog
    self._bm25 = retriever
    self._vocab = vocab
    self._provider_tokens = provider_tokens(catalog)
    self.clause_fusion = clause_fusion
    self._cached = functools.lru_cache(maxsize=65_536)(self._search_uncached)

  @staticmethod
  def documents(catalog: Catalog) -> list[list[str]]:
    """The token list of each tool, in catalog order."""
    cats, provs, descs = (catalog.column(c) for c in ("category", "provider", "description"))
    # Each word once per tool: a brand repeated in name, description and
    # provider should not outweigh the capability words of the query.
    return [list(dict.fromkeys(tokenize(f"{n} {d} {p} {c}")))
            for n, d, p, c in zip(catalog.names, descs, provs, cats)]

  @classmethod
  def build(cls, catalog: Catalog) -> "SearchIndex":
    """Indexes ``catalog`` from scratch."""
    docs = cls.documents(catalog)
    vocab: dict[str, int] = {}
    ids = [[vocab.setdefault(t, len(vocab)) for t in d] for d in docs]
    # A weak length penalty (b): longer descriptions list more capabilities.
    retriever = _bm25s().BM25(k1=1.2, b=0.3)
    retriever.index(_bm25s().tokenization.Tokenized(ids=ids, vocab=vocab),
                    show_progress=False)
    return cls(catalog, retriever, vocab)

  @classmethod
  def for_catalog(cls, catalog: Catalog, cache: bool = True) -> "SearchIndex":
    """The index of ``catalog``: memoised on it, and cached next to its store."""
    memo = getattr(catalog, "_search_index", None)
    if memo is not None:
      return memo
    path = catalog.info.get("cache_path")
    d = os.path.join(path, f"bm25-v{INDEX_VERSION}-{catalog.fingerprint}") if (
        cache and path) else None
    index = None
    if d and os.path.isfile(os.path.join(d, "toolenv_vocab.json")):
      try:
        retriever = _bm25s().BM25.load(d, show_progress=False)
        with open(os.path.join(d, "toolenv_vocab.json"), "rb") as f:
          vocab = json.loads(f.read())
        index = cls(catalog, retriever, vocab)
      except (OSError, ValueError, KeyError):
        index = None
    if index is None:
      index = cls.build(catalog)
      if d:
        index.save(d)
    catalog._search_index = index  # pylint: disable=protected-access
    return index

  def save(self, d: str) -> None:
    """Writes the BM25 arrays, then our vocabulary last (its presence marks a full save)."""
    os.makedirs(d, exist_ok=True)
    self._bm25.save(d, show_progress=False)
    atomic_write(os.path.join(d, "toolenv_vocab.json"),
                  json.dumps(self._vocab, separators=(",", ":")).encode())

  def _scores(self, text: str) -> np.ndarray | None:
    """Weighted BM25 score of every tool for ``text`` (None: no known word)."""
    toks = [t for t in dict.fromkeys(tokenize(text)) if t in self._vocab]
    if not toks:
      return None
    scores = self._bm25.get_scores([self._vocab[t] for t in toks])
    boost = [self._vocab[t] for t in toks if t in self._provider_tokens]
    if boost and PROVIDER_WEIGHT != 1:
      scores = scores + (PROVIDER_WEIGHT - 1) * self._bm25.get_scores(boost)
    return scores

  @staticmethod
  def _top(scores: np.ndarray, k: int) -> list[int]:
    """Indices of the ``k`` best positive scores, ties by catalog position."""
    n = scores.shape[0]
    k = min(k, n)
    cand = np.argpartition(-scores, k - 1)[:k] if k < n else np.arange(n)
    # Ties broken by catalog position, so results never depend on numpy's sort.
    return [i for i in sorted(cand.tolist(), key=lambda i: (-float(scores[i]), i))
            if scores[i] > 0]

  def _need_clauses(self, query: str) -> list[str]:
    """`split_clauses`, a clause of under ``MIN_CLAUSE_WORDS`` known words
    joined to the one before it (``then tell me its accent`` asks for a
    field of the last need's result; alone it would match any tool with an
    ``accent``); short clauses before the first long one join that one."""
    out: list[str] = []
    pending = ""
    for c in split_clauses(query):
      n = len({t for t in tokenize(c) if t in self._vocab})
      if n >= MIN_CLAUSE_WORDS:
        out.append(pending + c)
        pending = ""
      elif out:
        out[-1] += " " + c
      else:
        pending += c + " "
    return out or ([pending.strip()] if pending.strip() else [])

  def _search_uncached(self, query: str, top_k: int,
                       fusion: bool) -> tuple[tuple[str, float], ...]:
    names = self.catalog.names
    scores = self._scores(query)
    if scores is None:
      return ()
    clause_scores = []
    if fusion:
      clause_scores = [c for c in map(self._scores, self._need_clauses(query)) if c is not None]
    if len(clause_scores) < 2:
      return tuple((names[i], round(float(scores[i]), 4)) for i in self._top(scores, top_k))
    fused: dict[int, float] = {}
    lists = [(RRF_FULL_WEIGHT, scores)] + [(1.0, c) for c in clause_scores]
    for weight, sc in lists:
      for rank, i in enumerate(self._top(sc, max(RRF_DEPTH, top_k))):
        fused[i] = fused.get(i, 0.0) + weight / (RRF_K + rank)
    order = sorted(fused, key=lambda i: (-fused[i], i))[:top_k]
    return tuple((names[i], round(fused[i], 4)) for i in order)

  def search(self, query: Any, top_k: Any = 5) -> list[tuple[str, float]]:
    """Top ``top_k`` (1..10) tools for ``query`` as ``(name, score)``, best first."""
    if not isinstance(query, str) or not query.strip():
      return []
    k = top_k if isinstance(top_k, int) and not isinstance(top_k, bool) else 5
    k = max(1, min(MAX_TOP_K, k))
    # The setting is part of the memo key: switching it never serves stale hits.
    return list(self._cached(query[:MAX_QUERY_CHARS], k, bool(self.clause_fusion)))

  def search_text(self, query: Any, top_k: Any = 5) -> str:
    """Search results as the agent reads them (one line per tool)."""
    hits = self.search(query, top_k)
    if not hits:
      return "no tools found"
    return "\n".join(result_line(self.catalog[n]) for n, _ in hits)
