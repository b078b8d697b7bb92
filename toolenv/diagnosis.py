"""Why an episode failed, and how it acted, from ToolEnv's step log and the gold plan.

    diag = env.diagnosis()          # ToolEnv, after the episode
    diag["cause"]                   # None on success, else one of CAUSES
    diag["redundant_searches"]      # and the other behaviour counts

Every failed episode gets exactly one cause, the first that applies in this
order (each is computed from the log of steps and calls the environment
kept, and the task's gold DAG):

1. ``wrong_answer``: every gold call ran, the episode answered, and the
   answer misses a gold value (or a write task's final state differs).
2. ``limit``: every gold call ran but the episode never answered (turn or
   token budget), unless its last step was malformed (then ``parse_error``).
3. ``parse_error``: a step was malformed (unparseable text, no phase tag,
   broken JSON, an answer without text) and no gold call completed after the
   last such step: the policy did not recover from it.
4. The first gold node that never completed (by level, then id), with tool T:

   * ``tool_not_found``: T never appeared in a search or doc result, and was
     never called;
   * ``unknown_tool``: T was shown but never called, and the episode called a
     tool name that does not exist (a name not copied right);
   * ``wrong_tool``: T was shown but never called; other catalog tools were;
   * ``answered_early``: T was shown, nothing wrong was called, and the
     episode answered without calling it (the answer's values for that
     sub-goal were never observed);
   * ``limit``: as above, but the episode ran out of turns or tokens;
   * ``call_before_input``: T was called while a call whose output that node
     needs had not yet run (in the same parallel step or before it);
   * ``wrong_arguments``: T was called after its inputs, never with the gold
     arguments (errors such as a missing or mistyped argument, or a valid
     call with other values).

The behaviour counts (`behaviour`) are defined on the same log for the
policy and for the oracle's plan of the same task (`oracle_behaviour`), so a
report can put them side by side. Nothing here imports JAX.
"""

from __future__ import annotations

from typing import Any, Sequence

from toolenv import oracle
from toolenv.schema import META_TOOLS, SEARCH_TOOLS

CAUSES: tuple[str, ...] = (
    "parse_error", "tool_not_found", "unknown_tool", "wrong_tool", "call_before_input",
    "wrong_arguments", "answered_early", "limit", "wrong_answer")

CAUSE_TEXT: dict[str, str] = {
    "parse_error": "malformed step, not recovered",
    "tool_not_found": "needed tool never found by search",
    "unknown_tool": "called a tool that does not exist (name not copied right)",
    "wrong_tool": "called other tools, never the needed one",
    "call_before_input": "dependent call before its input",
    "wrong_arguments": "needed tool called, never with the right arguments",
    "answered_early": "answered before every needed call ran",
    "limit": "turn or token limit",
    "wrong_answer": "right calls, wrong answer",
}

BEHAVIOUR_FIELDS: tuple[str, ...] = (
    "turns", "calls_per_execute_step", "phase_switches", "searches",
    "redundant_searches", "malformed_steps", "unknown_tool_calls")


def _calls(log: Sequence[dict[str, Any]]):
  """(step index, call record) of every call in the log."""
  for s, e in enumerate(log):
    for c in e.get("calls", ()):
      yield s, c


def behaviour(log: Sequence[dict[str, Any]]) -> dict[str, float]:
  """Counts of how an episode acted (the `BEHAVIOUR_FIELDS`).

  ``redundant_searches``: ``search_tools`` calls that showed no needed tool
  not already known (repeats included); ``calls_per_execute_step``: mean
  calls of the well-formed execute steps (0 if none); ``phase_switches``:
  changes between explore and execute.
  """
  phases = [e["phase"] for e in log if e.get("phase") in ("explore", "execute")]
  exec_calls = [len(e.get("calls", ())) for e in log if e.get("phase") == "execute"]
  searches = [c for _, c in _calls(log) if c.get("name") == SEARCH_TOOLS]
  return {
      "turns": len(log),
      "calls_per_execute_step": sum(exec_calls) / len(exec_calls) if exec_calls else 0.0,
      "phase_switches": sum(1 for a, b in zip(phases, phases[1:]) if a != b),
      "searches": len(searches),
      "redundant_searches": sum(1 for c in searches if not c.get("found")),
      "malformed_steps": sum(1 for e in log if e.get("malformed")),
      "unknown_tool_calls": sum(1 for _, c in _calls(log) if c.get("error") == "unknown_tool"),
  }


