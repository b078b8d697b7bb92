"""A trained policy behind the chat-completions API, answering with ``tool_calls``.

`ServedPolicy.respond` is a `openai_http.ChatHTTPServer` responder. For each
request it rebuilds the token ids the in-process rollout would have given
the model at this point of the episode, with the same `ChatFormat` pieces
(`ChatFormat.conversation`: the strategy's own system prompt, the task, each
earlier turn, each observation), decodes greedily with the in-process
`policies.JaxPolicy` (the KV-cache sampler), parses the turn with the
project's parser and answers as an API model would:

* an explore / execute step: ``tool_calls`` (one per parallel call,
  arguments as JSON text) and its thought as ``content``;
* an answer: the answer text as ``content``;
* a malformed turn: the calls that parsed plus one call of ``invalid_step``
  (`api_policy.INVALID_STEP`) whose arguments hold the model's text and the
  parser's error; the API policy makes the turn a parse failure with that
  error, so the environment answers it as it answers the in-process
  rollout's malformed step.

What the request's messages carry is mapped back to the model's tokens:

* the system message is ignored: the model reads the system prompt it was
  trained with (``strategy``);
* the first user message is the task (the rollout's first observation);
* an assistant turn is the ids the model generated for it, kept by the
  server under its tool call ids (a turn the server did not write, or one
  it forgot, is rendered from its tool calls with `ChatFormat.render`);
* the ``tool`` messages after a turn are joined back into the environment's
  observation (`api_policy.join_blocks`); a later user message is an
  observation too (the API policy's answer to a turn without tool calls).

So with the same tokenizer, budgets and observation cut, greedy decisions
match the in-process evaluation's (docs/evaluation.md, "API models and
served checkpoints", says where they can part).
"""

from __future__ import annotations

import collections
import json
import threading
import uuid
from typing import Any

import toolenv
from paraagent_jax.paraact import api_policy, chat_format, policies
from paraagent_jax.serving import openai_http

_REMEMBERED_TURNS = 100_000


