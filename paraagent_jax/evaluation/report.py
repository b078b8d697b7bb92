"""Evaluation metrics, reports (markdown + JSON) and plots.

Everything here works on *episode records*: one flat dict per evaluated task,
as written by `paraagent_jax.evaluation.runner` (and by the rollout's episode
stats). The fields used are:

  benchmark, strategy, policy, kind, task_id, success (bool), turns, calls,
  calls_per_execute_step, phase_switches, explore_tokens, execute_tokens,
  parse_errors, tokens_generated, wall_time_s, step_reward_mean,
  phase_reward_mean, traj_reward, truncated.

Missing numeric fields are skipped in the means, so reports work for
benchmarks that do not produce every signal (e.g. BFCL has no phases).
"""

from __future__ import annotations

import collections
import json
import math
import os
from typing import Any, Iterable, Sequence

# The kinds whose gold DAG has several independent calls: where parallel acting pays.
MULTI_TOOL_KINDS = ("parallel", "fanout", "mixed")
KIND_ORDER = ("single", "parallel", "chain", "fanout", "mixed")
MEAN_FIELDS = (
    "turns", "calls", "calls_per_execute_step", "phase_switches",
    "explore_token_share", "parse_errors", "tokens_generated", "wall_time_s",
    "step_reward_mean", "phase_reward_mean", "traj_reward", "truncated")


def wilson_interval(successes: int, n: int, z: float = 1.959964) -> tuple[float, float]:
  """95% Wilson score interval for a binomial proportion (exact at the edges)."""
  if n == 0:
    return (0.0, 0.0)
  p = successes / n
  denom = 1.0 + z * z / n
  centre = (p + z * z / (2 * n)) / denom
  half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / denom
  return (max(0.0, centre - half), min(1.0, centre + half))


def _explore_share(r: dict[str, Any]) -> float | None:
  e, x = r.get("explore_tokens"), r.get("execute_tokens")
  if e is None or x is None or (e + x) == 0:
    return None
  return e / (e + x)


def summarise(records: Sequence[dict[str, Any]]) -> dict[str, Any]:
  """Success rate with its 95% CI and the means of the behavioural metrics."""
  n = len(records)
  wins = sum(bool(r.get("success")) for r in records)
  lo, hi = wilson_interval(wins, n)
  out: dict[str, Any] = {"n": n, "success": wins / n if n else 0.0,
                         "ci95": [lo, hi]}
  for field in MEAN_FIELDS:
    if field == "explore_token_share":
      vals = [_explore_share(r) for r in records]
    else:
      vals = [r.get(field) for r in records]
    vals = [float(v) for v in vals if v is not None]
    out[field] = sum(vals) / len(vals) if vals else None
  return out


def group_records(records: Iterable[dict[str, Any]],
                  keys: Sequence[str]) -> dict[tuple, list[dict[str, Any]]]:
  """Groups records by the given fields (in order of first appearance)."""
  groups: dict[tuple, list] = collections.OrderedDict()
  for r in records:
    groups.setdefault(tuple(r.get(k) for k in keys), []).append(r)
  return groups


def build_report(records: Sequence[dict[str, Any]]) -> dict[str, Any]:
  """The JSON report: per (benchmark, strategy, policy) overall, per kind, multi-tool.

  ``average`` is the unweighted mean of the per-kind success rates, the number
  papers report as "average success"; ``overall`` pools all tasks.
  """
  report: dict[str, Any] = {"runs": []}
  for (bench, strategy, policy), recs in group_records(
      records, ("benchmark", "strategy", "policy")).items():
    by_kind = group_records(recs, ("kind",))
    kinds = sorted((k[0] for k in by_kind),
                   key=lambda k: (KIND_ORDER.index(k) if k in KIND_ORDER else 99, str(k)))
    per_kind = {str(k): summarise(by_kind[(k,)]) for k in kinds}
    multi = [r for r in recs if r.get("kind") in MULTI_TOOL_KINDS]
    report["runs"].append({
        "benchmark": bench, "strategy": strategy, "policy": policy,
        "overall": summarise(recs),
        "average": (sum(v["success"] for v in per_kind.values()) / len(per_kind)
                    if per_kind else 0.0),
        "multi_tool": summarise(multi) if multi else None,
        "per_kind": per_kind,
    })
  return report


def _fmt(v: Any, pct: bool = False) -> str:
  if v is None:
    return "-"
  if pct:
    return f"{100 * v:.1f}"
  if isinstance(v, float):
    return f"{v:.2f}"
  return str(v)


