"""The evaluation entry point: oracle sanity check, resume, bad input."""

import os

import pytest

from paraagent_jax.evaluation import suite
from paraagent_jax import config_utils
from paraagent_jax import evaluate
from paraagent_jax.evaluation import heldout
from paraagent_jax.evaluation import runner


def small_config(**kw):
  c = config_utils.load_config("configs/evaluate.py:runlocal")
  c.num_per_kind = 2
  for k, v in kw.items():
    c[k] = v
  return c


@pytest.fixture(scope="module")
def oracle_run(tmp_path_factory):
  d = str(tmp_path_factory.mktemp("eval"))
  return d, evaluate.run(small_config(), d)


@pytest.mark.slow
def test_oracle_scores_100_percent_under_every_strategy(oracle_run):
  d, _ = oracle_run
  recs = {s: runner.read_records(runner.records_path(
      d, "toolenv-procedural", "oracle", s)) for s in
          ("paraact", "react", "plan_execute", "interleaved")}
  for s, r in recs.items():
    assert len(r) == 10 and all(x["success"] for x in r), s
    assert all(x["parse_errors"] == 0 for x in r)
  turns = {s: sum(x["turns"] for x in r) / len(r) for s, r in recs.items()}
  assert turns["paraact"] < turns["react"]
  # Every record carries the diagnosis; the oracle's own episode is its plan.
  for s, r in recs.items():
    for x in r:
      assert x["cause"] is None and x["cause_detail"] == ""
      assert x["oracle_turns"] == x["turns"] and x["unknown_tool_calls"] == 0, (s, x)
  for f in ("report.md", "report.json"):
    assert os.path.exists(os.path.join(d, f))


@pytest.mark.slow
def test_records_carry_transcripts_and_the_report_shows_them(oracle_run, capsys):
  d, _ = oracle_run
  recs = runner.read_records(runner.records_path(d, "toolenv-procedural", "oracle",
                                                 "paraact"))
  for r in recs:
    roles = [t["role"] for t in r["transcript"]]
    assert roles[0] == "task" and roles[1:] == ["assistant", "observation"] * (
        r["turns"] - 1) + ["assistant"], roles
    assert r["transcript"][-1]["text"].strip()     # the answer turn, as written
  # The instruction is the first thing the policy read.
  assert all(len(r["transcript"][0]["text"]) > 20 for r in recs)
  with open(os.path.join(d, "report.md")) as f:
    md = f.read()
  assert "Transcripts (one solved and one failed per kind" in md
  assert "Failed episodes by cause: toolenv-procedural / oracle / paraact" in md
  assert "| **failed** | 0 | 0 | 0 | 0 | 0 | 0 | 0 | |" in md
  # The oracle solves everything: one solved example per (strategy, kind).
  assert md.count(": solved\n[task]") == 4 * 5 and ": failed\n" not in md
  # --transcripts=N prints N after the compact table (no transcripts in it).
  capsys.readouterr()
  evaluate.run(small_config(strategies="paraact"), d, transcripts=2)
  out = capsys.readouterr().out
  assert out.count(": solved\n[task]") == 2
  assert "report " + os.path.join(d, "report.md") in out
  assert (f"plots report_success_by_kind.png, report_turns_vs_success.png, "
          f"report_calls_per_step.png in {d}") in out
  assert "failed episodes by cause, toolenv-procedural/oracle/paraact: none failed" in out
  table = out.split("toolenv-procedural / oracle")[0]
  assert "Transcripts" not in table


@pytest.mark.slow
def test_interrupted_evaluation_resumes_to_the_same_records(oracle_run, tmp_path):
  d, _ = oracle_run
  src = runner.records_path(d, "toolenv-procedural", "oracle", "paraact")
  full = runner.read_records(src)
  dst = runner.records_path(str(tmp_path), "toolenv-procedural", "oracle", "paraact")
  os.makedirs(os.path.dirname(dst))
  with open(src) as f, open(dst, "w") as g:
    lines = f.readlines()
    g.writelines(lines[:3])
    g.write(lines[3][:17])   # a torn record, as a kill leaves it
  logs = []
  c = small_config(strategies="paraact")
  import toolenv  # pylint: disable=g-import-not-at-top
  from paraagent_jax.paraact import chat_format, policies  # pylint: disable=g-import-not-at-top
  tok = suite.policy_tokenizer(c, "", d)  # pylint: disable=protected-access
  cat = toolenv.load_catalog("procedural", seed=0)
  held = heldout.HeldOut(heldout.HeldOutSpec(num_tasks=10, limits=suite.rollout_limits(c)),
                         catalog=cat)
  fmt = chat_format.ChatFormat(tok, strategy="paraact")
  out = held.run(policies.OraclePolicy(fmt, strategy="paraact"), fmt, batch_size=4,
                 workdir=str(tmp_path), policy_name="oracle", benchmark="toolenv-procedural",
                 fields={"catalog": cat.name}, log=logs.append).records
  assert "3 recorded, 7 to go" in logs[0]
  key = lambda r: (r["task_id"], r["success"], r["turns"], r["calls"])
  assert [key(r) for r in out] == [key(r) for r in full]
  assert len(runner.read_records(dst)) == 10


