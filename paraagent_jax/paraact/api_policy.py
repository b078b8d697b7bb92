"""An OpenAI-compatible chat model as a ParaAct policy (the API baselines).

Two ways to talk to the model (``tool_calling``):

* **Native function calling** (default; how GPT-4.1-class models are
  strongest). The episode's visible tools are sent as ``tools=``:
  ``search_tools`` and ``get_tool_doc`` first, then every catalog tool the
  episode's searches (or docs) have shown, added as they appear, each with its
  JSON schema from the catalog (the newest `MAX_TOOLS`); ``parallel_tool_calls``
  is on. The model's
  ``tool_calls`` become one `toolenv.Step` whose phase is inferred from the
  calls as the ``interleaved`` strategy does (only meta-tools: explore,
  otherwise execute); a reply without tool calls is the answer. Each call's
  result goes back as its own ``tool`` message (the environment's block for
  that call). The Step is handed to the rollout as is (`TurnOutput.step`);
  its text is our rendering of it, for the episode's tokens and transcript.
* **Text protocol** (``tool_calling=False``): the strategy's system prompt
  and our tags in plain text; the rollout parses the model's text like a
  trained model's, observations go back as user messages.

Malformed tool calls never raise: a call that is not an object, has no
function name, names a tool the episode was not given (``strict_tools``), or
whose ``arguments`` are not valid JSON or not a JSON object makes the turn a
parse failure (``Step.parse_error`` names each bad call, as the text parser
names a bad ``<call>``; the environment runs none of the turn's calls and
answers with an error observation), and so do an empty reply and a served
policy's own malformed turn (a call of `INVALID_STEP`, whose error becomes
the step's). `APIPolicy.stats` counts them: malformed turns, calls dropped
(the bad calls), and among those JSON errors, arguments not an object,
unknown tools, missing names, model parse errors.
"""

from __future__ import annotations

import concurrent.futures
import json
import re
import threading
from typing import Any, Sequence

import toolenv
from paraagent_jax.paraact import policies
from paraagent_jax.paraact import protocol
from paraagent_jax.paraact import strategies as strategy_lib

META_SPECS = [
    {"type": "function", "function": {
        "name": "search_tools",
        "description": ("Search the tool catalog; returns the best matching tools, each "
                        "with a one-line description and its parameters (* = required). "
                        "The tools found become callable."),
        "parameters": {"type": "object", "properties": {
            "query": {"type": "string", "description": "what the tool must do"},
            "top_k": {"type": "integer", "description": "how many tools (default 5)"}},
                       "required": ["query"]}}},
    {"type": "function", "function": {
        "name": "get_tool_doc",
        "description": "The full interface of one catalog tool; the tool becomes callable.",
        "parameters": {"type": "object", "properties": {"name": {"type": "string"}},
                       "required": ["name"]}}},
]

FUNCTION_CALLING_PROMPT = (
    "You solve tasks with tools from a large catalog. You start with search_tools and "
    "get_tool_doc; every tool your searches find is added to your tools. Call "
    "independent tools in the same turn (parallel tool calls); a call that needs "
    "another call's result goes in a later turn. When you have every value the task "
    "asks for, reply with the final answer as plain text, without tool calls.")
STRATEGY_LINES = {
    "react": "Make exactly one tool call per turn.",
    "plan_execute": ("First search until you have every tool you need, then only call "
                     "them: do not search again after your first call of a found tool."),
}
# A served policy's malformed turn (`serving.policy_server`): a call of this
# name whose arguments hold the model's text and its parser's error.
INVALID_STEP = "invalid_step"
# OpenAI's chat completions take at most 128 functions in ``tools``: past
# that the oldest found tools are no longer given (the meta-tools always are).
MAX_TOOLS = 128
_SCHEMA_TYPES = ("string", "integer", "number", "boolean", "array", "object", "null")
_LEADING_NAME = re.compile(r"\s*([A-Za-z0-9_.\-/]+)\s*[:(]")
_DOC_NAME = re.compile(r'"name":\s*"([^"]+)"')
_HEAD = re.compile(r"^\[\d+\] [^\n:]*: ")


def function_name(name: str) -> str:
  """``name`` as an OpenAI function name (``[A-Za-z0-9_-]{1,64}``)."""
  return (re.sub(r"[^A-Za-z0-9_-]", "_", name) or "_")[:64]


