"""The ParaAct text protocol: render, parse and classify the tokens of a step.

One assistant turn is one step, written as::

  <explore> find weather and currency tools
  <call>{"name": "search_tools", "arguments": {"query": "weather"}}</call>
  <call>{"name": "search_tools", "arguments": {"query": "currency rate"}}</call>
  </step>

or, to finish the episode::

  <answer> 21 C in Paris; 1 EUR = 1.08 USD </answer>

The phase tag (``<explore>`` or ``<execute>``) opens the step, a short thought
follows on the same line, then one ``<call>`` per parallel action (a JSON object
with ``name`` and ``arguments``), then ``</step>``. The format is small and
regular on purpose: a tiny model trained for minutes must learn to write it,
and every tag is one special token of the demo tokenizer, so the stop sequence
of a turn is a single token.

`parse_step` never raises: malformed output gives a `toolenv.Step` with
``parse_error`` set and whatever calls could be recovered, which the
environment turns into an error observation and a step penalty.
"""

from __future__ import annotations

import bisect
import json
import re
from typing import Any, Sequence

from toolenv.schema import Call, Step

# The tags are tokens of the vocabulary, so they are defined with it.
from paraagent_jax.tokenizer import (ANSWER_CLOSE, ANSWER_OPEN, CALL_CLOSE, CALL_OPEN,
                                     EXECUTE_OPEN, EXPLORE_OPEN, STEP_CLOSE)
# Token kinds as in `TrajectoryBatch.token_kind` (env tokens are labelled by
# the rollout, not here).
from paraagent_jax.learner.batch import KIND_ACTION, KIND_ANSWER, KIND_PLAN

EXPLORE = "explore"
EXECUTE = "execute"
ANSWER = "answer"
PHASES = (EXPLORE, EXECUTE)

PHASE_OPEN = {EXPLORE: EXPLORE_OPEN, EXECUTE: EXECUTE_OPEN}


META_TOOLS = (
    "search_tools(query: str, top_k: int = 5): the best matching tools, each "
    "with a one-line description and its parameters (* = required).",
    "get_tool_doc(name: str): the full interface of one tool.",
)

_OPEN_RE = re.compile(r"<(explore|execute|answer)>")
_MAX_ERROR_CHARS = 200


def dump_call_json(call: Call) -> str:
  """JSON of one call, with ``<`` escaped so that no tag occurs inside it."""
  obj = {"name": call.name, "arguments": call.arguments}
  return json.dumps(obj, ensure_ascii=False).replace("<", "\\u003c")


def render_step(step: Step) -> str:
  """Text of one assistant step (without chat-template markers).

  Args:
    step: a `toolenv.Step` with phase ``explore``/``execute`` and calls, or
      phase ``answer`` with ``answer`` text.

  Returns:
    The step text, ending with a stop string.
  """
  if step.phase == ANSWER:
    answer = "" if step.answer is None else str(step.answer)
    return f"{ANSWER_OPEN} {answer.strip()} {ANSWER_CLOSE}"
  if step.phase not in PHASE_OPEN:
    raise ValueError(f"cannot render phase {step.phase!r}")
  head = PHASE_OPEN[step.phase]
  thought = " ".join((step.thought or "").split())
  if thought:
    head += " " + thought
  lines = [head]
  lines += [f"{CALL_OPEN}{dump_call_json(c)}{CALL_CLOSE}" for c in step.calls]
  lines.append(STEP_CLOSE)
  return "\n".join(lines)


def _short(text: str) -> str:
  text = text.strip()
  if len(text) > _MAX_ERROR_CHARS:
    return text[:_MAX_ERROR_CHARS] + "..."
  return text


# Error prefixes of a call that is dropped (`failure_counts` counts them).
JSON_ERROR = "call is not valid JSON"
NOT_OBJECT_ERROR = "call must be a JSON object"
NO_NAME_ERROR = "call has no string 'name'"
UNTERMINATED_CALL = "unterminated "
# A call of a tool the policy was not given, refused before the environment
# (an API model's native tool call); the environment answers other unknown
# names itself (status ``unknown_tool``).
UNKNOWN_TOOL_ERROR = "unknown tool "


