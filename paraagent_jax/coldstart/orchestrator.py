"""Runs the role agents against `VectorToolEnv` and linearises their work.

    orch = Orchestrator(catalog, scripted_roles(catalog, Imperfection.default()))
    demos, stats = orch.run(tasks)          # demos: contract dicts (successes)

Each episode is a generator that asks the roles for the next ParaAct step and
receives the env's `StepResult`; all episodes of a batch are stepped together
through one `VectorToolEnv`. The flow per episode:

    planner -> for each dependency level:
                 explore (explorers of the unknown needs, one parallel step;
                          retried for explorers whose tool was not found)
                 execute (executor: the level's calls, one parallel step;
                          again for split levels and for calls that erred)
            -> answerer

Every assistant message records the role that produced it. A trajectory is
kept when the env says it succeeded (`ToolEnv.success`).
"""

from __future__ import annotations

import collections
import concurrent.futures
import dataclasses
import json
import re
import time
from typing import Any, Generator, Sequence

from paraagent_jax.coldstart.roles import Context, RoleOutput, RoleSet, step_of
from paraagent_jax.paraact import formats
from paraagent_jax.paraact import protocol
from paraagent_jax.paraact import qwen3_format
from paraagent_jax.paraact.strategies import get_strategy
from toolenv import oracle
from toolenv.env import VectorToolEnv
from toolenv.schema import Step, StepResult
from toolenv.tasks import Task

_BLOCK_RE = re.compile(r"(?m)^\[(\d+)\] ")
MAX_EXPLORE_ROUNDS = 3
MAX_EXECUTE_ROUNDS = 6

Episode = Generator[tuple[str, Step], StepResult, None]


def split_blocks(observation: str) -> list[str]:
  """Per-call texts of an observation (``[k] name: text`` blocks, name removed)."""
  parts = _BLOCK_RE.split(observation)
  out: dict[int, str] = {}
  for k in range(1, len(parts) - 1, 2):
    body = parts[k + 1].rstrip("\n")
    out[int(parts[k])] = body.split(": ", 1)[1] if ": " in body else body
  return [out[k] for k in sorted(out)]


def is_error(block: str) -> bool:
  """Whether a call's observation block is an error answer."""
  if block.startswith("error"):
    return True
  try:
    obj = json.loads(block)
  except ValueError:
    return False
  return isinstance(obj, dict) and "error" in obj


def plan_thought(plan_out, plan, thoughts: str) -> str:
  """The first step's thought under ``thoughts`` "plan" or "needs".

  "needs" numbers each distinct need in plan order:
  ``Plan: 2 sub-goal(s) over 1 level(s). (1) Acme order details by id (2) ...``
  """
  if thoughts != "needs":
    return plan_out.thought
  needs = list(dict.fromkeys(s.need for s in plan))
  return " ".join([plan_out.thought] + [f"({k}) {n}" for k, n in enumerate(needs, 1)])


