"""The catalog registry: builders by name, and their on-disk cache.

    cat = toolenv.load_catalog("procedural", seed=0)     # 50,011 tools

A builder is any function ``fn(seed=0, **kw) -> Catalog | Iterable[Tool]``.
Register one under a name and `load_catalog` builds it once, caches it under
``$TOOLENV_CACHE`` (default ``~/.cache/toolenv``) and loads the cache after:

    from toolenv.catalog import register_builder
    register_builder("openapi", build_openapi_catalog, version="3")

If a name is not registered, `load_catalog` imports ``toolenv.catalog.<name>``
once (so a module that calls `register_builder` at import time is found), and
failing that uses that module's ``build_catalog(seed=0, **kw)`` if it has one.
Bump ``version`` whenever the builder's output changes: it is part of the
cache key, so stale caches are never read.

`load_catalog` finds builder modules with ``importlib`` (a plug-in lookup by
name), so this module imports no builder, and the built-in builders
(``procedural``) define ``build_catalog`` and import nothing of it: no import
circle.
"""

from __future__ import annotations

import dataclasses
import hashlib
import importlib
import json
import os
from typing import Any, Callable

from toolenv.catalog.store import Catalog

__all__ = ["Catalog", "register_builder", "load_catalog", "cache_root", "cache_dir",
           "registered_builders"]


@dataclasses.dataclass(frozen=True)
class _Builder:
  fn: Callable[..., Any]
  version: str
  cache: bool


_BUILDERS: dict[str, _Builder] = {}


def register_builder(name: str, fn: Callable[..., Any], version: str = "1",
                     cache: bool = True) -> None:
  """Registers ``fn(seed=0, **kw)`` as the builder of catalog ``name``.

  Args:
    name: what `load_catalog` is called with.
    fn: returns a `Catalog` or an iterable of `Tool`s.
    version: part of the cache key; change it when the output changes.
    cache: whether to cache the result on disk (off for tiny in-memory sets).
  """
  _BUILDERS[name] = _Builder(fn, str(version), bool(cache))


def registered_builders() -> list[str]:
  """Names registered so far (modules not yet imported are not listed)."""
  _ensure_defaults()
  return sorted(_BUILDERS)


def cache_root() -> str:
  """``$TOOLENV_CACHE`` or ``~/.cache/toolenv``."""
  return os.environ.get("TOOLENV_CACHE") or os.path.join(
      os.path.expanduser("~"), ".cache", "toolenv")


def cache_dir() -> str:
  """`cache_root`, created if missing."""
  d = cache_root()
  os.makedirs(d, exist_ok=True)
  return d


def _ensure_defaults() -> None:
  # The default catalog is found like any plug-in (its module defines
  # `build_catalog` and `CATALOG_VERSION` and imports nothing of this one).
  if "procedural" not in _BUILDERS:
    _find("procedural")


def _find(name: str) -> _Builder:
  if name in _BUILDERS:
    return _BUILDERS[name]
  if not name.isidentifier():
    raise KeyError(f"Unknown catalog {name!r}")
  try:
    mod = importlib.import_module(f"toolenv.catalog.{name}")
  except ModuleNotFoundError as e:
    raise KeyError(f"Unknown catalog {name!r}; registered: "
                   f"{registered_builders()}") from e
  if name not in _BUILDERS and hasattr(mod, "build_catalog"):
    register_builder(name, mod.build_catalog,
                     version=str(getattr(mod, "CATALOG_VERSION", "1")))
  if name not in _BUILDERS:
    raise KeyError(f"Module toolenv.catalog.{name} registers no builder "
                   "(call register_builder or define build_catalog)")
  return _BUILDERS[name]


def _cache_key(name: str, version: str, seed: int, kw: dict[str, Any]) -> str:
  blob = json.dumps({"seed": seed, "kw": kw, "v": version}, sort_keys=True,
                    default=repr)
  return f"{name}-s{seed}-{hashlib.sha256(blob.encode()).hexdigest()[:12]}"


def load_catalog(name: str = "procedural", seed: int = 0, *,
                 cache_dir: str | None = None, rebuild: bool = False,
                 **kw: Any) -> Catalog:
  """Loads catalog ``name`` from the cache, building (and caching) it if needed.

  Args:
    name: a registered builder (``procedural``; ``openapi`` etc. once their
      modules register).
    seed: builder seed (part of the cache key).
    cache_dir: overrides ``$TOOLENV_CACHE``.
    rebuild: ignore an existing cache.
    **kw: passed to the builder (and part of the cache key).

  Returns:
    The `Catalog`, with ``info["cache_path"]`` set when it is cached.
  """
  b = _find(name)
  if not b.cache:
    return _as_catalog(b.fn(seed=seed, **kw), name)
  path = os.path.join(cache_dir or cache_root(),
                      _cache_key(name, b.version, seed, kw))
  if not rebuild:
    try:
      cat = Catalog.load(path)
      cat.info["cache_path"] = path
      return cat
    except (FileNotFoundError, ValueError, KeyError, json.JSONDecodeError):
      pass  # Missing or broken cache: build it again.
  cat = _as_catalog(b.fn(seed=seed, **kw), name)
  cat.save(path)
  cat.info["cache_path"] = path
  return cat


def _as_catalog(out: Any, name: str) -> Catalog:
  if isinstance(out, Catalog):
    if out.name == "custom":
      out.name = name
    return out
  return Catalog(out, name=name)
