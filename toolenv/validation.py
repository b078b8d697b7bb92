"""Call validation: structured errors, argument checks, defaults, call keys.

Errors are structured observations, never exceptions:
``{"error": "missing_argument", "message": "...", "tool": "..."}`` (an
`ErrorResponse`, which `is_error` tells from a simulated response).
"""

from __future__ import annotations

import math
from typing import Any

from toolenv.schema import Tool
from toolenv.values import canonical_json

MAX_ARG_CHARS = 2_000      # longer arguments are refused, not simulated


def _type_ok(value: Any, sch: dict[str, Any]) -> bool:
  t = sch.get("type")
  if t == "string":
    return isinstance(value, str)
  if t == "integer":
    return isinstance(value, int) and not isinstance(value, bool)
  if t == "number":
    return isinstance(value, (int, float)) and not isinstance(value, bool) and (
        math.isfinite(value))
  if t == "boolean":
    return isinstance(value, bool)
  if t == "array":
    return isinstance(value, list)
  if t == "object":
    return isinstance(value, dict)
  return True


class ErrorResponse(dict):
  """A structured error: a plain dict (same JSON) that says it is an error.

  The env and the task generator test `is_error`, not ``"error" in out``: a
  real API's response may be a bare scalar or have a top-level ``error``
  field of its own, and neither is a failed call.
  """

  __slots__ = ()


def is_error(out: Any) -> bool:
  """Whether ``out`` is an error made by `error` (not a simulated response)."""
  return isinstance(out, ErrorResponse)


def error(kind: str, message: str, tool: Any = None) -> dict[str, Any]:
  """A structured error response (an `ErrorResponse`)."""
  out = ErrorResponse(error=kind, message=message)
  if isinstance(tool, str):
    out["tool"] = tool[:80]
  return out


class ToolSpec:
  """What validation needs of a tool, read once (``Tool.properties`` copies a dict per access)."""

  __slots__ = ("tool", "props", "required", "defaults", "param_list")

  def __init__(self, tool: Tool):
    self.tool = tool
    # The tool's own dict, not a copy: read only.
    self.props = tool.parameters.get("properties", {})
    self.required = tuple(tool.required)
    self.defaults = tuple((k, sch["default"]) for k, sch in self.props.items()
                          if isinstance(sch, dict) and "default" in sch)
    self.param_list = ", ".join(self.props) or "none"


def validate(tool: Tool, arguments: Any, spec: ToolSpec | None = None) -> dict[str, Any] | None:
  """The error of calling ``tool`` with ``arguments``, or None if valid."""
  if not isinstance(arguments, dict):
    return error("bad_arguments", "arguments must be a JSON object, got "
                 f"{type(arguments).__name__}", tool.name)
  spec = spec or ToolSpec(tool)
  props = spec.props
  for k in arguments:
    if k not in props:
      return error("unknown_argument", f"{tool.name} has no parameter {str(k)[:40]!r}; "
                   f"parameters: {spec.param_list}", tool.name)
  for k in spec.required:
    if k not in arguments:
      return error("missing_argument", f"missing required argument {k!r}", tool.name)
  for k, v in arguments.items():
    sch = props[k] if isinstance(props[k], dict) else {}
    if not _type_ok(v, sch):
      return error("wrong_type", f"argument {k!r} must be {sch.get('type')}, got "
                   f"{type(v).__name__}", tool.name)
    if "enum" in sch and v not in sch["enum"]:
      return error("bad_enum", f"argument {k!r} must be one of {sch['enum']}", tool.name)
    if isinstance(v, (int, float)) and not isinstance(v, bool):
      lo, hi = sch.get("minimum"), sch.get("maximum")
      if (isinstance(lo, (int, float)) and v < lo) or (
          isinstance(hi, (int, float)) and v > hi):
        return error("out_of_range", f"argument {k!r}={v} is outside "
                     f"[{lo}, {hi}]", tool.name)
    size = len(v) if isinstance(v, str) else (
        0 if isinstance(v, (int, float)) else len(canonical_json(v)))
    if size > MAX_ARG_CHARS:
      return error("too_long", f"argument {k!r} is longer than {MAX_ARG_CHARS} "
                   "characters", tool.name)
  return None


def with_defaults(tool: Tool, arguments: dict[str, Any],
                  spec: ToolSpec | None = None) -> dict[str, Any]:
  """``arguments`` plus the declared defaults of the omitted parameters."""
  out = dict(arguments)
  for k, default in (spec or ToolSpec(tool)).defaults:
    if k not in out:
      out[k] = default
  return out


def canonical_call(tool: Tool, arguments: dict[str, Any]) -> str:
  """The key under which two calls count as the same (defaults filled)."""
  return tool.name + canonical_json(with_defaults(tool, arguments))

