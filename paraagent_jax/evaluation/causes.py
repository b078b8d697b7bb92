"""Failure causes and behaviour next to the oracle: the report's analysis tables.

Works on episode records carrying ToolEnv's diagnosis (`toolenv.diagnosis`:
``cause``, ``cause_detail``, ``searches``, ``redundant_searches`` and the
oracle plan's counts as ``oracle_*``), as the rollout writes them. Records
without it (other benchmarks, records from before the diagnosis existed) are
left out of these tables; `replay_diagnosis` recomputes it for ToolEnv
records that have a transcript, by playing the recorded assistant turns
through a fresh environment (ToolEnv is deterministic, so the replayed
episode is the recorded one; a changed success is an error).

    python -m paraagent_jax.evaluation.causes RECORDS.jsonl [...]

prints the cause and behaviour tables of per-task record files (any records
with ``kind`` and ``cause``: `evaluate`'s ``records/*.jsonl`` or the RL
stage's ``eval_before.jsonl`` / ``eval_after.jsonl``).
"""

from __future__ import annotations

import collections
import json
import sys
from typing import Any, Mapping, Sequence

from paraagent_jax import fileio
import toolenv
from toolenv import diagnosis as diag_lib

KIND_ORDER = toolenv.KINDS
# The one definition (docs/evaluation.md, "Multi-tool"): parallel, fanout, mixed.
MULTI_TOOL_KINDS = toolenv.MULTI_TOOL_KINDS
# (record field, oracle field, column title) of the behaviour table.
BEHAVIOUR_COLUMNS = (
    ("turns", "oracle_turns", "turns"),
    ("calls_per_execute_step", "oracle_calls_per_execute_step", "calls / execute step"),
    ("phase_switches", "oracle_phase_switches", "phase switches"),
    ("searches", "oracle_searches", "searches"),
    ("redundant_searches", "oracle_redundant_searches", "redundant searches"),
)


def _kinds(records: Sequence[Mapping[str, Any]]) -> list[str]:
  ks = {str(r.get("kind")) for r in records}
  return sorted(ks, key=lambda k: (KIND_ORDER.index(k) if k in KIND_ORDER else 99, k))


