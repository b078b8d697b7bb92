"""The command line: ``--config=FILE[:arg]`` and ``--config.KEY=VALUE`` overrides."""

import json
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _train(*args, cwd=ROOT):
  return subprocess.run([sys.executable, "-m", "paraagent_jax.train", *args], cwd=cwd,
                        capture_output=True, text=True, timeout=600,
                        env=dict(os.environ, PYTHONPATH=ROOT))


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
