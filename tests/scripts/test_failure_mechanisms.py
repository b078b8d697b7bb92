"""scripts/failure_mechanisms.py: the counts on hand-made records."""

import importlib.util
import os

import toolenv
from toolenv.catalog import procedural
from paraagent_jax.paraact import strategies
from toolenv.schema import Call, Step

_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _script():
  spec = importlib.util.spec_from_file_location(
      "failure_mechanisms", os.path.join(_ROOT, "scripts", "failure_mechanisms.py"))
  mod = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(mod)
  return mod


def test_swaps_repeats_and_corrupted_ids_are_counted():
  fm = _script()
  cat = procedural.build_catalog(seed=0, size=3000)
  tasks = {t.kind: t for t in toolenv.TaskGenerator(cat, seed=0).generate(10, split="test")}
  par, fan = tasks["parallel"], tasks["fanout"]
  a, b = par.gold_tools[0], par.gold_tools[1]
  swapped = a.split("_", 1)[0] + "_" + b.split("_", 1)[1]
  assert fm.unknown_tool_kind(swapped, par, cat).startswith("swap")
  assert fm.unknown_tool_kind("zzz_" + b.split("_", 1)[1], par, cat).startswith("the right op")
  assert fm.answer_values('"tracks": 3121; "tracks": 3932') == ["3121", "3932"]
  strat = strategies.get_strategy("paraact")
  render = strat.render_step
  first = fan.nodes[0]
  later = [n for n in fan.nodes if n["level"] == 1]
  key, good_id = next(iter(later[0]["arguments"].items()))
  bad_id = good_id[:-2] + ("0f" if not good_id.endswith("0f") else "1e")
  recs = [
      {"task_id": par.id, "success": False, "answer": "x", "transcript": [
          {"role": "task", "text": par.instruction},
          {"role": "assistant", "text": render(Step("execute", [Call(swapped, {})]))}]},
      {"task_id": fan.id, "success": False, "answer": '"v": 1; "v": 1; "v": 2',
       "transcript": [
           {"role": "task", "text": fan.instruction},
           {"role": "assistant", "text": render(Step("execute", [Call(first["tool"],
                                                                     first["arguments"])]))},
           {"role": "observation", "text": f'{{"id": "{good_id}"}}'},
           {"role": "assistant", "text": render(Step("execute", [
               Call(later[0]["tool"], {key: good_id}),
               Call(later[0]["tool"], {key: bad_id})]))}]},
  ]
  got = fm.count(recs, list(tasks.values()), cat, strat.parse_step)
  assert got["unknown tool names"] == {"swap: one sub-goal's provider + another's operation": 1}
  f = got["fanout"]
  assert f["fanout failed episodes that answered"] == 1
  assert f["... repeating a value where the gold values differ"] == (
      1 if len({x["value"] for x in fan.answers}) == len(fan.answers) else 0)
  assert f["fanout id arguments"] == 2
  assert f["... not an id the policy had observed (corrupted copy)"] == 1