def test_bad_inputs_are_one_line_errors(tmp_path):
  with pytest.raises(config_utils.ConfigError, match="policy"):
    evaluate.run(small_config(policy="gpt"), str(tmp_path))
  with pytest.raises(config_utils.ConfigError, match="no such directory"):
    evaluate.run(small_config(), str(tmp_path), checkpoint=str(tmp_path / "missing"))
  with pytest.raises(config_utils.ConfigError, match="benchmarks"):
    evaluate.run(small_config(benchmarks="nope"), str(tmp_path))


def test_evaluate_sees_observations_as_the_demo_rl_does():
  """`evaluate` and the demo's RL evaluation cut observations at the same length.

  At 256 (the old default) the second search's results of many parallel tasks
  were cut, and the shipped SFT policy scored 3 points lower under `evaluate`
  than under the RL stage's evaluation of the same tasks.
  """
  ev = config_utils.load_config("configs/evaluate.py")
  demo = config_utils.load_config("configs/demo.py")
  assert ev.rollout.max_obs_tokens == demo.rl.max_obs_tokens == 640


def test_a_checkpoint_of_neither_kind_says_so_and_leaves_no_workdir(tmp_path):
  """An empty directory or a file is refused for what it is (not with a
  tokenizer hint), and the eval workdir is not created."""
  empty = tmp_path / "empty"
  empty.mkdir()
  text = tmp_path / "notes.txt"
  text.write_text("hi")
  for ckpt in (empty, text):
    wd = tmp_path / f"eval_{ckpt.name}"
    with pytest.raises(config_utils.ConfigError,
                       match="neither a Hugging Face model directory .* nor a training workdir"):
      evaluate.run(small_config(), str(wd), checkpoint=str(ckpt))
    assert not wd.exists()


def test_a_failure_after_the_checks_removes_only_an_empty_new_workdir(tmp_path, monkeypatch):
  from paraagent_jax.evaluation import suite as suite_lib  # pylint: disable=g-import-not-at-top

  def boom(*a, **k):
    raise KeyboardInterrupt
  monkeypatch.setattr(suite_lib, "_run", boom)
  wd = tmp_path / "new"
  with pytest.raises(KeyboardInterrupt):
    evaluate.run(small_config(), str(wd))
  assert not wd.exists()
  kept = tmp_path / "kept"
  kept.mkdir()
  (kept / "mine.txt").write_text("x")
  with pytest.raises(KeyboardInterrupt):
    evaluate.run(small_config(), str(kept))
  assert (kept / "mine.txt").exists()


def test_ctrl_c_is_one_line_that_counts_the_kept_records(oracle_run, tmp_path, monkeypatch,
                                                          capsys):
  """Ctrl-C during `evaluate`: exit 130 and one line (records kept, how to
  resume), not a traceback."""
  import shutil  # pylint: disable=g-import-not-at-top
  from absl import flags  # pylint: disable=g-import-not-at-top
  d, _ = oracle_run
  wd = tmp_path / "ev"
  shutil.copytree(os.path.join(d, "records"), wd / "records")

  def interrupted(*a, **k):
    raise KeyboardInterrupt
  monkeypatch.setattr(evaluate.suite, "run", interrupted)
  fl = flags.FLAGS
  if not fl.is_parsed():
    fl(["evaluate"])
  monkeypatch.setattr(fl["workdir"], "value", str(wd))
  with pytest.raises(SystemExit) as e:
    evaluate.main(["evaluate"])
  assert e.value.code == 130
  err = capsys.readouterr().err.strip().splitlines()
  assert len(err) == 1, err
  assert err[0] == (f"paraagent_jax.evaluate: interrupted; 40 finished episodes are kept in "
                    f"{wd / 'records'}; rerun the same command to resume")
