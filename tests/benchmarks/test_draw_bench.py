"""benchmarks/draw_bench.py at a tiny size: both draws print a row, and both
draw the right distribution (TV distance at the sampling-noise level)."""

import os
import re
import subprocess
import sys
import pytest

_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.mark.slow
def test_draw_bench_prints_both_draws_and_their_distributions_agree():
  out = subprocess.run(
      [sys.executable, os.path.join(_ROOT, "benchmarks", "draw_bench.py"),
       "--batch=4", "--vocab=300", "--calls=3", "--repeats=2", "--check_draws=8000"],
      capture_output=True, text=True, timeout=600, cwd=_ROOT, check=False)
  assert out.returncode == 0, out.stderr[-3000:]
  rows = re.findall(r"^\| (\w+) \| ([\d.]+) \| ([\d.]+) \| ([\d.]+) \| ([\d.]+) \|$",
                    out.stdout, re.M)
  assert [r[0] for r in rows] == ["gumbel", "inverse_cdf"], out.stdout
  assert float(rows[0][3]) == 1.0
  noise = (64 / (2 * 3.14159 * 8000)) ** 0.5       # ~0.036
  for r in rows:
    assert float(r[4]) < 2.5 * noise, out.stdout