def parse_call_json(body: str) -> tuple[Call | None, str | None]:
  """One call from its JSON body; returns (call, None) or (None, error)."""
  try:
    obj = json.loads(body)
  except (ValueError, RecursionError) as e:
    return None, f"{JSON_ERROR} ({type(e).__name__}): {_short(body)}"
  if not isinstance(obj, dict):
    return None, f"{NOT_OBJECT_ERROR}: {_short(body)}"
  name = obj.get("name")
  if not isinstance(name, str) or not name:
    return None, f"{NO_NAME_ERROR}: {_short(body)}"
  arguments = obj.get("arguments", {})
  # A non-dict `arguments` is kept: the environment answers it with a schema
  # error for that call instead of dropping the whole step.
  return Call(name=name, arguments=arguments), None


def parse_step(text: Any) -> Step:
  """Parses one assistant turn into a `toolenv.Step`; never raises.

  Text before the first phase tag is ignored (a model may echo whitespace or
  chatter); the first tag decides the phase. Calls that parse are kept even if
  others in the same step are malformed; the step then carries
  ``parse_error``.

  Args:
    text: the decoded assistant turn (anything; non-strings are an error).

  Returns:
    The parsed step; ``parse_error`` is None exactly when the text is valid.
  """
  try:
    return _parse_step(text)
  except Exception as e:  # pylint: disable=broad-except
    # Last line of defence: model output must never crash a rollout.
    return Step(phase=EXECUTE, parse_error=f"internal parser error: {e!r}")


def parse_head(text: Any, step_close: str | None = None
               ) -> Step | tuple[str, str, list[str]]:
  """The phase tag of a turn and the body after it (both formats).

  Returns a finished `Step` for non-text, a missing phase tag and an answer;
  else ``(phase, body, errors)``: the body up to ``step_close`` (the whole rest
  when it is None or missing; missing is an error).
  """
  if not isinstance(text, str):
    return Step(phase=EXECUTE, parse_error="step is not text")
  m = _OPEN_RE.search(text)
  if m is None:
    return Step(phase=EXECUTE, parse_error=(
        "no phase tag: a step starts with <explore>, <execute> or <answer>"))
  phase = m.group(1)
  rest = text[m.end():]
  if phase == ANSWER:
    end = rest.find(ANSWER_CLOSE)
    error = None
    if end < 0:
      end, error = len(rest), "unterminated <answer>: missing </answer>"
    return Step(phase=ANSWER, answer=rest[:end].strip(), parse_error=error)
  errors = []
  end = rest.find(step_close) if step_close else len(rest)
  if end < 0:
    errors.append(f"unterminated step: missing {step_close}")
    end = len(rest)
  return phase, rest[:end], errors


def parse_call_blocks(body: str, open_tag: str, close_tag: str,
                      errors: list[str] | None = None) -> tuple[list[Call], list[str]]:
  """The calls of a step body, each between ``open_tag`` and ``close_tag``,
  and the errors of the blocks that do not parse (and of stray text).

  ``errors``: the head's errors (`parse_head`), extended and returned. "step
  has no <call>" is said only of a step with no other error: a step cut before
  its ``</step>`` with no call says "unterminated step" alone, the text the
  policy has always been shown for it (the README command's rollouts depend
  on it, token for token).
  """
  first = body.find(open_tag)
  calls, errors = [], ([] if errors is None else errors)
  pos = 0 if first < 0 else first
  while first >= 0:
    start = body.find(open_tag, pos)
    if start < 0:
      if body[pos:].strip():
        errors.append(f"text outside {open_tag}: {_short(body[pos:])}")
      break
    if body[pos:start].strip():
      errors.append(f"text outside {open_tag}: {_short(body[pos:start])}")
    close = body.find(close_tag, start)
    if close < 0:
      errors.append(f"{UNTERMINATED_CALL}{open_tag}: missing {close_tag}")
      break
    inner = body[start + len(open_tag):close]
    if open_tag in inner:
      errors.append(f"nested {open_tag}")
      inner = inner[inner.rfind(open_tag) + len(open_tag):]
    call, error = parse_call_json(inner)
    if call is not None:
      calls.append(call)
    else:
      errors.append(error)
    pos = close + len(close_tag)
  if not calls and not errors:
    errors.append(f"step has no {open_tag}")
  return calls, errors


def _parse_step(text: Any) -> Step:
  head = parse_head(text, STEP_CLOSE)
  if isinstance(head, Step):
    return head
  phase, body, errors = head
  first = body.find(CALL_OPEN)
  thought = (body if first < 0 else body[:first]).strip()
  calls, errors = parse_call_blocks(body, CALL_OPEN, CALL_CLOSE, errors)
  return Step(phase=phase, calls=calls, thought=thought,
              parse_error="; ".join(errors) if errors else None)


