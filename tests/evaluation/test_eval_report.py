"""Evaluation reports: CI, per-kind aggregation, markdown, plots, compare."""

import json
import math
import os

import pytest

from paraagent_jax.evaluation import report as rep


@pytest.mark.parametrize("k,n,lo,hi", [
    (0, 10, 0.0, 0.2775),     # textbook Wilson 95% values (z = 1.96)
    (5, 10, 0.2366, 0.7634),
    (10, 10, 0.7225, 1.0),
    (81, 263, 0.2553, 0.3662),
])
def test_wilson_interval_matches_published_values(k, n, lo, hi):
  got = rep.wilson_interval(k, n)
  assert got[0] == pytest.approx(lo, abs=6e-4)
  assert got[1] == pytest.approx(hi, abs=6e-4)


def _records():
  recs = []
  # 2 kinds x 4 tasks; paraact wins 3/4 single and 2/4 parallel.
  for strategy, wins in (("paraact", {"single": 3, "parallel": 2}),
                         ("react", {"single": 4, "parallel": 0})):
    for kind in ("single", "parallel"):
      for i in range(4):
        recs.append({"benchmark": "toolenv", "strategy": strategy, "policy": "oracle",
                     "kind": kind, "task_id": f"{kind}{i}", "success": i < wins[kind],
                     "turns": 3 if strategy == "paraact" else 5, "calls": 2,
                     "explore_tokens": 30, "execute_tokens": 10,
                     "calls_per_step": [2] if strategy == "paraact" else [1, 1]})
  return recs


def test_build_report_aggregates_by_kind_and_multi_tool():
  report = rep.build_report(_records())
  runs = {r["strategy"]: r for r in report["runs"]}
  para = runs["paraact"]
  assert para["overall"]["n"] == 8
  assert para["overall"]["success"] == pytest.approx(5 / 8)
  assert para["per_kind"]["single"]["success"] == pytest.approx(0.75)
  assert para["per_kind"]["parallel"]["success"] == pytest.approx(0.5)
  assert para["average"] == pytest.approx((0.75 + 0.5) / 2)
  assert para["multi_tool"]["n"] == 4 and para["multi_tool"]["success"] == pytest.approx(0.5)
  assert para["overall"]["turns"] == pytest.approx(3.0)
  assert para["overall"]["explore_token_share"] == pytest.approx(0.75)
  assert runs["react"]["multi_tool"]["success"] == 0.0
  assert list(para["per_kind"]) == ["single", "parallel"]  # canonical kind order


def test_markdown_and_files_and_compare(tmp_path):
  paths = rep.write_report(_records(), str(tmp_path), name="r1")
  md = open(paths["markdown"]).read()
  main, per_kind = md.split("Per kind")[0], md.split("Per kind")[1].split("Notes:")[0]
  assert main.strip().count("\n") == 3  # header, rule, two runs
  assert "| toolenv | oracle | paraact | 8 | 62.5 (" in md
  # Per-kind rows carry n and the Wilson CI: 3/4 single -> 30.1-95.4 (textbook).
  assert "| toolenv | oracle | paraact | 4: 75.0 (30.1-95.4) | 4: 50.0 (15.0-85.0) |" in per_kind
  assert "No published numbers" in md.split("Notes:")[1]
  for key in ("plot_success", "plot_turns", "plot_calls"):
    assert os.path.getsize(paths[key]) > 1000
    with open(paths[key], "rb") as f:
      assert f.read(8) == b"\x89PNG\r\n\x1a\n"
  data = json.load(open(paths["json"]))
  assert len(data["runs"]) == 2
  rep.write_report(_records()[:8], str(tmp_path), name="r2", plots=False)
  table = rep.compare_reports([paths["json"], str(tmp_path / "r2.json")])
  assert table.split("Per kind")[0].count("| toolenv |") == 3


def test_average_ci_token_shares_and_rewards():
  report = rep.build_report(_records())
  para = {r["strategy"]: r for r in report["runs"]}["paraact"]
  # Hand-derived: kinds 3/4 and 2/4 -> mean 0.625, var = (0.1875/4 + 0.25/4) / 4.
  half = 1.959964 * math.sqrt((0.1875 / 4 + 0.25 / 4) / 4)
  assert para["average_ci95"] == pytest.approx([0.625 - half, 0.625 + half])
  assert para["overall"]["execute_token_share"] == pytest.approx(0.25)
  # All-or-nothing kinds give a point interval.
  react = {r["strategy"]: r for r in report["runs"]}["react"]
  assert react["average_ci95"] == pytest.approx([0.5, 0.5])
  recs = [dict(r, step_reward_mean=0.2, phase_reward_mean=0.5, traj_reward=1.0 * r["success"],
               finished=True, api_recall=0.5 if r["kind"] == "single" else None)
          for r in _records()]
  o = {r["strategy"]: r for r in rep.build_report(recs)["runs"]}["paraact"]["overall"]
  assert o["traj_reward"] == pytest.approx(5 / 8) and o["phase_reward_mean"] == 0.5
  assert o["finished"] == 1.0 and o["api_recall"] == 0.5  # None values skipped
  md = rep.markdown_table(rep.build_report(recs))
  assert "finish %" in md and "API recall %" in md


