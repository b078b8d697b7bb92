"""Tasks: instruction, gold DAG of calls and gold answer, drawn from a catalog.

    gen = toolenv.TaskGenerator(catalog, seed=0)    # the catalog kind's generator
    tasks = gen.generate(100, split="test", kinds=("parallel", "chain"))

Modules, from the top down (each imports only the ones below it):

    registry      catalog kind -> generator class; `TaskGenerator` picks one
    procedural    `ProceduralTaskGenerator` (procedural catalog's value flow)
    openapi       `OpenAPITaskGenerator` (real operations, value flow by name)
    openapi_args  argument values and instruction wording of OpenAPI tasks
    base          `Task`, shared constants and helpers, `BaseTaskGenerator`

Layer: above `toolenv.executor` (with `toolenv.validation`, `toolenv.values`)
and `toolenv.catalog` (``vocab``, ``valueflow``) and `toolenv.schema`; below
`toolenv.env`, `toolenv.oracle` and `toolenv.benchmarks`, which import it.
Pure Python: never JAX, nothing from the ParaAgent policy package.
"""

from toolenv.tasks.base import (KINDS, MULTI_TOOL_KINDS, QUERY_WORDS, SPLITS, TEST_FRACTION,
                                WRITE_PROB, BaseTaskGenerator, Task, answer_key, fmt_value, plural)
from toolenv.tasks.openapi import OpenAPITaskGenerator, is_openapi_catalog
from toolenv.tasks.procedural import ProceduralTaskGenerator
from toolenv.tasks.registry import GENERATORS, TaskGenerator, catalog_kind

__all__ = ["KINDS", "MULTI_TOOL_KINDS", "QUERY_WORDS", "SPLITS", "TEST_FRACTION", "WRITE_PROB",
           "BaseTaskGenerator", "Task", "answer_key", "fmt_value", "plural",
           "OpenAPITaskGenerator", "is_openapi_catalog", "ProceduralTaskGenerator",
           "GENERATORS", "TaskGenerator", "catalog_kind"]
