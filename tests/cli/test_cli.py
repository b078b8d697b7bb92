"""The command line: ``--config=FILE[:arg]`` and ``--config.KEY=VALUE`` overrides."""

import json
import os
import subprocess
import sys
import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _train(*args, cwd=ROOT):
  return subprocess.run([sys.executable, "-m", "paraagent_jax.train", *args], cwd=cwd,
                        capture_output=True, text=True, timeout=600,
                        env=dict(os.environ, PYTHONPATH=ROOT))


@pytest.mark.slow
def test_dotted_overrides_reach_the_run_and_its_config_json(tmp_path):
  wd = str(tmp_path / "run")
  p = _train("--config=configs/sft_tiny.py:log_every=1", "--config.total_steps=2",
             "--config.optimizer.learning_rate=0.002", "--config.progress=false",
             f"--workdir={wd}")
  assert p.returncode == 0, p.stderr[-2000:]
  assert "sft: done at step 2" in p.stdout
  saved = json.load(open(os.path.join(wd, "config.json")))
  assert saved["total_steps"] == 2 and saved["log_every"] == 1
  assert saved["optimizer"]["learning_rate"] == 0.002
  assert saved["sharding"]["rules"]["batch"] == "data,fsdp"


@pytest.mark.slow
def test_unknown_keys_and_files_are_one_line_errors(tmp_path):
  for args, want in [
      (["--config=configs/sft_tiny.py", "--config.total_stepz=2"],
       "unknown config key 'total_stepz'; did you mean total_steps"),
      (["--config=configs/sft_tiny.py:total_stepz=2"],
       "unknown config key 'total_stepz'; did you mean total_steps"),
      (["--config=configs/nope.py", "--config.a.b=1"], "config file 'configs/nope.py' not found"),
  ]:
    p = _train(*args, f"--workdir={tmp_path / 'x'}")
    assert p.returncode == 1, (args, p.stderr[-1000:])
    lines = p.stderr.strip().splitlines()
    assert lines[-1].startswith("paraagent_jax.train: error: ") and want in lines[-1], p.stderr
    assert "Traceback" not in p.stderr


def _run(module, *args):
  return subprocess.run([sys.executable, "-m", f"paraagent_jax.{module}", *args], cwd=ROOT,
                        capture_output=True, text=True, timeout=600,
                        env=dict(os.environ, PYTHONPATH=ROOT))


@pytest.mark.slow
def test_help_lists_the_real_flags_and_exits_0():
  for module, want in [("train", ("--config", "--workdir", "--[no]dry_run", "--[no]print_config")),
                       ("evaluate", ("--config", "--workdir", "--step", "--checkpoint",
                                     "--compare")),
                       ("export_hf", ("--workdir", "--step", "--out"))]:
    p = _run(module, "--help")
    assert p.returncode == 0, (module, p.stderr[-1000:])
    for flag in want:
      assert f"  {flag}:" in p.stdout, (module, flag, p.stdout)
  assert "--print_config" in _run("train", "-h").stdout


@pytest.mark.slow
def test_print_config_shows_every_key_and_the_default_an_override_changed():
  p = _train("--config=configs/demo.py:runlocal", "--config.rl.iterations=3", "--print_config")
  assert p.returncode == 0, p.stderr[-1000:]
  lines = p.stdout.splitlines()
  assert "rl.iterations = 3    (default: 56)" in lines
  assert any(ln.startswith("model.attention = ") for ln in lines)
  assert "rl.grpo.levels = 'traj,phase,step'" in lines   # not overridden: no default shown


@pytest.mark.slow
def test_a_flag_value_that_does_not_parse_is_one_line():
  p = _train("--config=configs/demo.py", "--config.rl.iterations=abc", "--workdir=/tmp/x")
  assert p.returncode == 1
  assert p.stderr.strip().splitlines() == [
      "paraagent_jax.train: error: flag --config.rl.iterations=abc: invalid literal for "
      "int() with base 10: 'abc'"]


@pytest.mark.slow
def test_compare_with_a_missing_directory_says_what_it_wanted(tmp_path):
  p = _run("evaluate", f"--compare={tmp_path / 'nope'}")
  assert p.returncode == 1
  assert p.stderr.strip().splitlines() == [
      f"paraagent_jax.evaluate: error: --compare: {tmp_path / 'nope'} is neither an evaluate "
      "workdir (with report.json) nor a report.json file"]


@pytest.mark.slow
def test_print_config_reads_the_file_in_either_flag_form_and_the_default_one():
  p = _train("--config", "configs/demo.py:runlocal", "--print_config")   # space form
  assert p.returncode == 0, p.stderr[-1000:]
  assert "rl.iterations = 2    (default: 56)" in p.stdout.splitlines()
  p = _run("evaluate", "--print_config")                               # no --config
  assert p.returncode == 0, p.stderr[-1000:]
  assert "num_per_kind = 40" in p.stdout.splitlines()


@pytest.mark.slow
def test_a_missing_bucket_is_one_line_and_nothing_is_written(gcs_server, tmp_path):
  """A gs:// path whose bucket does not exist (here on the GCS emulator) stops
  each entry point with one line before any work; no local ``gs:`` folder
  (the old behaviour wrote one without a word)."""
  from tests.gcs_emulator import emulator_env
  env = emulator_env(dict(os.environ, PYTHONPATH=ROOT))
  cases = [("train", "--config=configs/demo.py:runlocal", "--workdir=gs://no-such-bkt/run"),
           ("evaluate", "--workdir=gs://no-such-bkt/eval"),
           ("export_hf", f"--workdir={tmp_path}", "--out=gs://no-such-bkt/hf")]
  for module, *args in cases:
    p = subprocess.run([sys.executable, "-m", f"paraagent_jax.{module}", *args], cwd=ROOT,
                       capture_output=True, text=True, timeout=600, env=env)
    assert p.returncode == 1, (module, p.stderr[-500:])
    (line,) = p.stderr.strip().splitlines()
    assert line == (f"paraagent_jax.{module}: error: {args[-1].split('=', 1)[1]}: no "
                    f"bucket gs://no-such-bkt (or no access to it)"), line
  assert not os.path.exists(os.path.join(ROOT, "gs:"))