def _ordered_nodes(nodes: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
  def key(n):
    digits = "".join(ch for ch in str(n["id"]) if ch.isdigit())
    return (n["level"], int(digits) if digits else 0, str(n["id"]))
  return sorted(nodes, key=key)


def failure_cause(nodes: Sequence[dict[str, Any]], log: Sequence[dict[str, Any]], *,
                  success: bool, answered: bool) -> tuple[str | None, str]:
  """``(cause, detail)`` of an episode (None, "" on success); see the module doc.

  Args:
    nodes: the task's gold nodes (``id``, ``tool``, ``deps``, ``level``).
    log: `ToolEnv.log`: per step ``phase`` (None if malformed), ``malformed``,
      ``found`` (needed tools first shown), ``completed`` (gold nodes done) and
      ``calls`` (``name``, ``status``, ``error``, ``node``, ``found``).
    success, answered: the episode's outcome.
  """
  if success:
    return None, ""
  completed: set[str] = set()
  for e in log:
    completed |= set(e.get("completed", ()))
  missing = [n for n in _ordered_nodes(nodes) if n["id"] not in completed]
  malformed = [s for s, e in enumerate(log) if e.get("malformed")]
  if not missing:
    if answered:
      return "wrong_answer", "every gold call ran; the answer misses a gold value or state"
    if malformed and malformed[-1] == len(log) - 1:
      return "parse_error", f"step {malformed[-1] + 1} malformed, then the budget ran out"
    return "limit", "every gold call ran; no answer before the budget ran out"
  if malformed:
    after = set()
    for e in log[malformed[-1] + 1:]:
      after |= set(e.get("completed", ()))
    if not after:
      return "parse_error", (f"step {malformed[-1] + 1} of {len(log)} malformed; "
                             f"{len(missing)} of {len(nodes)} gold calls never ran")
  n = missing[0]
  tool = n["tool"]
  gold_tools = {m["tool"] for m in nodes}
  shown: set[str] = set()
  for e in log:
    shown |= set(e.get("found", ()))
  calls_of_tool = [(s, c) for s, c in _calls(log) if c.get("name") == tool]
  if not calls_of_tool:
    if tool not in shown:
      return "tool_not_found", f"{tool} (node {n['id']}) never shown by a search"
    unknown = [c["name"] for _, c in _calls(log) if c.get("error") == "unknown_tool"]
    if unknown:
      return "unknown_tool", f"called {str(unknown[0])[:60]!r}; needed {tool}"
    other = [c["name"] for _, c in _calls(log)
             if c.get("name") not in META_TOOLS and c.get("name") not in gold_tools]
    if other:
      return "wrong_tool", f"called {str(other[0])[:60]}; needed {tool}"
    if answered:
      return "answered_early", f"answered without calling {tool} (node {n['id']})"
    return "limit", f"{tool} (node {n['id']}) not called before the budget ran out"
  done_before: list[set[str]] = []
  acc: set[str] = set()
  for e in log:
    done_before.append(set(acc))
    acc |= set(e.get("completed", ()))
  deps = set(n.get("deps", ()))
  early = [s for s, _ in calls_of_tool if not deps <= done_before[s]]
  if early:
    return "call_before_input", (f"{tool} called at step {early[0] + 1} before "
                                 f"{', '.join(sorted(deps - done_before[early[0]]))} ran")
  errs = [c.get("error") for _, c in calls_of_tool if c.get("error")]
  what = f"errors: {', '.join(sorted(set(errs)))}" if errs else "valid calls with other values"
  return "wrong_arguments", f"{tool} (node {n['id']}) called {len(calls_of_tool)}x; {what}"


def oracle_behaviour(env, task, strategy: str = "paraact") -> dict[str, float]:
  """`behaviour` of the oracle's plan of ``task`` played in ``env`` (a `ToolEnv`)."""
  env.reset(task)
  for step in oracle.solve(task, strategy):
    if env.done:
      break
    env.step(step)
  return behaviour(env.log)
