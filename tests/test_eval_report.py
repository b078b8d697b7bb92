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
