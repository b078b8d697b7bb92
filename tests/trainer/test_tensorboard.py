"""Training metrics are viewable in TensorBoard: its own reader sees them.

`paraagent_jax.metrics.MetricsWriter` writes ``WORKDIR/metrics.jsonl`` and
``WORKDIR/tb`` event files; here TensorBoard's `EventAccumulator` (what
``tensorboard --logdir`` uses) reads the events back, including after a
resume that rewrites the steps an interrupted run had logged.
"""

import time

import pytest

from paraagent_jax import metrics as metrics_lib

event_accumulator = pytest.importorskip(
    "tensorboard.backend.event_processing.event_accumulator")


def scalars(logdir, tag):
  acc = event_accumulator.EventAccumulator(logdir)
  acc.Reload()
  return {e.step: round(e.value, 6) for e in acc.Scalars(tag)}


def test_tensorboard_reads_what_the_jsonl_says(tmp_path):
  w = metrics_lib.MetricsWriter(str(tmp_path), total_steps=4, progress=False)
  for step in range(1, 5):
    w.write(step, {"loss": 1.0 / step, "tokens_per_sec": 100.0 * step})
  w.write(4, {"loss": 0.5}, prefix="eval")
  w.close()
  tb = str(tmp_path / metrics_lib.TB_SUBDIR)
  assert scalars(tb, "train/loss") == {1: 1.0, 2: 0.5, 3: 0.333333, 4: 0.25}
  assert scalars(tb, "eval/loss") == {4: 0.5}
  jsonl = metrics_lib.read_jsonl(str(tmp_path / metrics_lib.METRICS_FILE))
  assert [r["train/loss"] for r in jsonl if "train/loss" in r] == [
      1.0, 0.5, 1.0 / 3, 0.25]


def test_resume_replaces_the_interrupted_steps(tmp_path):
  w = metrics_lib.MetricsWriter(str(tmp_path), total_steps=4, progress=False)
  for step in range(1, 5):
    w.write(step, {"loss": float(step)})
  w.close()
  # Event files are named by the second they were opened in: a resume in the
  # same second would overwrite the first file (never happens in a real run).
  time.sleep(1.1)
  # Resumed from the step-2 checkpoint: steps 3 and 4 are redone.
  w = metrics_lib.MetricsWriter(str(tmp_path), total_steps=4, start_step=2,
                                progress=False)
  for step in (3, 4):
    w.write(step, {"loss": 10.0 * step})
  w.close()
  tb = str(tmp_path / metrics_lib.TB_SUBDIR)
  assert scalars(tb, "train/loss") == {1: 1.0, 2: 2.0, 3: 30.0, 4: 40.0}
