"""StableToolBench queries on ToolEnv's simulator, with judge-free metrics.

For a user who has StableToolBench's data (not fetched here): the query files
``solvable_queries/test_instruction/G1_instruction.json`` (etc.) and the tool
directory ``toolenv/tools/<Category>/<tool>.json``, read by
`toolenv.catalog.toolbench`. Every tool of the directory goes into one
catalog; each query becomes a `toolenv.Task` whose gold tools are its
``relevant APIs``.

    sets = env_tasks(["G1_instruction.json"], "tools/", setting="open")

Settings: ``open`` (the agent searches the whole tool directory) and
``closed`` (the episode is given the query's own ``api_list``, as
StableToolBench's prompts give it).

The tools are not called: ToolEnv simulates them (from the API's ``schema``,
its ``test_endpoint`` example, or a default, see `toolbench.response_schema`),
deterministically. So there is no real answer to judge and no LLM judge. The
per-episode metrics are structural:

* ``api_recall``: fraction of the query's relevant APIs (those in the tool
  directory) that the agent called without an error at least once;
* ``found_recall``: fraction surfaced by search or docs (or called);
* ``finished``: the episode ended with an answer (not a budget);
* ``success`` (pass): finished, ``api_recall`` = 1, and the answer quotes,
  for every relevant API, a value from a response the agent got from it
  (so the answer is grounded in the calls); if the query has our optional
  ``answer_values`` list (not part of StableToolBench's format), every one
  of those must appear too.

Not comparable with StableToolBench's published SoPR / SoWR: those use real
(or cached/virtual) API responses and a GPT judge of whether the answer
solves the query; these metrics only check that the right APIs were used
and that the answer reports what they returned (`NOT_COMPARABLE`).
"""

from __future__ import annotations

import dataclasses
import json
import os
from typing import Any, Sequence

from toolenv.catalog import toolbench
from toolenv.catalog.store import Catalog
from toolenv.executor import Executor
from toolenv.rewards import value_in_answer
from toolenv.schema import Tool
from toolenv.search import get_tool_doc
from toolenv.tasks import Task, fmt_value
from toolenv.values import Draw, gen_from_schema

NOT_COMPARABLE = (
    "StableToolBench here: tools are simulated by ToolEnv (schema-drawn responses, "
    "no real, cached or GPT-virtual API), and pass is a deterministic check (relevant "
    "APIs called + answer quotes their responses), not the GPT-judged Solvable Pass "
    "Rate (SoPR) or Win Rate (SoWR) StableToolBench publishes: the numbers are not "
    "comparable with those.")


@dataclasses.dataclass
class EnvSet:
  """StableToolBench as ToolEnv episodes (see `env_tasks`)."""
  setting: str
  tasks: list[Task]
  catalog: Catalog
  given: dict[str, list[Tool]]
  relevant: dict[str, list[str]]        # task id -> relevant tool names (present)
  missing: dict[str, list[str]]         # task id -> relevant APIs not in the tools
  expected: dict[str, list[str]]        # task id -> optional answer_values


def _group(path: str) -> str:
  stem = os.path.splitext(os.path.basename(path))[0]
  return stem[:-len("_instruction")] if stem.endswith("_instruction") else stem


def _coerce(default: Any, sch: dict[str, Any]) -> tuple[bool, Any]:
  """A documented default as a valid value of its schema type, if it is one."""
  t = sch.get("type")
  if default in (None, ""):
    return False, None
  try:
    if t == "integer":
      return True, int(str(default))
    if t == "number":
      return True, float(str(default))
  except ValueError:
    return False, None
  if t == "boolean":
    if str(default).lower() in ("true", "false"):
      return True, str(default).lower() == "true"
    return False, None
  if t == "string":
    return True, str(default)
  return False, None


def gold_arguments(tool: Tool) -> dict[str, Any]:
  """Arguments the scripted oracle uses: every required parameter filled.

  A documented default of the right type is used (as a user would), else a
  value drawn from the parameter's schema, deterministically.
  """
  args = {}
  for p in tool.required:
    sch = tool.properties.get(p) or {}
    ok, v = _coerce(sch.get("default"), sch)
    if not ok:
      v = gen_from_schema({k: x for k, x in sch.items() if k != "default"},
                          Draw("stb-arg", tool.name, p), p)
    args[p] = v
  return args


def scalars(obj: Any, limit: int = 50) -> list[str]:
  """The scalar leaves of a response as answer text would write them."""
  out: list[str] = []

  def walk(x):
    if len(out) >= limit:
      return
    if isinstance(x, dict):
      for v in x.values():
        walk(v)
    elif isinstance(x, list):
      for v in x:
        walk(v)
    elif isinstance(x, (str, int, float)) and not isinstance(x, bool):
      s = fmt_value(x).strip()
      if s:
        out.append(s)
  walk(obj)
  return out


