"""OpenAI-compatible chat endpoints through the official ``openai`` SDK.

The SDK does the HTTP work: retries with backoff on connection errors, 408,
409, 429 and 5xx (honouring ``Retry-After``), the per-request timeout, the
key from ``OPENAI_API_KEY`` and the base URL from ``OPENAI_BASE_URL``. This
module keeps only what the SDK does not do for us:

* the key read from an environment variable the config names
  (``api.api_key_env``), and a placeholder key for local servers (vLLM,
  SGLang, ``python -m paraagent_jax.serve``) that need none: the SDK refuses
  to start without one;
* `ChatModel`: a model name and sampling options bound to a client, whose
  ``complete`` returns the first choice's message as a plain dict (what the
  policies and the cold-start roles read), and counts requests.

    chat = ChatModel(make_client("http://127.0.0.1:8000/v1"), model="gpt-4.1")
    message = chat.complete([{"role": "user", "content": "hi"}])
"""

from __future__ import annotations

import dataclasses
import os
import threading
from typing import Any, Sequence

import openai

# The key sent to a local endpoint when no key is set (they ignore it).
NO_KEY = "EMPTY"


def make_client(base_url: str | None = None, api_key_env: str = "OPENAI_API_KEY", *,
                api_key: str | None = None, timeout_s: float = 60.0,
                max_retries: int = 4) -> openai.OpenAI:
  """An ``openai.OpenAI`` client.

  Args:
    base_url: e.g. ``http://127.0.0.1:8000/v1``; None or "" reads
      ``OPENAI_BASE_URL`` (the SDK's default, api.openai.com, without it).
    api_key_env: the environment variable that holds the key.
    api_key: the key itself (wins over ``api_key_env``).
    timeout_s: per-request timeout (the SDK retries a timed-out request).
    max_retries: retries after the first attempt (the SDK's backoff).
  """
  key = api_key if api_key is not None else os.environ.get(api_key_env or "", "")
  return openai.OpenAI(base_url=base_url or None, api_key=key or NO_KEY,
                       timeout=timeout_s, max_retries=max_retries)


class APIAnswerError(RuntimeError):
  """The endpoint answered 200 with no message (not a model-output problem)."""


@dataclasses.dataclass
class ChatModel:
  """One chat model behind a client: ``complete(messages, tools)`` -> message dict.

  Attributes:
    client: an ``openai.OpenAI`` client (`make_client`).
    model: the model name sent with every request.
    temperature: sampling temperature (0: as greedy as the endpoint allows).
    seed: sent when set (endpoints that support it sample reproducibly).
    max_tokens: the most tokens per answer (None: the endpoint's default).
  """

  client: Any
  model: str = "gpt-4.1"
  temperature: float = 0.0
  seed: int | None = None
  max_tokens: int | None = None

  def __post_init__(self):
    self.requests_made = 0
    self._lock = threading.Lock()

  def complete(self, messages: Sequence[dict[str, Any]],
               tools: Sequence[dict[str, Any]] | None = None,
               parallel: bool = True, temperature: float | None = None,
               max_tokens: int | None = None) -> dict[str, Any]:
    """Sends one chat completion; returns the first choice's ``message`` as a dict.

    With ``tools``, ``parallel_tool_calls`` is ``parallel``. ``temperature``
    and ``max_tokens`` override the model's for this request. Raises the SDK's
    ``openai.APIError`` subclasses when the endpoint refuses the request or
    the retries are spent (an infrastructure failure, not model output).
    """
    kwargs: dict[str, Any] = {"model": self.model, "messages": list(messages),
                              "temperature": self.temperature if temperature is None
                              else temperature}
    if tools:
      kwargs["tools"] = list(tools)
      kwargs["parallel_tool_calls"] = parallel
    if self.seed is not None:
      kwargs["seed"] = self.seed
    max_tokens = self.max_tokens if max_tokens is None else max_tokens
    if max_tokens is not None:
      kwargs["max_tokens"] = max_tokens
    with self._lock:
      self.requests_made += 1
    response = self.client.chat.completions.create(**kwargs)
    if not getattr(response, "choices", None):
      raise APIAnswerError(f"{self.model}: the endpoint's answer has no choices")
    return response.choices[0].message.model_dump(exclude_none=True)
