"""A run directory in a bucket, end to end: ``--workdir=gs://...`` on a GCS
emulator (tests/gcs_emulator.py), the way a TPU pod's hosts share one.

The runlocal pipeline from scratch (demos -> SFT -> RL), then `evaluate`
of its RL checkpoint and `export_hf` of it, all reading and writing the
bucket; the exported HF directory loads back from the bucket. Nothing of the
run lands on the local disk outside the documented caches: no ``gs:`` folder
in the working directory, and no file in the temporary directory the
commands were given (the tokenizer's temporary local copies are removed).
"""

import os
import subprocess
import sys

from flax import nnx
import jax
import numpy as np
import pytest

from paraagent_jax import fileio
from paraagent_jax.models import hf_io
from tests.gcs_emulator import emulator_env

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _run(env, cwd, module, *args):
  p = subprocess.run([sys.executable, "-m", f"paraagent_jax.{module}", *args],
                     cwd=cwd, env=env, capture_output=True, text=True,
                     timeout=2400)
  assert p.returncode == 0, (module, p.stderr[-3000:])
  return p


@pytest.mark.slow
def test_runlocal_pipeline_evaluate_and_export_on_a_bucket(gcs_bucket, tmp_path):
  cwd, tmp = tmp_path / "cwd", tmp_path / "tmp"
  cwd.mkdir()
  tmp.mkdir()
  env = emulator_env(dict(os.environ, PYTHONPATH=ROOT, JAX_PLATFORMS="cpu",
                          TMPDIR=str(tmp)))
  env.pop("XLA_FLAGS", None)
  run = f"{gcs_bucket}/run"
  _run(env, cwd, "train",
       f"--config={ROOT}/configs/demo.py:runlocal,from_scratch=True,progress=False",
       f"--workdir={run}")
  for stage in ("demos", "sft", "rl"):
    assert fileio.isdir(f"{run}/{stage}"), stage
  assert fileio.isfile(f"{run}/rl/DONE.json")
  assert fileio.isfile(f"{run}/rl/metrics.jsonl")
  assert fileio.listdir(f"{run}/rl/checkpoints")
  assert not fileio.exists(f"{run}/rl/.lock")        # released at the end

  out = _run(env, cwd, "evaluate",
             f"--config={ROOT}/configs/evaluate.py:runlocal",
             f"--checkpoint={run}/rl", f"--workdir={gcs_bucket}/eval")
  assert fileio.listdir(f"{gcs_bucket}/eval"), out.stdout[-2000:]

  _run(env, cwd, "export_hf", f"--workdir={run}/rl", f"--out={gcs_bucket}/hf")
  names = set(fileio.listdir(f"{gcs_bucket}/hf"))
  assert {"config.json", "model.safetensors", "tokenizer.json",
          "README.md"} <= names, names
  model = hf_io.load_hf(f"{gcs_bucket}/hf")
  assert all(np.isfinite(np.asarray(x)).all()
             for x in jax.tree.leaves(nnx.state(model)))

  assert not os.path.exists(cwd / "gs:"), os.listdir(cwd)
  assert not os.path.exists(os.path.join(ROOT, "gs:"))
  # No file in the temporary directory. TFDS leaves empty ones of its own
  # (dataset_info.initialize_from_bucket: a mkdtemp("tfds") it never removes,
  # also on a local run).
  left = [os.path.join(d, f) for d, _, files in os.walk(tmp) for f in files]
  assert left == [], left
  assert all(n.endswith("tfds") for n in os.listdir(tmp)), os.listdir(tmp)