def failure_counts(step: Step) -> dict[str, int]:
  """What a step's parse error lost: ``calls_dropped`` (calls written that did
  not become a call: broken JSON, not an object, no name, unterminated, an
  unknown tool refused before the environment), ``json_errors`` and
  ``unknown_tools`` (those among them)."""
  error = step.parse_error or ""
  def count(prefix: str) -> int:
    return len(re.findall(r"(?:^|; )" + re.escape(prefix), error))
  json_errors, unknown = count(JSON_ERROR), count(UNKNOWN_TOOL_ERROR)
  dropped = json_errors + unknown + count(NOT_OBJECT_ERROR) + count(NO_NAME_ERROR) + len(
      re.findall(r"(?:^|; )" + re.escape(UNTERMINATED_CALL) + r"<(?!answer>)[^>]*>: ",
                 error))
  return {"calls_dropped": dropped, "json_errors": json_errors, "unknown_tools": unknown}


def classify_spans(text: str, call_open: str = CALL_OPEN) -> list[tuple[int, int, int]]:
  """Splits a step's text into contiguous (start, end, kind) spans.

  Plan (0) is everything up to the first ``call_open`` (phase tag and thought;
  ``<call>`` in the tags format, ``<tool_call>`` in qwen3's);
  action (1) is from there to the end (calls and ``</step>``); a turn that
  opens with ``<answer>`` is all answer (2). The spans cover ``text`` exactly,
  so every token gets a kind even in malformed output.

  Args:
    text: the assistant turn text.

  Returns:
    Non-empty spans in order, covering ``[0, len(text))``.
  """
  n = len(text)
  if n == 0:
    return []
  m = _OPEN_RE.search(text)
  if m is not None and m.group(1) == ANSWER:
    return [(0, n, KIND_ANSWER)]
  first = text.find(call_open)
  if first < 0:
    return [(0, n, KIND_PLAN)]
  spans = [(0, first, KIND_PLAN)] if first > 0 else []
  return spans + [(first, n, KIND_ACTION)]


def token_kinds(offsets: Sequence[tuple[int, int]],
                spans: Sequence[tuple[int, int, int]]) -> list[int]:
  """Kind of each token from its character offsets and `classify_spans`.

  A token takes the kind of the span where it starts (byte-level BPE tokens
  may straddle a boundary; the start decides). Tokens past the text (e.g. a
  chat-template ``<|im_end|>``) take the last span's kind.

  Args:
    offsets: ``(start_char, end_char)`` per token, as from a fast tokenizer's
      ``return_offsets_mapping``.
    spans: output of `classify_spans` on the same text.

  Returns:
    One kind per token.
  """
  if not spans:
    return [KIND_PLAN] * len(offsets)
  starts = [s for s, _, _ in spans]
  kinds = []
  for start, _ in offsets:
    i = max(0, bisect.bisect_right(starts, start) - 1)
    kinds.append(spans[i][2])
  return kinds


def system_prompt(extra: str = "") -> str:
  """System prompt that explains the ParaAct format and the meta-tools.

  Kept short on purpose: it is a prefix of every episode, so on the CPU demo
  each of its tokens is paid for in every SFT row and every rollout.
  """
  tools = "\n".join(f"- {t}" for t in META_TOOLS)
  text = (
      "Find the tools you need in a large catalog, then call them.\n"
      "Meta-tools:\n" + tools + "\n"
      "One step per turn. <explore> calls meta-tools; <execute> calls catalog "
      "tools. Independent calls go in one step and run in parallel:\n"
      "<execute> short thought\n"
      '<call>{"name": "tool_name", "arguments": {"param": "value"}}</call>\n'
      "</step>\n"
      "When done: <answer> the final answer </answer>")
  return text + ("\n" + extra if extra else "")


_BLOCK = re.compile(r"^\[(\d+)\] ", re.M)


def split_observation(observation: str, n: int) -> list[str] | None:
  """The blocks ``[1] name: ...`` .. ``[n] ...`` of an observation, one per
  call (``"\n".join`` of them gives it back), or None when it is not ``n``."""
  found = [(m.start(), int(m.group(1))) for m in _BLOCK.finditer(observation)
           if 1 <= int(m.group(1)) <= n]
  if n < 1 or [k for _, k in found] != list(range(1, n + 1)) or found[0][0] != 0:
    return None
  heads = [h for h, _ in found]
  ends = [h - 1 for h in heads[1:]] + [len(observation)]
  return [observation[h:e] for h, e in zip(heads, ends)]


def render_observation(observation: str) -> str:
  """Content of the tool turn that answers a step (the env's text, trimmed)."""
  return str(observation).strip()
