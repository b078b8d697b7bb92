"""benchmarks/sampler_bench.py end to end at a tiny size (a subprocess: the
script pins the process's CPUs and sets XLA_FLAGS before JAX starts)."""

import os
import re
import subprocess
import sys
import pytest

_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.mark.slow
def test_sampler_bench_runs_with_a_growing_cache_and_matches_transformers():
  # prompt 8 + 8 new tokens, cache_steps=2: the cache starts at 8 slots and
  # grows to 16 during decode; the tokens must still equal transformers'.
  out = subprocess.run(
      [sys.executable, os.path.join(_ROOT, "benchmarks", "sampler_bench.py"),
       "--batches=2", "--prompt_len=8", "--new_tokens=8", "--repeats=3",
       "--cache_steps=2"],
      capture_output=True, text=True, timeout=600, cwd=_ROOT, check=False)
  assert out.returncode == 0, out.stderr[-3000:]
  assert "cache_steps=2" in out.stdout
  rows = [l for l in out.stdout.splitlines() if re.match(r"\| 2 \|", l)]
  assert len(rows) == 1, out.stdout
  assert rows[0].rstrip(" |").endswith("100.0%"), rows[0]
  # The per-pair ratio column: a median within its own [min, max].
  med, lo, hi = map(float, re.search(
      r"\| ([0-9.]+)x \[([0-9.]+), ([0-9.]+)\] \|", rows[0]).groups())
  assert 0 < lo <= med <= hi, rows[0]


@pytest.mark.slow
def test_pair_ratios_by_hand():
  # Ratios of the pairs (2/1, 3/1, 4/2) = (2, 3, 2): median 2, min 2, max 3.
  # A subprocess: importing the bench pins the process's CPUs.
  code = ("import sys; sys.argv = ['x']; sys.path.insert(0, 'benchmarks'); "
          "import sampler_bench as b; print(b.pair_ratios([2, 3, 4], [1, 1, 2]))"
          "\ntry:\n  b.pair_ratios([1.0], [1.0, 2.0])\n"
          "except ValueError as e:\n  print('error:', e)")
  out = subprocess.run([sys.executable, "-c", code], capture_output=True,
                       text=True, timeout=300, cwd=_ROOT, check=False)
  assert out.returncode == 0, out.stderr[-3000:]
  lines = out.stdout.strip().splitlines()
  assert lines[0] == "(2.0, 2.0, 3.0)", out.stdout
  assert lines[1].startswith("error: need equal, non-empty timings: 1 and 2")
