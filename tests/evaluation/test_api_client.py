"""The openai SDK client against a local server: answers, retries, keys, errors."""

import openai
import pytest

from paraagent_jax import api_client
from tests.openai_server import ChatServer


def _echo(request):
  last = request["messages"][-1]["content"]
  return {"role": "assistant", "content": f"echo: {last}"}


def test_complete_sends_model_tools_and_options_and_returns_a_dict():
  with ChatServer(_echo) as server:
    chat = api_client.ChatModel(api_client.make_client(server.base_url, api_key="k"),
                                model="m1", seed=3, max_tokens=7)
    tools = [{"type": "function", "function": {"name": "search_tools", "parameters": {}}}]
    msg = chat.complete([{"role": "user", "content": "hello"}], tools=tools)
    assert msg == {"role": "assistant", "content": "echo: hello"}
    req = server.requests[0]
    assert req["model"] == "m1" and req["max_tokens"] == 7 and req["seed"] == 3
    assert req["tools"] == tools and req["parallel_tool_calls"] is True
    assert req["temperature"] == 0.0 and server.auth == ["Bearer k"]
    chat.complete([{"role": "user", "content": "x"}], tools=tools, parallel=False)
    assert server.requests[1]["parallel_tool_calls"] is False
    assert "tools" not in chat.complete([{"role": "user", "content": "y"}]) and (
        "tools" not in server.requests[2])
    assert [m.id for m in chat.client.models.list()] == ["test"]


@pytest.mark.parametrize("status", [429, 503])
def test_the_sdk_retries_a_rate_limit_then_succeeds(status):
  with ChatServer(_echo, fail_first=1, fail_status=status) as server:
    chat = api_client.ChatModel(api_client.make_client(server.base_url, max_retries=2))
    assert chat.complete([{"role": "user", "content": "x"}])["content"] == "echo: x"
    assert len(server.requests) == 2 and chat.requests_made == 1


def test_gives_up_when_the_retries_are_spent():
  with ChatServer(_echo, fail_first=10, fail_status=429) as server:
    chat = api_client.ChatModel(api_client.make_client(server.base_url, max_retries=1))
    with pytest.raises(openai.RateLimitError, match="429"):
      chat.complete([{"role": "user", "content": "x"}])
    assert len(server.requests) == 2


def test_a_refused_request_is_raised_at_once():
  with ChatServer(_echo) as server:
    chat = api_client.ChatModel(api_client.make_client(server.base_url + "/nope"))
    with pytest.raises(openai.NotFoundError):
      chat.complete([{"role": "user", "content": "x"}])


def test_key_and_base_url_come_from_the_environment(monkeypatch):
  with ChatServer(_echo) as server:
    monkeypatch.setenv("OPENAI_BASE_URL", server.base_url)
    monkeypatch.setenv("MY_KEY", "secret")
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    api_client.ChatModel(api_client.make_client("", "MY_KEY")).complete(
        [{"role": "user", "content": "x"}])
    # No key set: the placeholder local servers ignore (the SDK needs one).
    api_client.ChatModel(api_client.make_client("", "NO_SUCH_VAR")).complete(
        [{"role": "user", "content": "x"}])
    assert server.auth == ["Bearer secret", f"Bearer {api_client.NO_KEY}"]


def test_unreachable_server_is_retried_then_reported():
  chat = api_client.ChatModel(api_client.make_client("http://127.0.0.1:9/v1", timeout_s=1,
                                                     max_retries=1))
  with pytest.raises(openai.APIConnectionError):
    chat.complete([{"role": "user", "content": "x"}])


def test_a_failing_responder_is_a_500_the_sdk_does_not_retry():
  def broken(request):
    raise KeyError("boom")
  with ChatServer(broken) as server:
    chat = api_client.ChatModel(api_client.make_client(server.base_url, max_retries=3))
    with pytest.raises(openai.InternalServerError, match="boom"):
      chat.complete([{"role": "user", "content": "x"}])
    assert len(server.requests) == 1
