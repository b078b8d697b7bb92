"""A trained policy served behind the chat-completions API and evaluated through it.

The reference is the in-process rollout: the token stream it builds for an
episode (checked against the server's rebuilt context) and the in-process
greedy evaluation of the same weights (checked against the served one).
"""

import json
import os
import subprocess
import sys

import openai
import pytest

import toolenv
from paraagent_jax import api_client
from paraagent_jax import config_utils
from paraagent_jax import evaluate
from paraagent_jax import serve
from paraagent_jax import tokenizer as tok_lib
from paraagent_jax.models import tiny_qwen3
from paraagent_jax.evaluation import runner
from paraagent_jax.paraact import api_policy, chat_format, policies, rollout
from paraagent_jax.serving import openai_http, policy_server
from tests.openai_server import ChatServer, oracle_tool_calls

DEMO = "pretrained/demo_sft"


@pytest.fixture(scope="module")
def cat():
  return toolenv.load_catalog("procedural", seed=0)


@pytest.fixture(scope="module")
def tok():
  return tok_lib.load_tokenizer(DEMO)


@pytest.fixture(scope="module")
def tasks(cat):
  # Made once: the first task generation indexes the catalog (seconds).
  return toolenv.TaskGenerator(cat, seed=0).generate(5, split="test")


@pytest.mark.parametrize("protocol_format", ["tags", "qwen3"])
def test_server_context_is_the_in_process_token_stream(cat, tok, tasks, protocol_format):
  """The API policy's conversation, mapped back by the server, gives the ids
  the in-process rollout built for the same episode (oracle turns,
  observations cut at the same budget), in both protocol formats (the demo
  tokenizer; a Qwen3-style tokenizer and chat template made here)."""
  if protocol_format == "qwen3":
    tok = tiny_qwen3.train_tokenizer()
  fmt = chat_format.ChatFormat(tok, "paraact", protocol_format=protocol_format)
  rcfg = rollout.RolloutConfig(max_turns=12, max_len=8192, max_obs_tokens=160)
  ref = rollout.run_rollout(policies.OraclePolicy(fmt), toolenv.VectorToolEnv(cat, 5),
                            tasks, fmt, rcfg)
  # The cut hides some found tools: the oracle calls them all the same.
  with ChatServer(oracle_tool_calls(tasks, only_offered=False)) as server:
    chat = api_client.ChatModel(api_client.make_client(server.base_url))
    policy = api_policy.APIPolicy(fmt, chat, catalog=cat, strict_tools=False)
    rollout.run_rollout(policy, toolenv.VectorToolEnv(cat, 5), tasks, fmt, rcfg)
    sent = list(server.requests)
  served = policy_server.ServedPolicy(None, tok, protocol_format=protocol_format)
  for task, buf in zip(tasks, ref.buffers):
    last = [r for r in sent if task.instruction in r["messages"][1]["content"]][-1]
    ids = served.context_ids(last["messages"])
    answer = fmt.encode(fmt.render(toolenv.oracle.solve(task)[-1]))
    assert buf.tokens[:len(ids) + len(answer)] == ids + answer
  # Some observation was cut: the cut text went back whole, once.
  assert any(chat_format.CUT_NOTE in m.get("content", "") for r in sent
             for m in r["messages"] if m["role"] == "tool")


