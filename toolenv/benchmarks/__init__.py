"""Benchmark adapters that score agents by a benchmark's own rules.

    bfcl             BFCL tasks (closed and open-world), BFCL's AST rules, perturbations
    stabletoolbench  StableToolBench tasks on the ToolBench catalog, judge-free metrics
    fixed_env        a `ToolEnv` over a fixed tool set (one episode per benchmark task)

Layer: the top of toolenv (below only `toolenv.demo` and the package itself):
may import every other toolenv module (catalog, values, executor, search,
rewards, tasks, env, oracle, schema); nothing in toolenv imports it. Pure
Python: never JAX, nothing from the ParaAgent policy package.
"""
