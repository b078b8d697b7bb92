"""Evaluation metrics, reports (markdown + JSON) and plots.

Everything here works on *episode records*: one flat dict per evaluated task,
as written by `paraagent_jax.evaluation.runner` (and by the rollout's episode
stats). The fields used are:

  benchmark, strategy, policy, kind, task_id, success (bool), turns, calls,
  calls_per_step (list), calls_per_execute_step, phase_switches,
  explore_tokens, execute_tokens, parse_errors (malformed steps), calls_dropped,
  json_errors, unknown_tool_calls (means per episode), tokens_generated,
  wall_time_s (the episode's latency within its batch), wall_per_task_s
  (batch wall time / tasks in it), step_reward_mean, phase_reward_mean,
  traj_reward, truncated; and, from the fixed-task benchmarks, finished,
  api_recall, found_recall (StableToolBench), bfcl_calls, reason (BFCL).

Missing numeric fields are skipped in the means, so reports work for
benchmarks that do not produce every signal. Token shares are of the tokens
written in explore and execute steps (answer and malformed steps excluded).
"""

from __future__ import annotations

import collections
import io
import math
import os
from typing import Any, Iterable, Sequence

# A Figure without pyplot: renders to files, never touches the global backend
# (a notebook importing this keeps its inline plots).
from matplotlib.figure import Figure
from matplotlib.ticker import MaxNLocator

from paraagent_jax import fileio
from paraagent_jax import provenance
from paraagent_jax.evaluation import causes as causes_lib
from paraagent_jax.evaluation import runner
from toolenv.benchmarks import stabletoolbench

# The kinds whose gold DAG has several independent calls: where parallel acting
# pays (one definition, `toolenv.MULTI_TOOL_KINDS`; docs/evaluation.md).
MULTI_TOOL_KINDS = causes_lib.MULTI_TOOL_KINDS


def is_multi_tool(benchmark: Any, kind: Any) -> bool:
  """Whether a task kind needs several independent calls.

  ToolEnv: parallel, fanout, mixed. BFCL: the parallel categories
  (parallel, parallel_multiple, live_parallel, live_parallel_multiple).
  StableToolBench's groups say where tools come from, not how many calls
  are independent, so none is counted.
  """
  fam = str(benchmark).split("-", 1)[0]
  if fam == "bfcl":
    return "parallel" in str(kind)
  if fam == "stabletoolbench":
    return False
  return kind in MULTI_TOOL_KINDS
KIND_ORDER = ("single", "parallel", "chain", "fanout", "mixed")
MEAN_FIELDS = (
    "turns", "calls", "calls_per_execute_step", "phase_switches",
    "explore_token_share", "execute_token_share", "parse_errors", "calls_dropped",
    "json_errors", "unknown_tool_calls", "tokens_generated",
    "wall_time_s", "wall_per_task_s", "step_reward_mean", "phase_reward_mean",
    "traj_reward", "truncated", "finished", "api_recall", "found_recall")
# What a benchmark's numbers can and cannot be compared with (report notes).
NOTES = {
    "toolenv": "ToolEnv: held-out test split (unseen providers); success = every gold "
               "value in the answer (+ gold final state for write tasks). No published "
               "numbers exist for it: compare runs of this harness only.",
    "bfcl": "BFCL: scored by our BFCL-rule AST checker (agrees with bfcl-eval's "
            "ast_checker on gold and perturbed answers); categories are BFCL's, but the "
            "agent acts multi-turn in ToolEnv (every catalog call it makes is its answer, "
            "schema errors are shown to it) and, open-world, must first search the pooled "
            "functions; so bfcl-closed is close to, not equal to, BFCL's leaderboard AST "
            "accuracy, and bfcl-open has no published counterpart.",
}


