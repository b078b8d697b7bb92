"""Failure causes and behaviour counts (toolenv.diagnosis): hand-worked episodes.

Each episode is written by hand so that exactly one thing goes wrong, and the
test checks that the diagnosis names that thing. No JAX.
"""

import pytest

import toolenv
from toolenv import diagnosis as dg
from toolenv.catalog import procedural
from toolenv.schema import Call, Step


@pytest.fixture(scope="module")
def cat():
  return procedural.build_catalog(seed=0, size=3000)


@pytest.fixture(scope="module")
def tasks(cat):
  gen = toolenv.TaskGenerator(cat, seed=0)
  return {t.kind: t for t in gen.generate(10, split="test")}


def _search(node):
  return Call("search_tools", {"query": node["query"]})


def _doc(name):
  return Call("get_tool_doc", {"name": name})


def _gold(node):
  return Call(node["tool"], dict(node["arguments"]))


def _explore_all(task):
  return Step("explore", [_doc(t) for t in task.gold_tools])


def _play(cat, task, steps, strategy="paraact"):
  env = toolenv.ToolEnv(cat)
  env.reset(task)
  for s in steps:
    if env.done:
      break
    env.step(s)
  return env, env.diagnosis(strategy)


def test_the_oracle_plan_succeeds_with_no_cause_and_matches_its_own_counts(cat, tasks):
  for kind, task in tasks.items():
    env, d = _play(cat, task, toolenv.oracle.solve(task, "paraact"))
    assert env.success, kind
    assert d["cause"] is None and d["cause_detail"] == ""
    for f in dg.BEHAVIOUR_FIELDS:
      assert d[f] == d[f"oracle_{f}"], (kind, f)
    assert d["malformed_steps"] == d["unknown_tool_calls"] == 0
    assert d["searches"] == len(set(n["tool"] for n in task.nodes)) or kind in ("chain", "mixed")


def test_parallel_counts_by_hand(cat, tasks):
  task = tasks["parallel"]
  n = task.nodes
  steps = [Step("explore", [_search(x) for x in n] + [_search(n[0])]),    # one repeat
           Step("execute", [_gold(x) for x in n]),
           Step("answer", answer="; ".join(a["value"] for a in task.answers))]
  env, d = _play(cat, task, steps)
  assert env.success and d["cause"] is None
  assert d["turns"] == 3 and d["phase_switches"] == 1
  assert d["calls_per_execute_step"] == len(n)
  assert d["searches"] == len(n) + 1
  assert d["redundant_searches"] >= 1          # the repeat shows nothing new


def test_misspelt_tool_name_is_unknown_tool(cat, tasks):
  task = tasks["parallel"]
  n = task.nodes
  calls = [_gold(x) for x in n]
  calls[1] = Call(n[1]["tool"] + "s", dict(n[1]["arguments"]))
  env, d = _play(cat, task, [_explore_all(task), Step("execute", calls),
                             Step("answer", answer="made up")])
  assert not env.success
  assert d["cause"] == "unknown_tool", d
  assert n[1]["tool"] + "s" in d["cause_detail"]
  assert d["unknown_tool_calls"] == 1


def test_never_searched_is_tool_not_found(cat, tasks):
  task = tasks["single"]
  env, d = _play(cat, task, [Step("answer", answer="no idea")])
  assert d["cause"] == "tool_not_found"
  assert task.nodes[0]["tool"] in d["cause_detail"]


def test_answer_without_calling_is_answered_early(cat, tasks):
  task = tasks["parallel"]
  n = task.nodes
  env, d = _play(cat, task, [_explore_all(task), Step("execute", [_gold(n[0])]),
                             Step("answer", answer="invented")])
  assert d["cause"] == "answered_early"
  assert n[1]["tool"] in d["cause_detail"]


def test_malformed_step_not_recovered_is_parse_error(cat, tasks):
  task = tasks["parallel"]
  env, d = _play(cat, task, [_explore_all(task),
                             Step("execute", parse_error="missing </step>"),
                             Step("answer", answer="invented")])
  assert d["cause"] == "parse_error" and d["malformed_steps"] == 1


def test_malformed_step_then_progress_is_judged_on_the_calls(cat, tasks):
  task = tasks["parallel"]
  n = task.nodes
  env, d = _play(cat, task, [Step("explore", parse_error="broken JSON"), _explore_all(task),
                             Step("execute", [_gold(n[0])]),
                             Step("answer", answer="invented")])
  assert d["cause"] == "answered_early"


def test_all_calls_right_but_wrong_answer(cat, tasks):
  task = tasks["fanout"]
  env, d = _play(cat, task, [_explore_all(task)]
                 + [Step("execute", [_gold(x) for x in task.nodes if x["level"] == lvl])
                    for lvl in range(task.depth)]
                 + [Step("answer", answer="something else")])
  assert d["cause"] == "wrong_answer"


def test_dependent_call_in_the_same_step_as_its_input(cat, tasks):
  task = tasks["chain"]
  n0, n1 = task.nodes[0], task.nodes[1]
  assert n0["id"] in n1["deps"]
  wrong = dict(n1["arguments"])
  key = next(iter(wrong))
  wrong[key] = "placeholder-from-step-1"
  env, d = _play(cat, task, [_explore_all(task),
                             Step("execute", [_gold(n0), Call(n1["tool"], wrong)]),
                             Step("answer", answer="x")])
  assert d["cause"] == "call_before_input", d


def test_bad_arguments_after_the_input_is_wrong_arguments(cat, tasks):
  task = tasks["single"]
  n0 = task.nodes[0]
  env, d = _play(cat, task, [_explore_all(task), Step("execute", [Call(n0["tool"], {})]),
                             Step("answer", answer="x")])
  assert d["cause"] == "wrong_arguments"
  assert "missing_argument" in d["cause_detail"]


def test_other_real_tool_is_wrong_tool(cat, tasks):
  task = tasks["single"]
  other = next(t for t in cat if t.name not in task.gold_tools and t.effect == "read")
  env, d = _play(cat, task, [_explore_all(task), Step("execute", [Call(other.name, {})]),
                             Step("answer", answer="x")])
  assert d["cause"] == "wrong_tool" and other.name in d["cause_detail"]


def test_budget_spent_exploring_is_limit(cat, tasks):
  task = tasks["single"]
  steps = [_explore_all(task)] * (task.max_turns + 2)
  env, d = _play(cat, task, steps)
  assert env.truncated and d["cause"] == "limit"
  assert d["redundant_searches"] == 0     # get_tool_doc is not a search


def test_every_call_ran_but_no_answer_is_limit(cat, tasks):
  task = tasks["single"]
  env, d = _play(cat, task, [_explore_all(task), Step("execute", [_gold(task.nodes[0])])])
  env.finish()
  assert d["cause"] == "limit" and "every gold call ran" in d["cause_detail"]


def test_failure_cause_order_is_documented():
  assert set(dg.CAUSES) == set(dg.CAUSE_TEXT)
  assert dg.failure_cause([], [], success=True, answered=True) == (None, "")