def _clean_schema(schema: Any) -> dict[str, Any]:
  """A catalog parameter schema as JSON schema (ToolEnv's ``any`` type dropped)."""
  if not isinstance(schema, dict):
    return {}
  out = {k: v for k, v in schema.items() if k != "type"}
  if schema.get("type") in _SCHEMA_TYPES:
    out["type"] = schema["type"]
  return out


def tool_spec(tool, name: str | None = None) -> dict[str, Any]:
  """The ``tools=`` entry of a catalog tool (its parameters' JSON schema)."""
  props = {p: _clean_schema(s) for p, s in (tool.properties or {}).items()}
  return {"type": "function", "function": {
      "name": name or function_name(tool.name),
      "description": str(tool.description or "")[:1000],
      "parameters": {"type": "object", "properties": props,
                     "required": [r for r in tool.required if r in props]}}}


# One block per call (`protocol.split_observation`; the qwen3 format splits alike).
split_blocks = protocol.split_observation


def join_blocks(contents: Sequence[str]) -> str:
  """The observation a turn's tool messages came from (`split_blocks`'s
  inverse; the same text in every message is one unsplit observation)."""
  if len(set(contents)) == 1:
    return contents[0]
  return "\n".join(contents)


class _Episode:
  """One episode's conversation, its visible tools and last turn's call ids."""

  def __init__(self):
    self.messages: list[dict[str, Any]] = []
    self.tools: dict[str, str] = {}            # function name -> catalog name
    self.specs: list[dict[str, Any]] = list(META_SPECS)
    self.pending: list[str] = []               # tool_call ids awaiting results
    for spec in META_SPECS:
      self.tools[spec["function"]["name"]] = spec["function"]["name"]


