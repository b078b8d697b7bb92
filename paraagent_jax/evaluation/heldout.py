"""The held-out evaluator: one set of ToolEnv test tasks, greedy ParaAct on it.

A `HeldOutSpec` (frozen; built at a stage's door from that stage's config
keys) names the tasks (catalog, seeds, kinds, how many), the strategy, the
observation format and the rollout limits. `HeldOut(spec)` builds the catalog
and the tasks once; `HeldOut.run(policy, fmt)` rolls the policy out greedily
on them (batch by batch, resumably when given a workdir: `evaluation.runner`)
and returns an `Evaluation`: the summary metrics (`summarize`: success per
kind, multi-tool success, turns, calls per execute step) and one record per
task. The SFT stage's final evaluation, the RL stage's before/after (and
every ``rl.eval_every``) evaluations and ``paraagent_jax.evaluate``'s
``toolenv`` benchmark all run through it.

`paired_record` keeps the fields the paired tests and cause tables read
(``eval_before.jsonl``, ``eval_after.jsonl``); `behaviour_table` puts a
policy's turns and calls per execute step next to the oracle's plan of the
same tasks.
"""

from __future__ import annotations

import collections
import dataclasses
from typing import Any, Callable, Sequence

import toolenv
from paraagent_jax import fileio
from paraagent_jax.evaluation import runner
from paraagent_jax.paraact import rollout


# The failure cause and behaviour counts of `toolenv.diagnosis` a paired
# record keeps (`evaluation.causes` tabulates them).
DIAGNOSIS_KEYS = frozenset(
    ["cause", "cause_detail"]
    + [k for k in toolenv.diagnosis.BEHAVIOUR_FIELDS
       if k not in ("turns", "calls_per_execute_step", "phase_switches")]
    + [f"oracle_{k}" for k in toolenv.diagnosis.BEHAVIOUR_FIELDS])


@dataclasses.dataclass(frozen=True)
class HeldOutSpec:
  """What a held-out evaluation runs: tasks, strategy, observations, limits.

  Attributes:
    catalog: ToolEnv catalog name (``toolenv.load_catalog``).
    catalog_seed: its seed.
    task_seed: the task generator's seed.
    kinds: task kinds, dealt round robin over the tasks.
    num_tasks: test-split tasks ``0 .. num_tasks - 1``.
    strategy: the acting strategy (its chat format and env options).
    obs_format: ToolEnv's observation format (the demonstrations').
    limits: the rollout's budgets.
    seed: the rollout's sampling seed (greedy decoding ignores it).
  """
  catalog: str = "procedural"
  catalog_seed: int = 0
  task_seed: int = 0
  kinds: tuple[str, ...] = tuple(toolenv.KINDS)
  num_tasks: int = 40
  strategy: str = "paraact"
  obs_format: str = "full"
  limits: rollout.RolloutConfig = rollout.RolloutConfig()
  seed: int = 0


@dataclasses.dataclass(frozen=True)
class Evaluation:
  """A held-out evaluation's summary metrics and per-task records (task order)."""
  metrics: dict[str, float]
  records: list[dict[str, Any]]


class HeldOut:
  """The held-out tasks of a `HeldOutSpec` and greedy evaluations on them."""

  def __init__(self, spec: HeldOutSpec, catalog=None, tasks=None):
    """``catalog``: the spec's catalog, already loaded (else loaded here);
    ``tasks``: its tasks, already drawn (else drawn here).

    Raises:
      ValueError: unknown kinds (the message names the choices).
    """
    self.spec = spec
    self.catalog = catalog if catalog is not None else toolenv.load_catalog(
        spec.catalog, seed=spec.catalog_seed)
    if tasks is None:
      gen = toolenv.TaskGenerator(self.catalog, seed=spec.task_seed)
      tasks = gen.generate(spec.num_tasks, split="test", kinds=tuple(spec.kinds))
    self.tasks = list(tasks)

  def with_strategy(self, strategy: str) -> "HeldOut":
    """The same tasks under another strategy (nothing rebuilt)."""
    return HeldOut(dataclasses.replace(self.spec, strategy=strategy), self.catalog, self.tasks)

  def run(self, policy, fmt, *, batch_size: int = 0, workdir: str | None = None,
          policy_name: str = "policy", benchmark: str = "toolenv",
          fields: dict[str, Any] | None = None,
          log: Callable[[str], None] | None = None) -> Evaluation:
    """Rolls ``policy`` out greedily on the tasks; metrics and records.

    ``batch_size``: episodes per rollout (0 = all tasks in one). ``workdir``:
    records are appended to ``workdir/records/`` after each batch and a
    rerun skips the recorded tasks (`runner.run_tasks`); None keeps them in
    memory. ``log``: progress lines (None: silent).
    """
    spec, n = self.spec, len(self.tasks)
    batch_size = batch_size or max(1, n)
    env = toolenv.VectorToolEnv(self.catalog, num_envs=max(1, min(batch_size, n or 1)),
                                obs_format=spec.obs_format,
                                **toolenv.oracle.env_options(spec.strategy))
    greedy = hasattr(policy, "temperature")
    temp = policy.temperature if greedy else None
    if greedy:
      policy.temperature = 0.0
    try:
      records = runner.run_tasks(
          policy, fmt, env, self.tasks, benchmark=benchmark, strategy=spec.strategy,
          policy_name=policy_name, workdir=workdir, rollout_config=spec.limits,
          batch_size=batch_size, seed=spec.seed, fields=fields,
          log=log or (lambda _: None))
    finally:
      if greedy:
        policy.temperature = temp
    return Evaluation(summarize(records), records)


def paired_record(r: dict[str, Any]) -> dict[str, Any]:
  """The fields of a task's record that paired tests and cause tables read."""
  return {"task_id": r["task_id"], "kind": r["kind"], "success": bool(r["success"]),
          "turns": int(r["turns"]),
          "calls_per_step": [int(n) for n in r.get("calls_per_step", [])],
          "calls_per_execute_step": r.get("calls_per_execute_step", 0.0),
          "phase_switches": r.get("phase_switches", 0),
          "parse_errors": r.get("parse_errors", 0),
          **{k: v for k, v in r.items() if k in DIAGNOSIS_KEYS},
          "transcript": r.get("transcript", [])}


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


def summarize(records: Sequence[dict]) -> dict[str, float]:
  """Success per kind, multi-tool success, mean turns and calls per execute step
  of per-task records (``kind``, ``success``, ``turns``, ``calls_per_step``),
  and the totals of their parse failures (`runner.parse_failures`)."""
  by = collections.defaultdict(list)
  for r in records:
    by[r["kind"]].append(float(r["success"]))
  out = {f"success_{k}": sum(v) / len(v) for k, v in sorted(by.items())}
  out["success"] = sum(float(r["success"]) for r in records) / max(1, len(records))
  multi = [float(r["success"]) for r in records if r["kind"] in toolenv.MULTI_TOOL_KINDS]
  if multi:
    out["success_multi_tool"] = sum(multi) / len(multi)
  out["turns"] = sum(r["turns"] for r in records) / max(1, len(records))
  per_step = [n for r in records for n in r.get("calls_per_step", [])]
  out["calls_per_execute_step"] = sum(per_step) / max(1, len(per_step))
  out.update(runner.parse_failures(records))
  return out
