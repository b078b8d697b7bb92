"""Training metrics: JSONL + TensorBoard writers, a progress bar, NaN checks.

``WORKDIR/metrics.jsonl`` has one JSON object per logging step (``step``
first, then floats); TensorBoard event files go to ``WORKDIR/tb`` (open with
``tensorboard --logdir WORKDIR/tb``). On resume, records written after the
restored step by the interrupted run are dropped, so the file always
describes one consistent run.

`check_finite` is called at logging steps: a NaN or Inf stops training with
the step, the offending metric and the last good checkpoint in one line.
"""

from __future__ import annotations

import json
import math
import os
import time
from typing import Any, Callable, Mapping

import numpy as np
from tqdm import tqdm

from paraagent_jax import fileio

METRICS_FILE = "metrics.jsonl"
TB_SUBDIR = "tb"


class NonFiniteError(FloatingPointError):
  """A NaN/Inf metric; the message names step, metric and checkpoint."""


def to_floats(metrics: Mapping[str, Any]) -> dict[str, float]:
  """Host floats of scalar metrics (device arrays are fetched here)."""
  out = {}
  for k, v in metrics.items():
    arr = np.asarray(v)
    if arr.size == 1:
      out[k] = float(arr.reshape(()))
  return out


def check_finite(step: int, metrics: Mapping[str, float],
                 last_good: str | Callable[[], str | None] | None,
                 context: str = "") -> None:
  """Raises `NonFiniteError` if any metric is NaN or Inf.

  The message is one line, e.g. ``NaN/Inf in 'loss' at step 37; last good
  checkpoint: /w/sft/checkpoints/30 (not overwritten)``; ``loss`` is named
  first when it is among the non-finite metrics.

  Args:
    step: the training step the metrics belong to.
    metrics: host floats.
    last_good: path of the newest complete checkpoint, None, or a callable
      returning it (called only on failure: it may wait for a pending save).
    context: shown in parentheses after the step (e.g. the RL iteration).
  """
  bad = sorted(k for k, v in metrics.items() if not math.isfinite(v))
  if not bad:
    return
  name = "loss" if "loss" in bad else bad[0]
  if callable(last_good):
    last_good = last_good()
  where = (f"{last_good} (not overwritten)" if last_good
           else "none (no checkpoint was written yet)")
  ctx = f" ({context})" if context else ""
  raise NonFiniteError(f"NaN/Inf in {name!r} at step {step}{ctx}; "
                       f"last good checkpoint: {where}")


def truncate_jsonl(path: str, after_step: int) -> int:
  """Drops records with ``step > after_step``; returns how many were kept."""
  if not fileio.exists(path):
    return 0
  kept = []
  with fileio.open(path) as f:
    for line in f:
      line = line.strip()
      if not line:
        continue
      try:
        rec = json.loads(line)
      except json.JSONDecodeError:
        continue  # A line cut short by a kill mid-write.
      if int(rec.get("step", 0)) <= after_step:
        kept.append(line)
  fileio.write_text_atomic(path, "".join(line + "\n" for line in kept))
  return len(kept)


def read_jsonl(path: str) -> list[dict]:
  """All records of a metrics file (complete lines only)."""
  out = []
  with fileio.open(path) as f:
    for line in f:
      try:
        out.append(json.loads(line))
      except json.JSONDecodeError:
        continue
  return out


class MetricsWriter:
  """Writes metrics to JSONL and TensorBoard, and draws a progress bar.

  Args:
    workdir: the run directory.
    total_steps: for the progress bar.
    start_step: the step training resumes from (0 for a fresh run).
    tensorboard: also write TensorBoard event files.
    progress: show a tqdm bar on stderr.
    is_primary: only the primary host writes files.
  """

  def __init__(self, workdir: str, *, total_steps: int, start_step: int = 0,
               tensorboard: bool = True, progress: bool = True,
               is_primary: bool = True):
    self._primary = is_primary
    self.path = os.path.join(workdir, METRICS_FILE)
    self._jsonl = None
    self._tb = None
    self._bar = None
    if is_primary:
      fileio.makedirs(workdir)
      truncate_jsonl(self.path, start_step)
      # On a bucket an object cannot be appended to: AppendFile rewrites it
      # whole every few seconds and at close (locally: append + flush).
      self._jsonl = fileio.AppendFile(self.path)
      if tensorboard:
        # Optional and heavy (tensorboardX pulls in protobuf): imported only
        # when a run writes TensorBoard events.
        from tensorboardX import SummaryWriter  # pylint: disable=g-import-not-at-top
        self._tb = SummaryWriter(os.path.join(workdir, TB_SUBDIR),
                                 purge_step=start_step + 1)
    if progress and is_primary:
      self._bar = tqdm(total=total_steps, initial=start_step, unit="step",
                       dynamic_ncols=True, mininterval=1.0)
    self._last_time = time.perf_counter()
    self._last_step = start_step
    self._tokens = 0.0

  def add_tokens(self, n: float) -> None:
    """Counts tokens processed since the last `write` (for throughput)."""
    self._tokens += float(n)

  def tick(self, step: int) -> None:
    """Advances the progress bar to ``step``."""
    if self._bar is not None:
      self._bar.update(step - self._bar.n)

  def throughput(self, step: int) -> dict[str, float]:
    """Tokens/s and steps/s since the previous call; resets the counters."""
    now = time.perf_counter()
    dt = max(now - self._last_time, 1e-9)
    out = {"tokens_per_sec": self._tokens / dt,
           "steps_per_sec": (step - self._last_step) / dt}
    self._last_time, self._last_step, self._tokens = now, step, 0.0
    return out

  def write(self, step: int, metrics: Mapping[str, float],
            prefix: str = "train") -> None:
    """Writes one record (host floats) for ``step``."""
    if not self._primary:
      return
    record = {"step": int(step)}
    record.update({f"{prefix}/{k}": float(v) for k, v in metrics.items()})
    self._jsonl.write(json.dumps(record) + "\n")
    if self._tb is not None:
      for k, v in metrics.items():
        self._tb.add_scalar(f"{prefix}/{k}", float(v), step)
    if self._bar is not None and prefix == "train":
      shown = {}
      if "loss" in metrics:
        shown["loss"] = f"{metrics['loss']:.4f}"
      if "tokens_per_sec" in metrics:
        shown["tok/s"] = f"{metrics['tokens_per_sec']:.0f}"
      self._bar.set_postfix(shown, refresh=False)
      self.tick(step)

  def close(self) -> None:
    """Flushes and closes everything (safe to call twice)."""
    if self._bar is not None:
      self._bar.close()
      self._bar = None
    if self._tb is not None:
      self._tb.close()
      self._tb = None
    if self._jsonl is not None:
      self._jsonl.close()
      self._jsonl = None