def test_benchmark_notes():
  notes = rep.notes_for(["stabletoolbench-open", "bfcl-open", "bfcl-closed"])
  assert set(notes) == {"stabletoolbench", "bfcl"}
  assert "SoPR" in notes["stabletoolbench"] and "not comparable" in notes["stabletoolbench"]


def test_multi_tool_kinds_per_benchmark_and_one_table_each(tmp_path):
  assert rep.is_multi_tool("bfcl-open", "live_parallel_multiple")
  assert not rep.is_multi_tool("bfcl-open", "multiple")
  assert rep.is_multi_tool("toolenv-procedural", "fanout")
  assert not rep.is_multi_tool("toolenv-procedural", "chain")
  recs = _records() + [
      {"benchmark": "bfcl-open", "strategy": "paraact", "policy": "oracle", "kind": k,
       "task_id": f"{k}{i}", "success": i == 0, "turns": 3}
      for k in ("parallel", "simple_python") for i in range(2)]
  report = rep.build_report(recs)
  bfcl = [r for r in report["runs"] if r["benchmark"] == "bfcl-open"][0]
  assert bfcl["multi_tool"]["n"] == 2 and bfcl["multi_tool"]["success"] == 0.5
  md = rep.markdown_table(report)
  main = md.split("Per kind")[0]
  # Two tables: the BFCL one has its own kind columns and no ToolEnv ones.
  assert main.count("| benchmark | policy |") == 2
  bfcl_head = [l for l in main.splitlines() if "simple_python %" in l][0]
  assert "single %" not in bfcl_head
  paths = rep.write_report(recs, str(tmp_path))
  assert os.path.getsize(paths["plot_success"]) > 1000


def test_per_kind_turns_and_calls_per_execute_step_table():
  recs = [dict(r, calls_per_execute_step=2.0 if r["strategy"] == "paraact" else 1.0)
          for r in _records()]
  md = rep.markdown_table(rep.build_report(recs))
  table = md.split("Per kind: mean turns / calls per execute step")[1]
  assert "| toolenv | oracle | paraact | 3.00 / 2.00 | 3.00 / 2.00 |" in table
  assert "| toolenv | oracle | react | 5.00 / 1.00 | 5.00 / 1.00 |" in table


def test_terminal_table_is_narrow_and_aligned():
  report = rep.build_report(_records())
  text = rep.terminal_table(report)
  lines = text.rstrip("\n").splitlines()
  # Header, rule, one row per run; every line fits a terminal.
  assert len(lines) == 2 + len(report["runs"]) and set(lines[1]) == {"-"}
  assert max(len(l) for l in lines) <= 120, text
  para = [l for l in lines if " paraact " in l][0]
  assert para.split()[:5] == ["toolenv", "oracle", "paraact", "8", "62.5"]
  # Columns line up: each header ends where its values end (right-aligned).
  end = lines[0].index("success % (95% CI)") + len("success % (95% CI)")
  assert para[:end].endswith(")") and para[end:end + 1] in (" ", "")


# ---- failure causes and behaviour next to the oracle (evaluation.causes) ----

def _diag_rec(kind, success, cause=None, **kw):
  r = {"kind": kind, "task_id": f"{kind}-{kw.pop('i', 0)}", "success": success,
       "cause": cause, "cause_detail": f"why {cause}" if cause else "",
       "turns": 3, "calls_per_execute_step": 2.0, "phase_switches": 1, "searches": 2,
       "redundant_searches": 1, "oracle_turns": 3, "oracle_calls_per_execute_step": 3.0,
       "oracle_phase_switches": 1, "oracle_searches": 3, "oracle_redundant_searches": 0}
  r.update(kw)
  return r


