"""Which task generator a catalog gets: an explicit table, catalog kind -> class.

    gen = toolenv.TaskGenerator(catalog, seed=0)   # ProceduralTaskGenerator or
                                                   # OpenAPITaskGenerator

A catalog of OpenAPI operations (`is_openapi_catalog`) is kind ``"openapi"``;
every other catalog is ``"procedural"`` (whose generator raises a clear
`ValueError` when the catalog has no procedural value-flow metadata).
"""

from __future__ import annotations

from toolenv.executor import Executor
from toolenv.tasks.base import BaseTaskGenerator
from toolenv.tasks.openapi import OpenAPITaskGenerator, is_openapi_catalog
from toolenv.tasks.procedural import ProceduralTaskGenerator

GENERATORS: dict[str, type[BaseTaskGenerator]] = {
    "procedural": ProceduralTaskGenerator,
    "openapi": OpenAPITaskGenerator,
}


def catalog_kind(catalog) -> str:
  """The `GENERATORS` key of ``catalog``: ``"openapi"`` or ``"procedural"``."""
  return "openapi" if is_openapi_catalog(catalog) else "procedural"


def TaskGenerator(catalog, seed: int = 0,  # pylint: disable=invalid-name
                  executor: Executor | None = None) -> BaseTaskGenerator:
  """The task generator of ``catalog``'s kind, deterministic from ``seed``.

  Named like a class because callers construct generators with it
  (``toolenv.TaskGenerator(cat, seed=0)``); it returns an instance of the
  class that `GENERATORS` names for `catalog_kind` (test its type with
  `BaseTaskGenerator`). ``executor`` defaults to a fresh `Executor` with the
  catalog's seed.
  """
  return GENERATORS[catalog_kind(catalog)](catalog, seed=seed, executor=executor)
