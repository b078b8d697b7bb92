"""benchmarks/sampler_bench.py end to end at a tiny size (a subprocess: the
script pins the process's CPUs and sets XLA_FLAGS before JAX starts)."""

import os
import re
import subprocess
import sys

_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_sampler_bench_runs_with_a_growing_cache_and_matches_transformers():
  # prompt 8 + 8 new tokens, cache_steps=2: the cache starts at 8 slots and
  # grows to 16 during decode; the tokens must still equal transformers'.
  out = subprocess.run(
      [sys.executable, os.path.join(_ROOT, "benchmarks", "sampler_bench.py"),
       "--batches=2", "--prompt_len=8", "--new_tokens=8", "--repeats=1",
       "--cache_steps=2"],
      capture_output=True, text=True, timeout=600, cwd=_ROOT, check=False)
  assert out.returncode == 0, out.stderr[-3000:]
  assert "cache_steps=2" in out.stdout
  rows = [l for l in out.stdout.splitlines() if re.match(r"\| 2 \|", l)]
  assert len(rows) == 1, out.stdout
  assert rows[0].rstrip(" |").endswith("100.0%"), rows[0]
