"""A small OpenAI-compatible HTTP server (standard library) around a responder.

    server = ChatHTTPServer(responder, model="demo_sft", port=8000).start()
    ...                                  # server.base_url == "http://127.0.0.1:8000/v1"
    server.stop()

It answers ``GET /v1/models`` (the one model) and ``POST
/v1/chat/completions``, whose JSON request goes to ``responder(request) ->
assistant message dict``; the answer is the chat-completion object the
``openai`` SDK reads. A responder raises `RequestError` for a request it
cannot serve (answered 400 with the message, the way OpenAI answers, so the
SDK does not retry it); any other exception is a 500 the SDK is told not to
retry. No streaming, one choice (``n`` is ignored).
Requests are served in threads; the responder serialises what must be.
"""

from __future__ import annotations

import http.server
import json
import threading
import time
from typing import Any, Callable

Responder = Callable[[dict[str, Any]], dict[str, Any]]
_PATHS = {"/v1/chat/completions": "chat", "/chat/completions": "chat",
          "/v1/models": "models", "/models": "models"}


class RequestError(ValueError):
  """A request the responder cannot serve (HTTP 400, not retried)."""


class ChatHTTPServer:
  """Threaded ``http.server`` answering the chat-completions API.

  ``port=0`` takes a free port (tests). `before_answer` is a hook for
  subclasses (a test server's injected failures).
  """

  def __init__(self, responder: Responder, model: str = "model", host: str = "127.0.0.1",
               port: int = 0):
    self.responder = responder
    self.model = model
    self.requests: list[dict[str, Any]] = []
    self.auth: list[str | None] = []           # each POST's Authorization header
    self.lock = threading.Lock()
    self._count = 0
    self._httpd = http.server.ThreadingHTTPServer((host, port), self._handler_class())
    self._httpd.daemon_threads = True
    self._thread: threading.Thread | None = None

  def before_answer(self, request: dict[str, Any]):
    """None, or ``(status, body, headers)`` to answer instead (subclasses)."""
    del request

  def answer(self, request: dict[str, Any]) -> tuple[int, dict[str, Any], list]:
    """(status, body, headers) of one chat-completions request."""
    early = self.before_answer(request)
    if early is not None:
      return early
    if not isinstance(request.get("messages"), list):
      return _error(400, "'messages' must be a list")
    try:
      message = self.responder(request)
    except RequestError as e:
      return _error(400, str(e))
    except Exception as e:  # pylint: disable=broad-except
      # A failing responder is reported to the client, which would only
      # fail the same way again: not retried (the SDK reads x-should-retry).
      return _error(500, f"the responder failed: {e!r}", [("x-should-retry", "false")])
    with self.lock:
      self._count += 1
      n = self._count
    calls = message.get("tool_calls")
    body = {"id": f"chatcmpl-{n}", "object": "chat.completion", "created": int(time.time()),
            "model": request.get("model") or self.model,
            "choices": [{"index": 0, "message": message,
                         "finish_reason": "tool_calls" if calls else "stop"}]}
    return 200, body, []

  def _handler_class(self):
    outer = self

    class Handler(http.server.BaseHTTPRequestHandler):
      """Request handler bound to this server."""

      def log_message(self, *args):  # quiet: a test's output stays readable
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
        if _PATHS.get(self.path.rstrip("/")) != "models":
          self._send(*_error(404, f"unknown path {self.path}"))
          return
        self._send(200, {"object": "list", "data": [
            {"id": outer.model, "object": "model", "created": 0, "owned_by": "paraagent"}]})

      def do_POST(self):  # pylint: disable=invalid-name
        if _PATHS.get(self.path.rstrip("/")) != "chat":
          self._send(*_error(404, f"unknown path {self.path}"))
          return
        length = int(self.headers.get("Content-Length", 0))
        try:
          request = json.loads(self.rfile.read(length).decode("utf-8"))
        except (ValueError, UnicodeDecodeError) as e:
          self._send(*_error(400, f"the body is not JSON: {e}"))
          return
        if not isinstance(request, dict):
          self._send(*_error(400, "the body must be a JSON object"))
          return
        with outer.lock:
          outer.requests.append(request)
          outer.auth.append(self.headers.get("Authorization"))
        self._send(*outer.answer(request))

    return Handler

  @property
  def base_url(self) -> str:
    host, port = self._httpd.server_address[:2]
    return f"http://{host}:{port}/v1"

  def start(self) -> "ChatHTTPServer":
    """Starts serving in a daemon thread."""
    self._thread = threading.Thread(target=self._httpd.serve_forever, daemon=True,
                                    kwargs={"poll_interval": 0.05})
    self._thread.start()
    return self

  def serve_forever(self) -> None:
    """Serves in this thread until interrupted (the command line)."""
    try:
      self._httpd.serve_forever(poll_interval=0.2)
    finally:
      self._httpd.server_close()

  def stop(self) -> None:
    """Stops the server and frees the port."""
    self._httpd.shutdown()
    self._httpd.server_close()
    if self._thread is not None:
      self._thread.join(timeout=5)

  def __enter__(self) -> "ChatHTTPServer":
    return self.start()

  def __exit__(self, *exc) -> None:
    self.stop()


def _error(code: int, message: str, headers=()) -> tuple[int, dict[str, Any], list]:
  """An OpenAI-style error answer."""
  return code, {"error": {"message": message, "type": "invalid_request_error",
                          "code": code}}, list(headers)