class Orchestrator:
  """Multi-agent episodes over a `VectorToolEnv`, linearised into ParaAct.

  Args:
    catalog: the ToolEnv catalog.
    roles: a `RoleSet` (scripted or chat backend).
    batch_size: episodes stepped together.
    verbose: print progress per batch.
    thoughts: what the linearised steps keep of the roles' thoughts: "full"
      (every one), "plan" (only the planner's, on the first step: the count
      of sub-goals and levels), "needs" (as "plan", followed by each distinct
      sub-goal's need, numbered, so that the first searches copy a nearby
      list) or "none". Fewer thought tokens make shorter demonstrations (the
      CPU demo) without changing any call.
    obs_format: ToolEnv's observation format ("full" or "compact"); the
      policy trained on these demonstrations must be run in the same one.
    protocol_format: how the steps are written (``protocol.format``): "tags"
      (assistant text `protocol.render_step`) or "qwen3" (the phase tag and
      thought as content plus ``tool_calls``, `qwen3_format.assistant_message`,
      which the chat template renders); the system prompt is that format's.
  """

  THOUGHTS = ("full", "plan", "needs", "none")

  def __init__(self, catalog, roles: RoleSet, batch_size: int = 256, verbose: bool = False,
               thoughts: str = "full", obs_format: str = "full",
               protocol_format: str = formats.TAGS):
    if thoughts not in self.THOUGHTS:
      raise ValueError(f"thoughts={thoughts!r}; expected one of {self.THOUGHTS}")
    self.catalog = catalog
    self.roles = roles
    self.batch_size = batch_size
    self.verbose = verbose
    self.thoughts = thoughts
    step_format = formats.get_format(protocol_format)
    self.system = get_strategy("paraact").system_prompt(step_format)
    self._message = (qwen3_format.assistant_message if step_format.chat_template else
                     lambda step: {"role": "assistant", "content": protocol.render_step(step)})
    # qwen3: a tool message per call, as the rollout writes them.
    self._tools = (qwen3_format.tool_messages if step_format.chat_template else
                   lambda obs, n: [{"role": "tool", "content": obs}])
    self.env = VectorToolEnv(catalog, 1, obs_format=obs_format,
                             **oracle.env_options("paraact"))

  # ---- one episode -----------------------------------------------------------
  def episode(self, task: Task, counters: collections.Counter) -> Episode:
    """The generator of one episode: yields (role, step), receives results."""
    r = self.roles
    ctx = Context(task=task)
    used = 0

    def budget_left() -> bool:
      return used < task.max_turns - 1       # one turn stays for the answer

    plan_out = r.planner.act(ctx)
    ctx.plan = plan_out.plan or []
    levels = sorted({s.level for s in ctx.plan})
    for li, level in enumerate(levels):
      want = [s for s in ctx.plan if s.id not in ctx.tools and (
          s.level == level or (li == 0 and not s.late))]
      by_need: dict[str, list] = {}
      for s in want:
        by_need.setdefault(s.need, []).append(s)
      heads = [g[0] for g in by_need.values()]
      attempts = {s.id: 0 for s in heads}
      blocks: dict[str, str | None] = {s.id: None for s in heads}
      for rnd in range(MAX_EXPLORE_ROUNDS):
        outs = r.map(lambda s: r.explorer.act(Context(
            task=task, plan=ctx.plan, subgoal=s, search_block=blocks[s.id],
            attempt=attempts[s.id])), heads)
        pending = []
        for s, out in zip(heads, outs):
          if out.tool is not None:
            for t in by_need[s.need]:
              ctx.tools[t.id] = out.tool
          elif out.call is not None:
            pending.append((s, out))
        if not pending or not budget_left():
          break
        if rnd > 0:
          counters["search_retries"] += len(pending)
        thought = (plan_out.thought + " " if used == 0 else "") + (
            f"Search tools for {len(pending)} need(s) in parallel." if rnd == 0
            else f"Search again for {len(pending)} need(s) with a better query.")
        if self.thoughts in ("plan", "needs"):
          thought = plan_thought(plan_out, ctx.plan, self.thoughts) if used == 0 else ""
        step = Step(phase="explore", calls=[o.call for _, o in pending], thought=thought)
        result = yield "explorer", step
        used += 1
        obs_blocks = split_blocks(result.observation)
        for j, (s, _) in enumerate(pending):
          blocks[s.id] = obs_blocks[j] if j < len(obs_blocks) else ""
          attempts[s.id] += 1
          for line in (blocks[s.id] or "").splitlines():
            name = line.split(":", 1)[0].strip()
            ctx.tool_info.setdefault(name, line)
        heads = [s for s, _ in pending]
        if result.done:
          return
      remaining = [s for s in ctx.plan if s.level == level]
      ctx.errors = {}
      for rnd in range(MAX_EXECUTE_ROUNDS):
        if not remaining or not budget_left():
          break
        out: RoleOutput = r.executor.act(Context(
            task=task, plan=ctx.plan, ready=remaining, tools=ctx.tools,
            tool_info=ctx.tool_info, results=ctx.results, errors=ctx.errors,
            history=ctx.history))
        if not out.calls:
          break
        if ctx.errors:
          counters["corrections"] += 1
        elif len(out.calls) < len(remaining):
          counters["split_levels"] += 1
        step = step_of(out, "execute")
        result = yield "executor", step
        used += 1
        ctx.history.append((protocol.render_step(step), result.observation))
        obs_blocks = split_blocks(result.observation)
        ctx.errors = {}
        for j, (sid, call) in enumerate(out.calls):
          block = obs_blocks[j] if j < len(obs_blocks) else "error: no observation"
          if is_error(block):
            ctx.errors[sid] = (call, block)
            counters["error_observations"] += 1
          else:
            ctx.results[sid] = block
        remaining = [s for s in remaining if s.id not in ctx.results]
        if result.done:
          return
    out = r.answerer.act(Context(task=task, plan=ctx.plan, results=ctx.results,
                                 tools=ctx.tools, history=ctx.history))
    yield "answerer", step_of(out, "answer")

  # ---- batches -----------------------------------------------------------------
  def _advance(self, gens, sends):
    """Next (role, step) of each generator (None when it has finished)."""
    def one(pair):
      gen, send = pair
      try:
        return next(gen) if send is None else gen.send(send)
      except StopIteration:
        return None
    pairs = list(zip(gens, sends))
    if self.roles.concurrent_episodes > 1 and len(pairs) > 1:
      with concurrent.futures.ThreadPoolExecutor(self.roles.concurrent_episodes) as pool:
        return list(pool.map(one, pairs))
    return [one(p) for p in pairs]

  def run_batch(self, tasks: Sequence[Task], counters: collections.Counter) -> list[dict]:
    """All episodes of ``tasks`` together; returns one record per task."""
    first = self.env.reset(list(tasks))
    records = [{"task_id": t.id, "kind": t.kind, "split": t.split, "strategy": "paraact",
                "messages": [{"role": "system", "content": self.system},
                             {"role": "user", "content": first[i]}],
                "roles": [], "steps": []} for i, t in enumerate(tasks)]
    gens = [self.episode(t, counters) for t in tasks]
    nxt = self._advance(gens, [None] * len(gens))
    while True:
      active = [i for i, x in enumerate(nxt) if x is not None and not self.env.envs[i].done]
      if not active:
        break
      steps: list[Step | None] = [None] * len(tasks)
      for i in active:
        role, step = nxt[i]
        if self.thoughts == "none" or (self.thoughts in ("plan", "needs") and role != "explorer"):
          step = dataclasses.replace(step, thought="")
        steps[i] = step
        rec = records[i]
        rec["messages"].append(self._message(step))
        rec["roles"].append(role)
        rec["steps"].append(step)
      results = self.env.step(steps)
      for i in active:
        if steps[i].phase != "answer":
          records[i]["messages"] += self._tools(
              protocol.render_observation(results[i].observation), len(steps[i].calls))
      adv = self._advance([gens[i] for i in active], [results[i] for i in active])
      nxt = [None] * len(tasks)
      for i, x in zip(active, adv):
        nxt[i] = x
    for i, rec in enumerate(records):
      rw = self.env.rewards(i)
      acts = [s for s in rec["steps"] if s.phase != "answer"]
      rec.update(success=bool(rw.success), turns=int(rw.turns),
                 calls=sum(len(s.calls) for s in acts))
    return records

  def run(self, tasks: Sequence[Task]) -> tuple[list[dict], dict]:
    """Runs every task; returns (kept records, statistics)."""
    counters: collections.Counter = collections.Counter()
    records: list[dict] = []
    t0 = time.time()
    for b in range(0, len(tasks), self.batch_size):
      records += self.run_batch(tasks[b:b + self.batch_size], counters)
      if self.verbose:
        ok = sum(r["success"] for r in records)
        print(f"[coldstart] {len(records)}/{len(tasks)} episodes, {ok} succeeded, "
              f"{time.time() - t0:.1f}s", flush=True)
    kept = [r for r in records if r["success"]]
    return kept, statistics(records, counters, time.time() - t0)


