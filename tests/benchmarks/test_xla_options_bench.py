"""benchmarks/xla_options_bench.py: variants compiled in one process, one table.

The timed run is a subprocess: the script pins its process to one CPU (through
sampler_bench) before JAX starts, which must not touch the test process. The
parser test imports the script in-process and undoes that pinning and its
XLA_FLAGS edit (JAX has started by then, so they could not have acted on it).
"""

import json
import os
import re
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BENCH = os.path.join("benchmarks", "xla_options_bench.py")


def _run(*args):
  return subprocess.run([sys.executable, BENCH, *args], cwd=ROOT,
                        capture_output=True, text=True, timeout=600,
                        check=False)


@pytest.mark.slow
def test_table_rows_per_variant_with_same_tokens():
  variants = {"default": {},
              "own dots": {"xla_cpu_experimental_ynn_fusion_type": ""}}
  res = _run("--batch=2", "--prompt_len=8", "--new_tokens=4", "--repeats=1",
             "--variants=" + json.dumps(variants))
  assert res.returncode == 0, res.stderr[-3000:]
  rows = re.findall(r"^\| (default|own dots) \| (.*?) \| ([\d.]+) \| "
                    r"([\d.]+)x \| ([\d.]+)% \|", res.stdout, re.M)
  assert [r[0] for r in rows] == ["default", "own dots"], res.stdout
  assert rows[0][1] == "-" and "ynn_fusion_type=''" in rows[1][1]
  assert rows[0][3] == "1.00"                   # the first is the baseline
  # XLA's own dots compute the same fp32 products: the same greedy tokens.
  assert all(float(r[4]) == 100.0 for r in rows), res.stdout
  assert all(float(r[2]) > 0 for r in rows)


def _parse_variants():
  """The bench's parser, imported without keeping the pinning of its import."""
  cpus, flags = os.sched_getaffinity(0), os.environ.get("XLA_FLAGS")
  sys.path.insert(0, os.path.join(ROOT, "benchmarks"))
  try:
    import xla_options_bench  # pylint: disable=g-import-not-at-top,import-outside-toplevel
  finally:
    sys.path.pop(0)
    os.sched_setaffinity(0, cpus)
    if flags is None:
      os.environ.pop("XLA_FLAGS", None)
    else:
      os.environ["XLA_FLAGS"] = flags
  return xla_options_bench.parse_variants


def test_variants_parse_and_malformed_ones_are_refused():
  parse = _parse_variants()
  assert "default" in parse(None) and parse("") == parse(None)
  assert parse('{"a": {}, "b": {"xla_cpu_prefer_vector_width": 512}}') == {
      "a": {}, "b": {"xla_cpu_prefer_vector_width": 512}}
  for bad, msg in [("{not json", "not JSON"),
                   ('{"a": 1}', "non-empty JSON object"),
                   ("{}", "non-empty JSON object"),
                   ('{"a": {"cpu_flag": 1}}', "not an XLA option name"),
                   ('{"a": {"xla_x": [1]}}', "not an XLA option name")]:
    with pytest.raises(ValueError, match=msg):
      parse(bad)
