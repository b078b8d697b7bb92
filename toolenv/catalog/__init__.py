"""Catalogs: tool interfaces, their store, a registry of builders, the cache.

    cat = toolenv.load_catalog("procedural", seed=0)     # 50,011 tools

Register a builder ``fn(seed=0, **kw) -> Catalog | Iterable[Tool]`` under a
name and `load_catalog` builds it once, caches it under ``$TOOLENV_CACHE``
(default ``~/.cache/toolenv``) and loads the cache after (`registry`). A name
not registered yet is looked up as module ``toolenv.catalog.<name>`` with
``importlib`` (a plug-in lookup: `registry` imports no builder statically).

Modules, from the top down (each imports only the ones below it; ``a | b``:
neither imports the other):

    build                          command line: builds and caches real catalogs
    openapi                        OpenAPI selection and the registry builder
    openapi_parse                  OpenAPI spec -> `Tool`s
    openapi_source                 reading spec files and tarballs, the npm fetch
    procedural | toolbench | bfcl  the procedural catalog; ToolBench, BFCL loaders
    registry                       builders by name, `load_catalog`, the cache
    store | valueflow | vocab      the `Catalog` store; value-flow tags; word lists

Layer: the lowest part of toolenv, above `toolenv.schema` only (the other
toolenv modules import it, it imports none of them). Pure Python: stdlib,
PyYAML only to read YAML specs; never JAX, nothing from the ParaAgent policy package.
"""

from toolenv.catalog.registry import (_cache_key, _find, cache_dir, cache_root, load_catalog,
                                      register_builder, registered_builders)
from toolenv.catalog.store import Catalog

# `_cache_key` and `_find` are re-exported for the cache look-ups of
# benchmarks/toolenv_bench.py and notebooks/hf_openapi.ipynb.
__all__ = ["Catalog", "register_builder", "load_catalog", "cache_root", "cache_dir",
           "registered_builders"]
