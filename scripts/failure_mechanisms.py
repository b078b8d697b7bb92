r"""Counts the copying and binding errors behind the multi-tool failure causes.

`toolenv.diagnosis` names one cause per failed episode; this script looks one
level further into ToolEnv evaluation records (docs/records/rl_robustness.md, section 1):

* calls of tool names that do not exist, split by how the name was made: the
  provider of one sub-goal joined to the operation of another sub-goal's gold
  tool (a swap), a provider of the task with an operation it lacks, the right
  operation with a provider not in the task, anything else;
* failed fanout episodes that answered, and how many of those answers repeat
  a value where the gold values differ (the copy went on from the latest
  repeated key);
* fanout calls of the needed tool with an id argument that is not one of the
  ids the policy observed (a corrupted copy).

    python scripts/failure_mechanisms.py --records=W/records/toolenv-procedural-demo_sft-paraact.jsonl \
        --task_seed=4242 [--num_per_kind=40] [--catalog=procedural]

``--records`` may repeat, each with its own ``--task_seed`` (same order).
"""

from __future__ import annotations

import argparse
import collections
import os
import re
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

# pylint: disable=g-import-not-at-top,wrong-import-position
import toolenv
from paraagent_jax.evaluation import heldout
from paraagent_jax.evaluation import runner
from paraagent_jax.paraact import strategies

ID_RE = re.compile(r"\b[a-z]{3}-[0-9a-f]{6}\b")      # the catalog's record ids
ARG_ID_RE = re.compile(r"[a-z]{3}-[0-9a-f]+")         # an argument written like one


def unknown_tool_kind(name: str, task, catalog) -> str:
  """How a non-existent tool name relates to the task's gold tools."""
  if "_" not in name:
    return "other"
  prov, op = name.split("_", 1)
  gold = task.gold_tools
  providers = {catalog[g].provider.lower() for g in gold}
  ops = {g.split("_", 1)[1]: g for g in gold}
  if prov in providers and op in ops and not ops[op].startswith(prov + "_"):
    return "swap: one sub-goal's provider + another's operation"
  if prov in providers:
    return "a task provider + an operation it lacks"
  if op in ops:
    return "the right operation + a provider not in the task"
  return "other"


def answer_values(answer: str) -> list[str]:
  """The values of a JSON-style answer (``"key": value; ...``)."""
  return [v.strip() for v in re.findall(r'":\s*("[^"]*"|[^;<]+)', answer or "")]


def count(records, tasks, catalog, parse_step) -> dict[str, collections.Counter]:
  by_id = {t.id: t for t in tasks}
  unknown, fanout = collections.Counter(), collections.Counter()
  for r in records:
    task = by_id[r["task_id"]]
    observed_ids: set[str] = set(ID_RE.findall(task.instruction))
    for turn in r.get("transcript", []):
      if turn["role"] == "observation":
        observed_ids |= set(ID_RE.findall(turn["text"]))   # before the next turn's calls
      if turn["role"] != "assistant":
        continue
      step = parse_step(turn["text"])
      if step.phase != "execute" or not isinstance(step.calls, list):
        continue
      for call in step.calls:
        name = call.name if isinstance(call.name, str) else ""
        if catalog.get(name) is None:
          unknown[unknown_tool_kind(name, task, catalog)] += 1
        elif task.kind == "fanout" and isinstance(call.arguments, dict):
          for v in call.arguments.values():
            if isinstance(v, str) and ARG_ID_RE.fullmatch(v):
              fanout["fanout id arguments"] += 1
              if v not in observed_ids:
                fanout["... not an id the policy had observed (corrupted copy)"] += 1
    if task.kind == "fanout" and not r.get("success"):
      gold = [a["value"] for a in task.answers]
      vals = answer_values(r.get("answer") or "")
      if vals:
        fanout["fanout failed episodes that answered"] += 1
        if len(vals) != len(set(vals)) and len(set(gold)) == len(gold):
          fanout["... repeating a value where the gold values differ"] += 1
  return {"unknown tool names": unknown, "fanout": fanout}


def main(argv=None) -> int:
  ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  ap.add_argument("--records", action="append", required=True)
  ap.add_argument("--task_seed", action="append", type=int, required=True)
  ap.add_argument("--num_per_kind", type=int, default=40)
  ap.add_argument("--catalog", default="procedural")
  ap.add_argument("--strategy", default="paraact")
  a = ap.parse_args(argv)
  if len(a.records) != len(a.task_seed):
    ap.error("give one --task_seed per --records")
  catalog = toolenv.load_catalog(a.catalog, seed=0)
  parse = strategies.get_strategy(a.strategy).parse_step
  total: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
  for path, seed in zip(a.records, a.task_seed):
    tasks = heldout.HeldOut(heldout.HeldOutSpec(num_tasks=5 * a.num_per_kind, task_seed=seed),
                            catalog=catalog).tasks
    got = count(runner.read_records(path), tasks, catalog, parse)
    print(f"{path} (task seed {seed}):")
    for group, c in got.items():
      total[group].update(c)
      for k, v in sorted(c.items(), key=lambda kv: -kv[1]):
        print(f"  {group}: {k}: {v}")
  if len(a.records) > 1:
    print("all files:")
    for group, c in total.items():
      for k, v in sorted(c.items(), key=lambda kv: -kv[1]):
        print(f"  {group}: {k}: {v}")
  return 0


if __name__ == "__main__":
  sys.exit(main())
