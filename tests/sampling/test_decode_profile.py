"""benchmarks/decode_profile.py: one profiled decode call, its per-op table.

Run as a subprocess: the script pins its process to one CPU and sets XLA's
dump flag before JAX starts, neither of which may touch the test process.
"""

import os
import re
import subprocess
import sys
import pytest


ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.mark.slow
def test_profile_table_accounts_for_the_traced_thunks():
  # A cache that grows once in the call (8 then 16 slots: the 4-token prompt
  # fits 8, the 12 new tokens need 16), so two decode programs and a resize
  # run in the traced call, as with the CPU default at the bench's size.
  res = subprocess.run(
      [sys.executable, os.path.join("benchmarks", "decode_profile.py"),
       "--batch=2", "--prompt_len=4", "--new_tokens=12", "--top=80",
       "--cache_steps=2"],
      cwd=ROOT, capture_output=True, text=True, timeout=600, check=False)
  assert res.returncode == 0, res.stderr[-3000:]
  out = res.stdout
  summed = float(re.search(r"thunks summed: ([\d.]+) s", out).group(1))
  assert summed > 0
  assert "decode programs at 8, 16 cache slots (cache_steps=2), 1 resizes" in out
  rows = re.findall(r"^\| (.+?) \| (.*?) \| ([\d.]+) \| ([\d.]+)% \| (\S+) \|",
                    out, re.M)
  assert rows[-1][0] == "(the other 0 groups)", out   # --top covers them all
  assert ("resize (copy into the next size)", "8 -> 16 slots") in [
      r[:2] for r in rows], out
  # The rows partition the traced thunks: their times add up to the total.
  assert abs(sum(float(r[2]) for r in rows) - summed) <= 1e-4 * (len(rows) + 1)
  # Every decode step runs the LM head: a dot with a [vocab, batch] output
  # (the demo-size model of sampler_bench: vocab 4096; on the CPU the decode
  # writes the head's product out-major, `cached_forward.decode_weights`).
  # Both programs' runs are mapped: one head per step over all 12 steps.
  head = [r for r in rows if "dot_general" in r[0] and r[1] == "f32[4096,2]"]
  assert [r[4] for r in head] == ["1.0"], out
  # The MLP's gate and up too: 2 a layer (4 layers), [intermediate, batch].
  mlp = [r for r in rows if "dot_general" in r[0] and r[1] == "f32[768,2]"]
  assert [r[4] for r in mlp] == ["8.0"], out
  # The scores' slots axis is written S: programs of both sizes in one row.
  assert any(r[1] == "f32[2,2,2,S]" for r in rows), out
  floor = float(re.search(r"dense matmuls alone.*\| ([\d.]+) \|", out).group(1))
  assert floor > 0
  torch_floor = float(re.search(r"matmuls in torch.*\| ([\d.]+) \|", out).group(1))
  assert torch_floor > 0
  om_floor = float(re.search(r"out-major as the decode's.*\| ([\d.]+) \|",
                             out).group(1))
  assert om_floor > 0
  # The torch peer and the out-major chain run the same products on the same
  # weights.
  diffs = re.search(r"differ by at most ([\d.e+-]+), the jitted and out-major "
                    r"ones by at most ([\d.e+-]+)", out)
  assert diffs and max(float(diffs.group(1)), float(diffs.group(2))) < 1e-5, out