def statistics(records: Sequence[dict], counters: collections.Counter | None = None,
               seconds: float = 0.0) -> dict[str, Any]:
  """Kept fraction per kind, turns and calls per step of the kept demonstrations."""
  per_kind: dict[str, dict[str, Any]] = {}
  for r in records:
    k = per_kind.setdefault(r["kind"], {"episodes": 0, "kept": 0})
    k["episodes"] += 1
    k["kept"] += int(r["success"])
  for k in per_kind.values():
    k["kept_fraction"] = k["kept"] / max(1, k["episodes"])
  kept = [r for r in records if r["success"]]
  ex_steps = [s for r in kept for s in r["steps"] if s.phase == "execute"]
  xp_steps = [s for r in kept for s in r["steps"] if s.phase == "explore"]
  roles = collections.Counter(x for r in kept for x in r["roles"])
  n = max(1, len(kept))
  return {"episodes": len(records), "kept": len(kept),
          "kept_fraction": len(kept) / max(1, len(records)), "per_kind": per_kind,
          "mean_turns": sum(r["turns"] for r in kept) / n,
          "mean_calls": sum(r["calls"] for r in kept) / n,
          "calls_per_execute_step": sum(len(s.calls) for s in ex_steps) / max(1, len(ex_steps)),
          "calls_per_explore_step": sum(len(s.calls) for s in xp_steps) / max(1, len(xp_steps)),
          "role_messages": dict(roles),
          "with_error_recovery": sum(
              any(m["role"] == "tool" and '"error"' in m["content"] for m in r["messages"])
              for r in kept),
          "events": dict(counters or {}), "seconds": round(seconds, 2)}


def format_statistics(stats: dict[str, Any]) -> str:
  """A short printable table of `statistics`."""
  lines = [f"demonstrations: kept {stats['kept']}/{stats['episodes']} "
           f"({100 * stats['kept_fraction']:.1f}%), mean turns {stats['mean_turns']:.2f}, "
           f"calls/execute step {stats['calls_per_execute_step']:.2f}, "
           f"calls/explore step {stats['calls_per_explore_step']:.2f}"]
  for kind, k in sorted(stats["per_kind"].items()):
    lines.append(f"  {kind:<9} kept {k['kept']:>5}/{k['episodes']:<5} "
                 f"({100 * k['kept_fraction']:.1f}%)")
  lines.append(f"  events {stats['events']}  with error recovery: {stats['with_error_recovery']}")
  return "\n".join(lines)
