"""BFCL tasks (closed and open-world), our BFCL-rule checker, perturbations.

The checker follows BFCL's published AST rules for Python categories:

* the model's calls are a list of ``{function_name: {param: value}}``;
* simple: exactly one call; multiple: as many calls as answers (one), checked
  against the expected function; parallel(_multiple): as many calls as
  answers, matched without regard to order (each expected call, in turn, takes
  the first still-unmatched model call that satisfies it);
* a call is valid when: the expected name is called; every required parameter
  is present; every given parameter is documented and has possible answers; its
  type matches (``int`` accepted for ``float``, ``bool`` is not ``int``; a value
  of the possible answers' own type is accepted when that type differs from the
  documented one: BFCL's "variable" case); its value is among the possible
  answers (strings compared after lowercasing and removing `` ,./-_*^``, also
  inside lists and dicts); every possible-answer parameter that is not given
  has ``""`` among its answers (``""`` means "may be omitted").

Agreement with BFCL's own ``ast_checker`` (bfcl-eval 2026.3.23, in a scratch
venv; see ``scripts/bfcl_agreement.py`` for the setup):

    .venv/bin/python scripts/bfcl_agreement.py --bfcl-python /tmp/bfcl-venv/bin/python

measured: gold 1000/1000 and perturbed 7843/7843 verdicts agree over
simple_python / multiple / parallel / parallel_multiple.
"""

from __future__ import annotations

import copy
import dataclasses
import json
import random
import re
from typing import Any

from toolenv import oracle
from toolenv.catalog.bfcl import BFCLEntry, pooled_tools
from toolenv.catalog.store import Catalog
from toolenv.schema import META_TOOLS, Tool
from toolenv.search import get_tool_doc
from toolenv.tasks import Task

_PY_TYPES = {"string": str, "integer": int, "float": float, "boolean": bool,
             "array": list, "tuple": list, "dict": dict, "any": str}
_STRIP = re.compile(r"[ ,./\-_*^]")


@dataclasses.dataclass
class BFCLTask:
  """One BFCL task in a setting.

  ``tools`` are the functions the agent is given: the entry's own in the
  closed setting; in the open-world setting none are given (the agent searches
  ``catalog``) and ``names`` maps original names to catalog names.
  """
  entry: BFCLEntry
  setting: str
  tools: list[Tool]
  names: dict[str, str]

  @property
  def instruction(self) -> str:
    """The user's request."""
    return self.entry.instruction


def make_tasks(entries: list[BFCLEntry], setting: str = "closed"
               ) -> tuple[list[BFCLTask], list[Tool]]:
  """Tasks and the catalog to search (empty list in the closed setting)."""
  if setting not in ("closed", "open"):
    raise ValueError(f"setting must be 'closed' or 'open', got {setting!r}")
  pool, mapping = pooled_tools(entries)
  by_name = {t.name: t for t in pool}
  tasks = []
  for e in entries:
    names = {fn["name"]: mapping[(e.id, fn["name"])] for fn in e.functions}
    own = [by_name[names[fn["name"]]] for fn in e.functions]
    tasks.append(BFCLTask(entry=e, setting=setting,
                          tools=own if setting == "closed" else [],
                          names=names))
  return tasks, (pool if setting == "open" else [])


# ------------------------------------------------------------------ checker

def _norm(s: str) -> str:
  return _STRIP.sub("", s).lower().replace("'", '"')


def _norm_any(v: Any) -> Any:
  return _norm(v) if isinstance(v, str) else v


def _first_type(answers: list[Any]):
  for a in answers:
    if a != "":
      return type(a)
  return None


def _dict_ok(value: dict, options: list[Any]) -> bool:
  for opt in options:
    if opt == "" or not isinstance(opt, dict):
      continue
    given_ok = all(k in opt and _norm_any(v) in [_norm_any(x) for x in opt[k]]
                   for k, v in value.items())
    omitted_ok = all(k in value or "" in opts for k, opts in opt.items())
    if given_ok and omitted_ok:
      return True
  return False


