"""CI runs the Colab notebooks end to end on the CPU (nbclient, small sizes).

The quickstart runs with ``QUICKSTART_SMALL=1``: every stage of the tiny demo
pipeline, then evaluation. Checks are on facts known without the notebook:
the scripted oracle solves every task (ToolEnv's guarantee, tested in
tests/paraact/test_strategies.py), and each stage leaves its files.
"""

import json
import os
import re

import pytest

nbformat = pytest.importorskip("nbformat")
nbclient = pytest.importorskip("nbclient")

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
NOTEBOOKS = os.path.join(ROOT, "notebooks")


def execute(name: str, env: dict[str, str]):
  """Runs notebooks/<name> in a fresh kernel started in notebooks/."""
  nb = nbformat.read(os.path.join(NOTEBOOKS, name), as_version=4)
  old = {k: os.environ.get(k) for k in env}
  os.environ.update(env)   # The kernel inherits this process's environment.
  try:
    nbclient.NotebookClient(
        # Per cell: minutes of CPU, but a shared 2-core VM can starve it.
        nb, timeout=3600, kernel_name="python3",
        resources={"metadata": {"path": NOTEBOOKS}}).execute()
  finally:
    for k, v in old.items():
      if v is None:
        os.environ.pop(k, None)
      else:
        os.environ[k] = v
  return nb


def text_of(nb) -> str:
  parts = []
  for cell in nb.cells:
    for out in cell.get("outputs", []):
      if out.get("output_type") == "stream":
        parts.append(out["text"])
      elif "data" in out and "text/plain" in out["data"]:
        parts.append(out["data"]["text/plain"])
      elif "data" in out and "text/markdown" in out["data"]:
        parts.append(out["data"]["text/markdown"])
  return "\n".join(parts)


@pytest.mark.slow
def test_quickstart_runs_end_to_end(tmp_path):
  work = str(tmp_path / "qs")
  nb = execute("quickstart.ipynb", {"QUICKSTART_SMALL": "1",
                                    "QUICKSTART_WORKDIR": work,
                                    "JAX_PLATFORMS": "cpu"})
  nbformat.write(nb, str(tmp_path / "quickstart.executed.ipynb"))  # to inspect
  out = text_of(nb)
  # Section 1 and 2: the oracle's episodes succeed, in ToolEnv and through
  # the text protocol.
  assert "success:    True" in out
  assert re.findall(r"success=(\w+)", out) == ["True"] * 4
  # Section 3: every stage finished and logged.
  for stage in ("demos", "sft", "sft2", "rl"):
    assert os.path.exists(os.path.join(work, stage, "DONE.json")), stage
  assert os.path.exists(os.path.join(work, "rl", "metrics.jsonl"))
  assert os.listdir(os.path.join(work, "sft", "tb"))   # TensorBoard events
  # Section 4: reports for the oracle and the trained policy.
  with open(os.path.join(work, "eval_oracle", "report.json")) as f:
    (oracle,) = json.load(f)["runs"]
  assert oracle["policy"] == "oracle" and oracle["overall"]["n"] == 5
  assert oracle["overall"]["success"] == 1.0
  with open(os.path.join(work, "eval_rl", "report.json")) as f:
    (trained,) = json.load(f)["runs"]
  assert trained["policy"] == "rl" and trained["overall"]["n"] == 5
  assert os.path.exists(os.path.join(work, "eval_rl", "report.md"))
  assert any(f.endswith(".png") for f in os.listdir(os.path.join(work, "eval_rl")))
