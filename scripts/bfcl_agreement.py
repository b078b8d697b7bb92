"""Agreement of our BFCL checker with BFCL's own ``ast_checker``.

Runs both checkers on every gold answer (the oracle's calls) and on perturbed
answers (wrong value, dropped parameter, string variant, int for float, wrong
type, extra parameter, extra call, missing call, swapped order, wrong name) of
the simple_python / multiple / parallel / parallel_multiple categories, and
prints the agreement per category and per perturbation kind.

BFCL's pinned dependencies clash with ours, so its checker runs in a scratch
virtual environment, in a child process fed JSON on stdin:

    python3 -m venv /tmp/bfcl-venv
    /tmp/bfcl-venv/bin/pip install bfcl-eval==2026.3.23 soundfile
    pip download --no-deps bfcl-eval==2026.3.23 -d ~/.cache/toolenv   # the data
    .venv/bin/python scripts/bfcl_agreement.py [--bfcl-python /tmp/bfcl-venv/bin/python]
        [--source WHEEL_OR_DATA_DIR] [--per-entry 3] [--show 10]

(``soundfile`` is imported by a BFCL dependency, qwen-agent, but not declared.)
Exit status 0 when every verdict agrees.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import random
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from toolenv.benchmarks import bfcl as ours  # pylint: disable=wrong-import-position
from toolenv.catalog import bfcl as data  # pylint: disable=wrong-import-position

CATEGORIES = ("simple_python", "multiple", "parallel", "parallel_multiple")
# A model whose config keeps dots in function names (no renaming).
_MODEL = "gorilla-openfunctions-v2"

_CHILD = r"""
import json, sys
from bfcl_eval.eval_checker.ast_eval.ast_checker import ast_checker
from bfcl_eval.constants.enums import Language
out = []
for line in sys.stdin:
  c = json.loads(line)
  try:
    r = ast_checker(c["functions"], c["calls"], c["answer"], Language.PYTHON,
                    c["category"], MODEL)
    out.append([bool(r["valid"]), r.get("error_type", "")])
  except Exception as e:  # A crash is a verdict to report, not to hide.
    out.append([None, f"crash: {type(e).__name__}: {e}"[:200]])
json.dump(out, sys.stdout)
"""


def bfcl_verdicts(python: str, cases: list[dict]) -> list[list]:
  """BFCL's ``ast_checker`` verdicts, computed in the scratch venv."""
  body = "".join(json.dumps(c) + "\n" for c in cases)
  proc = subprocess.run([python, "-c", f"MODEL = {_MODEL!r}\n" + _CHILD],
                        input=body, capture_output=True, text=True, check=False)
  if proc.returncode != 0:
    raise RuntimeError(f"BFCL checker failed: {proc.stderr[-2000:]}")
  return json.loads(proc.stdout)


def make_cases(entries, per_entry: int, seed: int = 0) -> list[dict]:
  """Gold and perturbed answers of every entry, as checker inputs."""
  rng = random.Random(seed)
  cases = []
  for e in entries:
    base = {"id": e.id, "category": e.category, "functions": e.functions,
            "answer": e.ground_truth}
    cases.append(dict(base, kind="gold", calls=ours.gold_calls(e)))
    for _ in range(per_entry):
      for kind, calls in ours.perturb(e, rng):
        cases.append(dict(base, kind=kind, calls=calls))
  return cases


def main(argv: list[str] | None = None) -> int:
  """Runs the comparison and prints the agreement table."""
  ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  ap.add_argument("--bfcl-python", default="/tmp/bfcl-venv/bin/python")
  ap.add_argument("--source", default=None, help="bfcl-eval wheel or data dir")
  ap.add_argument("--per-entry", type=int, default=1,
                  help="rounds of perturbations per entry")
  ap.add_argument("--show", type=int, default=10, help="disagreements shown")
  args = ap.parse_args(argv)
  entries = data.load_entries(args.source or data.default_source(), CATEGORIES)
  cases = make_cases(entries, args.per_entry)
  theirs = bfcl_verdicts(args.bfcl_python, cases)
  by = collections.defaultdict(lambda: [0, 0])
  bad = []
  for c, (valid, err) in zip(cases, theirs):
    entry = data.BFCLEntry(c["id"], c["category"], [], c["functions"],
                           c["answer"])
    mine, why = ours.check(entry, c["calls"])
    agree = valid is not None and mine == valid
    for key in (("category", c["category"]), ("kind", c["kind"]),
                ("all", "all")):
      by[key][0] += agree
      by[key][1] += 1
    if not agree:
      bad.append((c, valid, err, mine, why))
  gold = by[("kind", "gold")]
  perturbed = (by[("all", "all")][0] - gold[0], by[("all", "all")][1] - gold[1])
  print(f"BFCL ast_checker agreement ({data.BFCL_VERSION}): gold "
        f"{gold[0]}/{gold[1]}, perturbed {perturbed[0]}/{perturbed[1]}")
  for (group, name), (a, n) in sorted(by.items()):
    if group != "all":
      print(f"  {group:8s} {name:20s} {a:5d}/{n:<5d} {a / n:.4f}")
  for c, valid, err, mine, why in bad[:args.show]:
    print(f"DISAGREE {c['id']} {c['kind']}: bfcl={valid} ({err}) ours={mine} "
          f"({why}) calls={json.dumps(c['calls'])[:300]}")
  return 0 if not bad else 1


if __name__ == "__main__":
  sys.exit(main())
