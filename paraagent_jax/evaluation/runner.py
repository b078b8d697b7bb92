"""Runs a policy on a benchmark, batch by batch, resumably.

Records (one flat dict per task, see `report`) are appended to
``WORKDIR/records/<benchmark>-<policy>-<strategy>.jsonl`` after every batch
and fsynced, so an interrupted evaluation continues where it stopped: tasks
whose id is already recorded are skipped. The same checkpoint, seed and
benchmark give the same records (greedy decoding, deterministic ToolEnv).
"""

from __future__ import annotations

import json
import os
import time
from typing import Any, Callable, Sequence

from paraagent_jax import fileio
from paraagent_jax.paraact import rollout
from toolenv.benchmarks import bfcl as bench
from toolenv.catalog import bfcl as bfcl_cat


def records_path(workdir: str, benchmark: str, policy: str, strategy: str) -> str:
  return os.path.join(workdir, "records", f"{benchmark}-{policy}-{strategy}.jsonl")


def read_records(path: str) -> list[dict[str, Any]]:
  """Complete records of ``path`` (a torn last line from a kill is dropped)."""
  if not fileio.exists(path):
    return []
  out = []
  with fileio.open(path) as f:
    for line in f:
      try:
        out.append(json.loads(line))
      except json.JSONDecodeError:
        break
  return out


def _append(path: str, records: Sequence[dict[str, Any]]) -> None:
  """Adds ``records`` to ``path`` in one write: locally an append and a flush
  (no fsync: `fileio.AppendFile` has none; a torn tail is dropped on resume),
  on a bucket the object rewritten whole, so readers see whole batches."""
  with fileio.AppendFile(path, flush_every_s=0) as f:
    f.write("".join(json.dumps(r, default=str) + "\n" for r in records))


def _rewrite(path: str, records: Sequence[dict[str, Any]]) -> None:
  """Rewrites ``path`` with only complete records (drops a torn tail)."""
  fileio.write_jsonl_atomic(path, records, default=str)


PARSE_FAILURE_KEYS = ("parse_errors", "calls_dropped", "json_errors", "unknown_tool_calls")


def parse_failures(records: Sequence[dict]) -> dict[str, int]:
  """Totals of the records' parse failures: malformed steps (``parse_errors``),
  calls dropped, JSON errors among them, unknown tools (`rollout._episode_record`)."""
  return {k: int(sum(r.get(k, 0) or 0 for r in records)) for k in PARSE_FAILURE_KEYS}


def parse_failure_text(totals: dict) -> str:
  """One console phrase of `parse_failures` totals."""
  return (f"parse failures {int(totals.get('parse_errors', 0))} steps, "
          f"{int(totals.get('calls_dropped', 0))} calls dropped "
          f"({int(totals.get('json_errors', 0))} JSON errors), "
          f"{int(totals.get('unknown_tool_calls', 0))} unknown tools")


def run_tasks(policy, fmt, env, tasks: Sequence[Any], *, benchmark: str, strategy: str,
              policy_name: str, workdir: str | None, rollout_config, batch_size: int = 32,
              seed: int = 0, fields: dict[str, Any] | None = None,
              log: Callable[[str], None] = print) -> list[dict[str, Any]]:
  """Evaluates ``policy`` on ``tasks`` in ``env``, batch by batch, resumably.

  Args:
    policy: a `paraact.policies.Policy`.
    fmt: the strategy's `ChatFormat`.
    env: a `toolenv.VectorToolEnv` or any env with its interface (e.g.
      `toolenv.benchmarks.fixed_env.FixedTaskEnv`); if it has ``extra(i)``,
      those per-episode metrics are added to the records.
    tasks: objects with ``id`` and ``kind`` (`toolenv.Task`).
    benchmark, strategy, policy_name: the record's keys (and its file name).
    workdir: where ``records/`` lives (None: records are not written).
    rollout_config: `rollout.RolloutConfig`.
    batch_size: episodes per rollout batch. A JAX policy's last batch is
      padded with repeats of its last task (records dropped), so every batch
      has one shape and nothing is compiled twice.
    seed: sampling seed.
    fields: constant fields added to every record (e.g. the catalog).
    log: progress lines.

  Returns:
    The records of ``tasks`` in task order (earlier runs' records included).
  """
  path = records_path(workdir, benchmark, policy_name, strategy) if workdir else None
  done = read_records(path) if path else []
  if done:
    _rewrite(path, done)
  seen = {r["task_id"] for r in done}
  todo = [t for t in tasks if t.id not in seen]
  if done:
    log(f"evaluate: {benchmark}/{policy_name}/{strategy}: {len(done)} recorded, "
        f"{len(todo)} to go")
  pad = getattr(policy, "name", "") == "jax"
  records = list(done)
  for start in range(0, len(todo), batch_size):
    batch = todo[start:start + batch_size]
    real = len(batch)
    if pad and start > 0 and real < batch_size:
      batch = batch + [batch[-1]] * (batch_size - real)
    t0 = time.perf_counter()
    res = rollout.run_rollout(policy, env, batch, fmt, rollout_config, seed=seed)
    per_task = (time.perf_counter() - t0) / real
    new = []
    for i, (task, e) in enumerate(zip(batch[:real], res.episodes[:real])):
      r = dict(e)
      if hasattr(env, "extra"):
        r.update(env.extra(i))
      r.update(fields or {})
      r["wall_per_task_s"] = per_task
      r.update(benchmark=benchmark, strategy=strategy, policy=policy_name,
               kind=task.kind, task_id=task.id)
      new.append(r)
    if path:
      _append(path, new)
    records += new
    ok = sum(bool(r["success"]) for r in records)
    log(f"evaluate: {benchmark}/{policy_name}/{strategy}: {len(records)}/{len(tasks)} "
        f"tasks, success {ok / len(records):.3f}, "
        f"{parse_failure_text(parse_failures(records))} "
        f"({time.perf_counter() - t0:.1f}s/batch)")
  order = {t.id: i for i, t in enumerate(tasks)}
  return sorted((r for r in records if r["task_id"] in order), key=lambda r: order[r["task_id"]])


def run_bfcl_oracle(data_dir: str, settings=("closed", "open")) -> list[dict[str, Any]]:
  """BFCL scored by our BFCL-rule checker for the gold calls (harness check)."""
  entries = bfcl_cat.load_entries(data_dir)
  bad = set(bench.unsolvable(entries))
  entries = [e for e in entries if e.id not in bad]
  out = []
  for setting in settings:
    tasks, _ = bench.make_tasks(entries, setting)
    for task in tasks:
      names = task.names if setting == "open" else None
      ok, why = bench.check_task(task, bench.gold_calls(task.entry, names))
      out.append({"benchmark": f"bfcl-{setting}", "strategy": "gold", "policy": "oracle",
                  "kind": task.entry.category, "task_id": task.entry.id,
                  "success": bool(ok), "reason": why})
  return out
