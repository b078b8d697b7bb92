"""The OpenAI-compatible client against a local server: answers, retries, errors."""

import pytest

from paraagent_jax import api_client
from tests.openai_server import ChatServer


def _echo(request):
  last = request["messages"][-1]["content"]
  return {"role": "assistant", "content": f"echo: {last}"}


def test_complete_roundtrip_sends_model_tools_and_messages():
  with ChatServer(_echo) as server:
    client = api_client.ChatClient(base_url=server.base_url, model="m1", api_key="k")
    tools = [{"type": "function", "function": {"name": "search_tools", "parameters": {}}}]
    msg = client.complete([{"role": "user", "content": "hello"}], tools=tools, max_tokens=7)
    assert msg == {"role": "assistant", "content": "echo: hello"}
    req = server.requests[0]
    assert req["model"] == "m1" and req["max_tokens"] == 7
    assert req["tools"] == tools and req["parallel_tool_calls"] is True


def test_retries_on_503_then_succeeds():
  with ChatServer(_echo, fail_first=2) as server:
    client = api_client.ChatClient(base_url=server.base_url, backoff_s=0.01, max_retries=3)
    msg = client.complete([{"role": "user", "content": "x"}])
    assert msg["content"] == "echo: x"
    assert client.requests_made == 3 and client.retries_made == 2


def test_gives_up_after_retries_with_clear_message():
  with ChatServer(_echo, fail_first=10) as server:
    client = api_client.ChatClient(base_url=server.base_url, backoff_s=0.01, max_retries=1)
    with pytest.raises(api_client.APIError, match="giving up after 2 attempts .*HTTP 503"):
      client.complete([{"role": "user", "content": "x"}])


def test_non_retryable_error_is_raised_at_once():
  with ChatServer(_echo) as server:
    client = api_client.ChatClient(base_url=server.base_url + "/nope", backoff_s=0.01)
    with pytest.raises(api_client.APIError, match="HTTP 404"):
      client.complete([{"role": "user", "content": "x"}])
    assert client.requests_made == 1


def test_unreachable_server_is_retried_then_reported():
  client = api_client.ChatClient(base_url="http://127.0.0.1:9/v1", backoff_s=0.01,
                                 max_retries=1, timeout_s=1)
  with pytest.raises(api_client.APIError, match="giving up"):
    client.complete([{"role": "user", "content": "x"}])
