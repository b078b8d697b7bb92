"""The ``qwen3`` protocol format: ParaAct steps as Qwen3 (Hermes-style) tool calls.

One assistant turn is the phase tag and thought as text, then one
``<tool_call>`` block per parallel call, exactly as Qwen3's chat template renders
an assistant message with ``tool_calls``::

  <explore> find weather and currency tools
  <tool_call>
  {"name": "search_tools", "arguments": {"query": "weather"}}
  </tool_call>
  <tool_call>
  {"name": "search_tools", "arguments": {"query": "currency rate"}}
  </tool_call>

The turn ends with the template's ``<|im_end|>`` (no ``</step>``); a final
answer is ``<answer> ... </answer>`` as in the tags format. Tool results come
back as ``tool`` messages, one per call (`tool_messages`), which the template
renders (Qwen3's: one user turn with a ``<tool_response>`` block each). `render_step` writes the text that the
template writes for `assistant_message` of the same step (a test checks it
against the template), so demonstrations rendered through the template and
steps written by a policy are the same tokens.

`parse_step` never raises, like `protocol.parse_step`.
"""

from __future__ import annotations

import json
from typing import Any

from toolenv.schema import Step

from paraagent_jax.paraact import protocol

TOOL_CALL_OPEN = "<tool_call>"
TOOL_CALL_CLOSE = "</tool_call>"

# The meta-tools as function schemas: the system turn lists them in
# ``<tools></tools>`` (catalog tools are found with search_tools, not listed).
META_TOOL_SCHEMAS = (
    {"type": "function", "function": {
        "name": "search_tools",
        "description": "The best matching catalog tools for a query, each with a "
                       "one-line description and its parameters (* = required).",
        "parameters": {"type": "object", "properties": {
            "query": {"type": "string", "description": "what the tool should do"},
            "top_k": {"type": "integer", "description": "how many tools (default 5)"}},
                       "required": ["query"]}}},
    {"type": "function", "function": {
        "name": "get_tool_doc",
        "description": "The full interface of one catalog tool.",
        "parameters": {"type": "object", "properties": {
            "name": {"type": "string", "description": "the tool's exact name"}},
                       "required": ["name"]}}},
)


def _arguments_json(arguments: Any) -> str:
  """As the chat template's ``tojson`` writes them (HF: ``json.dumps`` with
  ``ensure_ascii=False``); a string is written as is, like the template."""
  if isinstance(arguments, str):
    return arguments
  return json.dumps(arguments, ensure_ascii=False)


def _head(step: Step) -> str:
  thought = " ".join((step.thought or "").split())
  head = protocol.PHASE_OPEN[step.phase]
  return head + (" " + thought if thought else "")


def render_step(step: Step) -> str:
  """Text of one assistant step (what the template renders for
  `assistant_message`, without the chat markers)."""
  if step.phase == protocol.ANSWER:
    return protocol.render_step(step)
  if step.phase not in protocol.PHASE_OPEN:
    raise ValueError(f"cannot render phase {step.phase!r}")
  blocks = [f'{TOOL_CALL_OPEN}\n{{"name": "{c.name}", "arguments": '
            f'{_arguments_json(c.arguments)}}}\n{TOOL_CALL_CLOSE}' for c in step.calls]
  return "\n".join([_head(step)] + blocks)


def assistant_message(step: Step) -> dict[str, Any]:
  """The chat message of a step: content (phase tag and thought, or the
  answer) and ``tool_calls`` in the OpenAI / HF shape."""
  if step.phase == protocol.ANSWER:
    return {"role": "assistant", "content": protocol.render_step(step)}
  if step.phase not in protocol.PHASE_OPEN:
    raise ValueError(f"cannot render phase {step.phase!r}")
  return {"role": "assistant", "content": _head(step), "tool_calls": [
      {"type": "function", "function": {"name": c.name, "arguments": c.arguments}}
      for c in step.calls]}


def tool_messages(observation: str, num_calls: int) -> list[dict[str, str]]:
  """The observation of a step of ``num_calls`` calls as ``tool`` messages:
  one per call (its ``[k] name: ...`` block), as a model with parallel tool
  calls reads their results; one message when it does not split that way (an
  error observation, one cut short)."""
  blocks = protocol.split_observation(observation, num_calls) or [observation]
  return [{"role": "tool", "content": b} for b in blocks]


def parse_step(text: Any) -> Step:
  """Parses one assistant turn in this format into a `toolenv.Step`; never raises.

  As `protocol.parse_step`: text before the first phase tag is ignored, the
  first tag decides the phase, calls that parse are kept next to the errors of
  those that do not (the step then carries ``parse_error``).
  """
  try:
    return _parse_step(text)
  except Exception as e:  # pylint: disable=broad-except
    # Last line of defence: model output must never crash a rollout.
    return Step(phase=protocol.EXECUTE, parse_error=f"internal parser error: {e!r}")


def _parse_step(text: Any) -> Step:
  head = protocol.parse_head(text)
  if isinstance(head, Step):
    return head
  phase, body, errors = head
  first = body.find(TOOL_CALL_OPEN)
  thought = (body if first < 0 else body[:first]).strip()
  calls, errors = protocol.parse_call_blocks(body, TOOL_CALL_OPEN, TOOL_CALL_CLOSE, errors)
  return Step(phase=phase, calls=calls, thought=thought,
              parse_error="; ".join(errors) if errors else None)


def system_prompt(extra: str = "") -> str:
  """System prompt of the qwen3 format: the phases and the answer; the call
  format itself is the chat template's (its tools section)."""
  text = (
      "Find the tools you need in a large catalog, then call them. "
      "The catalog's tools are not listed: find them with search_tools.\n"
      "One step per turn. Start it with <explore> (call search_tools or "
      "get_tool_doc) or <execute> (call catalog tools) and a short thought, "
      "then the calls. Independent calls go in one step and run in parallel.\n"
      "When done: <answer> the final answer </answer>")
  return text + ("\n" + extra if extra else "")