def env_tasks(query_files: Sequence[str] | str, tools_dir: str,
              setting: str = "open", limit: int = 0) -> EnvSet:
  """Queries and tools as `toolenv.Task`s.

  Args:
    query_files: StableToolBench query files (JSON lists), or one path.
    tools_dir: the ``tools`` directory (``<Category>/<tool>.json``).
    setting: ``open`` or ``closed``.
    limit: at most this many queries per file (0: all).

  Returns:
    An `EnvSet`; the task kind is the query group (``G1``, ``G2_category``, ...).
  """
  if setting not in ("open", "closed"):
    raise ValueError(f"setting must be 'open' or 'closed', got {setting!r}")
  if isinstance(query_files, str):
    query_files = [q for q in query_files.split(",") if q]
  if not query_files:
    raise ValueError("stabletoolbench: no query files given")
  catalog = Catalog(toolbench.load_tools(tools_dir), name="stabletoolbench",
                    info={"seed": 0})
  executor = Executor(catalog, seed=0)
  tasks, given, relevant, missing, expected = [], {}, {}, {}, {}
  for path in query_files:
    group = _group(path)
    queries = toolbench.load_queries(path)
    with open(path, encoding="utf-8") as f:
      raw = json.load(f)
    for q, item in list(zip(queries, raw))[:limit or None]:
      tid = f"{group}-{q.query_id}"
      rel = [n for n in dict.fromkeys(q.relevant) if n in catalog]
      missing[tid] = [n for n in dict.fromkeys(q.relevant) if n not in catalog]
      nodes, answers = [], []
      for i, name in enumerate(rel):
        tool = catalog[name]
        args = gold_arguments(tool)
        out = executor.run(name, args, executor.new_state())
        vals = scalars(out, 1) if "error" not in out else []
        nodes.append({"id": f"n{i}", "tool": name, "arguments": args, "deps": [],
                      "level": 0, "late": False,
                      "query": f"{tool.meta.get('api_name', name)} "
                               f"{tool.meta.get('tool_name', '')} {tool.description}"[:200]})
        if vals:
          answers.append({"label": tool.meta.get("api_name", name), "value": vals[0]})
      values = item.get("answer_values") if isinstance(item, dict) else None
      expected[tid] = [str(v) for v in values] if isinstance(values, list) else []
      answers += [{"label": "expected", "value": v} for v in expected[tid]]
      text = q.instruction
      if setting == "closed":
        own = [catalog[n] for n in dict.fromkeys(q.apis) if n in catalog]
        given[tid] = own
        text += "\n\nAPIs you can call (no others exist):\n" + "\n".join(
            json.dumps(_doc(t), ensure_ascii=False) for t in own)
      tasks.append(Task(id=tid, kind=group, split="test", instruction=text, nodes=nodes,
                        answers=answers, max_turns=min(40, 2 * len(nodes) + 6)))
      relevant[tid] = rel
  return EnvSet(setting, tasks, catalog, given, relevant, missing, expected)


def _doc(tool: Tool) -> dict[str, Any]:
  return get_tool_doc(Catalog([tool]), tool.name)


def score_episode(sets: EnvSet, task: Task, log, env) -> dict[str, Any]:
  """Judge-free metrics of one episode (see the module docstring)."""
  rel = sets.relevant[task.id]
  answer = log.answer if isinstance(log.answer, str) else ""
  called: dict[str, list[str]] = {}
  for c in log.tool_calls():
    if c.status in ("ok", "duplicate") and isinstance(c.name, str):
      # Responses are pure functions of the call (read tools, no state), so
      # the one the agent saw is recomputed rather than stored.
      out = env.executor.run(c.name, c.arguments, env.executor.new_state())
      called.setdefault(c.name, []).extend(scalars(out))
  hit = [n for n in rel if n in called]
  known = getattr(env, "known", set())
  found = [n for n in rel if n in known or n in called]
  grounded = all(any(value_in_answer(v, answer) for v in called.get(n, []))
                 for n in rel)
  expected_ok = all(value_in_answer(v, answer) for v in sets.expected.get(task.id, []))
  n = len(rel)
  ok = bool(log.finished and n and len(hit) == n and grounded and expected_ok)
  return {"success": ok,
          "api_recall": len(hit) / n if n else None,
          "found_recall": len(found) / n if n else None,
          "finished": bool(log.finished),
          "missing_apis": len(sets.missing.get(task.id, []))}
