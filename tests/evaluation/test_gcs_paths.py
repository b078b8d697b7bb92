"""Evaluation, the RL report and the demonstrations on a ``gs://`` run directory.

Against the GCS emulator (`gcs_bucket`, tests/gcs_emulator.py): what the
code writes lands in the bucket (never in a local ``./gs:`` folder), reads
back, resumes, and is byte for byte what the same call writes locally.
"""

import os

from ml_collections import ConfigDict
import pytest

from paraagent_jax import config_utils
from paraagent_jax import fileio
from paraagent_jax.coldstart import build
from paraagent_jax.data import demo_tokenizer
from paraagent_jax.data import demonstrations
from paraagent_jax.data import tfds_builders
from paraagent_jax.evaluation import heldout
from paraagent_jax.evaluation import report as report_lib
from paraagent_jax.evaluation import runner
from paraagent_jax.evaluation import suite
from paraagent_jax.paraact import chat_format, policies
from paraagent_jax.trainer import rl_report

_REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
_PLOTS = ("report_success_by_kind.png", "report_turns_vs_success.png",
          "report_calls_per_step.png")


@pytest.fixture(autouse=True)
def _no_local_gs_folder(tmp_path, monkeypatch):
  """Runs each test in an empty folder; a ``gs:`` folder there is the old bug."""
  monkeypatch.chdir(tmp_path)
  yield
  assert not os.path.exists(tmp_path / "gs:")


def _bytes(path):
  with fileio.open(path, "rb") as f:
    return f.read()


def _oracle_run(held, workdir, logs):
  fmt = chat_format.ChatFormat(suite.text_policy_tokenizer(), strategy="paraact")
  return held.run(policies.OraclePolicy(fmt, strategy="paraact"), fmt, batch_size=2,
                  workdir=workdir, policy_name="oracle", log=logs.append).records


@pytest.mark.slow
def test_records_append_and_resume_on_a_bucket(gcs_bucket):
  run = f"{gcs_bucket}/eval"
  held = heldout.HeldOut(heldout.HeldOutSpec(num_tasks=6, kinds=("single", "parallel")))
  first = heldout.HeldOut(held.spec, held.catalog, held.tasks[:3])
  logs = []
  _oracle_run(first, run, logs)               # two batches appended: 2 + 1
  path = runner.records_path(run, "toolenv", "oracle", "paraact")
  assert [r["task_id"] for r in runner.read_records(path)] == [t.id for t in held.tasks[:3]]
  recs = _oracle_run(held, run, logs)         # resumed: the 3 others only
  assert logs[-3] == "evaluate: toolenv/oracle/paraact: 3 recorded, 3 to go"
  assert [r["task_id"] for r in recs] == [t.id for t in held.tasks]
  assert runner.read_records(path) == recs
  assert all(r["success"] for r in recs)


@pytest.mark.slow
def test_evaluate_on_a_bucket_writes_there_and_resumes(gcs_bucket, capsys):
  """`suite.run` end to end: its text tokenizer, records and report in the bucket."""
  c = config_utils.load_config(os.path.join(_REPO, "configs/evaluate.py:runlocal"))
  c.num_per_kind, c.strategies, c.batch_size = 1, "paraact", 2
  run = f"{gcs_bucket}/ev"
  rep = suite.run(c, run)
  assert rep["markdown"] == f"{run}/report.md"
  assert sorted(fileio.listdir(run)) == sorted(
      ["records", "report.json", "report.md", "text_tokenizer", *_PLOTS])
  assert fileio.exists(f"{run}/text_tokenizer/tokenizer.json")
  first = fileio.read_text(rep["markdown"])
  capsys.readouterr()
  suite.run(c, run)
  assert "toolenv-procedural/oracle/paraact: 5 recorded, 0 to go" in capsys.readouterr().out
  assert fileio.read_text(rep["markdown"]) == first


def _records():
  """Two strategies x two kinds x 2 tasks, with transcripts (non-ASCII too)."""
  return [{"benchmark": "toolenv", "strategy": strategy, "policy": "oracle", "kind": kind,
           "task_id": f"{kind}{i}", "success": i == 0 or strategy == "react",
           "turns": 3, "calls": 2, "calls_per_step": [2] if strategy == "paraact" else [1, 1],
           "transcript": [{"role": "task", "text": "Paris → Zürich?"},
                          {"role": "assistant", "text": "done"}]}
          for strategy in ("paraact", "react") for kind in ("single", "parallel")
          for i in range(2)]


