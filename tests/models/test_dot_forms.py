"""benchmarks/dot_forms.py at a tiny size (a subprocess: the script pins the
process to one CPU and sets XLA_FLAGS before JAX starts)."""

import os
import re
import subprocess
import sys

_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_dot_forms_prints_every_form_with_the_same_products():
  out = subprocess.run(
      [sys.executable, os.path.join(_ROOT, "benchmarks", "dot_forms.py"),
       "--batch=4", "--shapes=16x24,24x8", "--layers=2", "--calls=3",
       "--repeats=2"],
      capture_output=True, text=True, timeout=600, cwd=_ROOT, check=False)
  assert out.returncode == 0, out.stderr[-3000:]
  rows = re.findall(r"^\| (\d+) x (\d+) \| (.+?) \| (\d+) \| ([\d.e+-]+) \|$",
                    out.stdout, re.M)
  assert [r[:2] for r in rows] == [("16", "24")] * 4 + [("24", "8")] * 4, out.stdout
  forms = [r[2] for r in rows[:4]]
  assert len(set(forms)) == 4 and "(decode_weights)" in forms[1], forms
  # The first form is the reference; every form computes the same products
  # (inputs ~N(0, 1) x N(0, 0.05): outputs of order 1, fp32 rounding).
  assert [float(r[4]) for r in rows[::4]] == [0.0, 0.0]
  assert max(float(r[4]) for r in rows) < 1e-5, out.stdout