def _type_ok(value: Any, answers: list[Any], want: type, inner: type | None
             ) -> tuple[bool, bool]:
  """(valid, is_variable) following BFCL's one-level type rules."""
  ans_type = _first_type(answers)
  variable = ans_type is not None and ans_type is not want
  if type(value) is want:
    if inner is None:
      return True, variable
    for opt in answers:
      if not isinstance(opt, list) or all(
          _type_ok(v, opt, inner, None)[0] for v in value):
        return True, variable
  if ans_type is not None and type(value) is ans_type:
    return True, True
  return False, variable


def check_call(fn: dict[str, Any], call: Any, answer: dict[str, Any]) -> str:
  """'' when ``call`` satisfies the possible ``answer`` for ``fn``, else why."""
  expected = dict(answer[next(iter(answer))])
  props = fn["parameters"].get("properties", {})
  name = fn["name"]
  if not isinstance(call, dict) or name not in call:
    return "wrong_func_name"
  args = call[name]
  if not isinstance(args, dict):
    return "bad_arguments"
  for r in fn["parameters"].get("required", []):
    if r not in args:
      return "missing_required"
  for p, value in args.items():
    if p not in props or p not in expected:
      return "unexpected_param"
    ptype = props[p].get("type", "any")
    want = _PY_TYPES.get(ptype, str)
    inner = None
    if ptype in ("array", "tuple"):
      inner = _PY_TYPES.get((props[p].get("items") or {}).get("type", "any"),
                            str)
    if ptype == "tuple" and isinstance(value, tuple):
      value = list(value)
    if ptype == "float" and type(value) is int:
      value = float(value)
    ok, variable = _type_ok(value, expected[p], want, inner)
    if not ok:
      return "type_error"
    opts = expected[p]
    if not variable:
      if want is dict:
        if not _dict_ok(value, opts):
          return "value_error"
        continue
      if want is list and inner is dict:
        if not any(isinstance(o, list) and len(o) == len(value) and all(
            isinstance(v, dict) and _dict_ok(v, [d]) for v, d in zip(value, o))
                   for o in opts):
          return "value_error"
        continue
      if want is str:
        if _norm(value) not in [_norm(o) for o in opts if isinstance(o, str)]:
          return "value_error"
        continue
      if want is list:
        normed = [_norm_any(v) for v in value]
        if not any(isinstance(o, list) and [_norm_any(x) for x in o] == normed
                   for o in opts):
          return "value_error"
        continue
    if value not in opts:
      return "value_error"
  for p, opts in expected.items():
    if p not in args and "" not in opts:
      return "missing_optional"
  return ""


def _find(fns: list[dict[str, Any]], name: str) -> dict[str, Any] | None:
  return next((f for f in fns if f["name"] == name), None)


def check(entry: BFCLEntry, calls: Any) -> tuple[bool, str]:
  """Scores a list of ``{name: args}`` calls against the entry's answers."""
  gt = entry.ground_truth
  if not isinstance(calls, list):
    return False, "not_a_list"
  if len(calls) != len(gt):
    return False, "wrong_count"
  if "parallel" not in entry.category:
    fn = _find(entry.functions, next(iter(gt[0])))
    if fn is None:
      return False, "unknown_function"
    why = check_call(fn, calls[0], gt[0])
    return not why, why
  used: set[int] = set()
  for ans in gt:
    fn = _find(entry.functions, next(iter(ans)))
    if fn is None:
      return False, "unknown_function"
    hit = next((i for i, c in enumerate(calls)
                if i not in used and not check_call(fn, c, ans)), None)
    if hit is None:
      return False, "cannot_find_match"
    used.add(hit)
  return True, ""


def check_task(task: BFCLTask, calls: list[dict[str, Any]]) -> tuple[bool, str]:
  """Scores calls made with catalog names (open world) or original names."""
  back = {v: k for k, v in task.names.items()}
  renamed = [{back.get(k, k): v for k, v in c.items()}
             if isinstance(c, dict) else c for c in calls]
  return check(task.entry, renamed)


# ------------------------------------------------------------------ oracle

def _gold_value(opts: list[Any]) -> tuple[bool, Any]:
  """(present, value): the first non-empty possible answer, realised."""
  for o in opts:
    if o == "":
      continue
    if isinstance(o, dict) and all(isinstance(v, list) for v in o.values()):
      return True, {k: v for k, (has, v) in (
          (k, _gold_value(vs)) for k, vs in o.items()) if has}
    if isinstance(o, list) and o and all(isinstance(x, dict) and all(
        isinstance(v, list) for v in x.values()) for x in o):
      return True, [_gold_value([x])[1] for x in o]
    return True, copy.deepcopy(o)
  return False, None


