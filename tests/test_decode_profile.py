"""benchmarks/decode_profile.py: one profiled decode call, its per-op table.

Run as a subprocess: the script pins its process to one CPU and sets XLA's
dump flag before JAX starts, neither of which may touch the test process.
"""

import os
import re
import subprocess
import sys

from paraagent_jax.models import qwen3

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_profile_table_accounts_for_the_traced_thunks():
  res = subprocess.run(
      [sys.executable, os.path.join("benchmarks", "decode_profile.py"),
       "--batch=2", "--prompt_len=8", "--new_tokens=4", "--top=6"],
      cwd=ROOT, capture_output=True, text=True, timeout=600, check=False)
  assert res.returncode == 0, res.stderr[-3000:]
  out = res.stdout
  summed = float(re.search(r"thunks summed: ([\d.]+) s", out).group(1))
  assert summed > 0
  rows = re.findall(r"^\| (.+?) \| (.*?) \| ([\d.]+) \| ([\d.]+)% \|", out, re.M)
  assert len(rows) == 7, out            # --top rows + "the other groups"
  # The rows partition the traced thunks: their times add up to the total.
  assert abs(sum(float(r[2]) for r in rows) - summed) <= 1e-4 * (len(rows) + 1)
  # Every decode step runs the LM head: a dot with a [batch, vocab] output
  # (the demo-size model of sampler_bench: vocab 4096; on the CPU the head's
  # weight is the transposed embedding with DECODE_HEAD_PAD zero columns).
  vocab = 4096 + qwen3.DECODE_HEAD_PAD
  assert any("dot_general" in r[0] and r[1] == f"f32[2,{vocab}]"
             for r in rows), out
  floor = float(re.search(r"dense matmuls alone.*\| ([\d.]+) \|", out).group(1))
  assert floor > 0
  torch_floor = float(re.search(r"matmuls in torch.*\| ([\d.]+) \|", out).group(1))
  assert torch_floor > 0
  # The torch peer runs the same function on the same weights.
  diff = float(re.search(r"outputs differ by at most ([\d.e+-]+)", out).group(1))
  assert diff < 1e-5, out