def test_cause_table_counts_by_hand():
  from paraagent_jax.evaluation import causes
  recs = [_diag_rec("single", True), _diag_rec("single", False, "wrong_answer", i=1),
          _diag_rec("parallel", False, "unknown_tool", i=0),
          _diag_rec("parallel", False, "unknown_tool", i=1),
          _diag_rec("parallel", False, "tool_not_found", i=2),
          {"kind": "parallel", "task_id": "x", "success": False}]   # no diagnosis: left out
  counts = causes.cause_counts(causes.diagnosed(recs))
  assert counts["parallel"]["unknown_tool"] == 2 and counts["parallel"]["tool_not_found"] == 1
  assert counts["multi_tool"]["unknown_tool"] == 2 and counts["all"]["wrong_answer"] == 1
  lines = causes.cause_table(recs)
  assert lines[0].startswith("| cause | single (2) | parallel (3) |")
  row = next(l for l in lines if "`unknown_tool`" in l)
  assert row.split(" | ")[1:5] == ["0", "2", "2", "2"]
  assert "parallel parallel-0: why unknown_tool" in row        # the first example
  assert lines[-1] == "| **failed** | 1 | 3 | 3 | 4 | |"
  beh = causes.behaviour_table(recs)
  assert beh[2].startswith("| single | 3.00 / 3.00 | 2.00 / 3.00 | 1.00 / 1.00 | 2.00 / 3.00 "
                           "| 1.00 / 0.00 |")
  before = recs[:5]
  after = [_diag_rec("single", True), _diag_rec("single", True, i=1),
           _diag_rec("parallel", True), _diag_rec("parallel", False, "unknown_tool", i=1),
           _diag_rec("parallel", False, "answered_early", i=2)]
  cmp = causes.compare_table(before, after)
  row = next(l for l in cmp if l.startswith("| called a tool"))
  # single, parallel, multi-tool, all
  assert row.split(" | ")[1:] == ["0 -> 0", "2 -> 1", "2 -> 1", "2 -> 1 |"]
  assert cmp[-1].endswith("| 1 -> 0 | 3 -> 2 | 3 -> 2 | 4 -> 2 |")


def test_report_has_the_cause_and_oracle_tables(tmp_path):
  recs = [dict(_diag_rec("parallel", False, "unknown_tool"), benchmark="toolenv",
               strategy="paraact", policy="p"),
          dict(_diag_rec("single", True), benchmark="toolenv", strategy="paraact",
               policy="p")]
  report = rep.build_report(recs)
  a = report["runs"][0]["analysis"]
  assert a["counts"]["parallel"]["unknown_tool"] == 1 and a["failed"] == {"single": 0,
                                                                           "parallel": 1}
  md = rep.markdown_table(report)
  assert "Failed episodes by cause: toolenv / p / paraact" in md
  assert "Behaviour next to the oracle's plan" in md and "Ran on: " in md


def test_replayed_diagnosis_equals_the_live_one():
  import toolenv
  from toolenv.catalog import procedural
  from toolenv.schema import Call, Step
  from paraagent_jax.evaluation import causes
  from paraagent_jax.paraact import strategies
  strat = strategies.get_strategy("paraact")
  cat = procedural.build_catalog(seed=0, size=3000)
  tasks = toolenv.TaskGenerator(cat, seed=0).generate(5, split="test")
  recs, live = [], []
  for j, task in enumerate(tasks):
    steps = toolenv.oracle.solve(task, "paraact")
    if j % 2:   # a misspelt tool and an invented answer
      n = task.nodes[0]
      steps = steps[:-2] + [Step("execute", [Call(n["tool"] + "x", dict(n["arguments"]))]),
                            Step("answer", answer="invented")]
    env = toolenv.ToolEnv(cat)
    env.reset(task)
    text = [strat.render_step(s) for s in steps]
    for t in text:
      env.step(strat.parse_step(t))
    live.append(env.diagnosis("paraact"))
    recs.append({"task_id": task.id, "kind": task.kind, "success": env.success,
                 "transcript": [{"role": "task", "text": "..."}]
                 + [{"role": "assistant", "text": t} for t in text]})
  out = causes.replay_diagnosis(recs, cat, tasks, strat.parse_step)
  for got, want in zip(out, live):
    for k in ("cause", "cause_detail", "searches", "redundant_searches", "oracle_turns"):
      assert got[k] == want[k], k
  assert [r["cause"] is None for r in out] == [True, False, True, False, True]
  recs[0]["success"] = False
  with pytest.raises(ValueError, match="replayed success"):
    causes.replay_diagnosis(recs[:1], cat, tasks, strat.parse_step)


def test_causes_cli_help_and_bad_path(tmp_path, capsys):
  """`python -m paraagent_jax.evaluation.causes --help` prints the usage (exit 0),
  a missing file one line on stderr (exit 1), not a traceback."""
  from paraagent_jax.evaluation import causes
  assert causes.main(["--help"]) == 0
  assert "python -m paraagent_jax.evaluation.causes" in capsys.readouterr().out
  assert causes.main([]) == 2
  capsys.readouterr()
  missing = str(tmp_path / "nope.jsonl")
  assert causes.main([missing]) == 1
  err = capsys.readouterr().err
  assert missing in err and "cannot read records" in err