def gold_calls(entry: BFCLEntry, names: dict[str, str] | None = None
               ) -> list[dict[str, Any]]:
  """The oracle's calls: one per answer, first option of every parameter."""
  out = []
  for ans in entry.ground_truth:
    fname = next(iter(ans))
    fn = _find(entry.functions, fname) or {"parameters": {}}
    props = fn["parameters"].get("properties", {})
    args = {}
    for p, opts in ans[fname].items():
      if p not in props and "" in opts:
        continue  # Undocumented but optional: giving it would be "unexpected".
      has, v = _gold_value(opts)
      if has:
        args[p] = v
    out.append({(names or {}).get(fname, fname): args})
  return out


# ------------------------------------------------------------- perturbations

def _wrong(v: Any) -> Any:
  if isinstance(v, bool):
    return not v
  if isinstance(v, (int, float)):
    return v + 7919
  if isinstance(v, str):
    return v + " zq"
  if isinstance(v, list):
    return v + v[:1] if v else ["zq"]
  if isinstance(v, dict):
    return {**v, "zq_extra": 1}
  return "zq"


def perturb(entry: BFCLEntry, rng: random.Random) -> list[tuple[str, list]]:
  """Perturbed answers of the gold calls: (kind, calls). Some stay valid."""
  gold = gold_calls(entry)
  out: list[tuple[str, list]] = []
  i = rng.randrange(len(gold))
  name = next(iter(gold[i]))
  args = gold[i][name]
  if args:
    p = rng.choice(sorted(args))
    bad = copy.deepcopy(gold)
    bad[i][name][p] = _wrong(args[p])
    out.append(("wrong_value", bad))
    drop = copy.deepcopy(gold)
    del drop[i][name][p]
    out.append(("drop_param", drop))
    if isinstance(args[p], str):
      case = copy.deepcopy(gold)
      case[i][name][p] = args[p].upper() + " ."
      out.append(("string_variant", case))
    if isinstance(args[p], float) and args[p].is_integer():
      as_int = copy.deepcopy(gold)
      as_int[i][name][p] = int(args[p])
      out.append(("int_for_float", as_int))
    if isinstance(args[p], int) and not isinstance(args[p], bool):
      as_str = copy.deepcopy(gold)
      as_str[i][name][p] = str(args[p])
      out.append(("wrong_type", as_str))
  extra_p = copy.deepcopy(gold)
  extra_p[i][name]["zq_unknown"] = 1
  out.append(("extra_param", extra_p))
  out.append(("extra_call", copy.deepcopy(gold) + [copy.deepcopy(gold[i])]))
  out.append(("missing_call", copy.deepcopy(gold[:i] + gold[i + 1:])))
  out.append(("swapped_order", copy.deepcopy(gold[::-1])))
  renamed = copy.deepcopy(gold)
  renamed[i] = {name + "_zq": args}
  out.append(("wrong_name", renamed))
  return out


def unsolvable(entries: list[BFCLEntry]) -> list[str]:
  """Ids whose possible answers contradict their own function docs.

  (A required parameter absent from every answer, or an answer parameter the
  doc does not define.) BFCL's checker rejects every answer to these too.
  """
  return [e.id for e in entries if not check(e, gold_calls(e))[0]]


def score_oracle(entries: list[BFCLEntry], setting: str) -> float:
  """Fraction of solvable tasks the oracle's gold calls pass in ``setting``."""
  bad = set(unsolvable(entries))
  tasks, _ = make_tasks([e for e in entries if e.id not in bad], setting)
  ok = sum(check_task(t, gold_calls(t.entry, t.names if setting == "open"
                                    else None))[0] for t in tasks)
  return ok / max(len(tasks), 1)


# ------------------------------------------------- ToolEnv episodes (agents)

@dataclasses.dataclass
class EnvSet:
  """BFCL as ToolEnv episodes for an agent (see `env_tasks`)."""
  setting: str
  tasks: list[Any]                    # toolenv.Task, one per entry
  catalog: Any                        # the pooled Catalog
  given: dict[str, list[Tool]]        # closed setting: task id -> its functions
  bfcl: dict[str, BFCLTask]           # task id -> the BFCL task (for the checker)


