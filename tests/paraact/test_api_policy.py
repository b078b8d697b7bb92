"""The API policy end to end through the openai SDK and a local server.

The server plays the oracle with native OpenAI ``tool_calls`` (only tools the
request offered); the policy turns them into Steps, the rollout runs them in
ToolEnv, and the evaluation entry point reports them. Malformed tool calls
are parse failures, never exceptions; the SDK retries a 429.
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
from paraagent_jax.paraact import api_policy, chat_format, protocol, rollout
from tests.openai_server import ChatServer, oracle_tool_calls, tool_call


@pytest.fixture(scope="module")
def cat():
  return toolenv.load_catalog("procedural", seed=0)


@pytest.fixture(scope="module")
def tasks(cat):
  # Made once: the first task generation indexes the catalog (seconds).
  return toolenv.TaskGenerator(cat, seed=0).generate(5, split="test")


@pytest.fixture(scope="module")
def fmt():
  tok = tok_lib.train_bpe_tokenizer([protocol.system_prompt()] * 2, vocab_size=600)
  return chat_format.ChatFormat(tok, strategy="paraact")


def _chat(server, **kw):
  return api_client.ChatModel(api_client.make_client(server.base_url, api_key="k", **kw),
                              model="gpt-4.1")


def test_function_calling_solves_tasks_through_the_rollout(cat, fmt, tasks):
  with ChatServer(oracle_tool_calls(tasks), fail_first=1, fail_status=429) as server:
    chat = _chat(server, max_retries=2)
    policy = api_policy.APIPolicy(fmt, chat, catalog=cat, concurrency=4)
    env = toolenv.VectorToolEnv(cat, num_envs=len(tasks))
    # Observations whole: a cut one would hide found tools from the model.
    res = rollout.run_rollout(policy, env, tasks, fmt, rollout.RolloutConfig(
        max_turns=12, max_len=16384, max_obs_tokens=4096))
    sent = list(server.requests)
  assert all(e["success"] for e in res.episodes)
  turns = sum(len(toolenv.oracle.solve(t)) for t in tasks)
  # The 429 was retried by the SDK: one request more than turns, one policy request per turn.
  assert len(sent) == turns + 1 and chat.requests_made == turns
  assert policy.stats()["api_malformed_turns"] == 0
  # Tools grow as searches find them: search_tools first, catalog schemas after.
  last = sent[-1]
  names = [t["function"]["name"] for t in last["tools"]]
  assert names[:2] == ["search_tools", "get_tool_doc"] and len(names) > 2
  found = next(t["function"] for t in last["tools"][2:])
  tool = cat.get(found["name"])
  assert set(found["parameters"]["properties"]) == set(tool.properties)
  assert found["parameters"]["required"] == list(tool.required)
  assert last["parallel_tool_calls"] is True and last["model"] == "gpt-4.1"
  # Every tool call got its own tool message with that call's result block.
  for req in sent[1:]:
    msgs = req["messages"]
    for i, m in enumerate(msgs):
      if m["role"] == "assistant" and m.get("tool_calls"):
        answers = msgs[i + 1:i + 1 + len(m["tool_calls"])]
        assert [a.get("tool_call_id") for a in answers] == [c["id"] for c in m["tool_calls"]]
        assert [a["content"][:4] for a in answers] == [f"[{k + 1}] " for k in
                                                       range(len(answers))]


def _scripted(replies):
  """A server answering each task's turn t with ``replies[t]`` (tool_calls or text)."""
  def respond(request):
    t = sum(m["role"] == "assistant" for m in request["messages"])
    calls = replies[min(t, len(replies) - 1)]
    if isinstance(calls, str):
      return {"role": "assistant", "content": calls}
    return {"role": "assistant", "content": None,
            "tool_calls": [c if isinstance(c, dict) else tool_call(i, *c)
                           for i, c in enumerate(calls)]}
  return respond


def test_malformed_tool_calls_are_parse_failures_not_exceptions(cat, fmt):
  task = toolenv.TaskGenerator(cat, seed=0).generate(1, split="test", kinds=("single",))[0]
  good = ("search_tools", {"query": "weather"})
  replies = [
      [good, ("search_tools", '{"query": "x"')],                 # bad JSON
      [("no_such_tool", {"a": 1})],                                # unknown tool
      [{"id": "c", "type": "function", "function": {"arguments": "{}"}}],  # no name
      [("search_tools", "[1, 2]"), {"id": "d"}],                   # not an object; no function
      [good],                                                       # well formed
      "",                                                           # an empty reply
      "final answer",
  ]
  with ChatServer(_scripted(replies)) as server:
    policy = api_policy.APIPolicy(fmt, _chat(server), catalog=cat)
    env = toolenv.VectorToolEnv(cat, num_envs=1)
    res = rollout.run_rollout(policy, env, [task], fmt,
                              rollout.RolloutConfig(max_turns=7, max_len=8192))
    sent = list(server.requests)
  rec = res.episodes[0]
  assert rec["turns"] == 7 and rec["parse_errors"] == 5 and rec["answer"] == "final answer"
  stats = policy.stats()
  assert stats == {"api_requests": 7, "api_malformed_turns": 5, "api_calls_dropped": 5,
                   "api_json_errors": 1, "api_not_objects": 1, "api_unknown_tools": 1,
                   "api_missing_names": 2, "api_model_parse_errors": 0}
  # The environment ran none of a malformed turn's calls and said why.
  second = sent[1]["messages"]
  errs = [m["content"] for m in second if m["role"] == "tool"]
  assert len(errs) == 2 and all("could not parse your step" in e for e in errs)
  assert protocol.JSON_ERROR in errs[0]
  # The transcript shows what was wrong; the well-formed search ran.
  assistant = [t["text"] for t in rec["transcript"] if t["role"] == "assistant"]
  assert "unknown tool 'no_such_tool'" in assistant[1]
  result = [m["content"] for m in sent[5]["messages"] if m["role"] == "tool"][-1]
  assert result and not result.startswith("error")