def wilson_interval(successes: int, n: int, z: float = 1.959964) -> tuple[float, float]:
  """95% Wilson score interval for a binomial proportion (exact at the edges)."""
  if n == 0:
    return (0.0, 0.0)
  p = successes / n
  denom = 1.0 + z * z / n
  centre = (p + z * z / (2 * n)) / denom
  half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / denom
  return (max(0.0, centre - half), min(1.0, centre + half))


def _token_share(r: dict[str, Any], which: str) -> float | None:
  e, x = r.get("explore_tokens"), r.get("execute_tokens")
  if e is None or x is None or (e + x) == 0:
    return None
  return (e if which == "explore" else x) / (e + x)


def average_interval(per_kind: dict[str, dict[str, Any]],
                     z: float = 1.959964) -> tuple[float, float]:
  """95% CI of the unweighted mean of per-kind success rates.

  Kinds are independent samples, so Var(mean) = sum_k p_k (1 - p_k) / n_k / K^2
  (normal approximation, clipped to [0, 1]); with a rate of 0 or 1 in every
  kind the interval is that point.
  """
  ks = [v for v in per_kind.values() if v["n"]]
  if not ks:
    return (0.0, 0.0)
  mean = sum(v["success"] for v in ks) / len(ks)
  var = sum(v["success"] * (1 - v["success"]) / v["n"] for v in ks) / len(ks) ** 2
  half = z * math.sqrt(var)
  return (max(0.0, mean - half), min(1.0, mean + half))


def summarise(records: Sequence[dict[str, Any]]) -> dict[str, Any]:
  """Success rate with its 95% CI and the means of the behavioural metrics."""
  n = len(records)
  wins = sum(bool(r.get("success")) for r in records)
  lo, hi = wilson_interval(wins, n)
  out: dict[str, Any] = {"n": n, "success": wins / n if n else 0.0,
                         "ci95": [lo, hi]}
  for field in MEAN_FIELDS:
    if field in ("explore_token_share", "execute_token_share"):
      vals = [_token_share(r, field.split("_")[0]) for r in records]
    else:
      vals = [r.get(field) for r in records]
    vals = [float(v) for v in vals if v is not None]
    out[field] = sum(vals) / len(vals) if vals else None
  # The parse failures as counts too (the means above are per episode).
  out["parse_failure_totals"] = runner.parse_failures(records)
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
    multi = [r for r in recs if is_multi_tool(bench, r.get("kind"))]
    report["runs"].append({
        "benchmark": bench, "strategy": strategy, "policy": policy,
        "overall": summarise(recs),
        "average": (sum(v["success"] for v in per_kind.values()) / len(per_kind)
                    if per_kind else 0.0),
        "average_ci95": list(average_interval(per_kind)),
        "multi_tool": summarise(multi) if multi else None,
        "per_kind": per_kind,
        # Failure causes and behaviour next to the oracle's plan (ToolEnv
        # records; None for benchmarks without a diagnosis).
        "analysis": causes_lib.summary(recs),
    })
  report["notes"] = notes_for(r["benchmark"] for r in report["runs"])
  report["transcripts"] = example_transcripts(records)
  report["machine"] = provenance.machine()
  return report