class APIPolicy(policies.Policy):
  """An OpenAI-compatible chat model (the paper's API-served baselines).

  Args:
    fmt: the strategy's `ChatFormat` (renders steps into tokens; the text
      protocol's system prompt and parser).
    chat: an `api_client.ChatModel`.
    catalog: the benchmark's catalog (tool schemas of found tools); None
      offers found tools with an open ``{"type": "object"}`` schema.
    tool_calling: native function calling (True) or our text protocol.
    strict_tools: a call of a tool the episode was not given is a parse
      failure (True); False hands it to the environment, which answers an
      unknown tool with an error as it does a text-protocol call (a served
      checkpoint's evaluation: the in-process rollout's rule).
    concurrency: episodes asked at once (threads).
  """

  name = "api"

  def __init__(self, fmt, chat, *, catalog=None, tool_calling: bool = True,
               strict_tools: bool = True, concurrency: int = 8):
    self.fmt = fmt
    self.chat = chat
    self.catalog = catalog
    self.tool_calling = tool_calling
    self.strict_tools = strict_tools
    self.concurrency = concurrency
    strategy = getattr(fmt.strategy, "name", "")
    self.parallel = getattr(fmt.strategy, "max_calls", None) != 1
    self.system_prompt = " ".join(
        [FUNCTION_CALLING_PROMPT] + ([STRATEGY_LINES[strategy]] if strategy in STRATEGY_LINES
                                     else []))
    self._episodes: list[_Episode] = []
    self._lock = threading.Lock()
    self._counts = dict.fromkeys(("malformed_turns", "calls_dropped", "json_errors",
                                  "not_objects", "unknown_tools", "missing_names",
                                  "model_parse_errors"), 0)

  def reset(self, num_episodes, tasks, seed=0):
    del tasks, seed
    self._episodes = [_Episode() for _ in range(num_episodes)]

  def act(self, requests):
    with concurrent.futures.ThreadPoolExecutor(max_workers=self.concurrency) as pool:
      return list(pool.map(self._one, requests))

  def stats(self):
    out = {"api_requests": self.chat.requests_made}
    out.update({f"api_{k}": v for k, v in self._counts.items()})
    return out

  def _count(self, **deltas: int) -> None:
    with self._lock:
      for k, v in deltas.items():
        self._counts[k] += v

  # ---- one turn ----------------------------------------------------------
  def _one(self, r: policies.TurnRequest) -> policies.TurnOutput:
    ep = self._episodes[r.episode]
    if not self.tool_calling:
      return self._text_turn(ep, r)
    self._take_context(ep, r.new_messages)
    message = self.chat.complete(ep.messages, tools=ep.specs, parallel=self.parallel)
    step, history, counts = message_to_step(message, ep.tools, turn=len(ep.messages),
                                            strict=self.strict_tools)
    if step.parse_error is not None:
      counts["malformed_turns"] = 1
    self._count(**counts)
    ep.messages.append(history)
    ep.pending = [tc["id"] for tc in history.get("tool_calls", [])]
    text = self._render(step)
    ids = self.fmt.encode(text)
    return policies.TurnOutput(ids, [0.0] * len(ids), text, step)

  def _text_turn(self, ep: _Episode, r: policies.TurnRequest) -> policies.TurnOutput:
    """Our tags in plain text: the rollout parses the model's own text."""
    for m in r.new_messages:
      role = m.get("role")
      # Chat APIs take a tool message only as the answer to a tool call.
      ep.messages.append({"role": "user" if role == "tool" else role,
                          "content": str(m.get("content", ""))})
    message = self.chat.complete(ep.messages)
    text = str(message.get("content") or "")
    if self.fmt.parse(text).parse_error is not None:
      self._count(malformed_turns=1)
    ep.messages.append({"role": "assistant", "content": text})
    ids = self.fmt.encode(text)
    return policies.TurnOutput(ids, [0.0] * len(ids), text)

  def _take_context(self, ep: _Episode, new_messages) -> None:
    """Adds the rollout's new messages: the opening (our system prompt
    replaced by the function-calling one) or the last turn's results, one
    ``tool`` message per call id; tools they show become callable."""
    texts = [str(m.get("content", "")) for m in new_messages if m.get("role") != "system"]
    if not ep.messages:
      ep.messages.append({"role": "system", "content": self.system_prompt})
      for t in texts:
        ep.messages.append({"role": "user", "content": t})
        self._add_tools(ep, [t])
      return
    if not ep.pending:      # the last turn was no tool call (a malformed answer)
      ep.messages.append({"role": "user", "content": "\n".join(texts)})
      return
    if len(texts) == len(ep.pending):
      blocks = texts
    else:
      whole = "\n".join(texts)
      blocks = split_blocks(whole, len(ep.pending)) or [whole] * len(ep.pending)
    for call_id, block in zip(ep.pending, blocks):
      ep.messages.append({"role": "tool", "tool_call_id": call_id, "content": block})
    self._add_tools(ep, blocks)
    ep.pending = []

  def _add_tools(self, ep: _Episode, blocks) -> None:
    """Offers every catalog tool named at the start of a line (search
    results) or as a doc's ``"name"`` in ``blocks``."""
    for block in blocks:
      # A line may open a call's block ("[2] search_tools: name: ..."), also
      # inside an observation that could not be split.
      lines = [_HEAD.sub("", line) for line in block.splitlines()]
      names = [m.group(1) for m in map(_LEADING_NAME.match, lines) if m]
      names += _DOC_NAME.findall(block)[:1]
      for name in names:
        if name in ep.tools.values():
          continue
        tool = self.catalog.get(name) if self.catalog is not None else None
        if tool is None:
          continue
        fn = function_name(name)
        if fn in ep.tools:      # two catalog names that clean to one function name
          continue
        ep.tools[fn] = name
        ep.specs.append(tool_spec(tool, fn))
        if len(ep.specs) > MAX_TOOLS:
          oldest = ep.specs.pop(len(META_SPECS))["function"]["name"]
          del ep.tools[oldest]

  def _render(self, step: toolenv.Step) -> str:
    """The step in the strategy's text (a parse failure shows in the thought)."""
    if step.parse_error is None:
      return self.fmt.render(step)
    if step.phase == "answer":
      return self.fmt.render(toolenv.Step(phase="answer", answer=""))
    note = f"[malformed tool calls: {step.parse_error}] {step.thought}".strip()
    return self.fmt.render(toolenv.Step(phase=step.phase, calls=list(step.calls),
                                        thought=note))


