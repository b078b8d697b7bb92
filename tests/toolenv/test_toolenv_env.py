"""ToolEnv executor, tasks, rewards and env: hand-worked examples.

A small procedural catalog (3,000 tools, built in memory) keeps these fast;
the 50,011-tool checks live in test_toolenv_determinism.py.
"""

import json

import pytest

import toolenv
from toolenv import executor as ex
from toolenv import values
from toolenv import rewards as rw
from toolenv.catalog import procedural
from toolenv.schema import Call, Step


@pytest.fixture(scope="module")
def cat():
  return procedural.build_catalog(seed=0, size=3000)


@pytest.fixture(scope="module")
def gen(cat):
  return toolenv.TaskGenerator(cat, seed=0)


def _find(cat, kind, provider=None):
  for t in cat:
    if t.meta.get("kind") == kind and (provider is None or t.provider == provider):
      return t
  raise LookupError(kind)


def test_validation_errors_are_structured(cat):
  get = _find(cat, "get")
  idf = get.meta["id_field"]
  e = ex.Executor(cat, seed=0)
  s = e.new_state()
  assert e.run("no_such_tool", {}, s)["error"] == "unknown_tool"
  assert e.run(get.name, [1, 2], s)["error"] == "bad_arguments"
  assert e.run(get.name, {}, s)["error"] == "missing_argument"
  assert e.run(get.name, {idf: 5}, s)["error"] == "wrong_type"
  assert e.run(get.name, {idf: "x", "extra": 1}, s)["error"] == "unknown_argument"
  stats = _find(cat, "stats")
  sid = stats.meta["id_field"]
  assert e.run(stats.name, {sid: "a", "period": "decade"}, s)["error"] == "bad_enum"
  conv = _find(cat, "convert")
  u = conv.meta["units"]
  assert e.run(conv.name, {"amount": 1, "from_unit": u[0], "to_unit": u[1],
                           "precision": 99}, s)["error"] == "out_of_range"
  # A wrong id prefix is "not found", as a real API would answer.
  assert e.run(get.name, {idf: "zzz-000000"}, s)["error"] == "not_found"


def test_responses_are_deterministic_and_consistent(cat):
  search = _find(cat, "search")
  get = cat[f"{search.name.split('_')[0]}_get_{search.meta['entity']}"]
  idf = get.meta["id_field"]
  a, b = ex.Executor(cat, seed=0), ex.Executor(cat, seed=0)
  r1 = a.run(search.name, {"query": "amber"}, a.new_state())
  r2 = b.run(search.name, {"query": "amber", "limit": 3}, b.new_state())
  assert r1 == r2 and len(r1["results"]) == 3  # default limit filled in
  hit = r1["results"][0]
  rec = a.run(get.name, {idf: hit[idf]}, a.new_state())
  # A search hit and a get of the same id agree on the fields they share.
  assert rec["name"] == hit["name"]
  other = ex.Executor(cat, seed=1).run(search.name, {"query": "amber"},
                                       a.new_state())
  assert other != r1


def test_writes_change_state_that_reads_reflect(cat):
  upd = _find(cat, "update")
  brand, ent = upd.name.split("_")[0], upd.meta["entity"]
  get, dele = cat[f"{brand}_get_{ent}"], cat.get(f"{brand}_delete_{ent}")
  idf, field = upd.meta["id_field"], upd.meta["update_field"]
  e = ex.Executor(cat, seed=0)
  s = e.new_state()
  rid = ex.make_id(upd.meta["id_prefix"], "t")
  before = e.run(get.name, {idf: rid}, s)
  new = before[field] + 1 if isinstance(before[field], (int, float)) else "Zzz"
  assert e.run(upd.name, {idf: rid, field: new}, s)["status"] == "updated"
  assert e.run(get.name, {idf: rid}, s)[field] == new
  assert e.run(get.name, {idf: rid}, e.new_state())[field] == before[field]
  if dele is not None:
    e.run(dele.name, {idf: rid}, s)
    assert e.run(get.name, {idf: rid}, s)["error"] == "not_found"