def example_transcripts(records: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
  """One solved and one failed episode per (benchmark, strategy, policy, kind),
  where they exist and carry a transcript (records from before transcripts
  were recorded have none)."""
  out = []
  for (bench, strategy, policy, kind), recs in group_records(
      records, ("benchmark", "strategy", "policy", "kind")).items():
    for solved in (True, False):
      r = next((r for r in recs if bool(r.get("success")) == solved
                and r.get("transcript")), None)
      if r is not None:
        out.append({"benchmark": bench, "strategy": strategy, "policy": policy,
                    "kind": kind, "task_id": r.get("task_id"), "success": solved,
                    "transcript": r["transcript"]})
  return out


def format_transcript(example: dict[str, Any], max_chars: int = 800) -> str:
  """A transcript as plain text: a header, then each turn with its role
  (long turns cut to ``max_chars``; 0 = whole)."""
  head = (f"{example.get('benchmark')} / {example.get('policy')} / "
          f"{example.get('strategy')} / {example.get('kind')} / task "
          f"{example.get('task_id')}: {'solved' if example.get('success') else 'failed'}")
  lines = [head]
  for turn in example.get("transcript") or []:
    text = str(turn.get("text", ""))
    if max_chars and len(text) > max_chars:
      text = text[:max_chars] + f" [... {len(text) - max_chars} more characters]"
    lines.append(f"[{turn.get('role')}] {text}")
  return "\n".join(lines)


def notes_for(benchmarks: Iterable[Any]) -> dict[str, str]:
  """The comparability notes of the benchmark families present."""
  out = {}
  for b in benchmarks:
    fam = str(b).split("-", 1)[0]
    if fam == "stabletoolbench":
      out[fam] = stabletoolbench.NOT_COMPARABLE
    elif fam in NOTES:
      out[fam] = NOTES[fam]
  return out


def _fmt(v: Any, pct: bool = False) -> str:
  if v is None:
    return "-"
  if pct:
    return f"{100 * v:.1f}"
  if isinstance(v, float):
    return f"{v:.2f}"
  return str(v)


def _ci(lo_hi) -> str:
  return f"{_fmt(lo_hi[0], True)}-{_fmt(lo_hi[1], True)}"


def _kinds(runs) -> list[str]:
  kinds: list[str] = []
  for run in runs:
    for k in run["per_kind"]:
      if k not in kinds:
        kinds.append(k)
  return sorted(kinds, key=lambda k: (KIND_ORDER.index(k) if k in KIND_ORDER else 99, k))


def _run_table(runs) -> list[str]:
  """The main table of runs that share a benchmark."""
  kinds = _kinds(runs)
  extra = [f for f in ("finished", "api_recall", "found_recall")
           if any(r["overall"].get(f) is not None for r in runs)]
  head = (["benchmark", "policy", "strategy", "n", "success % (95% CI)",
           "avg % (95% CI)"] + [f"{k} %" for k in kinds]
          + ["multi-tool %", "turns", "calls", "calls/exec step", "phase switches",
             "explore tok share", "execute tok share", "parse errors", "calls dropped",
             "JSON errors", "unknown tools", "tokens",
             "s/task", "step r", "phase r", "traj r"]
          + [{"finished": "finish %", "api_recall": "API recall %",
              "found_recall": "found recall %"}[f] for f in extra])
  lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
  for run in runs:
    o = run["overall"]
    avg_ci = run.get("average_ci95")
    row = [str(run["benchmark"]), str(run["policy"]), str(run["strategy"]), str(o["n"]),
           f"{_fmt(o['success'], True)} ({_ci(o['ci95'])})",
           _fmt(run["average"], True) + (f" ({_ci(avg_ci)})" if avg_ci else "")]
    row += [_fmt(run["per_kind"][k]["success"], True) if k in run["per_kind"] else "-"
            for k in kinds]
    mt = run["multi_tool"]
    row += [_fmt(mt["success"], True) if mt else "-", _fmt(o["turns"]), _fmt(o["calls"]),
            _fmt(o["calls_per_execute_step"]), _fmt(o["phase_switches"]),
            _fmt(o["explore_token_share"]), _fmt(o.get("execute_token_share")),
            _fmt(o["parse_errors"]), _fmt(o.get("calls_dropped")), _fmt(o.get("json_errors")),
            _fmt(o.get("unknown_tool_calls")), _fmt(o["tokens_generated"]),
            _fmt(o.get("wall_per_task_s") if o.get("wall_per_task_s") is not None
                 else o["wall_time_s"]),
            _fmt(o["step_reward_mean"]), _fmt(o["phase_reward_mean"]),
            _fmt(o["traj_reward"])]
    row += [_fmt(o.get(f), True) for f in extra]
    lines.append("| " + " | ".join(row) + " |")
  return lines


def _per_kind_table(runs, cell) -> list[str]:
  """One row per run, one column per kind; ``cell(per_kind_summary)``."""
  kinds = _kinds(runs)
  lines = ["| benchmark | policy | strategy | " + " | ".join(kinds) + " |",
           "|" + "---|" * (3 + len(kinds))]
  for run in runs:
    cells = [cell(run["per_kind"][k]) if run["per_kind"].get(k) else "-" for k in kinds]
    lines.append(f"| {run['benchmark']} | {run['policy']} | {run['strategy']} | "
                 + " | ".join(cells) + " |")
  return lines


def _kind_table(runs) -> list[str]:
  """n and success with its Wilson CI per kind."""
  return _per_kind_table(
      runs, lambda v: f"{v['n']}: {_fmt(v['success'], True)} ({_ci(v['ci95'])})")


def _kind_behaviour_table(runs) -> list[str]:
  """Mean turns and calls per execute step per kind, one row per run (a
  trained policy next to the oracle when both are in the report)."""
  return _per_kind_table(
      runs, lambda v: f"{_fmt(v.get('turns'))} / {_fmt(v.get('calls_per_execute_step'))}")


def markdown_table(report: dict[str, Any], transcripts: bool = True) -> str:
  """Renders the report as markdown.

  Per benchmark, a main table (one row per run: success with its 95% CI, the
  per-kind average with its CI, success per kind, multi-tool kinds pooled,
  the behaviour means and the three reward levels); then a per-kind table
  for all runs (n and success with Wilson CI), one of mean turns and calls
  per execute step per kind; per run with ToolEnv's diagnosis, the failed
  episodes by cause and kind and the behaviour next to the oracle's plan
  (`evaluation.causes`); then the comparability notes
  of the benchmarks present; then (``transcripts``) one solved and one failed
  transcript per kind.
  """
  runs = report["runs"]
  by_bench = group_records(runs, ("benchmark",))
  lines: list[str] = []
  for i, (_, group) in enumerate(by_bench.items()):
    if i:
      lines.append("")
    lines += _run_table(group)
  for title, table in (("Per kind: n, success % (95% Wilson CI)", _kind_table),
                       ("Per kind: mean turns / calls per execute step",
                        _kind_behaviour_table)):
    lines += ["", title, ""]
    for i, (_, group) in enumerate(by_bench.items()):
      if i:
        lines.append("")
      lines += table(group)
  for run in runs:
    analysis = run.get("analysis")
    if not analysis:
      continue
    lines += ["", f"Failed episodes by cause: {run['benchmark']} / {run['policy']} / "
              f"{run['strategy']} (one cause each, `toolenv.diagnosis`; kind (n tasks))", ""]
    lines += causes_lib.cause_table(analysis)
    lines += ["", f"Behaviour next to the oracle's plan of the same tasks: "
              f"{run['benchmark']} / {run['policy']} / {run['strategy']}", ""]
    lines += causes_lib.behaviour_table(analysis)
  notes = report.get("notes") or notes_for(r["benchmark"] for r in runs)
  bullets = [f"* {v}" for v in notes.values()]
  if report.get("machine"):
    bullets.append(f"* Ran on: {provenance.one_line(report['machine'])} (float rounding "
                   "differs between CPUs: greedy decisions, and so these numbers, can too).")
  if bullets:
    lines += ["", "Notes:", ""] + bullets
  examples = report.get("transcripts") or []
  if examples and transcripts:
    lines += ["", "Transcripts (one solved and one failed per kind, where they exist; "
              "long turns cut):"]
    for ex in examples:
      lines += ["", "```", format_transcript(ex), "```"]
  return "\n".join(lines) + "\n"


def terminal_table(report: dict[str, Any]) -> str:
  """The few columns a terminal shows: per run, n, success (95% CI), success
  per kind, multi-tool kinds pooled, turns and calls per execute step.

  Plain text with aligned columns (the full table is in ``report.md``).
  """
  runs = report["runs"]
  kinds = _kinds(runs)
  head = (["benchmark", "policy", "strategy", "n", "success % (95% CI)"] + kinds
          + ["multi-tool", "turns", "calls/step"])
  rows = [head]
  for run in runs:
    o, mt = run["overall"], run["multi_tool"]
    rows.append([str(run["benchmark"]), str(run["policy"]), str(run["strategy"]),
                 str(o["n"]), f"{_fmt(o['success'], True)} ({_ci(o['ci95'])})"]
                + [_fmt(run["per_kind"][k]["success"], True) if k in run["per_kind"]
                   else "-" for k in kinds]
                + [_fmt(mt["success"], True) if mt else "-", _fmt(o["turns"]),
                   _fmt(o["calls_per_execute_step"])])
  widths = [max(len(r[i]) for r in rows) for i in range(len(head))]
  text = ["  ".join(c.ljust(w) if i < 3 else c.rjust(w)
                    for i, (c, w) in enumerate(zip(r, widths))).rstrip() for r in rows]
  return "\n".join(text[:1] + ["-" * len(text[0])] + text[1:]) + "\n"


def write_report(records: Sequence[dict[str, Any]], workdir: str,
                 name: str = "report", plots: bool = True) -> dict[str, str]:
  """Writes ``{name}.json``, ``{name}.md`` and the PNG plots; returns their paths."""
  fileio.makedirs(workdir)
  report = build_report(records)
  paths = {"json": os.path.join(workdir, f"{name}.json"),
           "markdown": os.path.join(workdir, f"{name}.md")}
  fileio.write_json_atomic(paths["json"], report, default=None)
  fileio.write_text_atomic(paths["markdown"], markdown_table(report))
  if plots:
    paths.update(write_plots(records, report, workdir, name))
  return paths


def save_figure(fig: Figure, path: str, dpi: int = 100) -> str:
  """Writes ``fig`` as a PNG to ``path`` (local or ``gs://``), whole; returns
  ``path``. Rendered in memory: matplotlib cannot write to a bucket."""
  buf = io.BytesIO()
  fig.savefig(buf, format="png", dpi=dpi)
  return fileio.write_bytes_atomic(path, buf.getvalue())


_MARKERS = ("o", "s", "^", "D", "v", "P", "X", "*")


def write_plots(records: Sequence[dict[str, Any]], report: dict[str, Any],
                workdir: str, name: str = "report") -> dict[str, str]:
  """Success by kind and strategy; turns vs success; calls-per-step histogram.

  Each figure has one panel per benchmark (their kinds differ).
  """
  def _save(fig, path):
    fig.tight_layout()
    return save_figure(fig, path)

  def _panels(n, width):
    fig = Figure(figsize=(width * n, 4))
    axes = fig.subplots(1, n, squeeze=False)
    return fig, list(axes[0])

  def _legend_below(ax, n):
    if ax.get_legend_handles_labels()[0]:
      ax.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.2),
                ncol=min(n, 3), frameon=False)

  out = {}
  by_bench = list(group_records(report["runs"], ("benchmark",)).items())
  fig, axes = _panels(len(by_bench), 7)
  for ax, ((bench,), runs) in zip(axes, by_bench):
    kinds = _kinds(runs)
    width = 0.8 / max(1, len(runs))
    for i, run in enumerate(runs):
      xs = [j + i * width for j in range(len(kinds))]
      ys = [100 * run["per_kind"][k]["success"] if k in run["per_kind"] else None
            for k in kinds]
      bars = ax.bar(xs, [y or 0 for y in ys], width,
                    label=f"{run['policy']}/{run['strategy']}")
      # Every bar says its value: a 0% bar is otherwise invisible and reads
      # as missing data; "-" marks a kind this run has no tasks of.
      for x, y, b in zip(xs, ys, bars):
        ax.text(x, (y or 0) + 1.5, "-" if y is None else f"{y:.0f}", ha="center",
                va="bottom", fontsize=6, color=b.get_facecolor())
    ax.set_xticks([j + 0.4 - width / 2 for j in range(len(kinds))], kinds,
                  rotation=30 if len(kinds) > 5 else 0, fontsize=9)
    ax.set_xlabel("task kind")
    ax.set_ylabel("success % (of tasks of the kind)")
    ax.set_ylim(0, 110)
    _legend_below(ax, len(runs))
    ax.set_title(f"{bench}: success by kind (bars: policy/strategy)", fontsize=9)
  out["plot_success"] = _save(fig, os.path.join(workdir, f"{name}_success_by_kind.png"))

  fig, axes = _panels(len(by_bench), 5)
  for ax, ((bench,), runs) in zip(axes, by_bench):
    for i, run in enumerate(runs):
      # A marker shape per run and its name beside it: runs at the same point
      # (every oracle strategy at 100%) stay apart.
      x, y = run["overall"]["turns"] or 0, 100 * run["overall"]["success"]
      label = f"{run['policy']}/{run['strategy']}"
      dots = ax.scatter([x], [y], label=label, s=50, alpha=0.85,
                        marker=_MARKERS[i % len(_MARKERS)])
      ax.annotate(run["strategy"], (x, y), xytext=(4, -10 - 9 * (i % 6)),
                  textcoords="offset points", fontsize=7,
                  color=dots.get_facecolor()[0])
    ax.set_xlabel("mean turns per task")
    ax.set_ylabel("success %")
    ax.set_ylim(-3, 103)   # fixed: all-zero runs sit on 0, not mid-axis
    ax.set_xlim(0, 1.15 * max([r["overall"]["turns"] or 0 for r in runs] + [1]) + 0.5)
    ax.grid(alpha=0.3)
    _legend_below(ax, len(runs))
    ax.set_title(f"{bench}: mean turns vs success (one point per run)", fontsize=9)
  out["plot_turns"] = _save(fig, os.path.join(workdir, f"{name}_turns_vs_success.png"))

  rec_by_bench = group_records(records, ("benchmark",))
  fig, axes = _panels(len(by_bench), 5)
  for ax, ((bench,), _) in zip(axes, by_bench):
    groups = [(f"{p}/{st}", [c for r in recs for c in r.get("calls_per_step") or []])
              for (p, st), recs in group_records(rec_by_bench.get((bench,), []),
                                                 ("policy", "strategy")).items()]
    groups = [(label, vals) for label, vals in groups if vals]
    if groups:
      # Side by side, centred on the integers: the share of each run's
      # execute steps that made k calls.
      top = max(max(v) for _, v in groups)
      width = 0.8 / len(groups)
      for i, (label, vals) in enumerate(groups):
        ks = list(range(0, top + 1))
        share = [100 * sum(v == k for v in vals) / len(vals) for k in ks]
        ax.bar([k - 0.4 + (i + 0.5) * width for k in ks], share, width, label=label)
      ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    else:
      ax.text(0.5, 0.5, "no execute steps", transform=ax.transAxes, ha="center",
              va="center", color="0.4")
    ax.set_xlabel("calls in one execute step")
    ax.set_ylabel("% of the run's execute steps")
    _legend_below(ax, len(groups))
    ax.set_title(f"{bench}: calls per execute step", fontsize=9)
  out["plot_calls"] = _save(fig, os.path.join(workdir, f"{name}_calls_per_step.png"))
  return out


def compare_reports(paths: Sequence[str]) -> str:
  """Puts the runs of several JSON reports side by side in one markdown table."""
  merged: dict[str, Any] = {"runs": []}
  for p in paths:
    merged["runs"].extend(fileio.read_json(p)["runs"])
  return markdown_table(merged)