def test_message_to_step_infers_the_phase_from_the_calls():
  tools = {"search_tools": "search_tools", "a_b": "a.b"}
  def step(*calls):
    msg = {"role": "assistant", "content": "why",
           "tool_calls": [tool_call(i, n, {}) for i, n in enumerate(calls)]}
    return api_policy.message_to_step(msg, tools)[0]
  assert step("search_tools", "search_tools").phase == "explore"
  s = step("a_b", "a_b")
  assert s.phase == "execute" and [c.name for c in s.calls] == ["a.b", "a.b"]
  assert step("search_tools", "a_b").phase == "execute"     # mixed: execute, as interleaved
  assert s.thought == "why" and s.parse_error is None
  assert api_policy.function_name("math.factorial") == "math_factorial"
  bad = {"role": "assistant", "tool_calls": [
      tool_call(0, "search_tools", '{"query"'), tool_call(1, "a_b", {"x": 1}), {"id": "call_0"}]}
  s, history, counts = api_policy.message_to_step(bad, tools, turn=3)
  assert s.parse_error and [c.name for c in s.calls] == ["a.b"]
  assert counts == {"json_errors": 1, "missing_names": 1, "calls_dropped": 2}
  # The text parser's failure counts read an API step as they read a parsed one.
  lost = protocol.failure_counts(s)
  assert (lost["calls_dropped"], lost["json_errors"]) == (2, 1)
  # The history keeps every call, with unique ids and string names and arguments.
  assert [(c["id"], c["function"]["name"]) for c in history["tool_calls"]] == [
      ("call_0", "search_tools"), ("call_1", "a_b"), ("call_3_2", "unnamed")]


def test_found_tools_are_offered_from_split_and_unsplit_observations(cat, fmt):
  names = cat.names[:3]
  obs = (f'[1] get_tool_doc: {{"name": "{names[0]}", "parameters": {{}}}}\n'
         f"[2] search_tools: {names[1]}: d (x*: str)\n{names[2]}(y: int)")
  policy = api_policy.APIPolicy(fmt, None, catalog=cat)
  for pending in (["a", "b"], ["a", "b", "c"]):     # two blocks; not three
    policy.reset(1, [None])
    ep = policy._episodes[0]
    ep.messages, ep.pending = [{"role": "system", "content": ""}], list(pending)
    policy._take_context(ep, [{"role": "tool", "content": obs}])
    sent = [m["content"] for m in ep.messages[1:]]
    assert [m["tool_call_id"] for m in ep.messages[1:]] == pending
    assert sent == (obs.split("\n[2]")[:1] + ["[2]" + obs.split("\n[2]")[1]]
                    if len(pending) == 2 else [obs] * 3)
    assert api_policy.join_blocks(sent) == obs           # what a served policy reads back
    assert sorted(list(ep.tools.values())[2:]) == sorted(names)


def test_at_most_max_tools_are_given_the_oldest_found_leave_first(cat, fmt):
  names = cat.names[:api_policy.MAX_TOOLS + 5]
  policy = api_policy.APIPolicy(fmt, None, catalog=cat)
  policy.reset(1, [None])
  ep = policy._episodes[0]
  policy._add_tools(ep, ["\n".join(f"{n}: d (x*: str)" for n in names)])
  given = [t["function"]["name"] for t in ep.specs]
  assert len(given) == api_policy.MAX_TOOLS and list(ep.tools) == given
  assert given[:2] == ["search_tools", "get_tool_doc"] and given[2:] == names[7:]


def test_text_protocol_option_parses_our_tags(cat, fmt):
  task = toolenv.TaskGenerator(cat, seed=0).generate(1, split="test", kinds=("single",))[0]
  steps = toolenv.oracle.solve(task)
  replies = [fmt.render(s) for s in steps]
  with ChatServer(_scripted(replies)) as server:
    policy = api_policy.APIPolicy(fmt, _chat(server), catalog=cat, tool_calling=False)
    env = toolenv.VectorToolEnv(cat, num_envs=1)
    res = rollout.run_rollout(policy, env, [task], fmt, rollout.RolloutConfig(max_len=8192))
    sent = list(server.requests)
  assert res.episodes[0]["success"]
  assert "tools" not in sent[-1] and sent[-1]["messages"][0]["content"] == fmt.system_text
  # Observations go back as user messages (a tool message needs a tool call).
  assert [m["role"] for m in sent[-1]["messages"]][-2:] == ["assistant", "user"]
  assert json.dumps(sent[-1]).count("[1]") >= 1


@pytest.mark.slow
def test_evaluate_with_policy_api_end_to_end(cat, tmp_path):
  c = config_utils.load_config("configs/evaluate.py:runlocal")
  c.policy = "api"
  c.strategies = "paraact"
  tasks = heldout.HeldOut(heldout.HeldOutSpec(num_tasks=10), catalog=cat).tasks
  with ChatServer(oracle_tool_calls(tasks)) as server:
    c.api.base_url = server.base_url
    evaluate.run(c, str(tmp_path))
  recs = runner.read_records(runner.records_path(str(tmp_path), "toolenv-procedural",
                                                 "api", "paraact"))
  assert len(recs) == 10 and all(r["success"] for r in recs)