def _read_call(tc: Any, tools: dict[str, str], strict: bool = True
               ) -> tuple[toolenv.Call | None, str | None, str]:
  """One tool call: (call, None, "") or (None, error, counter name).

  The errors start as `protocol`'s do for the same fault in text, so
  `protocol.failure_counts` reads an API step as it reads a parsed one.
  ``strict`` False: a name not in ``tools`` is a call all the same (the
  environment answers a tool it does not know with an error, as it does a
  text-protocol call).
  """
  fn = tc.get("function") if isinstance(tc, dict) else None
  if not isinstance(fn, dict):
    return None, f"{protocol.NO_NAME_ERROR} (a tool call without a function)", "missing_names"
  name = fn.get("name")
  if not isinstance(name, str) or not name:
    return None, f"{protocol.NO_NAME_ERROR} (a tool call without a name)", "missing_names"
  raw = fn.get("arguments")
  if name == INVALID_STEP:
    error = _served_error(raw)
    return None, error, "model_parse_errors"
  if strict and name not in tools:
    return None, (f"{protocol.UNKNOWN_TOOL_ERROR}{name[:60]!r} (not among the tools "
                   "given)"), "unknown_tools"
  if raw is None or raw == "":
    args: Any = {}
  elif isinstance(raw, str):
    try:
      args = json.loads(raw)
    except (ValueError, RecursionError):
      return None, f"{protocol.JSON_ERROR} ({name} arguments): {raw[:80]}", "json_errors"
  else:
    args = raw
  if not isinstance(args, dict):
    return None, f"{protocol.NOT_OBJECT_ERROR} ({name} arguments)", "not_objects"
  return toolenv.Call(tools.get(name, name), args), None, ""


def _served_error(raw: Any) -> str:
  """The parser's error a served policy sent with its malformed turn."""
  try:
    error = json.loads(raw).get("error") if isinstance(raw, str) else None
  except (ValueError, AttributeError, RecursionError):
    error = None
  return error if isinstance(error, str) and error else "a malformed turn (served policy)"


def message_to_step(message: dict[str, Any], tools: dict[str, str], turn: int = 0,
                    strict: bool = True):
  """An assistant message -> (Step, the message for the history, counters).

  Never raises on what the message holds. ``tools``: function name ->
  catalog name of the tools the episode was given; ``strict``: whether a
  call of another name is a parse failure (`_read_call`).
  """
  content = message.get("content")
  content = content if isinstance(content, str) else ""
  raw_calls = message.get("tool_calls") or []
  if not isinstance(raw_calls, list):
    raw_calls = [raw_calls]
  if not raw_calls:
    step = toolenv.Step(phase="answer", answer=content.strip())
    if not content.strip():
      step.parse_error = "an empty reply: no tool call and no answer text"
    return step, {"role": "assistant", "content": content}, {}
  calls, errors, counts, history, seen = [], [], {}, [], set()
  for i, tc in enumerate(raw_calls):
    call, error, counter = _read_call(tc, tools, strict)
    if call is not None:
      calls.append(call)
    else:
      errors.append(error)
      counts[counter] = counts.get(counter, 0) + 1
      # A served model's own parse error counts what it lost, as in-process.
      lost = (protocol.failure_counts(toolenv.Step("execute", parse_error=error))
              if counter == "model_parse_errors" else {"calls_dropped": 1})
      for k, v in lost.items():
        if v:
          counts[k] = counts.get(k, 0) + v
    history.append(_history_call(tc, f"call_{turn}_{i}", seen))
  thought = " ".join(content.split())[:200]
  phase = strategy_lib.infer_phase(toolenv.Step(phase="execute", calls=calls))
  step = toolenv.Step(phase=phase, calls=calls, thought=thought,
                      parse_error="; ".join(errors) if errors else None)
  return step, {"role": "assistant", "content": content or None, "tool_calls": history}, counts


def _history_call(tc: Any, fallback_id: str, seen: set[str]) -> dict[str, Any]:
  """A tool call as the conversation keeps it: a unique id, a string name and
  string arguments, whatever the model sent (chat APIs reject less)."""
  fn = tc.get("function") if isinstance(tc, dict) else None
  fn = fn if isinstance(fn, dict) else {}
  call_id = tc.get("id") if isinstance(tc, dict) else None
  if not isinstance(call_id, str) or not call_id or call_id in seen:
    call_id = fallback_id
  seen.add(call_id)
  name = fn.get("name") if isinstance(fn.get("name"), str) and fn.get("name") else "unnamed"
  args = fn.get("arguments", "")
  if not isinstance(args, str):
    try:
      args = json.dumps(args)
    except (TypeError, ValueError):
      args = str(args)
  return {"id": call_id, "type": "function", "function": {"name": name, "arguments": args}}