def markdown_table(report: dict[str, Any]) -> str:
  """Renders the report as markdown: one row per run, success per kind and behaviour."""
  kinds: list[str] = []
  for run in report["runs"]:
    for k in run["per_kind"]:
      if k not in kinds:
        kinds.append(k)
  kinds.sort(key=lambda k: KIND_ORDER.index(k) if k in KIND_ORDER else 99)
  head = (["benchmark", "policy", "strategy", "n", "success % (95% CI)", "avg %"]
          + [f"{k} %" for k in kinds]
          + ["multi-tool %", "turns", "calls", "calls/exec step", "phase switches",
             "explore tok share", "parse errors", "tokens", "s/task"])
  lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
  for run in report["runs"]:
    o = run["overall"]
    ci = f"{_fmt(o['success'], True)} ({_fmt(o['ci95'][0], True)}-{_fmt(o['ci95'][1], True)})"
    row = [str(run["benchmark"]), str(run["policy"]), str(run["strategy"]), str(o["n"]), ci,
           _fmt(run["average"], True)]
    row += [_fmt(run["per_kind"][k]["success"], True) if k in run["per_kind"] else "-"
            for k in kinds]
    mt = run["multi_tool"]
    row += [_fmt(mt["success"], True) if mt else "-", _fmt(o["turns"]), _fmt(o["calls"]),
            _fmt(o["calls_per_execute_step"]), _fmt(o["phase_switches"]),
            _fmt(o["explore_token_share"]), _fmt(o["parse_errors"]),
            _fmt(o["tokens_generated"]), _fmt(o["wall_time_s"])]
    lines.append("| " + " | ".join(row) + " |")
  return "\n".join(lines) + "\n"


def write_report(records: Sequence[dict[str, Any]], workdir: str,
                 name: str = "report", plots: bool = True) -> dict[str, str]:
  """Writes ``{name}.json``, ``{name}.md`` and the PNG plots; returns their paths."""
  os.makedirs(workdir, exist_ok=True)
  report = build_report(records)
  paths = {"json": os.path.join(workdir, f"{name}.json"),
           "markdown": os.path.join(workdir, f"{name}.md")}
  tmp = paths["json"] + ".tmp"
  with open(tmp, "w") as f:
    json.dump(report, f, indent=1)
  os.replace(tmp, paths["json"])
  with open(paths["markdown"], "w") as f:
    f.write(markdown_table(report))
  if plots:
    paths.update(write_plots(records, report, workdir, name))
  return paths


def write_plots(records: Sequence[dict[str, Any]], report: dict[str, Any],
                workdir: str, name: str = "report") -> dict[str, str]:
  """Success by kind and strategy; turns vs success; calls-per-step histogram."""
  import matplotlib  # pylint: disable=g-import-not-at-top
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt  # pylint: disable=g-import-not-at-top

  def _save(fig, path):
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path

  out = {}
  runs = report["runs"]
  kinds = [k for k in KIND_ORDER if any(k in r["per_kind"] for r in runs)]
  fig, ax = plt.subplots(figsize=(max(6, 1.6 * len(kinds) + 2), 4))
  width = 0.8 / max(1, len(runs))
  for i, run in enumerate(runs):
    ys = [100 * run["per_kind"][k]["success"] if k in run["per_kind"] else 0 for k in kinds]
    ax.bar([j + i * width for j in range(len(kinds))], ys, width,
           label=f"{run['policy']}/{run['strategy']} ({run['benchmark']})")
  ax.set_xticks([j + 0.4 - width / 2 for j in range(len(kinds))], kinds)
  ax.set_ylabel("success %")
  ax.set_ylim(0, 105)
  ax.legend(fontsize=7)
  ax.set_title("Success by task kind and strategy")
  out["plot_success"] = _save(fig, os.path.join(workdir, f"{name}_success_by_kind.png"))

  fig, ax = plt.subplots(figsize=(5, 4))
  for run in runs:
    ax.scatter([run["overall"]["turns"] or 0], [100 * run["overall"]["success"]],
               label=f"{run['policy']}/{run['strategy']}")
  ax.set_xlabel("mean turns per task")
  ax.set_ylabel("success %")
  ax.legend(fontsize=7)
  ax.set_title("Turns vs success")
  out["plot_turns"] = _save(fig, os.path.join(workdir, f"{name}_turns_vs_success.png"))

  fig, ax = plt.subplots(figsize=(5, 4))
  for (policy, strategy), recs in group_records(records, ("policy", "strategy")).items():
    vals = [c for r in recs for c in r.get("calls_per_step", [])]
    if vals:
      ax.hist(vals, bins=range(0, max(vals) + 2), alpha=0.5, label=f"{policy}/{strategy}")
  ax.set_xlabel("calls per execute step")
  ax.set_ylabel("steps")
  ax.legend(fontsize=7)
  ax.set_title("Calls per execute step")
  out["plot_calls"] = _save(fig, os.path.join(workdir, f"{name}_calls_per_step.png"))
  return out


def compare_reports(paths: Sequence[str]) -> str:
  """Puts the runs of several JSON reports side by side in one markdown table."""
  merged: dict[str, Any] = {"runs": []}
  for p in paths:
    with open(p) as f:
      merged["runs"].extend(json.load(f)["runs"])
  return markdown_table(merged)
