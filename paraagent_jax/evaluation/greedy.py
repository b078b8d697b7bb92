"""Greedy held-out evaluation of a policy on ToolEnv tasks, and its summaries.

`greedy_eval` runs a policy at temperature 0 through the ParaAct rollout on a
list of tasks and returns success per task kind, multi-tool success, mean
turns and calls per execute step (`summarize`); with ``per_task`` it also
collects one record per task, which `evaluation.paired` compares across
runs. `behaviour_table` puts a policy's turns and calls per execute step next
to the oracle's plan of the same tasks. The SFT and RL stages and
``paraagent_jax.evaluate`` share these.
"""

from __future__ import annotations

import collections
from typing import Sequence

import toolenv
from paraagent_jax import fileio
from paraagent_jax.paraact import rollout


# The failure cause and behaviour counts of `toolenv.diagnosis` a per-task
# record keeps (`evaluation.causes` tabulates them).
DIAGNOSIS_KEYS = frozenset(
    ["cause", "cause_detail"]
    + [k for k in toolenv.diagnosis.BEHAVIOUR_FIELDS
       if k not in ("turns", "calls_per_execute_step", "phase_switches")]
    + [f"oracle_{k}" for k in toolenv.diagnosis.BEHAVIOUR_FIELDS])


def rollout_config(rl) -> rollout.RolloutConfig:
  """The rollout limits of ``config.rl`` (turns, tokens per turn, length)."""
  return rollout.RolloutConfig(max_turns=rl.max_turns, max_turn_tokens=rl.max_turn_tokens,
                               max_len=rl.max_len, max_obs_tokens=rl.max_obs_tokens)


def greedy_eval(policy, fmt, catalog, tasks, rcfg, strategy: str = "paraact",
                seed: int = 0, obs_format: str = "full",
                per_task: list | None = None) -> dict[str, float]:
  """Greedy success per task kind (and overall), turns, calls per execute step.

  ``obs_format``: ToolEnv's observation format (``config.data.obs_format``,
  the one the demonstrations were built with). ``per_task``: if a list, one
  record per task is appended (``task_id``, ``kind``, ``success``,
  ``turns``), for paired comparisons (`evaluation.paired`).
  """
  env = toolenv.VectorToolEnv(catalog, num_envs=len(tasks), obs_format=obs_format,
                              **toolenv.oracle.env_options(strategy))
  temp = policy.temperature
  policy.temperature = 0.0
  try:
    res = rollout.run_rollout(policy, env, tasks, fmt, rcfg, seed=seed)
  finally:
    policy.temperature = temp
  if per_task is not None:
    per_task.extend({"task_id": t.id, "kind": t.kind, "success": bool(e["success"]),
                     "turns": int(e["turns"]),
                     "calls_per_step": [int(n) for n in e.get("calls_per_step", [])],
                     "calls_per_execute_step": e.get("calls_per_execute_step", 0.0),
                     "phase_switches": e.get("phase_switches", 0),
                     "parse_errors": e.get("parse_errors", 0),
                     **{k: v for k, v in e.items() if k in DIAGNOSIS_KEYS},
                     "transcript": e.get("transcript", [])}
                    for t, e in zip(tasks, res.episodes))
  return summarize(tasks, res.episodes)


def behaviour_by_kind(records: Sequence[dict]) -> dict[str, tuple[float, float]]:
  """``{kind: (mean turns, calls per execute step)}`` of per-task records
  (``turns``, ``calls_per_step``: calls of each execute step)."""
  by = collections.defaultdict(list)
  for r in records:
    by[r["kind"]].append(r)
  out = {}
  for k, rs in sorted(by.items()):
    calls = [n for r in rs for n in r.get("calls_per_step", [])]
    out[k] = (sum(r["turns"] for r in rs) / len(rs), sum(calls) / max(1, len(calls)))
  return out


def oracle_records(tasks, strategy: str = "paraact") -> list[dict]:
  """Per-task records of the oracle's plan (`toolenv.oracle.solve`) of ``tasks``."""
  out = []
  for t in tasks:
    steps = toolenv.oracle.solve(t, strategy)
    out.append({"task_id": t.id, "kind": t.kind, "success": True, "turns": len(steps),
                "calls_per_step": [len(s.calls) for s in steps if s.phase == "execute"]})
  return out


def behaviour_table(policy_records: Sequence[dict], oracle_recs: Sequence[dict]) -> list[str]:
  """Markdown: mean turns and calls per execute step per kind, policy and oracle."""
  pol, orc = behaviour_by_kind(policy_records), behaviour_by_kind(oracle_recs)
  lines = ["| kind | turns (policy) | turns (oracle) | calls per execute step (policy) "
           "| calls per execute step (oracle) |", "|---|---|---|---|---|"]
  for k in sorted(set(pol) | set(orc)):
    p, o = pol.get(k, (float("nan"),) * 2), orc.get(k, (float("nan"),) * 2)
    lines.append(f"| {k} | {p[0]:.2f} | {o[0]:.2f} | {p[1]:.2f} | {o[1]:.2f} |")
  return lines


def write_per_task(path: str, records: Sequence[dict]) -> None:
  """Per-task evaluation records as JSON lines, atomically."""
  fileio.write_jsonl_atomic(path, records)


def summarize(tasks, episodes) -> dict[str, float]:
  """Success per kind, multi-tool success, mean turns and calls per execute step."""
  by = collections.defaultdict(list)
  for t, e in zip(tasks, episodes):
    by[t.kind].append(float(e["success"]))
  out = {f"success_{k}": sum(v) / len(v) for k, v in sorted(by.items())}
  out["success"] = sum(float(e["success"]) for e in episodes) / max(1, len(episodes))
  multi = [float(e["success"]) for t, e in zip(tasks, episodes)
           if t.kind in toolenv.MULTI_TOOL_KINDS]
  if multi:
    out["success_multi_tool"] = sum(multi) / len(multi)
  out["turns"] = sum(e["turns"] for e in episodes) / max(1, len(episodes))
  per_step = [n for e in episodes for n in e.get("calls_per_step", [])]
  out["calls_per_execute_step"] = sum(per_step) / max(1, len(per_step))
  return out
