"""ToolEnv: a deterministic, vectorised open-world tool simulator (pure Python).

    import toolenv
    cat = toolenv.load_catalog("procedural", seed=0)     # 50,011 tools
    gen = toolenv.TaskGenerator(cat, seed=0)
    tasks = gen.generate(100, split="test", kinds=("parallel", "chain"))
    env = toolenv.VectorToolEnv(cat, num_envs=len(tasks))
    observations = env.reset(tasks)
    steps = toolenv.oracle.solve(tasks[0], strategy="paraact")

No JAX here: the policy is somebody else's business.
"""

from toolenv import oracle, rewards
from toolenv.catalog import Catalog, load_catalog, register_builder
from toolenv.env import ToolEnv, VectorToolEnv
from toolenv.executor import Executor
from toolenv.rewards import RewardConfig
from toolenv.schema import Call, Step, StepResult, Tool
from toolenv.search import SearchIndex
from toolenv.tasks import KINDS, MULTI_TOOL_KINDS, Task, TaskGenerator

__all__ = ["Catalog", "load_catalog", "register_builder", "Call", "Step",
           "StepResult", "Tool", "SearchIndex", "Executor", "ToolEnv",
           "VectorToolEnv", "RewardConfig", "Task", "TaskGenerator", "KINDS",
           "MULTI_TOOL_KINDS", "oracle", "rewards"]
