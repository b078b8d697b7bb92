"""ToolEnv: a deterministic, vectorised open-world tool simulator (pure Python).

    import toolenv
    cat = toolenv.load_catalog("procedural", seed=0)     # 50,011 tools
    gen = toolenv.TaskGenerator(cat, seed=0)
    tasks = gen.generate(100, split="test", kinds=("parallel", "chain"))
    env = toolenv.VectorToolEnv(cat, num_envs=len(tasks))
    observations = env.reset(tasks)
    steps = toolenv.oracle.solve(tasks[0], strategy="paraact")

Layer: pure Python (stdlib, numpy; bm25s for search and PyYAML for YAML
specs, both imported when first needed). Never JAX, nothing from the ParaAgent
policy package: the policy is somebody else's business; it imports toolenv,
never the reverse. Modules, from the top down (each imports only ones below):

    demo                        command-line demo
    benchmarks/                 BFCL and StableToolBench adapters, fixed-tool env
    env                         the vectorised env
    diagnosis                   failure causes and behaviour counts of an episode
    oracle                      scripted oracle episodes
    tasks/                      task generators (procedural, OpenAPI) and `Task`
    executor | search | rewards the simulator; BM25 tool search; reward signals
    validation                  argument checks, structured errors, call keys
    values                      canonical JSON, hashes, values drawn from schemas
    catalog/                    catalogs, their builders and cache
    schema                      `Tool`, `Call`, `Step`, `StepResult`, `EpisodeRewards`

(``a | b``: neither imports the other.)
"""

from toolenv import diagnosis, oracle, rewards
from toolenv.catalog import Catalog, load_catalog, register_builder
from toolenv.env import ToolEnv, VectorToolEnv
from toolenv.executor import Executor
from toolenv.rewards import RewardConfig
from toolenv.schema import Call, EpisodeRewards, Step, StepResult, Tool
from toolenv.search import SearchIndex
from toolenv.tasks import KINDS, MULTI_TOOL_KINDS, Task, TaskGenerator

__all__ = ["Catalog", "load_catalog", "register_builder", "Call", "Step",
           "StepResult", "EpisodeRewards", "Tool", "SearchIndex", "Executor", "ToolEnv",
           "VectorToolEnv", "RewardConfig", "Task", "TaskGenerator", "KINDS",
           "MULTI_TOOL_KINDS", "diagnosis", "oracle", "rewards"]
