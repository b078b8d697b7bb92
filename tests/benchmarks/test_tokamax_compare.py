"""benchmarks/tokamax_compare.py: its tables, its agreement lines, a missing tokamax."""

import os
import re
import subprocess
import sys
import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SMALL = ["--seq=256", "--heads=4", "--kv_heads=2", "--head_dim=16",
         "--tokens=256", "--hidden=32", "--vocab=4096", "--logits_chunk=16"]


def _run(args, **env):
  return subprocess.run([sys.executable, "benchmarks/tokamax_compare.py", *args],
                        cwd=ROOT, env=dict(os.environ, **env), capture_output=True,
                        text=True, timeout=600)


@pytest.mark.slow
def test_small_run_agrees_and_prints_both_tables():
  res = _run(SMALL)
  assert res.returncode == 0, res.stdout + res.stderr
  out = res.stdout
  diffs = [float(x) for x in re.findall(r"(?:loss|grads) ([0-9.e+-]+)", out)]
  assert len(diffs) == 4 and max(diffs) < 1e-4, out
  for row in ("| chunked (ours) |", "| tokamax (its default choice) |",
              "| tokamax xla_chunked |", "| ours, logits_chunk=16 |",
              "| tokamax linear_softmax_cross_entropy_loss |"):
    assert row in out
  # Forward + backward: the unchunked log-probs hold the [256, 4096] fp32 logits
  # (4 MiB), the chunked ones a [16, 4096] block.
  both = {name: float(b) for name, b in re.findall(
      r"\| (ours, [^|]+) \| [0-9.,]+ MiB \| ([0-9.]+) MiB \|", out)}
  assert both["ours, logits_chunk=0 (unchunked)"] >= 4.0, out
  assert both["ours, logits_chunk=16"] * 4 < both["ours, logits_chunk=0 (unchunked)"], out


def test_without_tokamax_it_says_how_to_install(tmp_path):
  # A `tokamax` module that fails to import shadows the installed one.
  (tmp_path / "tokamax.py").write_text("raise ImportError('no tokamax here')\n")
  res = _run(SMALL, PYTHONPATH=str(tmp_path))
  assert res.returncode == 2
  assert "pip install tokamax" in res.stderr


@pytest.mark.slow
def test_bad_arguments_are_clear_errors():
  res = _run(["--heads=6", "--kv_heads=4"])
  assert res.returncode == 2 and "--heads must be a multiple of --kv_heads" in res.stderr
  res = _run(["--seq=0"])
  assert res.returncode == 2 and "--seq must be >= 1" in res.stderr
