"""BFCL and StableToolBench through the ParaAct rollout, for any policy.

Both benchmarks are fixed task sets run as ToolEnv episodes
(`toolenv.benchmarks.fixed_env.FixedTaskEnv`) by the same rollout, policies
and strategies as the ToolEnv benchmark, and scored by their own rule:

* ``bfcl-open`` / ``bfcl-closed``: every BFCL function pooled into one catalog
  the agent must search, or the task's own functions given in the prompt;
  the catalog calls the agent made are scored by our BFCL-rule checker
  (`toolenv.benchmarks.bfcl`).
* ``stabletoolbench-open`` / ``-closed``: StableToolBench queries on the
  simulated tool directory, with judge-free metrics
  (`toolenv.benchmarks.stabletoolbench`).

``make_policy(strategy, plan_fn, catalog=)`` builds the policy: for the
scripted oracle ``plan_fn(task)`` gives its steps (the benchmarks' own oracle
plans); model and API policies ignore it. The API policy takes the schemas
of the tools it is given from ``catalog``.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any, Callable, Sequence

from paraagent_jax.evaluation import runner
from paraagent_jax.paraact import policies
from toolenv.catalog import bfcl as bfcl_cat
import toolenv
from toolenv.benchmarks import bfcl as bfcl_bench
from toolenv.benchmarks import fixed_env
from toolenv.benchmarks import stabletoolbench as stb


class PlanOraclePolicy(policies.OraclePolicy):
  """The scripted oracle replaying ``plan_fn(task)`` through the text protocol."""

  def __init__(self, fmt, plan_fn: Callable[[Any], list], strategy: str = "paraact"):
    super().__init__(fmt, strategy=strategy)
    self.plan_fn = plan_fn

  def reset(self, num_episodes, tasks, seed=0):
    del seed
    self._plans = [self.plan_fn(t) for t in tasks]
    self._turn = [0] * num_episodes


def _run_sets(sets, scorer, make_policy, fmt_for, *, benchmark: str,
              strategies: Sequence[str], policy_name: str, workdir: str,
              rollout_config, batch_size: int, plan_fn, seed: int = 0,
              log: Callable[[str], None] = print) -> list[dict[str, Any]]:
  records = []
  for strategy in strategies:
    env = fixed_env.FixedTaskEnv(
        sets.catalog, max(1, min(batch_size, len(sets.tasks) or 1)),
        scorer=functools.partial(scorer, sets), given=sets.given,
        **toolenv.oracle.env_options(strategy))
    policy = make_policy(strategy, functools.partial(plan_fn, strategy=strategy),
                         catalog=sets.catalog)
    records += runner.run_tasks(policy, fmt_for(strategy), env, sets.tasks,
                                benchmark=benchmark, strategy=strategy,
                                policy_name=policy_name, workdir=workdir,
                                rollout_config=rollout_config, batch_size=batch_size,
                                seed=seed, fields={"setting": sets.setting}, log=log)
  return records


def bfcl_entries(source: str, categories: Sequence[str] = (), limit: int = 0):
  """Solvable BFCL entries of ``categories`` (default: all), ``limit`` per category.

  Entries whose possible answers contradict their own docs (`bfcl.unsolvable`)
  are left out, as BFCL's checker rejects every answer to them.
  """
  cats = tuple(categories) or bfcl_cat.CATEGORIES
  entries = bfcl_cat.load_entries(source or bfcl_cat.default_source(), cats)
  bad = set(bfcl_bench.unsolvable(entries))
  entries = [e for e in entries if e.id not in bad]
  if limit:
    per: dict[str, int] = {}
    kept = []
    for e in entries:
      per[e.category] = per.get(e.category, 0) + 1
      if per[e.category] <= limit:
        kept.append(e)
    entries = kept
  return entries


def run_bfcl(make_policy, fmt_for, entries, *, settings: Sequence[str] = ("open", "closed"),
             strategies: Sequence[str], policy_name: str, workdir: str, rollout_config,
             batch_size: int = 32, seed: int = 0,
             log: Callable[[str], None] = print) -> list[dict[str, Any]]:
  """BFCL entries under each setting and strategy; records scored by the checker."""
  records = []
  for setting in settings:
    sets = bfcl_bench.env_tasks(entries, setting)
    plan = lambda task, strategy, setting=setting: bfcl_bench.oracle_steps(
        task, strategy, setting)
    records += _run_sets(sets, bfcl_bench.score_episode, make_policy, fmt_for,
                         benchmark=f"bfcl-{setting}", strategies=strategies,
                         policy_name=policy_name, workdir=workdir,
                         rollout_config=rollout_config, batch_size=batch_size,
                         plan_fn=plan, seed=seed, log=log)
  return records


def run_stabletoolbench(make_policy, fmt_for, query_files, tools_dir: str, *,
                        settings: Sequence[str] = ("open",), strategies: Sequence[str],
                        policy_name: str, workdir: str, rollout_config,
                        batch_size: int = 32, limit: int = 0, seed: int = 0,
                        log: Callable[[str], None] = print) -> list[dict[str, Any]]:
  """StableToolBench queries under each setting and strategy (judge-free metrics)."""
  records = []
  for setting in settings:
    sets = stb.env_tasks(query_files, tools_dir, setting, limit=limit)
    records += _run_sets(sets, stb.score_episode, make_policy, fmt_for,
                         benchmark=f"stabletoolbench-{setting}", strategies=strategies,
                         policy_name=policy_name, workdir=workdir,
                         rollout_config=rollout_config, batch_size=batch_size,
                         plan_fn=functools.partial(_stb_plan, setting=setting),
                         seed=seed, log=log)
  return records


def _stb_plan(task, strategy, setting):
  """The oracle's steps; with the APIs given (closed) it does not search."""
  steps = toolenv.oracle.solve(task, strategy)
  if setting == "open":
    return steps
  out = []
  for s in steps:
    if s.phase == "execute":
      s = dataclasses.replace(s, calls=[c for c in s.calls
                                        if c.name not in toolenv.schema.META_TOOLS])
    if s.phase != "explore" and (s.phase == "answer" or s.calls):
      out.append(s)
  return out
