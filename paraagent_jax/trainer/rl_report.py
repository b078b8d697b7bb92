"""What the RL stage leaves for a reader: the report, the curve, the paired test.

* ``rl_report.md``: held-out greedy success before and after RL per kind, the
  paired comparison, the failed episodes by cause before and after
  (`evaluation.causes`), behaviour next to the oracle's plan,
  one solved and one failed transcript per kind (`write_report`);
* ``rl_curve.jsonl`` / ``rl_curve.png``: rollout success and each level's
  mean reward per iteration, held-out success where evaluated (`save_curve`);
* ``rl_paired.json``: the McNemar comparison of the per-task results before
  and after RL (`paired_before_after`).
"""

from __future__ import annotations

import json
import os
from typing import Sequence

# A Figure without pyplot: renders to files, never touches the global backend
# (a notebook importing this keeps its inline plots).
from matplotlib.figure import Figure
from matplotlib.ticker import MaxNLocator

from paraagent_jax import fileio
from paraagent_jax import metrics as metrics_lib
from paraagent_jax import provenance
from paraagent_jax.evaluation import causes as causes_lib
from paraagent_jax.evaluation import paired as paired_lib
from paraagent_jax.evaluation import runner
from paraagent_jax.evaluation import report as report_lib

RUN_META_FILE = "rl_run.json"
# Per-task greedy results on the held-out tasks before and after RL, and
# their paired comparison (`evaluation.paired`).
EVAL_BEFORE_FILE = "eval_before.jsonl"
EVAL_AFTER_FILE = "eval_after.jsonl"
PAIRED_FILE = "rl_paired.json"


# rl_curve.jsonl field <- metrics key.
CURVE_KEYS = {"success": "train/rollout/success", "traj_reward": "train/rollout/traj_reward",
              "phase_reward": "train/rollout/phase_reward",
              "step_reward": "train/rollout/step_reward",
              "dropped_episode_frac": "train/dropped_episode_frac",
              "traj_spread_groups": "train/rollout/traj_spread_groups",
              "eval_success": "eval/success"}


def write_report(workdir: str, history: Sequence[dict], after: dict,
                 paired: dict | None, meta: dict,
                 behaviour: Sequence[str] = ()) -> str:
  """``rl_report.md`` (before/after per kind, the paired comparison) and
  ``rl_curve.jsonl`` (success and each level's mean reward per iteration)."""
  by_it: dict[int, dict] = {}
  for r in history:   # a train and an eval record may share an iteration
    vals = {name: r[key] for name, key in CURVE_KEYS.items() if key in r}
    if vals:
      by_it.setdefault(int(r["step"]), {"iteration": int(r["step"])}).update(vals)
  curve = [by_it[i] for i in sorted(by_it)]
  curve_path = os.path.join(workdir, "rl_curve.jsonl")
  fileio.write_jsonl_atomic(curve_path, curve)
  before = {}
  for r in history:
    if int(r["step"]) == 0 and "eval/success" in r:
      before = {k[len("eval/"):]: v for k, v in r.items() if k.startswith("eval/")}
  keys = sorted(k for k in after if k.startswith("success_"))
  lines = [f"# RL report ({', '.join(meta.get('levels', []))} advantages)", "",
           f"Started from `{meta.get('init_from') or 'scratch'}`; greedy ParaAct on the "
           "same held-out test tasks before and after RL.", "",
           f"Ran on: {provenance.one_line(meta.get('machine'))} (`{RUN_META_FILE}`); "
           "another CPU's float rounding can change greedy decisions.", "",
           "| metric | before RL | after RL |", "|---|---|---|"]
  for k in ["success"] + keys + ["turns", "calls_per_execute_step"]:
    b = before.get(k)
    lines.append(f"| {k} | {'-' if b is None else f'{b:.3f}'} | {after.get(k, float('nan')):.3f} |")
  # Parse failures on the held-out tasks (totals: steps, calls dropped, ...).
  for k in runner.PARSE_FAILURE_KEYS:
    b, a = before.get(k), after.get(k)
    if a is not None:
      lines.append(f"| {k} (total) | {'-' if b is None else int(b)} | {int(a)} |")
  if paired:
    lines += ["", "Paired: " + paired_lib.format_paired(paired, ("before", "after")) + "."]
  before_recs = _read_records(os.path.join(workdir, EVAL_BEFORE_FILE))
  after_recs = _read_records(os.path.join(workdir, EVAL_AFTER_FILE))
  compare = causes_lib.compare_table(before_recs, after_recs, ("before RL", "after RL"))
  if compare:
    lines += ["", "Why the held-out episodes fail (one cause per failed episode, "
              "`toolenv.diagnosis`), so a change in success is attributed to behaviour. "
              + compare[0], "", *compare[2:]]
  oracle_side = causes_lib.behaviour_table(after_recs)
  if oracle_side:
    lines += ["", "After RL, behaviour per kind next to the oracle's plan of the same "
              "tasks (policy / oracle):", "", *oracle_side]
    before_side = causes_lib.behaviour_table(before_recs)
    if before_side:
      lines += ["", "Before RL, the same:", "", *before_side]
  elif behaviour:
    lines += ["", "After RL, per kind, next to the oracle's plan of the same tasks:", "",
              *behaviour]
  lines += ["", "Learning curve: `rl_curve.png`, `rl_curve.jsonl` (per iteration: rollout "
            "success, mean trajectory / phase / step reward, held-out success where "
            "evaluated); every metric: `metrics.jsonl`.", ""]
  examples = report_lib.example_transcripts(
      [dict(r, benchmark="toolenv", policy="after RL",
            strategy=meta.get("strategy", "paraact")) for r in after_recs])
  if examples:
    lines += ["After RL, one solved and one failed held-out transcript per kind "
              f"(all in `{EVAL_AFTER_FILE}`; long turns cut):", ""]
    for ex in examples:
      lines += ["```", report_lib.format_transcript(ex, max_chars=600), "```", ""]
  path = os.path.join(workdir, "rl_report.md")
  return fileio.write_text_atomic(path, "\n".join(lines))


