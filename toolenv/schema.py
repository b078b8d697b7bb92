"""Plain data types shared by every part of ToolEnv.

These are the seams of the environment: catalogs (procedural, OpenAPI, BFCL,
ToolBench) produce `Tool`s, agents produce `Step`s made of `Call`s, and the
environment answers with `StepResult`s. Nothing here imports JAX.

A tool's ``parameters`` and ``response`` are JSON Schema objects (plain dicts):

    {"type": "object",
     "properties": {"city": {"type": "string", "description": "..."},
                    "units": {"type": "string", "enum": ["metric", "imperial"],
                              "default": "metric"}},
     "required": ["city"]}

Supported property types: string, integer, number, boolean, array, object, and
string/integer enums (``"enum": [...]``).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Literal

Phase = Literal["explore", "execute", "answer"]
Effect = Literal["read", "write"]

PHASES: tuple[str, ...] = ("explore", "execute", "answer")
EFFECTS: tuple[str, ...] = ("read", "write")
JSON_TYPES: tuple[str, ...] = (
    "string", "integer", "number", "boolean", "array", "object")

# The meta-tools of the explore phase. They are not catalog tools.
SEARCH_TOOLS = "search_tools"
GET_TOOL_DOC = "get_tool_doc"
META_TOOLS: tuple[str, ...] = (SEARCH_TOOLS, GET_TOOL_DOC)


def empty_object_schema() -> dict[str, Any]:
  """Returns the JSON Schema of an object with no properties."""
  return {"type": "object", "properties": {}, "required": []}


@dataclasses.dataclass(frozen=True)
class Tool:
  """One tool interface of a catalog.

  Attributes:
    name: unique, stable identifier the agent calls (e.g. ``weatherly_get_forecast``).
    category: marketplace category (``weather``, ``finance``, ...).
    provider: the API provider within the category.
    description: one or two sentences the agent reads in search results.
    parameters: JSON Schema object of the arguments.
    response: JSON Schema of a successful response.
    effect: ``read`` tools do not change state; ``write`` tools do.
    source: which catalog builder made it (``procedural``, ``openapi``, ...).
    meta: builder-specific extras (operation kind, HTTP method and path, ...).
  """

  name: str
  category: str
  provider: str
  description: str
  parameters: dict[str, Any] = dataclasses.field(
      default_factory=empty_object_schema)
  response: dict[str, Any] = dataclasses.field(
      default_factory=empty_object_schema)
  effect: str = "read"
  source: str = "procedural"
  meta: dict[str, Any] = dataclasses.field(default_factory=dict)

  @property
  def required(self) -> list[str]:
    """Names of the required parameters."""
    return list(self.parameters.get("required", []))

  @property
  def properties(self) -> dict[str, Any]:
    """Parameter name -> JSON Schema of that parameter."""
    return dict(self.parameters.get("properties", {}))

  def to_dict(self) -> dict[str, Any]:
    """Returns a JSON-serialisable dict (the catalog store's row format)."""
    return dataclasses.asdict(self)

  @classmethod
  def from_dict(cls, d: dict[str, Any]) -> "Tool":
    """Inverse of `to_dict`; unknown keys are rejected."""
    fields = {f.name for f in dataclasses.fields(cls)}
    unknown = set(d) - fields
    if unknown:
      raise ValueError(f"Unknown Tool fields: {sorted(unknown)}")
    return cls(**d)


@dataclasses.dataclass
class Call:
  """One action: a tool name and its arguments.

  ``arguments`` is typed ``Any`` on purpose: a model may write a list or a
  string where a dict belongs, and the environment must answer that with an
  error observation rather than fail while building the Call.
  """

  name: Any
  arguments: Any = dataclasses.field(default_factory=dict)


@dataclasses.dataclass
class Step:
  """One assistant turn of ParaAct: a phase and its parallel calls, or an answer.

  Attributes:
    phase: ``explore`` (meta-tools), ``execute`` (catalog tools) or ``answer``.
    calls: actions run in parallel in this step (empty for an answer).
    answer: the final answer text when ``phase == "answer"``.
    thought: the short plan the agent wrote before acting (may be empty).
    parse_error: set by a text parser when the model output was malformed; the
      environment then answers with an error observation and a penalty.
  """

  phase: Any
  calls: Any = dataclasses.field(default_factory=list)
  answer: Any = None
  thought: str = ""
  parse_error: str | None = None


@dataclasses.dataclass(frozen=True)
class StepResult:
  """What the environment returns for one episode's step (gymnasium's shape).

  Attributes:
    observation: text the agent reads next (one block per call).
    reward: the step's reward (`toolenv.rewards.step_reward`; a penalty for a
      malformed step or a step after the episode ended).
    terminated: the episode ended by an answer.
    truncated: the episode ended by the task's turn budget (or from outside,
      `ToolEnv.finish`).
    info: structured details: ``phase`` (the phase the env recorded, None for
      a malformed step), per-call ``statuses``, ``useful``, ``error``.
  """

  observation: str
  reward: float
  terminated: bool
  truncated: bool = False
  info: dict[str, Any] = dataclasses.field(default_factory=dict)

  @property
  def done(self) -> bool:
    """No more steps are accepted: ``terminated or truncated``."""
    return self.terminated or self.truncated


@dataclasses.dataclass(frozen=True)
class EpisodeRewards:
  """An episode's rewards at the three levels, and its outcome.

  Attributes:
    step: one reward per logged step (steps after the end are not logged).
    phase: ``(phase_type, reward)`` per maximal explore / execute run
      (`toolenv.rewards.segments`), in order.
    trajectory: `toolenv.rewards.trajectory_reward` of the outcome.
    success: the answer (and, for write tasks, the final state) is right.
    turns: steps taken.
    truncated: ended by the turn budget or from outside, not by an answer.
    completed: gold nodes completed; nodes: gold nodes of the task.
  """

  step: tuple[float, ...]
  phase: tuple[tuple[str, float], ...]
  trajectory: float
  success: bool
  turns: int
  truncated: bool
  completed: int
  nodes: int

  def asdict(self) -> dict[str, Any]:
    """A JSON-ready dict (tuples as lists)."""
    return {"step": list(self.step), "phase": [list(p) for p in self.phase],
            "trajectory": self.trajectory, "success": self.success, "turns": self.turns,
            "truncated": self.truncated, "completed": self.completed, "nodes": self.nodes}
