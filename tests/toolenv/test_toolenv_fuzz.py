"""Property-based fuzzing of ToolEnv / VectorToolEnv with malformed steps.

Hypothesis draws steps that are wrong by construction (unknown tools,
non-dict arguments, huge strings, wrong types, nested junk, empty calls,
non-Step objects, parse errors, bad phases, meta-tool junk arguments, phase
violations, gold calls with one argument broken, calls after the end) and
throws them at the environment over the 50,011-tool procedural catalog.
Every one must come back as a `StepResult` whose observation reports an
error, with a negative step reward and no ``internal_error`` (the env's
catch-all, which would mean the env itself tripped over the input).

At least 10,000 steps: each Hypothesis example runs 20 steps (4 episodes x
4 rounds through `VectorToolEnv`, then one round after the episodes ended).
"""

import pytest

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import toolenv
from toolenv.schema import GET_TOOL_DOC, SEARCH_TOOLS, Call, Step, StepResult

NUM_ENVS = 4
ROUNDS = 4
EXAMPLES = 500           # 500 x (4 x 4 + 4) = 10,000 steps
MIN_STEPS = 10_000

# Huge-string examples have long reprs; that is the point of them.
pytestmark = pytest.mark.filterwarnings("ignore::hypothesis.errors.HypothesisWarning")


@pytest.fixture(scope="module")
def cat():
  return toolenv.load_catalog("procedural", seed=0)


@pytest.fixture(scope="module")
def tasks(cat):
  gen = toolenv.TaskGenerator(cat, seed=0)
  return gen.generate(20, split="train") + gen.generate(20, split="test")