def test_task_kinds_shapes_and_split(gen, cat):
  for kind in toolenv.KINDS:
    for t in gen.generate(10, split="train", kinds=(kind,)):
      assert t.kind == kind and t.answers
      assert all(a["value"] for a in t.answers)
      for n in t.nodes:
        assert n["tool"] not in t.instruction  # needs are described, not named
      levels = [n["level"] for n in t.nodes]
      if kind == "single":
        assert len(t.nodes) == 1
      if kind == "parallel":
        assert 2 <= len(t.nodes) <= 4 and set(levels) == {0}
      if kind == "chain":
        assert levels == list(range(len(levels))) and len(levels) >= 2
      if kind == "fanout":
        assert levels[0] == 0 and set(levels[1:]) == {1} and len(levels) >= 3
  train = {cat[n["tool"]].provider for t in gen.generate(100, "train") for n in t.nodes}
  test = {cat[n["tool"]].provider for t in gen.generate(100, "test") for n in t.nodes}
  assert train and test and not train & test
  with pytest.raises(ValueError):
    gen.generate(1, split="dev")
  with pytest.raises(ValueError):
    gen.generate(1, kinds=("nope",))


def test_hand_worked_episode_rewards(gen, cat):
  """A chain episode whose every reward is computed by hand below."""
  task = gen.generate(1, split="train", kinds=("chain",))[0]
  while len(task.nodes) != 2:  # the two-call form (search -> get)
    task = gen.task(len(task.id), "train", "chain")
  n0, n1 = task.nodes
  env = toolenv.ToolEnv(cat)
  env.reset(task)
  doc = lambda name: Call("get_tool_doc", {"name": name})
  steps = [
      Step("explore", [doc(n0["tool"]), doc(n1["tool"])]),     # 0.1 + 2*0.3 + 2*0.05
      Step("execute", [Call(n0["tool"], n0["arguments"]), Call("nope", {})]),
      # ^ 0.1 + 0.3 (n0 done) + 0.05 - 0.2
      Step("execute", [Call(n1["tool"], {list(n1["arguments"])[0]: "xxx-1"})]),
      # ^ not found: 0.1 - 0.2
      Step("execute", [doc(n1["tool"])]),                        # violation: 0.1 - 0.3
      Step("execute", [Call(n1["tool"], n1["arguments"])]),     # 0.1 + 0.3 + 0.05
      Step("execute", [Call(n1["tool"], n1["arguments"])]),     # dup: 0.1 + 0.05 - 0.1
      Step("answer", answer="It is " + task.answers[0]["value"] + "."),  # 0.1
  ]
  results = [env.step(s) for s in steps]
  assert [r.done for r in results] == [False] * 6 + [True]
  assert "phase_violation" in results[3].observation
  r = env.rewards()
  assert r.step == pytest.approx([0.8, 0.25, -0.1, -0.2, 0.45, 0.05, 0.1])
  # explore: both needed tools found in one step -> 1.0; execute: the one
  # ready node done, 2 levels over 5 steps -> 0.4.
  assert r.phase == (("explore", pytest.approx(1.0)), ("execute", pytest.approx(0.4)))
  assert task.max_turns == 10
  assert r.success and r.trajectory == pytest.approx(1 + 0.1 * (1 - 7 / 10))


def test_parallel_execution_is_worth_more_than_serial(gen, cat):
  task = gen.generate(1, split="train", kinds=("parallel",))[0]
  calls = [Call(n["tool"], n["arguments"]) for n in task.nodes]
  k = len(calls)
  env = toolenv.ToolEnv(cat)
  env.reset(task)
  for c in calls:
    env.step(Step("execute", [c]))
  env.step(Step("answer", answer="nothing useful"))
  r = env.rewards()
  assert r.phase == (("execute", pytest.approx(1 / k)),)
  assert not r.success and r.trajectory == 0.0
  env.reset(task)
  env.step(Step("execute", calls))
  env.step(Step("answer", answer=" ".join(a["value"] for a in task.answers)))
  r = env.rewards()
  assert r.phase == (("execute", pytest.approx(1.0)),) and r.success


def test_write_task_needs_the_gold_state(gen, cat):
  tasks = [t for t in gen.generate(300, split="train", kinds=("single",)) if t.writes]
  assert tasks, "no write tasks drawn"
  task = tasks[0]
  env = toolenv.ToolEnv(cat)
  gold_answer = toolenv.oracle.answer_text(task)
  env.reset(task)
  env.step(Step("answer", answer=gold_answer))   # right words, no write done
  assert not env.rewards().success
  env.reset(task)
  for s in toolenv.oracle.solve(task, "paraact"):
    env.step(s)
  assert env.rewards().success


