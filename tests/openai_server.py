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

import http.server
import json
import threading
from typing import Any, Callable

import toolenv
from paraagent_jax.paraact import api_policy

Responder = Callable[[dict[str, Any]], dict[str, Any]]


class ChatServer:
  """Threaded HTTP server answering ``POST /v1/chat/completions``.

  ``responder(request_json) -> message dict`` builds the assistant message.
  ``fail_first`` makes the first N requests answer ``fail_status`` (503, or
  429 for a rate limit) with ``retry-after-ms: 10`` (to test the SDK's
  retries quickly). ``GET /v1/models`` lists ``model``.
  """

  def __init__(self, responder: Responder, fail_first: int = 0, host: str = "127.0.0.1",
               fail_status: int = 503, model: str = "test"):
    self.responder = responder
    self.fail_first = fail_first
    self.fail_status = fail_status
    self.model = model
    self.requests: list[dict[str, Any]] = []
    self.auth: list[str | None] = []           # each POST's Authorization header
    self._lock = threading.Lock()
    outer = self

    class Handler(http.server.BaseHTTPRequestHandler):
      """Request handler bound to this server instance."""

      def log_message(self, *args):  # quiet in tests
        del args

      def _send(self, code: int, body: dict[str, Any], headers=()):
        data = json.dumps(body).encode("utf-8")
        self.send_response(code)
        for k, v in headers:
          self.send_header(k, v)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

      def do_GET(self):  # pylint: disable=invalid-name
        if self.path.rstrip("/") not in ("/v1/models", "/models"):
          self._send(404, {"error": {"message": f"unknown path {self.path}"}})
          return
        self._send(200, {"object": "list", "data": [
            {"id": outer.model, "object": "model", "owned_by": "test"}]})

      def do_POST(self):  # pylint: disable=invalid-name
        if self.path.rstrip("/") not in ("/v1/chat/completions", "/chat/completions"):
          self._send(404, {"error": {"message": f"unknown path {self.path}"}})
          return
        length = int(self.headers.get("Content-Length", 0))
        try:
          request = json.loads(self.rfile.read(length).decode("utf-8"))
        except json.JSONDecodeError as e:
          self._send(400, {"error": {"message": f"bad JSON: {e}"}})
          return
        with outer._lock:
          outer.requests.append(request)
          outer.auth.append(self.headers.get("Authorization"))
          failing = outer.fail_first > 0
          if failing:
            outer.fail_first -= 1
        if failing:
          self._send(outer.fail_status, {"error": {"message": "overloaded (test)"}},
                     [("retry-after-ms", "10")])
          return
        try:
          message = outer.responder(request)
        except Exception as e:  # pylint: disable=broad-except
          # A failing test responder is reported, not retried by the client.
          self._send(500, {"error": {"message": f"responder failed: {e!r}"}},
                     [("x-should-retry", "false")])
          return
        self._send(200, {"id": f"cmpl-{len(outer.requests)}", "object": "chat.completion",
                         "model": request.get("model", ""),
                         "choices": [{"index": 0, "message": message,
                                      "finish_reason": "tool_calls" if message.get("tool_calls")
                                      else "stop"}]})

    self._httpd = http.server.ThreadingHTTPServer((host, 0), Handler)
    self._thread: threading.Thread | None = None

  @property
  def base_url(self) -> str:
    host, port = self._httpd.server_address[:2]
    return f"http://{host}:{port}/v1"

  def start(self) -> "ChatServer":
    """Starts serving in a daemon thread."""
    self._thread = threading.Thread(target=self._httpd.serve_forever, daemon=True,
                                    kwargs={"poll_interval": 0.05})
    self._thread.start()
    return self

  def stop(self) -> None:
    """Stops the server and frees the port."""
    self._httpd.shutdown()
    self._httpd.server_close()
    if self._thread is not None:
      self._thread.join(timeout=5)

  def __enter__(self) -> "ChatServer":
    return self.start()

  def __exit__(self, *exc) -> None:
    self.stop()


def tool_call(i: int, name: Any, arguments: Any) -> dict[str, Any]:
  """An OpenAI ``tool_calls`` entry (``arguments`` given as a JSON string)."""
  args = arguments if isinstance(arguments, str) else json.dumps(arguments)
  return {"id": f"call_{i}", "type": "function",
          "function": {"name": name, "arguments": args}}


def oracle_tool_calls(tasks, strategy: str = "paraact") -> Responder:
  """A responder whose 'model' plays each task's oracle plan as tool calls.

  It finds the task by its instruction in the user messages and its turn by
  the assistant messages so far; it calls a tool only if the request offered
  it in ``tools`` (else the test would pass on names it was never given).
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
      assert name in offered, f"{name} was not offered"
      calls.append(tool_call(i, name, c.arguments))
    return {"role": "assistant", "content": step.thought, "tool_calls": calls}

  return respond