def _junk_strategies(cat, tasks):
  """Strategies for junk values, bad names and broken calls/steps."""
  leaves = (st.none() | st.booleans() | st.integers() | st.floats()
            | st.text(max_size=12))
  json_junk = st.recursive(
      leaves, lambda c: st.lists(c, max_size=4) | st.dictionaries(
          st.text(max_size=8), c, max_size=4), max_leaves=10)
  # Python objects a careless parser might hand over (not only JSON).
  py_junk = st.one_of(
      json_junk, st.binary(max_size=8), st.tuples(leaves, leaves),
      st.frozensets(st.integers(), max_size=3),
      st.dictionaries(st.integers(), leaves, max_size=3),
      st.just({1: "a", "b": 2}), st.just({("t", 1): 1}),
      st.just(float("nan")), st.just(10**40), st.just([[[[[[[[[[[]]]]]]]]]]]))
  huge = st.builds(lambda s, n: s * n, st.text(min_size=1, max_size=3),
                   st.integers(3_000, 20_000))
  names = cat.names
  tool_names = st.sampled_from(names[::7])
  unknown = (st.text(max_size=40) | huge).filter(
      lambda s: cat.get(s) is None and s not in (SEARCH_TOOLS, GET_TOOL_DOC))
  bad_name = unknown | py_junk.filter(lambda x: not isinstance(x, str))
  non_dict = py_junk.filter(lambda x: not isinstance(x, dict))
  nodes = [n for t in tasks for n in t.nodes]

  def broken_gold(node, how, junk, extra):
    """A gold call of some task with exactly one thing wrong."""
    tool = cat[node["tool"]]
    args = dict(node["arguments"])
    if how == "extra":
      args["zz_" + extra] = junk
    elif how == "missing":
      args.pop(tool.required[0], None)
    elif how == "huge":
      args[tool.required[0]] = "x" * 5_000
    else:  # wrong type: a value of another JSON type than the schema's
      k = tool.required[0]
      t = tool.properties[k].get("type")
      args[k] = 3 if t == "string" else "three"
    return Call(tool.name, args)

  gold_bad = st.builds(
      broken_gold, st.sampled_from([n for n in nodes if cat[n["tool"]].required]),
      st.sampled_from(("extra", "missing", "huge", "type")), json_junk,
      st.text(max_size=6))
  search_bad = st.one_of(
      non_dict,
      st.dictionaries(st.text(max_size=6).filter(lambda k: k not in ("query", "top_k")),
                      json_junk, max_size=3),                       # no query
      st.builds(lambda q: {"query": q}, json_junk.filter(lambda q: not isinstance(q, str))),
      st.builds(lambda q: {"query": q}, st.text(alphabet=" \t\n\r", max_size=5)),
      st.builds(lambda q, k, v: {"query": q, "zz" + k: v}, st.text(min_size=1),
                st.text(max_size=5), json_junk),                     # extra key
      st.just({1: "a", "query": "weather"}))
  doc_bad = st.one_of(
      non_dict,
      st.builds(lambda n: {"name": n}, bad_name),
      st.builds(lambda n, v: {"name": n, "extra": v}, tool_names, json_junk),
      st.builds(lambda v: {"tool": v}, tool_names),
      st.just({}))
  meta_bad = st.one_of(st.builds(Call, st.just(SEARCH_TOOLS), search_bad),
                       st.builds(Call, st.just(GET_TOOL_DOC), doc_bad))
  not_a_call = st.one_of(
      py_junk, st.builds(lambda n: {"name": n, "arguments": {}}, tool_names),
      st.builds(lambda n: (n, {}), tool_names),
      st.builds(lambda: Step(phase="explore", calls=[])))
  explore_call = st.one_of(
      meta_bad, not_a_call,
      st.builds(Call, tool_names | bad_name, py_junk),   # not a meta-tool: violation
      gold_bad)
  execute_call = st.one_of(
      st.builds(Call, st.sampled_from((SEARCH_TOOLS, GET_TOOL_DOC)),
                st.builds(lambda q: {"query": q}, st.text(min_size=1))),   # violation
      st.builds(Call, bad_name, py_junk),                 # unknown tool
      st.builds(Call, tool_names, non_dict),               # arguments not a dict
      st.builds(lambda n, k, v: Call(n, {"zz_" + k: v}), tool_names,
                st.text(max_size=6), json_junk),           # unknown argument
      gold_bad, not_a_call)

  def call_step(phase, calls, thought):
    return Step(phase=phase, calls=calls, thought=thought)

  bad_phase = (st.text(max_size=12) | py_junk).filter(
      lambda p: p not in ("explore", "execute", "answer"))
  good_call = st.builds(lambda n: Call(n["tool"], dict(n["arguments"])),
                        st.sampled_from(nodes))
  step = st.one_of(
      py_junk.filter(lambda x: x is not None),                     # not a Step
      st.builds(Call, tool_names, st.just({})),
      st.builds(Step, bad_phase, st.lists(good_call, max_size=3)),
      st.builds(lambda p, c, e: Step(phase=p, calls=c, parse_error=e),
                st.sampled_from(("explore", "execute", "answer")),
                st.lists(good_call, max_size=2), st.text(min_size=1) | huge),
      st.builds(lambda a: Step(phase="answer", answer=a),
                py_junk.filter(lambda a: not isinstance(a, str))),
      st.builds(Step, st.sampled_from(("explore", "execute")),
                st.just([]) | st.just(()) | st.none() | st.text() | st.builds(
                    lambda n: Call(n, {}), tool_names) | st.dictionaries(
                        st.text(max_size=4), leaves, max_size=2)),   # no call list
      st.builds(call_step, st.just("explore"), st.lists(explore_call, min_size=1, max_size=5),
                st.text(max_size=20)),
      st.builds(call_step, st.just("execute"), st.lists(execute_call, min_size=1, max_size=5),
                st.text(max_size=20)),
      st.builds(call_step, st.just("execute"),
                st.lists(execute_call, min_size=17, max_size=20), st.just("")))
  return step


