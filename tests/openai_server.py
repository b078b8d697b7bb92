"""A local OpenAI-compatible chat-completions server around any Python responder.

For tests and demos: serve a scripted policy (or our own JAX policy) on
127.0.0.1 so the API-policy path is exercised end to end without the network.

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

Responder = Callable[[dict[str, Any]], dict[str, Any]]


class ChatServer:
  """Threaded HTTP server answering ``POST /v1/chat/completions``.

  ``responder(request_json) -> message dict`` builds the assistant message.
  ``fail_first`` makes the first N requests answer 503 (to test retries).
  """

  def __init__(self, responder: Responder, fail_first: int = 0, host: str = "127.0.0.1"):
    self.responder = responder
    self.fail_first = fail_first
    self.requests: list[dict[str, Any]] = []
    self._lock = threading.Lock()
    outer = self

    class Handler(http.server.BaseHTTPRequestHandler):
      """Request handler bound to this server instance."""

      def log_message(self, *args):  # quiet in tests
        del args

      def _send(self, code: int, body: dict[str, Any]):
        data = json.dumps(body).encode("utf-8")
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

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
          failing = outer.fail_first > 0
          if failing:
            outer.fail_first -= 1
        if failing:
          self._send(503, {"error": {"message": "overloaded (test)"}})
          return
        message = outer.responder(request)
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
    self._thread = threading.Thread(target=self._httpd.serve_forever, daemon=True)
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