def test_turn_messages_and_bad_requests(tok):
  served = policy_server.ServedPolicy(None, tok)
  msg = served.turn_message('<execute> go\n<call>{"name": "a_b", "arguments": {"x": 1}}</call>'
                            '\n<call>{"name": "c", "arguments": {}}</call>\n</step>')
  assert msg["content"] == "go" and [
      (c["function"]["name"], json.loads(c["function"]["arguments"]))
      for c in msg["tool_calls"]] == [("a_b", {"x": 1}), ("c", {})]
  assert served.turn_message("<answer> 42 </answer>") == {"role": "assistant",
                                                         "content": "42"}
  bad = served.turn_message('<execute>\n<call>{"name": "a", "arguments": {}}</call>\n'
                            '<call>{"name": </call>\n</step>')
  names = [c["function"]["name"] for c in bad["tool_calls"]]
  assert names == ["a", api_policy.INVALID_STEP]
  # The API policy reads it as the model's own parse failure, the call that parsed kept.
  step, _, counts = api_policy.message_to_step(bad, {"a": "a"})
  assert step.parse_error.startswith("call is not valid JSON") and step.calls[0].name == "a"
  assert counts["model_parse_errors"] == 1 and counts["json_errors"] == 1
  for messages, match in (([{"role": "system", "content": "s"}], "start with the task"),
                          ([{"role": "user", "content": "t"}, {"role": "tool", "content": "o"}],
                           "must follow an assistant turn"),
                          ([{"role": "user", "content": "t"},
                            {"role": "assistant", "content": "x"}], "nothing to answer")):
    with pytest.raises(openai_http.RequestError, match=match):
      served.context_ids(messages)
  # Over HTTP a bad conversation is a 400 the SDK does not retry.
  with openai_http.ChatHTTPServer(served.respond) as server:
    chat = api_client.ChatModel(api_client.make_client(server.base_url, max_retries=3))
    with pytest.raises(openai.BadRequestError, match="start with the task"):
      chat.complete([{"role": "system", "content": "s"}])
    assert len(server.requests) == 1


def test_command_line_errors_are_one_line(capsys):
  with pytest.raises(SystemExit) as e:
    serve.main(["--checkpoint=/nonexistent/dir", "--port=0"])
  assert e.value.code == 1
  err = capsys.readouterr().err.strip()
  assert err.startswith("paraagent_jax.serve: error:") and "\n" not in err


def _start_cli_server():
  """``python -m paraagent_jax.serve`` on a free port; (process, base_url)."""
  proc = subprocess.Popen(
      [sys.executable, "-m", "paraagent_jax.serve", f"--checkpoint={DEMO}", "--port=0"],
      stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
      env=dict(os.environ, JAX_PLATFORMS="cpu"))
  line = proc.stdout.readline()
  if " at http" not in line:
    proc.kill()
    raise AssertionError(f"the server did not start: {line}{proc.stdout.read()}")
  return proc, line.split(" at ", 1)[1].split()[0]


@pytest.mark.slow
def test_served_checkpoint_matches_in_process_evaluation(tmp_path):
  """`python -m paraagent_jax.serve` over the shipped SFT policy, evaluated
  through the API policy, solves the same runlocal tasks as the in-process
  greedy evaluation of the same weights, in the same turns."""
  def config(**kw):
    c = config_utils.load_config("configs/evaluate.py:runlocal")
    c.num_per_kind, c.strategies, c.batch_size = 1, "paraact", 5
    c.update(kw)
    return c
  evaluate.run(config(), str(tmp_path / "in"), DEMO)
  proc, base_url = _start_cli_server()
  try:
    c = config(policy="api", policy_name="served", tokenizer=DEMO, text_max_len=0)
    c.api.update(dict(base_url=base_url, model="demo_sft", strict_tools=False,
                      max_obs_tokens=c.rollout.max_obs_tokens,
                      max_tokens=c.rollout.max_turn_tokens))
    evaluate.run(c, str(tmp_path / "api"))
    models = api_client.make_client(base_url).models.list()
  finally:
    proc.terminate()
    proc.wait(timeout=30)
  assert [m.id for m in models] == ["demo_sft"]
  ref = runner.read_records(runner.records_path(str(tmp_path / "in"), "toolenv-procedural",
                                                "demo_sft", "paraact"))
  got = runner.read_records(runner.records_path(str(tmp_path / "api"),
                                                "toolenv-procedural", "served", "paraact"))
  assert len(ref) == len(got) == 5
  assert 0 < sum(r["success"] for r in ref) < 5        # a check that can fail both ways
  key = ("task_id", "success", "turns", "calls", "parse_errors", "answer")
  assert [[r[k] for k in key] for r in got] == [[r[k] for k in key] for r in ref]