def cause_summary_lines(workdir: str) -> list[str]:
  """Console lines: the failed held-out episodes by cause, before and after RL."""
  out = []
  for name, f in (("before RL", EVAL_BEFORE_FILE), ("after RL", EVAL_AFTER_FILE)):
    s = causes_lib.summary(_read_records(os.path.join(workdir, f)))
    if s:
      out.append(f"failed held-out episodes by cause {name}: {causes_lib.one_line(s)}; "
                 f"multi-tool: {causes_lib.one_line(s, 'multi_tool')}")
  return out


def _read_records(path: str) -> list[dict]:
  if not fileio.exists(path):
    return []
  with fileio.open(path) as f:
    return [json.loads(line) for line in f if line.strip()]


def paired_before_after(workdir: str) -> dict | None:
  """The paired comparison of the evaluations before and after RL.

  Written to ``rl_paired.json``; None when either per-task file is absent
  (``rl.eval_every=0`` skips the evaluation before RL).
  """
  files = [os.path.join(workdir, f) for f in (EVAL_BEFORE_FILE, EVAL_AFTER_FILE)]
  if not all(fileio.exists(f) for f in files):
    return None
  paired = paired_lib.paired_comparison(*(paired_lib.read_per_task(f) for f in files),
                                        names=("before", "after"))
  fileio.write_json_atomic(os.path.join(workdir, PAIRED_FILE), paired)
  return paired


def _running_mean(values, window: int) -> list[float]:
  """Mean of the last ``window`` values at each position (fewer at the start)."""
  out = []
  for i in range(len(values)):
    part = values[max(0, i - window + 1):i + 1]
    out.append(sum(part) / len(part))
  return out


def save_curve(workdir: str) -> str | None:
  """Plots success and each level's mean reward per iteration to rl_curve.png."""
  path = os.path.join(workdir, "metrics.jsonl")
  if not fileio.exists(path):
    return None
  records = metrics_lib.read_jsonl(path)
  rows = [r for r in records if "train/rollout/success" in r]
  if not rows:
    return None
  fig = Figure(figsize=(11, 4))
  axes = fig.subplots(1, 2)
  it = [r["step"] for r in rows]   # the RL stage logs one record per iteration
  # Few iterations: markers, so single points show; many: the per-iteration
  # values thin, with their 5-iteration running mean over them.
  style = "o-" if len(rows) <= 20 else "-"
  succ = [r["train/rollout/success"] for r in rows]
  if len(rows) > 20:
    axes[0].plot(it, succ, lw=0.8, alpha=0.45, color="C0", label="rollout (sampled)")
    axes[0].plot(it, _running_mean(succ, 5), lw=2.0, color="C0",
                 label="rollout, 5-iteration mean")
  else:
    axes[0].plot(it, succ, style, color="C0", label="rollout (sampled)")
  ev = [r for r in records if "eval/success" in r]
  if ev:
    axes[0].plot([r["step"] for r in ev], [r["eval/success"] for r in ev], "o-",
                 color="C1", label="held-out greedy")
  # Success is a fraction: a fixed 0-1 axis, so 0% reads as 0%, not as an
  # axis squeezed around a flat line.
  axes[0].set_ylim(-0.02, 1.02)
  axes[0].set_title("task success")
  axes[0].set_ylabel("fraction of tasks solved")
  for key in ("traj_reward", "phase_reward", "step_reward"):
    axes[1].plot(it, [r.get(f"train/rollout/{key}", float("nan")) for r in rows],
                 style, label=key.split("_")[0])
  axes[1].axhline(0.0, color="0.7", lw=0.8, zorder=0)
  axes[1].set_title("mean reward per level (sampled episodes)")
  axes[1].set_ylabel("reward")
  for ax in axes:
    ax.set_xlabel("RL iteration")
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.grid(alpha=0.3)
    # Legends below the axes: never over the data.
    ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.18), ncol=3, frameon=False)
  meta_path = os.path.join(workdir, RUN_META_FILE)
  levels = []
  if fileio.exists(meta_path):
    levels = fileio.read_json(meta_path).get("levels", [])
  fig.suptitle("RL learning curve" + (f" (GRPO advantage levels: {', '.join(levels)})"
                                      if levels else ""))
  fig.tight_layout()
  return report_lib.save_figure(fig, os.path.join(workdir, "rl_curve.png"))