class ServedPolicy:
  """Greedy turns of one model for the chat-completions API.

  Args:
    model: the Flax model (`rundir.load_model`).
    tokenizer: its tokenizer.
    strategy: the strategy it was trained in (its system prompt and step format).
    protocol_format: ``tags`` or ``qwen3`` (`paraact.formats`).
    max_len: tokens per episode (the sampler's cache; a longer context is a 400).
    max_turn_tokens: tokens per turn when the request sets no ``max_tokens``.
  """

  def __init__(self, model, tokenizer, *, strategy: str = "paraact",
               protocol_format: str = "tags", max_len: int = 2048,
               max_turn_tokens: int = 256):
    self.fmt = chat_format.ChatFormat(tokenizer, strategy, protocol_format=protocol_format)
    self.max_len = max_len
    self.max_turn_tokens = max_turn_tokens
    self.policy = policies.JaxPolicy(model, self.fmt, max_len=max_len,
                                     max_turn_tokens=max_turn_tokens, temperature=0.0)
    self._turns: collections.OrderedDict[str, list[int]] = collections.OrderedDict()
    self._lock = threading.Lock()
    self.turns_generated = 0

  # ---- the conversation -> ids ---------------------------------------------
  def context_ids(self, messages: list[dict[str, Any]]) -> list[int]:
    """The ids the in-process rollout would hold before the next turn.

    Raises:
      openai_http.RequestError: the messages do not form an episode (no
        task, a turn after a turn, ending on an assistant turn).
    """
    rest = [m for m in messages if isinstance(m, dict) and m.get("role") != "system"]
    if not rest or rest[0].get("role") != "user":
      raise openai_http.RequestError("the conversation must start with the task as a "
                                     "user message (after an optional system message)")
    conv = self.fmt.conversation(_text(rest[0]))
    ids = list(conv.prompt_ids)
    last: list[int] | None = None
    i = 1
    while i < len(rest):
      m = rest[i]
      if m.get("role") == "assistant":
        if last is not None:
          raise openai_http.RequestError(f"message {i + 1}: two assistant turns in a row")
        last = self._turn_ids(m)
        ids += last
        i += 1
        continue
      if last is None:
        raise openai_http.RequestError(f"message {i + 1}: an observation must follow "
                                       "an assistant turn")
      j = i
      while j < len(rest) and rest[j].get("role") in ("tool", "user"):
        j += 1
      observation = api_policy.join_blocks([_text(x) for x in rest[i:j]])
      ids += conv.observation_ids(last, self.fmt.decode(last), observation, None)
      last, i = None, j
    if last is not None:
      raise openai_http.RequestError("the conversation ends with an assistant turn: "
                                     "nothing to answer")
    return ids

  def _turn_ids(self, message: dict[str, Any]) -> list[int]:
    """The ids of an earlier assistant turn: remembered, else rendered."""
    calls = message.get("tool_calls") or []
    key = calls[0].get("id") if calls and isinstance(calls[0], dict) else None
    with self._lock:
      if key in self._turns:
        return list(self._turns[key])
    tools = {}
    for c in calls:
      name = (c.get("function") or {}).get("name") if isinstance(c, dict) else None
      if isinstance(name, str):
        tools[name] = name
    step = api_policy.message_to_step(message, tools)[0]
    if step.parse_error is not None:
      step = toolenv.Step(phase=step.phase, calls=step.calls, thought=step.thought)
    return self.fmt.encode(self.fmt.render(step))

  # ---- one turn --------------------------------------------------------------
  def respond(self, request: dict[str, Any]) -> dict[str, Any]:
    """The assistant message for one chat-completions request (greedy)."""
    ids = self.context_ids(request["messages"])
    want = request.get("max_completion_tokens") or request.get("max_tokens")
    want = int(want) if isinstance(want, int) and want > 0 else self.max_turn_tokens
    room = self.max_len - len(ids)
    if room <= 0:
      raise openai_http.RequestError(f"context_length_exceeded: {len(ids)} tokens, the "
                                     f"served model holds {self.max_len}")
    with self._lock:
      self.policy.max_turn_tokens = min(want, room)
      self.policy.reset(1, [None])
      out = self.policy.act([policies.TurnRequest(0, ids, [])])[0]
      self.policy.release()
      self.turns_generated += 1
    message = self.turn_message(out.text)
    if message.get("tool_calls"):
      self._remember(message["tool_calls"][0]["id"], out.token_ids)
    return message

  def turn_message(self, text: str) -> dict[str, Any]:
    """The model's turn as an API assistant message (see the module docstring)."""
    step = self.fmt.parse(text)
    if step.phase == "answer" and step.parse_error is None:
      return {"role": "assistant", "content": step.answer or ""}
    calls = [_tool_call(c.name, c.arguments) for c in (step.calls or [])
             if isinstance(c, toolenv.Call) and isinstance(c.name, str)]
    if step.parse_error is not None:
      calls.append(_tool_call(api_policy.INVALID_STEP,
                              {"text": text, "error": step.parse_error}))
    return {"role": "assistant", "content": step.thought or None, "tool_calls": calls}

  def _remember(self, key: str, ids: list[int]) -> None:
    with self._lock:
      self._turns[key] = list(ids)
      while len(self._turns) > _REMEMBERED_TURNS:
        self._turns.popitem(last=False)


def _text(message: dict[str, Any]) -> str:
  """A message's content as text (a list of text parts is joined)."""
  content = message.get("content")
  if isinstance(content, list):
    return "".join(p.get("text", "") for p in content if isinstance(p, dict))
  return "" if content is None else str(content)


def _tool_call(name: str, arguments: Any) -> dict[str, Any]:
  """An OpenAI tool call with a fresh id."""
  try:
    args = json.dumps(arguments, ensure_ascii=False)
  except (TypeError, ValueError):
    args = json.dumps(str(arguments))
  return {"id": f"call_{uuid.uuid4().hex[:24]}", "type": "function",
          "function": {"name": api_policy.function_name(name), "arguments": args}}
