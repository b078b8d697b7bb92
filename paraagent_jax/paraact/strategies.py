"""Acting strategies: ParaAct and the baselines, as prompts, formats and rules.

* ``paraact``: explicit phases, parallel calls (the protocol as is).
* ``react``: one call per turn, no phase tags (``<act>``).
* ``plan_execute``: explicit phases; once an execute step happened, exploring
  again is a rule violation.
* ``interleaved``: many calls per turn, no phase tags.

Where a strategy has no phase tags, the phase is inferred from the calls:
meta-tools -> explore, catalog tools -> execute, mixed -> execute with
``mixed_phase`` reported by `check_step`.
"""

from __future__ import annotations

import dataclasses
from typing import Sequence

from paraagent_jax.paraact import formats
from paraagent_jax.paraact import protocol
from toolenv.schema import Step

ACT_OPEN = "<act>"
_TAGS = formats.get_format(formats.TAGS)
META_TOOL_NAMES = ("search_tools", "get_tool_doc")


def infer_phase(step: Step) -> str:
  """Phase of an untagged step from its calls (mixed counts as execute)."""
  names = [c.name for c in step.calls]
  if names and all(n in META_TOOL_NAMES for n in names):
    return protocol.EXPLORE
  return protocol.EXECUTE


def _render_untagged(step: Step, fmt: formats.StepFormat) -> str:
  if step.phase == protocol.ANSWER:
    return fmt.render(step)
  tagged = fmt.render(dataclasses.replace(step, phase=protocol.EXECUTE))
  return ACT_OPEN + tagged[len(protocol.PHASE_OPEN[protocol.EXECUTE]):]


def _parse_untagged(text, fmt: formats.StepFormat) -> Step:
  if isinstance(text, str):
    text = text.replace(ACT_OPEN, protocol.PHASE_OPEN[protocol.EXECUTE], 1)
  step = fmt.parse(text)
  if step.phase != protocol.ANSWER:
    step.phase = infer_phase(step)
  return step


@dataclasses.dataclass(frozen=True)
class Strategy:
  """One acting strategy.

  Attributes:
    name: registry key (a config value).
    tagged: whether steps carry explicit phase tags.
    max_calls: most calls per step (None: unlimited).
    no_explore_after_execute: the plan-then-execute rule.
    description: the strategy-specific paragraph of the system prompt.
  """

  name: str
  tagged: bool
  max_calls: int | None
  no_explore_after_execute: bool
  description: str

  def system_prompt(self, fmt: formats.StepFormat = _TAGS) -> str:
    """The system prompt of this strategy in protocol format ``fmt``."""
    text = fmt.system_prompt(self.description)
    if not self.tagged:
      text = text.replace(protocol.PHASE_OPEN[protocol.EXPLORE], ACT_OPEN)
      text = text.replace(protocol.PHASE_OPEN[protocol.EXECUTE], ACT_OPEN)
    return text

  def render_step(self, step: Step, fmt: formats.StepFormat = _TAGS) -> str:
    """Text of a step in this strategy's form of protocol format ``fmt``."""
    return fmt.render(step) if self.tagged else _render_untagged(step, fmt)

  def parse_step(self, text, fmt: formats.StepFormat = _TAGS) -> Step:
    """Parses a turn in this strategy's form of format ``fmt``; never raises."""
    return fmt.parse(text) if self.tagged else _parse_untagged(text, fmt)

  def check_step(self, step: Step, history: Sequence[Step] = ()) -> str | None:
    """The rule violation of ``step`` after ``history``, or None."""
    if step.phase == protocol.ANSWER:
      return None
    if self.max_calls is not None and len(step.calls) > self.max_calls:
      return f"{self.name}: at most {self.max_calls} call per step"
    names = [c.name for c in step.calls]
    meta = [n in META_TOOL_NAMES for n in names]
    if self.tagged and step.phase == protocol.EXPLORE and not all(meta):
      return "explore step calls a catalog tool"
    if self.tagged and step.phase == protocol.EXECUTE and any(meta):
      return "execute step calls a meta-tool"
    if not self.tagged and any(meta) and not all(meta):
      return "mixed_phase"
    if (self.no_explore_after_execute and step.phase == protocol.EXPLORE and
        any(h.phase == protocol.EXECUTE for h in history)):
      return "plan_execute: exploring after execution started"
    return None


_REGISTRY = {
    "paraact": Strategy("paraact", True, None, False,
                        "Switch between explore and execute when you need to."),
    "react": Strategy("react", False, 1, False,
                      "Make exactly one call per step."),
    "plan_execute": Strategy(
        "plan_execute", True, None, True,
        "First explore until you have every tool you need; then only "
        "execute. You cannot explore again after your first execute step."),
    "interleaved": Strategy("interleaved", False, None, False,
                            "You may make several calls per step."),
}


def get_strategy(name: str) -> Strategy:
  """The strategy registered under ``name``."""
  if name not in _REGISTRY:
    raise ValueError(f"unknown strategy {name!r}; expected one of "
                     f"{sorted(_REGISTRY)}")
  return _REGISTRY[name]


STRATEGY_NAMES: tuple[str, ...] = tuple(_REGISTRY)