def test_malformed_steps_and_after_done(gen, cat):
  task = gen.generate(1, split="test")[0]
  env = toolenv.ToolEnv(cat)
  env.reset(task)
  for bad in (None, "text", Step("dance"), Step("execute", []),
              Step("explore", parse_error="unterminated JSON"), Step("answer", answer=3)):
    res = env.step(bad)
    assert res.observation.startswith("error") and res.reward == -0.5
  env.step(Step("answer", answer="x"))
  res = env.step(Step("execute", [Call("a", {})]))
  assert res.done and "over" in res.observation and res.reward < 0


def test_turn_budget_truncates(gen, cat):
  task = gen.generate(1, split="train")[0]
  env = toolenv.ToolEnv(cat)
  env.reset(task)
  for _ in range(task.max_turns):
    res = env.step(Step("explore", [Call("search_tools", {"query": "weather"})]))
  assert res.done and env.rewards().truncated and not env.rewards().success


def test_vector_env_none_steps_and_finish(gen, cat):
  tasks = gen.generate(3, split="train", kinds=("single",))
  venv = toolenv.VectorToolEnv(cat, num_envs=3)
  obs = venv.reset(tasks)
  assert all(t.instruction in o for t, o in zip(tasks, obs))
  plans = [toolenv.oracle.solve(t) for t in tasks]
  out = venv.step([plans[0][0], None, plans[2][0]])
  assert out[1] is None and out[0] is not None
  venv.finish([1])
  assert venv.done[1] and venv.rewards(1).truncated
  with pytest.raises(ValueError):
    venv.step([None])


def test_segments_rules():
  assert rw.segments(["explore", "explore", "execute", None, "execute", "answer"]) == [
      ("explore", 0, 1), ("execute", 2, 4)]
  assert rw.segments(["execute", "answer", "execute"]) == [("execute", 0, 0), ("execute", 2, 2)]
  assert rw.value_in_answer("12.5", "the value is 12.5.")
  assert not rw.value_in_answer("12.5", "the value is 112.55")


def test_schema_memos_are_shared_but_seed_free_and_reset_on_growth(cat):
  """Executors of one catalog share spec/plan memos; results never depend on it."""
  from toolenv.catalog.store import Catalog
  search = _find(cat, "search")
  brand = search.name.split("_")[0]
  get = cat[f"{brand}_get_{search.meta['entity']}"]
  idf = get.meta["id_field"]
  # A seed-0 executor fills the shared memos first; a seed-1 one reusing them
  # must answer exactly like a seed-1 executor over a fresh copy of the catalog.
  e0 = ex.Executor(cat, seed=0)
  hit = e0.run(search.name, {"query": "amber"}, e0.new_state())["results"][0]
  e1 = ex.Executor(cat, seed=1)
  assert e1._plan_cache is e0._plan_cache  # pylint: disable=protected-access
  fresh = ex.Executor(Catalog(list(cat), name="copy"), seed=1)
  assert fresh._plan_cache is not e0._plan_cache  # pylint: disable=protected-access
  r1 = e1.run(get.name, {idf: hit[idf]}, e1.new_state())
  r2 = fresh.run(get.name, {idf: hit[idf]}, fresh.new_state())
  assert r1 == r2 and r1 != e0.run(get.name, {idf: hit[idf]}, e0.new_state())
  # Without its get tool, the provider's records come from the search tool's
  # response schema; after the get tool is added, a new executor must see it.
  small = Catalog([t for t in cat if t.provider == search.provider and t.name != get.name])
  es = ex.Executor(small, seed=0)
  hs = es.run(search.name, {"query": "amber"}, es.new_state())["results"][0]
  before = es._record_schema(search)  # pylint: disable=protected-access
  small.add(get)
  eg = ex.Executor(small, seed=0)
  assert eg._plan_cache is not es._plan_cache  # pylint: disable=protected-access
  assert eg._record_schema(search) == dict(get.response["properties"]) != before  # pylint: disable=protected-access
  # ... and answer like an executor over the full catalog (names now known).
  full = e0.run(search.name, {"query": "amber"}, e0.new_state())
  assert eg.run(search.name, {"query": "amber"}, eg.new_state()) == full
  assert hs["name"] is None and hs[idf] == full["results"][0][idf]