def _query(fn: dict[str, Any]) -> str:
  """What the scripted explorer searches for: the function's words."""
  words = re.sub(r"[._]+", " ", fn["name"])
  return f"{words} {fn.get('description', '')}"[:200].strip()


def _doc_block(tools: list[Tool]) -> str:
  """The closed setting's function list, as ``get_tool_doc`` would show it."""
  cat = Catalog(tools, name="given")
  return "\n".join(json.dumps(get_tool_doc(cat, t.name), ensure_ascii=False)
                   for t in tools)


def env_tasks(entries: list[BFCLEntry], setting: str = "open") -> EnvSet:
  """BFCL entries as `toolenv.Task`s in the open-world or closed setting.

  Open world: the instruction is the user's request and nothing else; the
  agent searches the pooled catalog of every entry's functions. Closed: the
  instruction also lists the entry's own functions (``get_tool_doc`` JSON,
  one per line) and that episode can only search and call those. In both,
  each gold call is a task node (tool = catalog name, arguments = the first
  possible answer, level 0), so ToolEnv's step and phase rewards apply; the
  task has no answer values: success is the BFCL checker's verdict on the
  calls (`score_episode`).
  """
  if setting not in ("closed", "open"):
    raise ValueError(f"setting must be 'closed' or 'open', got {setting!r}")
  bfcl_tasks, _ = make_tasks(entries, setting)
  pool, _ = pooled_tools(entries)
  catalog = Catalog(pool, name="bfcl", info={"seed": 0})
  out, given, by_id = [], {}, {}
  for bt in bfcl_tasks:
    e = bt.entry
    gold = gold_calls(e, bt.names)
    fns = {bt.names[fn["name"]]: fn for fn in e.functions}
    nodes = []
    for i, call in enumerate(gold):
      (name, args), = call.items()
      nodes.append({"id": f"n{i}", "tool": name, "arguments": args, "deps": [],
                    "level": 0, "query": _query(fns.get(name, {"name": name})),
                    "late": False})
    text = e.instruction
    if setting == "closed":
      own = [catalog[bt.names[fn["name"]]] for fn in e.functions]
      given[e.id] = own
      text += "\n\nFunctions you can call (no others exist):\n" + _doc_block(own)
    out.append(Task(id=e.id, kind=e.category, split="test", instruction=text,
                    nodes=nodes, answers=[], max_turns=min(40, 2 * len(nodes) + 6)))
    by_id[e.id] = bt
  return EnvSet(setting, out, catalog, given, by_id)


def episode_calls(log) -> list[dict[str, Any]]:
  """The agent's answer in BFCL's form: every catalog call it made, in order.

  ``log`` is a `toolenv.benchmarks.fixed_env.EpisodeLog`. Calls the simulator
  rejected for their arguments still count (the checker, not the simulator,
  judges arguments, as BFCL's AST checker does without executing anything);
  meta-tool calls and phase violations (never run) do not.
  """
  out = []
  for c in log.tool_calls():
    name = c.name if isinstance(c.name, str) else repr(c.name)
    out.append({name: c.arguments})
  return out


def score_episode(sets: EnvSet, task, log, env=None) -> dict[str, Any]:
  """BFCL verdict on an episode: ``{"success", "reason", "bfcl_calls", "finished"}``."""
  del env
  calls = episode_calls(log)
  ok, why = check_task(sets.bfcl[task.id], calls)
  return {"success": ok, "reason": why, "bfcl_calls": len(calls),
          "finished": bool(log.finished)}


def oracle_steps(task, strategy: str, setting: str) -> list:
  """The scripted oracle's steps for a BFCL task (`toolenv.oracle.solve`).

  In the closed setting the functions are given, so the search steps and
  search calls are dropped.
  """
  steps = oracle.solve(task, strategy)
  # BFCL tasks have no answer values; the oracle still closes with a text.
  steps[-1] = dataclasses.replace(steps[-1], answer=f"Made {len(task.nodes)} call(s).")
  if setting == "open":
    return steps
  out = []
  for s in steps:
    if s.phase == "explore":
      continue
    if s.phase == "execute":
      calls = [c for c in s.calls if c.name not in META_TOOLS]
      if not calls:
        continue
      s = dataclasses.replace(s, calls=calls)
    out.append(s)
  return out
