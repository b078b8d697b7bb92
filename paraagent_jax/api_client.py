"""A small client for OpenAI-compatible chat-completions endpoints.

Used by the API policy (the paper's GPT-4.1-style baselines) and by the chat
backend of the cold-start role agents. Standard library only, so it runs
anywhere: retries with exponential backoff on timeouts, connection errors,
429 and 5xx answers; a per-request timeout; the key from the config or the
environment (``OPENAI_API_KEY``), the base URL from the config or
``OPENAI_BASE_URL``.
"""

from __future__ import annotations

import dataclasses
import json
import os
import random
import socket
import time
import urllib.error
import urllib.request
from typing import Any, Sequence

RETRY_STATUS = (408, 409, 429, 500, 502, 503, 504)


class APIError(RuntimeError):
  """An endpoint answered with an error that retrying will not fix (or retries ran out)."""


@dataclasses.dataclass
class ChatClient:
  """Client of ``POST {base_url}/chat/completions``.

  Attributes:
    base_url: e.g. ``https://api.openai.com/v1`` or ``http://127.0.0.1:8000/v1``.
    model: the model name sent with every request.
    api_key: bearer token; ``None`` reads ``OPENAI_API_KEY`` (may be empty for local servers).
    timeout_s: per-request timeout.
    max_retries: retries after the first attempt, for retryable failures only.
    backoff_s: first backoff; doubles each retry, with jitter.
  """

  base_url: str | None = None
  model: str = "gpt-4.1"
  api_key: str | None = None
  timeout_s: float = 60.0
  max_retries: int = 4
  backoff_s: float = 1.0
  seed: int | None = None

  def __post_init__(self):
    self.base_url = (self.base_url or os.environ.get("OPENAI_BASE_URL")
                     or "https://api.openai.com/v1").rstrip("/")
    if self.api_key is None:
      self.api_key = os.environ.get("OPENAI_API_KEY", "")
    self.requests_made = 0
    self.retries_made = 0

  def _post(self, payload: dict[str, Any]) -> dict[str, Any]:
    data = json.dumps(payload).encode("utf-8")
    headers = {"Content-Type": "application/json"}
    if self.api_key:
      headers["Authorization"] = f"Bearer {self.api_key}"
    req = urllib.request.Request(f"{self.base_url}/chat/completions", data=data,
                                 headers=headers, method="POST")
    with urllib.request.urlopen(req, timeout=self.timeout_s) as resp:
      return json.loads(resp.read().decode("utf-8"))

  def complete(self, messages: Sequence[dict[str, Any]],
               tools: Sequence[dict[str, Any]] | None = None,
               temperature: float = 0.0, max_tokens: int | None = None,
               **extra: Any) -> dict[str, Any]:
    """Sends one chat completion and returns the first choice's ``message`` dict.

    Raises:
      APIError: on a non-retryable HTTP error, a malformed answer, or when the
        retries are spent (the message names the last failure).
    """
    payload: dict[str, Any] = {"model": self.model, "messages": list(messages),
                               "temperature": temperature}
    if tools:
      payload["tools"] = list(tools)
      payload["parallel_tool_calls"] = True
    if max_tokens is not None:
      payload["max_tokens"] = max_tokens
    if self.seed is not None:
      payload["seed"] = self.seed
    payload.update(extra)
    last = "no attempt"
    for attempt in range(self.max_retries + 1):
      self.requests_made += 1
      try:
        body = self._post(payload)
        choice = body["choices"][0]
        message = choice["message"]
        if not isinstance(message, dict):
          raise APIError(f"malformed answer from {self.base_url}: message is not an object")
        return message
      except urllib.error.HTTPError as e:
        detail = e.read().decode("utf-8", "replace")[:300]
        last = f"HTTP {e.code}: {detail}"
        if e.code not in RETRY_STATUS:
          raise APIError(f"{self.base_url} refused the request ({last})") from e
      except (urllib.error.URLError, socket.timeout, TimeoutError, ConnectionError) as e:
        last = f"{type(e).__name__}: {e}"
      except (KeyError, IndexError, TypeError, json.JSONDecodeError) as e:
        raise APIError(f"malformed answer from {self.base_url}: {e!r}") from e
      if attempt < self.max_retries:
        self.retries_made += 1
        time.sleep(self.backoff_s * (2 ** attempt) * (0.5 + random.random() / 2))
    raise APIError(f"{self.base_url}: giving up after {self.max_retries + 1} attempts ({last})")