def test_bare_scalar_and_error_field_responses_are_not_errors():
  """A real API may return a bare scalar or have its own top-level ``error`` field."""
  from toolenv.catalog.store import Catalog
  from toolenv.tasks import Task
  tools = [
      toolenv.Tool("acme_count_items", "misc", "acme", "Count the items.", source="openapi",
                   response={"type": "integer", "minimum": 5, "maximum": 9}),
      toolenv.Tool("acme_get_status", "misc", "acme", "The service status.", source="openapi",
                   response={"type": "object", "properties": {
                       "error": {"type": "string"}, "uptime": {"type": "number"}}}),
  ]
  cat = Catalog(tools, name="tiny")
  node = {"id": "n0", "tool": "acme_count_items", "arguments": {}, "deps": [], "level": 0,
          "query": "acme count items", "late": False}
  task = Task("t0", "single", "test", "Count the acme items.", [node],
              [{"label": "count", "value": "x"}])
  env = toolenv.VectorToolEnv(cat, num_envs=1)
  env.reset([task])
  r = env.step([Step("execute", [Call("acme_count_items", {}), Call("acme_get_status", {}),
                                 Call("acme_get_status", {"bogus": 1})])])[0]
  assert "internal_error" not in r.info, r.info
  assert r.info["statuses"] == ["ok", "ok", "error"]
  lines = r.observation.splitlines()
  assert 5 <= int(lines[0].split(": ", 1)[1]) <= 9      # the bare integer itself
  assert '"uptime"' in lines[1] and '"unknown_argument"' in lines[2]
  assert env.envs[0].completed == {"n0"}
  # The error marker survives as plain JSON: observations read the same as before.
  e = ex.error("not_found", "no such id", "acme_get_status")
  assert ex.is_error(e) and not ex.is_error({"error": "x", "message": "y"})
  assert json.loads(json.dumps(e)) == {"error": "not_found", "message": "no such id",
                                       "tool": "acme_get_status"}


def test_list_items_of_a_schema_response_differ():
  """Each item of a simulated array has its own draws: ids are not repeated."""
  sch = {"type": "object", "properties": {"items": {"type": "array", "items": {
      "type": "object", "properties": {"id": {"type": "string"},
                                       "name": {"type": "string"}}}}}}
  out = ex.gen_from_schema(sch, values.Draw(0, "tool{}"))
  ids = [item["id"] for item in out["items"]]
  assert len(ids) == 3 and len(set(ids)) == 3, ids
  assert out == ex.gen_from_schema(sch, values.Draw(0, "tool{}"))
  assert out != ex.gen_from_schema(sch, values.Draw(0, "tool{\"a\":1}"))


def test_step_results_and_episode_rewards_are_typed(gen, cat):
  """StepResult is gymnasium's (observation, reward, terminated, truncated,
  info): an answer terminates, the turn budget truncates, and the reward is a
  field, not an ``info`` key. EpisodeRewards is frozen."""
  import dataclasses  # pylint: disable=g-import-not-at-top
  task = gen.generate(1, split="train", kinds=("single",))[0]
  env = toolenv.ToolEnv(cat)
  env.reset(task)
  results = [env.step(s) for s in toolenv.oracle.solve(task)]
  last = results[-1]
  assert last.terminated and not last.truncated and last.done
  assert not any(r.done for r in results[:-1])
  assert all("step_reward" not in r.info for r in results)
  rew = env.rewards()
  assert list(rew.step) == [r.reward for r in results]
  assert rew.success and not rew.truncated and rew.turns == len(results)
  with pytest.raises(dataclasses.FrozenInstanceError):
    rew.success = False
  with pytest.raises(dataclasses.FrozenInstanceError):
    last.reward = 0.0
  assert json.loads(json.dumps(rew.asdict()))["phase"] == [list(p) for p in rew.phase]
  after = env.step(Step("answer", answer="again"))
  assert after.terminated and not after.truncated and after.reward < 0
  # The turn budget: truncated, not terminated, and so are steps after it.
  env.reset(task)
  for _ in range(task.max_turns):
    res = env.step(Step("explore", [Call("search_tools", {"query": "weather"})]))
  assert res.truncated and not res.terminated and res.done
  after = env.step(Step("answer", answer="late"))
  assert after.truncated and not after.terminated and after.info["error"] == "after_done"
