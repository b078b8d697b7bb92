"""One run per workdir: `paraagent_jax.rundir`'s lock and ``train``'s use of it."""

import json
import os
import socket
import subprocess
import sys

import ml_collections
import pytest

from paraagent_jax import config_utils
from paraagent_jax import fileio
from paraagent_jax import rundir

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def write_lock(workdir, pid, host=None):
  os.makedirs(workdir, exist_ok=True)
  with open(os.path.join(workdir, rundir.LOCK_FILE), "w") as f:
    json.dump({"pid": pid, "host": host or socket.gethostname(),
               "since": "2026-01-01 00:00:00", "argv": "python -m x"}, f)


@pytest.fixture
def live_pid():
  proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
  yield proc.pid
  proc.kill()
  proc.wait()


def test_held_writes_owner_and_removes_on_exit(tmp_path):
  wd = str(tmp_path / "run")
  with rundir.held(wd) as path:
    with open(path) as f:
      owner = json.load(f)
    assert owner["pid"] == os.getpid() and owner["host"] == socket.gethostname()
    assert rundir.acquire(wd) == ""   # this process already holds it
    assert os.path.exists(path)
  assert not os.path.exists(path)


def test_released_on_error(tmp_path):
  wd = str(tmp_path)
  with pytest.raises(RuntimeError):
    with rundir.held(wd):
      raise RuntimeError("boom")
  assert not os.path.exists(os.path.join(wd, rundir.LOCK_FILE))


def test_live_owner_refuses(tmp_path, live_pid):
  write_lock(str(tmp_path), live_pid)
  with pytest.raises(rundir.WorkdirLocked, match=f"in use by pid {live_pid}"):
    rundir.acquire(str(tmp_path))
  # The other run's lock is left alone.
  with open(tmp_path / rundir.LOCK_FILE) as f:
    assert json.load(f)["pid"] == live_pid


def test_stale_and_garbage_locks_are_taken_over(tmp_path, capsys):
  proc = subprocess.Popen([sys.executable, "-c", "pass"])
  proc.wait()
  write_lock(str(tmp_path), proc.pid)       # that pid is gone
  path = rundir.acquire(str(tmp_path))
  assert "stale lock" in capsys.readouterr().err
  with open(path) as f:
    assert json.load(f)["pid"] == os.getpid()
  rundir.release(path)
  with open(path, "w") as f:
    f.write("{half a lock")
  assert rundir.acquire(str(tmp_path)) == path


def test_other_host_names_the_file(tmp_path):
  write_lock(str(tmp_path), 1, host="some-other-vm")
  with pytest.raises(rundir.WorkdirLocked, match="delete .*\\.lock"):
    rundir.acquire(str(tmp_path))


def test_disabled(tmp_path, live_pid, monkeypatch):
  write_lock(str(tmp_path), live_pid)
  with rundir.held(str(tmp_path), enabled=False) as path:
    assert path is None
  monkeypatch.setenv("PARAAGENT_NO_LOCK", "1")
  with rundir.held(str(tmp_path)) as path:
    assert path is None


def test_train_on_a_locked_workdir_stops_with_one_line(tmp_path, live_pid):
  wd = str(tmp_path / "run")
  write_lock(wd, live_pid)
  proc = subprocess.run(
      [sys.executable, "-m", "paraagent_jax.train",
       "--config=configs/demo.py:runlocal", f"--workdir={wd}"],
      cwd=REPO, capture_output=True, text=True, timeout=300,
      env=dict(os.environ, JAX_PLATFORMS="cpu"))
  assert proc.returncode == 1
  lines = [l for l in proc.stderr.splitlines() if l.strip()]
  assert len(lines) == 1, proc.stderr
  assert f"in use by pid {live_pid}" in lines[0]
  assert lines[0].startswith("paraagent_jax.train: error:")
  # Nothing was written beside the lock.
  assert sorted(os.listdir(wd)) == [rundir.LOCK_FILE]


def test_train_with_a_workdir_under_a_file_stops_with_one_line(tmp_path):
  (tmp_path / "afile").write_text("x")
  proc = subprocess.run(
      [sys.executable, "-m", "paraagent_jax.train",
       "--config=configs/demo.py:runlocal", f"--workdir={tmp_path}/afile/run"],
      cwd=REPO, capture_output=True, text=True, timeout=300,
      env=dict(os.environ, JAX_PLATFORMS="cpu"))
  assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stderr
  lines = [l for l in proc.stderr.splitlines() if l.strip()]
  assert len(lines) == 1 and "cannot create it (Not a directory)" in lines[0], lines


def test_atomic_writes_leave_the_old_file_on_failure(tmp_path):
  """`fileio.atomic_open`: the target appears whole or not at all."""
  path = str(tmp_path / "sub" / "a.json")
  fileio.write_json_atomic(path, {"x": 1})
  with open(path) as f:
    assert json.load(f) == {"x": 1}
  with pytest.raises(RuntimeError, match="killed mid-write"):
    with fileio.atomic_open(path) as f:
      f.write('{"x": 2, "half": ')
      raise RuntimeError("killed mid-write")
  with open(path) as f:
    assert json.load(f) == {"x": 1}
  assert os.listdir(tmp_path / "sub") == ["a.json"]   # no temporary left behind
  assert fileio.write_jsonl_atomic(str(tmp_path / "b.jsonl"), [{"a": 1}, {"b": 2}]) == 2
  assert (tmp_path / "b.jsonl").read_text() == '{"a": 1}\n{"b": 2}\n'


def test_tokenizer_dir_prefers_settings_then_existing_derived_dirs(tmp_path):
  c = config_utils.train_defaults()
  c.data.data_dir = str(tmp_path / "demos")
  c.init_from = str(tmp_path / "sft")
  # Nothing exists yet: the first derived place (for the error message).
  assert rundir.tokenizer_dir(c) == str(tmp_path / "demos" / "tokenizer")
  # Only init_from's tokenizer exists: that one.
  os.makedirs(tmp_path / "sft" / "tokenizer")
  (tmp_path / "sft" / "tokenizer" / "tokenizer.json").write_text("{}")
  assert rundir.tokenizer_dir(c) == str(tmp_path / "sft" / "tokenizer")
  c.rl.tokenizer = "/explicit"
  assert rundir.tokenizer_dir(c) == "/explicit"
  # A config without data / rl groups (an HF config.json read as one): none.
  assert rundir.tokenizer_dir(ml_collections.ConfigDict({"model_type": "qwen3"})) == ""
  with pytest.raises(config_utils.ConfigError, match="no config.json"):
    rundir.load_run_config(str(tmp_path))