def _check(res, step, where):
  """Every fuzzed step: an error observation, a penalty, no internal error."""
  assert isinstance(res, StepResult), where
  assert isinstance(res.observation, str) and "error" in res.observation.lower(), (
      where, res.observation[:300])
  assert res.reward < 0, (where, step, res.info)
  assert "internal_error" not in res.info, (where, step, res.info)
  statuses = res.info.get("statuses") or []
  # A step that ran its calls: every call must have failed.
  assert all(s in ("error", "violation") for s in statuses), (where, step, res.info)


@pytest.mark.slow
def test_malformed_steps_never_raise(cat, tasks):
  step_st = _junk_strategies(cat, tasks)
  venv = toolenv.VectorToolEnv(cat, num_envs=NUM_ENVS)
  single = toolenv.ToolEnv(cat, index=venv.envs[0].index)
  count = {"steps": 0, "examples": 0}

  @settings(max_examples=EXAMPLES, deadline=None, database=None, derandomize=True,
            suppress_health_check=list(HealthCheck))
  @given(st.lists(st.lists(step_st, min_size=NUM_ENVS, max_size=NUM_ENVS),
                  min_size=ROUNDS, max_size=ROUNDS),
         st.lists(step_st, min_size=NUM_ENVS, max_size=NUM_ENVS),
         st.integers(0, len(tasks) - NUM_ENVS))
  def run(rounds, after, first):
    count["examples"] += 1
    batch = tasks[first:first + NUM_ENVS]
    venv.reset(batch)
    for r, steps in enumerate(rounds):
      for i, (s, res) in enumerate(zip(steps, venv.step(steps))):
        _check(res, s, ("round", r, i))
        count["steps"] += 1
    # End every episode with an answer, then keep acting: all after-done errors.
    venv.step([Step(phase="answer", answer="I could not find it.")] * NUM_ENVS)
    assert all(venv.done)
    for i, (s, res) in enumerate(zip(after, venv.step(after))):
      _check(res, s, ("after_done", i))
      assert res.done
      count["steps"] += 1
    for i in range(NUM_ENVS):
      parts = venv.rewards(i)
      assert parts.success is False and parts.trajectory == 0.0
      assert len(parts.step) == ROUNDS + 1          # after-done steps are not logged
      assert all(r < 0 for r in parts.step[:ROUNDS])
    # The single-episode env too (a turn budget may end it: still errors).
    single.reset(batch[0])
    for s in rounds[0] + after:
      _check(single.step(s), s, "single")
      count["steps"] += 1

  run()
  assert count["examples"] == EXAMPLES
  assert count["steps"] >= MIN_STEPS, count


def test_step_before_reset_is_an_error(cat):
  env = toolenv.ToolEnv(cat)
  res = env.step(Step(phase="explore", calls=[Call(SEARCH_TOOLS, {"query": "weather"})]))
  assert res.done and res.observation.startswith("error") and res.reward < 0


def test_fuzzer_would_see_a_valid_step(cat, tasks):
  """The checker is not vacuous: a correct gold call passes none of its error tests."""
  env = toolenv.ToolEnv(cat)
  env.reset(tasks[0])
  node = tasks[0].nodes[0]
  res = env.step(Step(phase="execute", calls=[Call(node["tool"], dict(node["arguments"]))]))
  assert "error" not in res.observation.lower() and res.reward > 0


def test_mixed_key_arguments_are_an_error_not_a_crash(cat):
  """Regression: ``{1: 'a', 'query': ...}`` made canonical_json raise TypeError."""
  env = toolenv.ToolEnv(cat)
  env.reset(toolenv.TaskGenerator(cat, seed=0).task(0, "train", "single"))
  for args in ({1: "a", "query": "weather"}, {("t", 1): 1}):
    res = env.step(Step(phase="explore", calls=[Call(SEARCH_TOOLS, args)]))
    assert "internal_error" not in res.info and res.info["statuses"] == ["error"]
