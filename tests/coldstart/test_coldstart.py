"""Cold-start demonstrations: scripted and chat role backends, filtering, build.

A small procedural catalog (3,000 tools, built in memory) keeps these fast;
only the build test loads the full 50,011-tool catalog, as the demo does.
References are independent of the orchestrator: `toolenv.oracle.solve` (the
gold step sequence), a fresh `ToolEnv` replaying the parsed steps, and the
gold DAG nodes of each task.
"""

import json
import os
import threading
import time

import pytest
from ml_collections import ConfigDict

import toolenv
from paraagent_jax import api_client
from paraagent_jax.coldstart import build, chat_roles, orchestrator, roles
from tests.openai_server import ChatServer
from paraagent_jax.paraact import protocol
from toolenv.catalog import procedural


@pytest.fixture(scope="module")
def cat():
  return procedural.build_catalog(seed=0, size=3000)


@pytest.fixture(scope="module")
def tasks(cat):
  return toolenv.TaskGenerator(cat, seed=0).generate(25, split="train")


def _assistant_steps(demo):
  return [protocol.parse_step(m["content"]) for m in demo["messages"]
          if m["role"] == "assistant"]


def _sig(step):
  return (step.phase, [(c.name, c.arguments) for c in step.calls], step.answer)


def _check_shape(demo):
  msgs = demo["messages"]
  assert [m["role"] for m in msgs[:2]] == ["system", "user"]
  rest = [m["role"] for m in msgs[2:]]
  assert rest == ["assistant", "tool"] * (len(rest) // 2) + ["assistant"]
  assert len(demo["roles"]) == rest.count("assistant") == demo["turns"]
  assert set(demo["roles"]) <= set(roles.ROLE_NAMES)
  assert demo["roles"][-1] == "answerer"


def test_perfect_scripted_demos_are_the_oracle_and_replay(cat, tasks):
  orch = orchestrator.Orchestrator(cat, roles.scripted_roles(cat, roles.Imperfection()))
  kept, stats = orch.run(tasks)
  assert len(kept) == len(tasks) and stats["kept_fraction"] == 1.0
  env = toolenv.ToolEnv(cat, **toolenv.oracle.env_options("paraact"))
  for task, demo in zip(tasks, kept):
    _check_shape(demo)
    steps = _assistant_steps(demo)
    assert all(s.parse_error is None for s in steps)
    # Same phases, calls and answer as the gold oracle (thoughts may differ).
    assert [_sig(s) for s in steps] == [_sig(s) for s in toolenv.oracle.solve(task)]
    assert [_sig(s) for s in steps] == [_sig(s) for s in demo["steps"]]
    # Replaying the parsed text in a fresh env gives the same observations and success.
    assert env.reset(task) == demo["messages"][1]["content"]
    tool_msgs = [m["content"] for m in demo["messages"] if m["role"] == "tool"]
    for step, obs in zip(steps, tool_msgs + [None]):
      r = env.step(step)
      if obs is not None:
        assert r.observation.strip() == obs
    assert env.success
    want_roles = ["explorer" if s.phase == "explore" else "executor" if
                  s.phase == "execute" else "answerer" for s in steps]
    assert demo["roles"] == want_roles


def test_short_demos_top_k_and_thoughts(cat, tasks):
  """search_top_k=3 puts top_k in every search call and three results in
  every search block; thoughts="plan" keeps only the first step's thought
  (the planner's count), "needs" that count and every distinct need, numbered,
  and "none" none; the calls stay the oracle's."""
  gold = [[_sig(s)[:2] for s in toolenv.oracle.solve(t)] for t in tasks]
  for thoughts in ("plan", "needs", "none"):
    orch = orchestrator.Orchestrator(
        cat, roles.scripted_roles(cat, roles.Imperfection(), search_top_k=3),
        thoughts=thoughts)
    kept, _ = orch.run(tasks)
    assert len(kept) == len(tasks)
    for demo, want, task in zip(kept, gold, tasks):
      _check_shape(demo)
      steps = _assistant_steps(demo)
      searches = [c for s in steps for c in s.calls if c.name == "search_tools"]
      assert searches and all(c.arguments.get("top_k") == 3 for c in searches)
      # Same tools and arguments as the oracle, apart from the added top_k.
      strip = lambda calls: [(n, {k: v for k, v in a.items() if k != "top_k"})
                             for n, a in calls]
      assert [(p, strip(c)) for p, c in (_sig(s)[:2] for s in steps)] == [
          (p, strip(c)) for p, c in want]
      texts = [m["content"] for m in demo["messages"] if m["role"] == "assistant"]
      heads = [t.split("\n", 1)[0] for t in texts if not t.startswith("<answer>")]
      if thoughts == "none":
        assert all(h in ("<explore>", "<execute>") for h in heads)
      else:
        assert heads[0].startswith("<explore> Plan: ")
        assert all(h in ("<explore>", "<execute>") for h in heads[1:])
        needs = list(dict.fromkeys(n["query"] for n in task.nodes))
        listed = "".join(f" ({k}) {n}" for k, n in enumerate(needs, 1))
        assert heads[0].endswith(" level(s)." + (listed if thoughts == "needs" else ""))
      for m in demo["messages"]:
        if m["role"] == "tool" and m["content"].startswith("[1] search_tools:"):
          # One block per search call, at most three result lines each.
          blocks = [b for b in m["content"].split("\n[") if b]
          assert all(len(b.strip().splitlines()) <= 3 for b in blocks)
  with pytest.raises(ValueError, match="thoughts"):
    orchestrator.Orchestrator(cat, roles.scripted_roles(cat), thoughts="some")


@pytest.fixture(scope="module")
def full_cat():
  # The 50,011-tool catalog: with only 3,000 tools a brandless search still
  # finds the one provider that has the entity, so nothing needs a retry.
  return toolenv.load_catalog("procedural", seed=0)


def test_imperfect_demos_show_recovery_and_succeed(full_cat):
  cat = full_cat
  tasks = toolenv.TaskGenerator(cat, seed=0).generate(25, split="train")
  imp = roles.Imperfection(vague_search=1.0, split_level=1.0, wrong_argument=1.0)
  kept, stats = orchestrator.Orchestrator(cat, roles.scripted_roles(cat, imp)).run(tasks)
  assert len(kept) == len(tasks)
  assert stats["events"]["corrections"] >= len(tasks)
  by_id = {t.id: t for t in tasks}
  recovered = retried = 0
  for demo in kept:
    _check_shape(demo)
    gold = {(n["tool"], json.dumps(n["arguments"], sort_keys=True))
            for n in by_id[demo["task_id"]].nodes}
    msgs = demo["messages"]
    for i, m in enumerate(msgs):
      if m["role"] == "tool" and '"error"' in m["content"]:
        bad = protocol.parse_step(msgs[i - 1]["content"])
        fix = protocol.parse_step(msgs[i + 1]["content"])
        assert fix.phase == "execute"
        bad_calls = {(c.name, json.dumps(c.arguments, sort_keys=True)) for c in bad.calls}
        fixed = {(c.name, json.dumps(c.arguments, sort_keys=True)) for c in fix.calls}
        assert bad_calls - gold, "the erroring step holds a non-gold call"
        assert fixed <= gold and {c[0] for c in bad_calls - gold} == {c[0] for c in fixed}
        recovered += 1
    steps = _assistant_steps(demo)
    task = by_id[demo["task_id"]]
    # The first searches drop the provider brand; if one missed its tool, the
    # next step searches again with the precise query.
    vague = {roles.vague_query(n["query"]) for n in task.nodes}
    assert {c.arguments["query"] for c in steps[0].calls} <= vague
    first_obs = msgs[3]["content"]
    if any(n["tool"] + ":" not in first_obs for n in task.nodes if not n["late"]):
      assert steps[1].phase == "explore"
      assert {c.arguments["query"] for c in steps[1].calls} <= {n["query"] for n in task.nodes}
      retried += 1
  assert recovered >= len(tasks) and retried >= len(tasks) // 2
  # Some level of >= 2 calls was split into two execute steps.
  assert stats["events"]["split_levels"] > 0
  assert stats["calls_per_execute_step"] < orchestrator.statistics(
      orchestrator.Orchestrator(cat, roles.scripted_roles(cat)).run(tasks)[0]
  )["calls_per_execute_step"]


class _WrongForFirst(roles.Role):
  """An answerer that gets the first task wrong."""

  name = "answerer"

  def __init__(self, bad_id):
    self.bad_id = bad_id

  def act(self, context):
    if context.task.id == self.bad_id:
      return roles.RoleOutput(self.name, answer="I could not find it.")
    return roles.ScriptedAnswerer().act(context)


def test_filtering_drops_failed_trajectories(cat, tasks):
  rs = roles.scripted_roles(cat)
  rs.answerer = _WrongForFirst(tasks[0].id)
  kept, stats = orchestrator.Orchestrator(cat, rs, batch_size=10).run(tasks)
  assert tasks[0].id not in {d["task_id"] for d in kept}
  assert len(kept) == len(tasks) - 1 and stats["episodes"] == len(tasks)
  kind = stats["per_kind"][tasks[0].kind]
  assert kind["kept"] == kind["episodes"] - 1
  assert all(d["success"] for d in kept)


class _Responder:
  """A scripted OpenAI-compatible model that plays the gold DAG per role."""

  def __init__(self, tasks, delay=0.15):
    self.by_text = {f"Task: {t.instruction}": t for t in tasks}
    self.delay = delay
    self.inflight = 0
    self.max_inflight = 0
    self.lock = threading.Lock()

  def _task(self, user):
    return self.by_text[user.split("\n", 1)[0]]

  def __call__(self, request):
    system, user = (m["content"] for m in request["messages"])
    task = self._task(user)
    nodes = {n["id"]: n for n in task.nodes}
    role = system.split("]", 1)[0][len("[role:"):]
    if role == "planner":
      body = {"subgoals": [{"id": n["id"], "need": n["query"], "after": n["deps"]}
                           for n in task.nodes]}
      return {"role": "assistant", "content": "Plan:\n" + json.dumps(body)}
    if role == "explorer":
      with self.lock:
        self.inflight += 1
        self.max_inflight = max(self.max_inflight, self.inflight)
      time.sleep(self.delay)
      with self.lock:
        self.inflight -= 1
      need = user.split("\n")[1].split(": ", 1)[1]
      tool = next(n["tool"] for n in task.nodes if n["query"] == need)
      if "Search results:" in user and tool in user:
        return {"role": "assistant", "content": json.dumps({"tool": tool})}
      return {"role": "assistant", "content": json.dumps({"query": need})}
    if role == "executor":
      calls = [toolenv.Call(nodes[i]["tool"], nodes[i]["arguments"])
               for i in chat_roles.run_ids(user)]
      return {"role": "assistant",
              "content": protocol.render_step(toolenv.Step("execute", calls, thought="go"))}
    return {"role": "assistant", "content": toolenv.oracle.answer_text(task)}


def test_chat_backend_against_local_server(cat, tmp_path):
  tasks = toolenv.TaskGenerator(cat, seed=1).generate(4, split="train",
                                                      kinds=("parallel", "chain"))
  responder = _Responder(tasks)
  with ChatServer(responder, fail_first=2) as server:
    chat = api_client.ChatModel(api_client.make_client(server.base_url, max_retries=3),
                                model="test")
    rs = chat_roles.chat_roles(chat, cache_dir=str(tmp_path / "cache"), max_workers=4,
                               concurrent_episodes=1)
    kept, stats = orchestrator.Orchestrator(cat, rs).run(tasks)
    # The two 503s were retried by the SDK: every answer took one request more.
    assert len(server.requests) == chat.requests_made + 2 == rs.backend.misses + 2
    assert len(kept) == len(tasks), stats
    # Explorers of a parallel task ran at once (episodes were stepped serially).
    assert responder.max_inflight >= 2
    for task, demo in zip(tasks, kept):
      _check_shape(demo)
      assert ([_sig(s) for s in _assistant_steps(demo)] ==
              [_sig(s) for s in toolenv.oracle.solve(task)])
    n_requests = len(server.requests)
    # Same prompts again: every answer comes from the on-disk cache.
    rs2 = chat_roles.chat_roles(chat, cache_dir=str(tmp_path / "cache"), max_workers=4)
    kept2, _ = orchestrator.Orchestrator(cat, rs2).run(tasks)
    assert len(server.requests) == n_requests and rs2.backend.misses == 0
    assert [d["messages"] for d in kept2] == [d["messages"] for d in kept]
  assert len(os.listdir(tmp_path / "cache")) == rs.backend.misses


@pytest.mark.slow
def test_build_demonstrations_writes_the_contract(tmp_path):
  cfg = ConfigDict({"data": {"catalog": "procedural", "num_tasks": 20,
                             "backend": "scripted", "seed": 0}})
  out = str(tmp_path / "demos")
  stats = build.build_demonstrations(cfg, out)
  assert sorted(os.listdir(out)) == sorted([
      "demonstrations_train.jsonl", "demonstrations_test.jsonl", "tasks_train.jsonl",
      "tasks_test.jsonl", "stats.json"])
  for split, n in (("train", 20), ("test", 8)):
    with open(os.path.join(out, f"tasks_{split}.jsonl")) as f:
      ts = [toolenv.Task.from_dict(json.loads(line)) for line in f]
    assert len(ts) == n and {t.split for t in ts} == {split}
    with open(os.path.join(out, f"demonstrations_{split}.jsonl")) as f:
      demos = [json.loads(line) for line in f]
    assert len(demos) == stats[split]["kept"] > 0
    for d in demos:
      assert set(d) == {"id", "task_id", "kind", "split", "strategy", "messages", "roles",
                        "success", "turns", "calls"}
      assert d["strategy"] == "paraact" and d["split"] == split and d["success"] is True
      assert all(set(m) == {"role", "content"} and isinstance(m["content"], str)
                 for m in d["messages"])
      assert d["messages"][0]["content"] == protocol.system_prompt(
          "Switch between explore and execute when you need to.")
      steps = _assistant_steps(d)
      assert d["calls"] == sum(len(s.calls) for s in steps)
      assert len(d["roles"]) == len(steps) == d["turns"]
  with open(os.path.join(out, "stats.json")) as f:
    on_disk = json.load(f)
  assert on_disk["train"]["per_kind"].keys() == set(toolenv.KINDS)


@pytest.mark.slow
def test_build_demonstrations_with_the_chat_backend(full_cat, tmp_path):
  gen = toolenv.TaskGenerator(full_cat, seed=0)
  responder = _Responder(gen.generate(4, "train") + gen.generate(2, "test"), delay=0.0)
  with ChatServer(responder) as server:
    cfg = ConfigDict({"data": {
        "catalog": "procedural", "num_tasks": 4, "test_tasks": 2, "backend": "chat",
        "seed": 0, "chat": {"base_url": server.base_url, "model": "test",
                            "cache_dir": str(tmp_path / "cache"), "max_workers": 2}}})
    stats = build.build_demonstrations(cfg, str(tmp_path / "out"))
  assert stats["backend"] == "chat"
  assert (stats["train"]["kept"], stats["test"]["kept"]) == (4, 2)
  with open(tmp_path / "out" / "demonstrations_train.jsonl") as f:
    demos = [json.loads(line) for line in f]
  for d in demos:
    _check_shape(d)
