"""Role agents of the cold-start multi-agent system, scripted backend.

Four roles share one interface, ``Role.act(context) -> RoleOutput``:

    planner   decomposes the task into sub-goals (one per gold DAG node for the
              scripted backend), with dependency levels and "late" needs.
    explorer  finds the tool of one sub-goal: first it proposes a search call,
              then, given that call's observation block, picks the tool or
              asks to search again. Several explorers run for independent
              sub-goals; their calls form one parallel explore step.
    executor  writes the calls of the ready sub-goals (one parallel execute
              step per ready level), and corrects calls that got an error.
    answerer  writes the final answer from the observations.

The scripted backend plays the gold information of the task (it is built on
`toolenv.oracle`) with configurable imperfection so demonstrations show
recovery: a vaguer first search that misses and is retried, a level split
into two steps, a wrong argument that gets an error and is then corrected.
The chat backend (`chat_roles`) implements the same roles with an API model.
"""

from __future__ import annotations

import dataclasses
import random
import re
from typing import Any, Callable, Iterable, Sequence

from toolenv import oracle
from toolenv.schema import SEARCH_TOOLS, Call, Step
from toolenv.tasks import Task

ROLE_NAMES: tuple[str, ...] = ("planner", "explorer", "executor", "answerer")


@dataclasses.dataclass
class SubGoal:
  """One sub-goal of the plan (the scripted planner makes one per DAG node).

  Attributes:
    id: stable id (the gold node id for the scripted planner).
    need: what to search for (the explorer's precise query).
    level: dependency level (0 = runnable at once).
    deps: ids of the sub-goals whose results this one uses.
    late: the need only appears after earlier results (explored then).
    tool: the gold tool (privileged; None for the chat backend).
    arguments: the gold arguments (privileged; None for the chat backend).
  """

  id: str
  need: str
  level: int = 0
  deps: list[str] = dataclasses.field(default_factory=list)
  late: bool = False
  tool: str | None = None
  arguments: dict[str, Any] | None = None


@dataclasses.dataclass
class Context:
  """What a role sees when it acts (fields unused by a role stay empty).

  Attributes:
    task: the task (roles of the chat backend read only its instruction).
    plan: the planner's sub-goals.
    subgoal: the explorer's sub-goal.
    search_block: the observation block answering the explorer's last call.
    attempt: how many searches the explorer made for this sub-goal so far.
    ready: the executor's sub-goals to run now.
    tools: sub-goal id -> tool name chosen by the explorers.
    tool_info: tool name -> the search-result line that describes it.
    results: sub-goal id -> observation block of its successful call.
    errors: sub-goal id -> (the call that failed, its error block).
    history: every (step text, observation) so far, for the answerer.
  """

  task: Task
  plan: list[SubGoal] = dataclasses.field(default_factory=list)
  subgoal: SubGoal | None = None
  search_block: str | None = None
  attempt: int = 0
  ready: list[SubGoal] = dataclasses.field(default_factory=list)
  tools: dict[str, str] = dataclasses.field(default_factory=dict)
  tool_info: dict[str, str] = dataclasses.field(default_factory=dict)
  results: dict[str, str] = dataclasses.field(default_factory=dict)
  errors: dict[str, tuple[Call, str]] = dataclasses.field(default_factory=dict)
  history: list[tuple[str, str]] = dataclasses.field(default_factory=list)


@dataclasses.dataclass
class RoleOutput:
  """What a role produced.

  Attributes:
    role: the role's name.
    plan: planner output.
    call: explorer output: the next search call (None when done).
    tool: explorer output: the tool picked from the results (None if missed).
    calls: executor output: ``(sub-goal id, Call)`` pairs for one step.
    answer: answerer output.
    thought: the short thought written with the step.
  """

  role: str
  plan: list[SubGoal] | None = None
  call: Call | None = None
  tool: str | None = None
  calls: list[tuple[str, Call]] = dataclasses.field(default_factory=list)
  answer: str | None = None
  thought: str = ""


class Role:
  """Interface of a role agent."""

  name: str = "role"

  def act(self, context: Context) -> RoleOutput:
    """One decision of this role in ``context``."""
    raise NotImplementedError


@dataclasses.dataclass
class Imperfection:
  """Probabilities of the scripted backend's deliberate mistakes.

  Attributes:
    vague_search: an explorer first searches without the provider brand.
    split_level: the executor runs a level of >= 2 calls as two steps.
    wrong_argument: the executor breaks one argument of a level's first step
      (drops a required one, or adds an unknown one); the env answers with an
      error and the executor then sends the gold call.
  """

  vague_search: float = 0.0
  split_level: float = 0.0
  wrong_argument: float = 0.0

  @classmethod
  def default(cls) -> "Imperfection":
    """The mix used for the demo demonstrations."""
    return cls(vague_search=0.15, split_level=0.1, wrong_argument=0.1)


def _rng(seed: int, task: Task, *salt: Any) -> random.Random:
  return random.Random("|".join(str(x) for x in (seed, task.id) + salt))


class ScriptedPlanner(Role):
  """Sub-goals from the gold DAG: one per node, with its level and need."""

  name = "planner"

  def act(self, context: Context) -> RoleOutput:
    plan = [SubGoal(id=n["id"], need=n["query"], level=n["level"], deps=list(n["deps"]),
                    late=bool(n["late"]), tool=n["tool"], arguments=dict(n["arguments"]))
            for n in context.task.nodes]
    return RoleOutput(self.name, plan=plan,
                      thought=f"Plan: {len(plan)} sub-goal(s) over "
                              f"{1 + max(s.level for s in plan)} level(s).")


def vague_query(need: str) -> str:
  """The need without its first word (the provider brand): a worse query."""
  words = need.split()
  return " ".join(words[1:]) if len(words) > 1 else need


