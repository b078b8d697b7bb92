"""The API policy end to end: a local OpenAI-compatible server plays the oracle.

The server answers with OpenAI tool calls (``search_tools``, ``call_tool``),
as an API model would; the policy turns them into Steps, the rollout runs them
in ToolEnv, and the evaluation entry point reports them.
"""

import json

import pytest

import toolenv
from paraagent_jax import api_client
from paraagent_jax import config_utils
from paraagent_jax import evaluate
from paraagent_jax import tokenizer as tok_lib
from paraagent_jax.evaluation import heldout
from paraagent_jax.evaluation import runner
from tests.openai_server import ChatServer
from paraagent_jax.paraact import chat_format, policies, protocol, rollout


@pytest.fixture(scope="module")
def cat():
  return toolenv.load_catalog("procedural", seed=0)


def oracle_server(tasks, fail_first=0):
  """A server whose 'model' replays the oracle's steps as tool calls."""
  plans = {t.instruction: toolenv.oracle.solve(t, "paraact") for t in tasks}

  def respond(request):
    msgs = request["messages"]
    text = "\n".join(str(m.get("content", "")) for m in msgs if m["role"] == "user")
    plan = next(p for ins, p in plans.items() if ins in text)
    step = plan[sum(m["role"] == "assistant" for m in msgs)]
    if step.phase == "answer":
      return {"role": "assistant", "content": step.answer}
    calls = []
    for i, c in enumerate(step.calls):
      if c.name in toolenv.schema.META_TOOLS:
        fn = {"name": c.name, "arguments": json.dumps(c.arguments)}
      else:
        fn = {"name": "call_tool",
              "arguments": json.dumps({"name": c.name, "arguments": c.arguments})}
      calls.append({"id": f"call_{i}", "type": "function", "function": fn})
    return {"role": "assistant", "content": step.thought, "tool_calls": calls}

  return ChatServer(respond, fail_first=fail_first)


def test_api_policy_solves_tasks_through_the_rollout(cat):
  tasks = toolenv.TaskGenerator(cat, seed=0).generate(10, split="test")
  tok = tok_lib.train_bpe_tokenizer([protocol.system_prompt()] * 2, vocab_size=600)
  fmt = chat_format.ChatFormat(tok, strategy="paraact")
  with oracle_server(tasks, fail_first=1) as server:
    client = api_client.ChatClient(base_url=server.base_url, model="gpt-4.1",
                                   backoff_s=0.01, max_retries=3)
    policy = policies.APIPolicy(fmt, client, concurrency=4)
    env = toolenv.VectorToolEnv(cat, num_envs=len(tasks))
    res = rollout.run_rollout(policy, env, tasks, fmt, rollout.RolloutConfig(max_turns=12, max_len=8192))
    sent = list(server.requests)
  assert all(e["success"] for e in res.episodes)
  turns = sum(len(toolenv.oracle.solve(t)) for t in tasks)
  assert client.requests_made == turns + 1 and client.retries_made == 1
  # The API model saw the tool schema and the observations of earlier turns.
  assert sent[-1]["tools"] == policies.API_TOOLS
  assert any(m["role"] != "assistant" and "[1]" in str(m.get("content"))
             for r in sent for m in r["messages"])


@pytest.mark.slow
def test_evaluate_with_policy_api_end_to_end(cat, tmp_path):
  c = config_utils.load_config("configs/evaluate.py:runlocal")
  c.policy = "api"
  c.num_per_kind = 1
  c.strategies = "paraact"
  tasks = heldout.HeldOut(heldout.HeldOutSpec(num_tasks=5), catalog=cat).tasks
  with oracle_server(tasks) as server:
    c.api.base_url = server.base_url
    evaluate.run(c, str(tmp_path))
  recs = runner.read_records(runner.records_path(str(tmp_path), "toolenv-procedural",
                                                 "api", "paraact"))
  assert len(recs) == 5 and all(r["success"] for r in recs)
