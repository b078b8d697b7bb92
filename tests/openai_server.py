"""A local OpenAI-compatible chat-completions server around any Python responder.

For tests and demos: serve a scripted policy (or our own JAX policy) on
127.0.0.1 so the API-policy path is exercised end to end without the network.
`oracle_tool_calls` is a responder that plays each task's oracle plan as
OpenAI ``tool_calls``.

    server = ChatServer(lambda request: {"role": "assistant", "content": "hi"})
    server.start()            # server.base_url == "http://127.0.0.1:PORT/v1"
    ...
    server.stop()
"""

from __future__ import annotations

import json
from typing import Any, Callable

import toolenv
from paraagent_jax.paraact import api_policy
from paraagent_jax.serving import openai_http

Responder = Callable[[dict[str, Any]], dict[str, Any]]


class ChatServer(openai_http.ChatHTTPServer):
  """`serving.openai_http.ChatHTTPServer` on a free port, with failures to inject.

  ``responder(request_json) -> message dict`` builds the assistant message
  (an exception in it is answered 500, not retried, with its text).
  ``fail_first`` makes the first N requests answer ``fail_status`` (503, or
  429 for a rate limit) with ``retry-after-ms: 10`` (to test the SDK's
  retries quickly). ``GET /v1/models`` lists ``model``.
  """

  def __init__(self, responder: Responder, fail_first: int = 0, host: str = "127.0.0.1",
               fail_status: int = 503, model: str = "test"):
    super().__init__(responder, model=model, host=host)
    self.fail_first = fail_first
    self.fail_status = fail_status

  def before_answer(self, request):
    with self.lock:
      failing = self.fail_first > 0
      if failing:
        self.fail_first -= 1
    if failing:
      return self.fail_status, {"error": {"message": "overloaded (test)"}}, [
          ("retry-after-ms", "10")]
    return None


def tool_call(i: int, name: Any, arguments: Any) -> dict[str, Any]:
  """An OpenAI ``tool_calls`` entry (``arguments`` given as a JSON string)."""
  args = arguments if isinstance(arguments, str) else json.dumps(arguments)
  return {"id": f"call_{i}", "type": "function",
          "function": {"name": name, "arguments": args}}


def oracle_tool_calls(tasks, strategy: str = "paraact", only_offered: bool = True
                      ) -> Responder:
  """A responder whose 'model' plays each task's oracle plan as tool calls.

  It finds the task by its instruction in the user messages and its turn by
  the assistant messages so far. ``only_offered``: it fails (500) rather than
  call a tool the request did not offer in ``tools`` (else a test would pass
  on names the model was never given).
  """
  plans = {t.instruction: toolenv.oracle.solve(t, strategy) for t in tasks}

  def respond(request):
    msgs = request["messages"]
    text = "\n".join(str(m.get("content", "")) for m in msgs if m["role"] == "user")
    plan = next(p for ins, p in plans.items() if ins in text)
    step = plan[sum(m["role"] == "assistant" for m in msgs)]
    if step.phase == "answer":
      return {"role": "assistant", "content": step.answer}
    offered = {t["function"]["name"] for t in request.get("tools", [])}
    calls = []
    for i, c in enumerate(step.calls):
      name = api_policy.function_name(c.name)
      if only_offered and name not in offered:
        raise AssertionError(f"{name} was not offered")
      calls.append(tool_call(i, name, c.arguments))
    return {"role": "assistant", "content": step.thought, "tool_calls": calls}

  return respond