def block_mentions(block: str | None, tool: str) -> bool:
  """Whether a search-result block lists ``tool`` (one result per line)."""
  if not block:
    return False
  # A line starts with the tool name, then ": description (params)" (the
  # full format) or "(params)" (ToolEnv's obs_format="compact").
  return any(re.split(r"[:(]", line, maxsplit=1)[0].strip().endswith(tool)
             for line in block.splitlines())


class ScriptedExplorer(Role):
  """Searches for the gold tool; sometimes first with a vaguer query."""

  name = "explorer"

  def __init__(self, imperfection: Imperfection, seed: int = 0,
               top_k: int | None = None):
    self.imp = imperfection
    self.seed = seed
    # An explicit top_k in the call: fewer results make shorter observations
    # (the CPU demo's context budget); None leaves the env's default.
    self.top_k = top_k

  def act(self, context: Context) -> RoleOutput:
    sg = context.subgoal
    if context.search_block is not None:
      if block_mentions(context.search_block, sg.tool):
        return RoleOutput(self.name, tool=sg.tool)
      if context.attempt >= 3:
        return RoleOutput(self.name)
    query = sg.need
    if context.attempt == 0 and _rng(self.seed, context.task, "vague", sg.id).random() < (
        self.imp.vague_search):
      query = vague_query(sg.need)
    args: dict[str, Any] = {"query": query}
    if self.top_k:
      args["top_k"] = int(self.top_k)
    return RoleOutput(self.name, call=Call(SEARCH_TOOLS, args))


def break_arguments(arguments: dict[str, Any], required: Sequence[str]) -> dict[str, Any]:
  """A wrong version of ``arguments`` that a schema check always rejects."""
  bad = dict(arguments)
  for k in required:
    if k in bad:
      del bad[k]
      return bad
  bad["options"] = "all"
  return bad


class ScriptedExecutor(Role):
  """Gold calls of the ready sub-goals, with optional split / wrong argument."""

  name = "executor"

  def __init__(self, catalog, imperfection: Imperfection, seed: int = 0):
    self.catalog = catalog
    self.imp = imperfection
    self.seed = seed

  def act(self, context: Context) -> RoleOutput:
    ready = list(context.ready)
    if context.errors:
      fix = [s for s in ready if s.id in context.errors]
      return RoleOutput(self.name, thought="Fix the failed call(s) from the error.",
                        calls=[(s.id, Call(s.tool, dict(s.arguments))) for s in fix])
    rng = _rng(self.seed, context.task, "exec", ready[0].id)
    # Mistakes only on a level's first step, so that recovery stays bounded.
    first = not any(s.id in context.results for s in context.plan
                    if s.level == ready[0].level)
    if first and len(ready) >= 2 and rng.random() < self.imp.split_level:
      ready = ready[:len(ready) // 2]
    calls = [(s.id, Call(s.tool, dict(s.arguments))) for s in ready]
    if first and rng.random() < self.imp.wrong_argument:
      j = rng.randrange(len(calls))
      sid, call = calls[j]
      tool = self.catalog[call.name]
      calls[j] = (sid, Call(call.name, break_arguments(call.arguments, tool.required)))
    return RoleOutput(self.name, calls=calls,
                      thought=f"Run {len(calls)} independent call(s) together.")


class ScriptedAnswerer(Role):
  """The gold answer text: every gold value, in ``oracle.answer_text`` style."""

  name = "answerer"

  def __init__(self, style: str = "label"):
    if style not in oracle.ANSWER_STYLES:
      raise ValueError(f"answer_style={style!r}; expected one of {oracle.ANSWER_STYLES}")
    self.style = style

  def act(self, context: Context) -> RoleOutput:
    return RoleOutput(self.name, answer=oracle.answer_text(context.task, self.style))


def serial_map(fn: Callable[[Any], Any], items: Iterable[Any]) -> list[Any]:
  """`map` that runs in the caller's thread (the scripted backend's pool)."""
  return [fn(x) for x in items]


@dataclasses.dataclass
class RoleSet:
  """The four roles of one backend, and how explorers run concurrently.

  Attributes:
    planner, explorer, executor, answerer: the roles.
    map: ``map(fn, items) -> list`` used to run explorers for independent
      sub-goals (a thread pool in the chat backend).
    concurrent_episodes: threads advancing episodes of a batch at once (the
      chat backend waits on the network; the scripted one does not).
    name: backend name.
  """

  planner: Role
  explorer: Role
  executor: Role
  answerer: Role
  map: Callable[[Callable[[Any], Any], Iterable[Any]], list[Any]] = serial_map
  concurrent_episodes: int = 1
  name: str = "scripted"


def scripted_roles(catalog, imperfection: Imperfection | None = None,
                   seed: int = 0, search_top_k: int | None = None,
                   answer_style: str = "label") -> RoleSet:
  """The scripted backend (gold information with ``imperfection``).

  ``search_top_k``: the explorers pass this ``top_k`` to ``search_tools``
  (None: they leave it to the environment's default). ``answer_style``: how
  the answerer writes values (`toolenv.oracle.answer_text`).
  """
  imp = imperfection or Imperfection()
  return RoleSet(planner=ScriptedPlanner(),
                 explorer=ScriptedExplorer(imp, seed, top_k=search_top_k),
                 executor=ScriptedExecutor(catalog, imp, seed),
                 answerer=ScriptedAnswerer(answer_style))


def step_of(output: RoleOutput, phase: str) -> Step:
  """The ParaAct step of an explore/execute/answer role output."""
  if phase == "answer":
    return Step(phase="answer", answer=output.answer or "", thought=output.thought)
  return Step(phase=phase, calls=[c for _, c in output.calls], thought=output.thought)