def diagnosed(records: Sequence[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
  """The records that carry a diagnosis."""
  return [r for r in records if "cause" in r]


def cause_counts(records: Sequence[Mapping[str, Any]]) -> dict[str, dict[str, int]]:
  """``{kind: {cause: failed episodes}}`` (every cause present, 0 if none),
  plus ``"all"`` and ``"multi_tool"`` (parallel, fanout, mixed pooled)."""
  out: dict[str, dict[str, int]] = {}
  groups = {k: [r for r in records if str(r.get("kind")) == k] for k in _kinds(records)}
  groups["multi_tool"] = [r for r in records if r.get("kind") in MULTI_TOOL_KINDS]
  groups["all"] = list(records)
  for k, rs in groups.items():
    c = collections.Counter(r["cause"] for r in rs if r.get("cause"))
    out[k] = {cause: int(c.get(cause, 0)) for cause in diag_lib.CAUSES}
  return out


def cause_examples(records: Sequence[Mapping[str, Any]]) -> dict[str, str]:
  """One example per cause: ``kind task_id: detail`` of its first episode."""
  out: dict[str, str] = {}
  for r in records:
    c = r.get("cause")
    if c and c not in out:
      out[c] = f"{r.get('kind')} {r.get('task_id')}: {r.get('cause_detail', '')}"
  return out


def summary(records: Sequence[Mapping[str, Any]]) -> dict[str, Any] | None:
  """The JSON form of the analysis (None if no record has a diagnosis).

  ``n`` and ``failed`` per kind, ``counts`` (`cause_counts`), ``examples``
  (`cause_examples`) and ``behaviour``: per kind and ``all``, each
  `BEHAVIOUR_COLUMNS` field as ``[policy mean, oracle-plan mean]``.
  """
  recs = diagnosed(records)
  if not recs:
    return None
  kinds = _kinds(recs)
  beh = {}
  with_oracle = [r for r in recs if "oracle_turns" in r]
  for k in kinds + ["all"]:
    rs = with_oracle if k == "all" else [r for r in with_oracle if str(r.get("kind")) == k]
    if rs:
      beh[k] = {f: [_mean(r.get(f) for r in rs), _mean(r.get(of) for r in rs)]
                for f, of, _ in BEHAVIOUR_COLUMNS}
  return {"kinds": kinds,
          "n": {k: sum(1 for r in recs if str(r.get("kind")) == k) for k in kinds},
          "failed": {k: sum(1 for r in recs if str(r.get("kind")) == k
                            and not r.get("success")) for k in kinds},
          "counts": cause_counts(recs), "examples": cause_examples(recs),
          "behaviour": beh}


def cause_table(records_or_summary) -> list[str]:
  """Markdown: failed episodes per cause and kind, with one example per cause.

  Takes records or their `summary`.
  """
  s = (records_or_summary if isinstance(records_or_summary, Mapping)
       else summary(records_or_summary))
  if not s:
    return []
  kinds, counts, ex = s["kinds"], s["counts"], s["examples"]
  head = ["cause"] + [f"{k} ({s['n'][k]})" for k in kinds] + ["multi-tool", "all", "example"]
  lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
  for cause in diag_lib.CAUSES:
    if not counts["all"][cause]:
      continue
    cells = [str(counts[k][cause]) for k in kinds]
    lines.append(f"| {diag_lib.CAUSE_TEXT[cause]} (`{cause}`) | " + " | ".join(cells)
                 + f" | {counts['multi_tool'][cause]} | {counts['all'][cause]} | "
                 + ex.get(cause, "").replace("|", "/") + " |")
  failed = [s["failed"][k] for k in kinds]
  multi = sum(s["failed"][k] for k in kinds if k in MULTI_TOOL_KINDS)
  lines.append("| **failed** | " + " | ".join(str(f) for f in failed)
               + f" | {multi} | {sum(failed)} | |")
  return lines


def one_line(s: Mapping[str, Any] | None, group: str = "all") -> str:
  """The causes of ``group``'s failed episodes, most frequent first, as one line
  (``""`` without a diagnosis): for consoles."""
  if not s or group not in s["counts"]:
    return ""
  c = sorted(((n, cause) for cause, n in s["counts"][group].items() if n), reverse=True)
  return ", ".join(f"{cause} {n}" for n, cause in c) or "none failed"


def _mean(vals) -> float | None:
  vals = [float(v) for v in vals if v is not None]
  return sum(vals) / len(vals) if vals else None


def behaviour_table(records_or_summary) -> list[str]:
  """Markdown: per kind, each behaviour mean as ``policy / oracle plan``.

  Takes records or their `summary`.
  """
  s = (records_or_summary if isinstance(records_or_summary, Mapping)
       else summary(records_or_summary))
  if not s or not s["behaviour"]:
    return []
  head = ["kind"] + [title + " (policy / oracle)" for _, _, title in BEHAVIOUR_COLUMNS]
  lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
  for k, vals in s["behaviour"].items():
    cells = []
    for field, _, _ in BEHAVIOUR_COLUMNS:
      p, o = vals[field]
      cells.append("-" if p is None or o is None else f"{p:.2f} / {o:.2f}")
    lines.append(f"| {k} | " + " | ".join(cells) + " |")
  return lines


def compare_table(before: Sequence[Mapping[str, Any]], after: Sequence[Mapping[str, Any]],
                  names: Sequence[str] = ("before", "after")) -> list[str]:
  """Markdown: failed episodes per cause, ``before -> after``, per kind and pooled.

  Both lists are the same tasks' records (e.g. before and after RL); a cause
  whose count falls is a behaviour the change fixed.
  """
  a, b = diagnosed(before), diagnosed(after)
  if not a or not b:
    return []
  kinds = _kinds(list(a) + list(b))
  ca, cb = cause_counts(a), cause_counts(b)
  cols = kinds + ["multi_tool", "all"]
  head = ["cause"] + [c.replace("_", "-") for c in cols]
  lines = [f"Failed episodes per cause, {names[0]} -> {names[1]}:", "",
           "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
  for cause in diag_lib.CAUSES:
    if not (ca["all"].get(cause) or cb["all"].get(cause)):
      continue
    cells = [f"{ca.get(k, {}).get(cause, 0)} -> {cb.get(k, {}).get(cause, 0)}" for k in cols]
    lines.append(f"| {diag_lib.CAUSE_TEXT[cause]} | " + " | ".join(cells) + " |")
  fa = {k: sum(ca.get(k, {}).values()) for k in cols}
  fb = {k: sum(cb.get(k, {}).values()) for k in cols}
  lines.append("| **failed** | " + " | ".join(f"{fa[k]} -> {fb[k]}" for k in cols) + " |")
  return lines


def replay_diagnosis(records: Sequence[dict[str, Any]], catalog, tasks,
                     parse_step, strategy: str = "paraact",
                     obs_format: str = "full") -> list[dict[str, Any]]:
  """Records with the diagnosis recomputed from their transcripts.

  Args:
    records: per-task records with ``task_id`` and ``transcript`` (the
      assistant turns as written).
    catalog, tasks: the catalog and the tasks they were evaluated on.
    parse_step: text -> `toolenv.Step` (the strategy's parser).
    strategy: the strategy (phases enforced, and the oracle's plan).
    obs_format: ToolEnv's observation format.

  Raises:
    ValueError: a task id is unknown, or the replay's success differs from
      the record's (the records do not come from these tasks or this code).
  """
  by_id = {t.id: t for t in tasks}
  env = toolenv.ToolEnv(catalog, obs_format=obs_format,
                        **toolenv.oracle.env_options(strategy))
  out = []
  for r in records:
    task = by_id.get(r["task_id"])
    if task is None:
      raise ValueError(f"record of task {r['task_id']!r}: no such task")
    env.reset(task)
    for turn in r.get("transcript", []):
      if turn.get("role") == "assistant" and not env.done:
        env.step(parse_step(turn["text"]))
    diag = env.diagnosis(strategy)
    if bool(env.success) != bool(r.get("success")):
      raise ValueError(f"task {task.id}: replayed success {env.success} != recorded "
                       f"{r.get('success')}")
    for k in ("turns", "calls_per_execute_step", "phase_switches"):
      diag.pop(k)       # the record's own, counted on the same steps
    out.append({**r, **diag})
  return out


def _read(path: str) -> list[dict[str, Any]]:
  with fileio.open(path) as f:
    return [json.loads(line) for line in f if line.strip()]


def main(argv: Sequence[str]) -> int:
  if not argv or argv[0] in ("-h", "--help"):
    print(__doc__)
    return 0 if argv else 2
  for path in argv:
    try:
      recs = _read(path)
    except (OSError, json.JSONDecodeError) as e:
      print(f"{path}: cannot read records: {e}", file=sys.stderr)
      return 1
    print(f"{path}: {len(recs)} records, {sum(bool(r.get('success')) for r in recs)} solved")
    lines = cause_table(recs)
    if not lines:
      print("  (no diagnosis in these records)")
      continue
    print("\n".join(lines + [""] + behaviour_table(recs)) + "\n")
  return 0


if __name__ == "__main__":
  sys.exit(main(sys.argv[1:]))