def test_the_report_on_a_bucket_is_the_local_report(gcs_bucket, tmp_path):
  run = f"{gcs_bucket}/eval"
  paths = report_lib.write_report(_records(), run)
  local = report_lib.write_report(_records(), str(tmp_path / "local"))
  assert paths["markdown"] == f"{run}/report.md"
  for key in ("markdown", "plot_success", "plot_turns", "plot_calls"):
    assert _bytes(paths[key]) == _bytes(local[key]), key
  assert sorted(fileio.listdir(run)) == sorted(["report.json", "report.md", *_PLOTS])
  assert (report_lib.compare_reports([paths["json"]])
          == report_lib.compare_reports([local["json"]]))


def test_rl_report_writes_its_files_to_a_bucket(gcs_bucket, tmp_path):
  """The curve, the paired comparison and the markdown, as written locally."""
  rows = [{"step": i, "train/rollout/success": i / 4, "train/rollout/traj_reward": 0.1,
           "train/rollout/phase_reward": 0.5, "train/rollout/step_reward": 0.2}
          for i in range(4)] + [{"step": 0, "eval/success": 0.25}]
  ev = [{"task_id": f"t{i}", "kind": "single", "success": i % 2 == 0, "turns": 3,
         "cause": None if i % 2 == 0 else "wrong_answer",
         "transcript": [{"role": "task", "text": "q"}, {"role": "assistant", "text": "a"}]}
        for i in range(4)]
  after = {"success": 0.5, "success_single": 0.5, "turns": 3.0,
           "calls_per_execute_step": 1.0}
  meta = {"levels": ["traj", "step"], "machine": None}
  out = {}
  for where, d in (("gcs", f"{gcs_bucket}/rl"), ("local", str(tmp_path / "rl"))):
    fileio.write_jsonl_atomic(f"{d}/metrics.jsonl", rows)
    fileio.write_json_atomic(f"{d}/{rl_report.RUN_META_FILE}", meta)
    for name in (rl_report.EVAL_BEFORE_FILE, rl_report.EVAL_AFTER_FILE):
      fileio.write_jsonl_atomic(f"{d}/{name}", ev)
    assert rl_report.save_curve(d) == f"{d}/rl_curve.png"
    paired = rl_report.paired_before_after(d)
    assert paired["tasks"] == 4
    assert rl_report.write_report(d, rows, after, paired, meta) == f"{d}/rl_report.md"
    assert rl_report.cause_summary_lines(d)[1].startswith(
        "failed held-out episodes by cause after RL: wrong_answer 2")
    out[where] = {name: _bytes(f"{d}/{name}") for name in (
        "rl_curve.png", "rl_curve.jsonl", "rl_report.md", rl_report.PAIRED_FILE)}
  assert out["gcs"] == out["local"]
  assert out["gcs"]["rl_curve.png"][:8] == b"\x89PNG\r\n\x1a\n"
  assert b"one solved and one failed held-out transcript" in out["gcs"]["rl_report.md"]


@pytest.mark.slow
def test_demonstrations_built_into_and_loaded_from_a_bucket(gcs_bucket, tmp_path):
  """The cold start writes JSONL to a bucket; the SFT source reads it back
  (the prepared TFDS data stays local here: TFDS has its own gs:// layer)."""
  data_dir = f"{gcs_bucket}/data"
  stats = build.build_demonstrations(ConfigDict({"data": {
      "catalog": "procedural", "num_tasks": 4, "test_tasks": 2, "kinds": ("single",),
      "backend": "scripted", "seed": 0}}), data_dir)
  assert sorted(fileio.listdir(data_dir)) == sorted([
      "demonstrations_train.jsonl", "demonstrations_test.jsonl", "tasks_train.jsonl",
      "tasks_test.jsonl", "stats.json"])
  assert fileio.read_json(f"{data_dir}/stats.json")["train"] == stats["train"]
  cfg = config_utils.demonstration_defaults()
  cfg.data_dir, cfg.tfds_dir = data_dir, str(tmp_path / "tfds")
  recs = demonstrations.load_demonstrations(cfg, "train")
  assert len(recs) == stats["train"]["kept"] > 0
  texts = list(demo_tokenizer.demonstration_texts(data_dir))
  assert len(texts) == len(recs) + 4            # each demonstration, each task
  # A changed source in the bucket rebuilds the prepared data.
  path = f"{data_dir}/demonstrations_train.jsonl"
  fileio.write_text_atomic(path, fileio.read_text(path).split("\n", 1)[0] + "\n")
  assert len(demonstrations.load_demonstrations(cfg, "train")) == 1
  # The cache key of a bucket file: its size (no modification time there).
  assert tfds_builders.files_key(path, f"{data_dir}/none") == (
      (path, fileio.getsize(path)), (f"{data_dir}/none",))
