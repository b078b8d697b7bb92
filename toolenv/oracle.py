"""A scripted solver: the gold DAG played back as Steps under a strategy.

    steps = toolenv.oracle.solve(task, strategy="paraact")

Strategies (the paper's agent and its baselines):

    paraact       explore in parallel for every tool whose need is apparent,
                  execute each DAG level as one parallel step, go back to
                  explore when a later need appears, then answer.
    react         one action per turn: search a tool, call it, next one.
    plan_execute  all exploration first (one parallel step), then one call per
                  turn in dependency order.
    interleaved   parallel calls with phases mixed: each turn runs the ready
                  calls and searches for the next tools together (needs
                  ``enforce_phases=False`` in the env, see `env_options`).

The oracle never looks at observations: gold arguments are already resolved
in the task (the simulator is deterministic). It is the seed of the cold-start
demonstrators and a check on the task generator.
"""

from __future__ import annotations

from toolenv.schema import SEARCH_TOOLS, Call, Step
from toolenv.tasks import Task

STRATEGIES: tuple[str, ...] = ("paraact", "react", "plan_execute", "interleaved")


def env_options(strategy: str) -> dict:
  """`ToolEnv` keyword arguments the strategy's steps need."""
  _check(strategy)
  return {"enforce_phases": strategy != "interleaved"}


def _check(strategy: str) -> None:
  if strategy not in STRATEGIES:
    raise ValueError(f"strategy must be one of {STRATEGIES}, got {strategy!r}")


ANSWER_STYLES: tuple[str, ...] = ("label", "json")


def answer_text(task: Task, style: str = "label") -> str:
  """The final answer: every gold value, ``; ``-separated.

  ``style="label"`` writes ``owner: Goran Haddad`` (the task's label);
  ``"json"`` writes the field as the observation shows it,
  ``"owner": "Goran Haddad"``, so that an answer is a copy of observed text
  (tasks from before answers kept their field fall back to the label).
  """
  if style not in ANSWER_STYLES:
    raise ValueError(f"answer style must be one of {ANSWER_STYLES}, got {style!r}")
  if style == "json" and all("key" in a and "json" in a for a in task.answers):
    return "; ".join(f'"{a["key"]}": {a["json"]}' for a in task.answers)
  return "; ".join(f"{a['label']}: {a['value']}" for a in task.answers)


def _search(node) -> Call:
  return Call(SEARCH_TOOLS, {"query": node["query"]})


def _call(node) -> Call:
  return Call(node["tool"], dict(node["arguments"]))


def _levels(task: Task) -> list[list[dict]]:
  out: list[list[dict]] = [[] for _ in range(task.depth)]
  for n in task.nodes:
    out[n["level"]].append(n)
  return out


def _first_per_tool(nodes) -> list[dict]:
  """One node per distinct tool (the one to search for)."""
  seen, out = set(), []
  for n in nodes:
    if n["tool"] not in seen:
      seen.add(n["tool"])
      out.append(n)
  return out


def solve(task: Task, strategy: str = "paraact") -> list[Step]:
  """The Step sequence that solves ``task`` under ``strategy``."""
  _check(strategy)
  final = Step(phase="answer", answer=answer_text(task),
               thought="I have every value the task asks for.")
  levels = _levels(task)
  steps: list[Step] = []
  known: set[str] = set()
  if strategy == "paraact":
    for li, level in enumerate(levels):
      # Explore what is needed now and not known: at the start every need
      # that the instruction makes apparent; later the late needs.
      if li == 0:
        want = [n for n in task.nodes if not n["late"]]
      else:
        want = [n for n in level if n["late"]]
      want = [n for n in _first_per_tool(want) if n["tool"] not in known]
      if want:
        steps.append(Step(phase="explore", calls=[_search(n) for n in want],
                          thought=f"Find tools for {len(want)} need(s) in parallel."))
        known |= {n["tool"] for n in want}
      steps.append(Step(phase="execute", calls=[_call(n) for n in level],
                        thought=f"Run {len(level)} independent call(s) together."))
    return steps + [final]
  if strategy == "react":
    for n in sorted(task.nodes, key=lambda n: (n["level"], n["id"])):
      if n["tool"] not in known:
        steps.append(Step(phase="explore", calls=[_search(n)],
                          thought="Search for the next tool."))
        known.add(n["tool"])
      steps.append(Step(phase="execute", calls=[_call(n)], thought="Call it."))
    return steps + [final]
  if strategy == "plan_execute":
    steps.append(Step(phase="explore", calls=[_search(n) for n in _first_per_tool(task.nodes)],
                      thought="Plan: find every tool first."))
    for n in sorted(task.nodes, key=lambda n: (n["level"], n["id"])):
      steps.append(Step(phase="execute", calls=[_call(n)], thought="Next call of the plan."))
    return steps + [final]
  # interleaved: each turn runs the ready level and searches for the next one.
  first = _first_per_tool(levels[0])
  steps.append(Step(phase="explore", calls=[_search(n) for n in first],
                    thought="Find the first tools."))
  known |= {n["tool"] for n in first}
  for li, level in enumerate(levels):
    nxt = levels[li + 1] if li + 1 < len(levels) else []
    new = [n for n in _first_per_tool(nxt) if n["tool"] not in known]
    known |= {n["tool"] for n in new}
    steps.append(Step(phase="execute", calls=[_call(n) for n in level] + [_search(n) for n in new],
                      thought="Run the ready calls and look for the next tools."))
  return steps + [final]
