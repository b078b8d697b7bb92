"""Orbax checkpoints of a training run: save every N steps, keep K, resume.

A checkpoint is one Orbax step directory ``WORKDIR/checkpoints/<step>/`` with
three items:

* ``model``: the NNX model state (``nnx.split(model)[1]``), sharded arrays;
* ``opt``: the Optax optimizer state, sharded like the parameters;
* ``meta``: JSON: ``step``, the data position (``data.state()``), the base
  RNG key data, and whatever the stage adds (``extra``).

No pickle anywhere: arrays go through TensorStore/OCDBT, the rest is JSON.
Saves are asynchronous (the device-to-host copy happens inside ``save``, so
the caller may donate the arrays right after); `Checkpointer.close` waits for
the last one. Orbax writes a step into a temporary directory and renames it
when complete, so an interrupted save never looks like a checkpoint. A step
that exists but cannot be read (truncated or deleted files) is moved aside
to ``corrupt-<step>`` when an older step restores, and the log says so; if
no step can be read, `CheckpointError` says why in one line. Each finished
step is sealed with ``checksums.json`` (every file's size and SHA-256,
`checksums.write_tree_manifest`), checked before Orbax reads the step, so a
damaged file is named in one line rather than found by TensorStore.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging as std_logging
import os
from typing import Any, Mapping

from absl import logging
import jax
from jax.experimental import multihost_utils
import numpy as np
import orbax.checkpoint as ocp

from paraagent_jax import checksums
from paraagent_jax import fileio

CHECKPOINT_SUBDIR = "checkpoints"


class CheckpointError(RuntimeError):
  """A checkpoint that cannot be read or written; the message is one line."""


@dataclasses.dataclass
class Restored:
  """What `Checkpointer.restore` returns."""

  step: int
  model_state: Any
  opt_state: Any
  data_state: Mapping[str, Any] | None
  rng: jax.Array
  extra: Mapping[str, Any]
  path: str


def rng_to_json(key: jax.Array) -> dict:
  """A PRNG key (typed or raw uint32) as JSON."""
  if jax.dtypes.issubdtype(key.dtype, jax.dtypes.prng_key):
    data = jax.random.key_data(key)
    impl = str(jax.random.key_impl(key))
    return {"typed": True, "impl": impl,
            "data": np.asarray(data).astype(np.uint32).tolist()}
  return {"typed": False, "data": np.asarray(key).astype(np.uint32).tolist()}


def rng_from_json(obj: Mapping[str, Any]) -> jax.Array:
  """Inverse of `rng_to_json`."""
  data = np.asarray(obj["data"], np.uint32)
  if obj.get("typed"):
    return jax.random.wrap_key_data(data, impl=obj["impl"])
  return jax.numpy.asarray(data)


def _one_line(err: BaseException) -> str:
  text = " ".join(str(err).split())
  text = text if len(text) <= 300 else text[:297] + "..."
  return f"{type(err).__name__}: {text}" if text else type(err).__name__


def with_shardings(abstract, shardings):
  """Attaches shardings to an abstract (ShapeDtypeStruct) pytree."""
  return jax.tree.map(
      lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s),
      abstract, shardings)


class Checkpointer:
  """Saves and restores (model, optimizer, step, data position, RNG).

  Args:
    directory: the run's workdir; checkpoints go to ``directory/checkpoints``.
    every_steps: save when ``step % every_steps == 0`` (and at the end via
      ``force=True``); <= 0 saves only when forced.
    keep: keep the last ``keep`` checkpoints (None keeps all).
    async_save: write in a background thread.
  """

  def __init__(self, directory: str, *, every_steps: int = 100,
               keep: int | None = 3, async_save: bool = True):
    self.directory = os.path.join(fileio.abspath(directory),
                                  CHECKPOINT_SUBDIR)
    self.every_steps = int(every_steps)
    self._keep = keep
    self._async = async_save
    self._manager = self._make_manager()

  def _make_manager(self) -> ocp.CheckpointManager:
    # cleanup_tmp_directories: a save killed half way leaves a temporary
    # step directory (never listed as a step); remove it on the next start.
    options = ocp.CheckpointManagerOptions(
        max_to_keep=self._keep, create=True,
        enable_async_checkpointing=self._async, cleanup_tmp_directories=True)
    try:
      return ocp.CheckpointManager(self.directory, options=options,
                                   item_names=("model", "opt", "meta"))
    except (OSError, ValueError) as e:
      raise CheckpointError(f"cannot open checkpoint directory "
                            f"{self.directory}: {_one_line(e)}") from None

  def all_steps(self) -> list[int]:
    """Complete checkpoint steps on disk, ascending."""
    return sorted(self._manager.all_steps())

  def latest_step(self) -> int | None:
    """The newest complete checkpoint step, or None."""
    steps = self.all_steps()
    return steps[-1] if steps else None

  def step_path(self, step: int) -> str:
    """The directory of checkpoint ``step``."""
    return os.path.join(self.directory, str(step))

  def should_save(self, step: int) -> bool:
    """True when ``step`` is a periodic save step."""
    return self.every_steps > 0 and step % self.every_steps == 0

  def save(self, step: int, model_state, opt_state, *,
           data_state: Mapping[str, Any] | None, rng: jax.Array,
           extra: Mapping[str, Any] | None = None,
           force: bool = False) -> bool:
    """Saves step ``step`` if it is a save step (or ``force``).

    Returns:
      True if a save was started.
    """
    if not (force or self.should_save(step)):
      return False
    if step in self._manager.all_steps():
      return False
    # Orbax waits for the previous asynchronous save here anyway; doing it
    # first lets that step be sealed before the next one starts.
    self._manager.wait_until_finished()
    self._seal()
    meta = {"step": int(step), "data": dict(data_state or {}),
            "rng": rng_to_json(rng), "extra": dict(extra or {})}
    self._manager.save(
        step, args=ocp.args.Composite(
            model=ocp.args.StandardSave(model_state),
            opt=ocp.args.StandardSave(opt_state),
            meta=ocp.args.JsonSave(meta)), force=True)
    return True

  def wait(self) -> None:
    """Blocks until the pending asynchronous save is on disk (and sealed)."""
    self._manager.wait_until_finished()
    self._seal()

  def _seal(self) -> None:
    """Writes ``checksums.json`` into finished steps that lack one.

    Only after Orbax has finished (and renamed) a step: the list then
    describes exactly the files a later restore must find. One process
    writes it (a multi-host run shares the directory); remote paths
    (``gs://``) are left to the storage's own integrity checks.
    """
    if (jax.process_index() != 0 or fileio.is_remote(self.directory)
        or not fileio.isdir(self.directory)):
      return
    for step in self._manager.all_steps():
      path = self.step_path(step)
      if fileio.isdir(path) and not fileio.exists(
          os.path.join(path, checksums.TREE_MANIFEST)):
        try:
          checksums.write_tree_manifest(path)
        except OSError as e:   # never stop training for the seal itself
          logging.warning("could not write %s in %s: %s",
                          checksums.TREE_MANIFEST, path, _one_line(e))

  def last_complete(self) -> str | None:
    """Path of the newest checkpoint on disk (after pending saves finish)."""
    self.wait()
    step = self.latest_step()
    return None if step is None else self.step_path(step)

  def _restore_step(self, step, abstract_model, abstract_opt) -> Restored:
    verify_step(self.step_path(step), step)
    out = self._manager.restore(step, args=ocp.args.Composite(
        model=ocp.args.StandardRestore(abstract_model),
        opt=ocp.args.StandardRestore(abstract_opt),
        meta=ocp.args.JsonRestore()))
    meta = out.meta
    if not isinstance(meta, Mapping) or int(meta.get("step", -1)) != step:
      raise CheckpointError(f"metadata of step {step} is missing or wrong")
    return Restored(step=step, model_state=out.model, opt_state=out.opt,
                    data_state=meta.get("data"),
                    rng=rng_from_json(meta["rng"]),
                    extra=meta.get("extra", {}), path=self.step_path(step))

  def restore(self, abstract_model, abstract_opt) -> Restored | None:
    """Restores the newest readable checkpoint, or None if there is none.

    ``abstract_*`` are pytrees of `jax.ShapeDtypeStruct` with shardings
    (see `with_shardings`): arrays come back laid out on the mesh.

    Raises:
      CheckpointError: checkpoints exist but none can be read.
    """
    steps = self.all_steps()
    failures = []
    for step in reversed(steps):
      try:
        restored = self._restore_step(step, abstract_model, abstract_opt)
      except (CheckpointError, OSError, ValueError, KeyError, TypeError,
              RuntimeError) as e:
        # Orbax/TensorStore raise these for missing or truncated files and
        # for a tree that does not match (a changed config).
        failures.append((step, _one_line(e)))
        logging.warning("checkpoint step %d in %s is unreadable: %s", step,
                        self.directory, failures[-1][1])
        continue
      if failures:
        self._set_aside(failures, step)
      return restored
    if failures:
      step, why = failures[0]
      raise CheckpointError(
          f"no readable checkpoint in {self.directory} (tried steps "
          f"{[s for s, _ in failures]}); step {step}: {why}. Move the "
          f"directory away to start afresh")
    return None

  def _set_aside(self, failures, good_step) -> None:
    # Several processes share the directory: process 0 moves the steps, the
    # others wait for it (every process found the same steps unreadable).
    for step, why in failures:
      src = self.step_path(step)
      dst = os.path.join(self.directory, f"corrupt-{step}")
      if jax.process_index() == 0:
        fileio.rename(src, dst)
      logging.warning("moved unreadable checkpoint %s to %s; resuming from "
                      "step %d", src, dst, good_step)
      print(f"checkpoint: step {step} unreadable ({why}), moved to {dst}; "
            f"resuming from step {good_step}", flush=True)
    if jax.process_count() > 1:
      multihost_utils.sync_global_devices("checkpoint: unreadable steps set aside")
    # The manager caches its step list; reopen it on the cleaned directory.
    self._manager.close()
    self._manager = self._make_manager()

  def close(self) -> None:
    """Waits for pending saves, seals them and releases the manager."""
    self._manager.wait_until_finished()
    self._seal()
    self._manager.close()


def verify_step(step_dir: str, step: int) -> None:
  """Checks a step against the ``checksums.json`` written when it was saved.

  Steps without one (saved by an older version, or killed before sealing)
  pass; Orbax's own errors still catch what they can.

  Raises:
    CheckpointError: a file is missing, shorter/longer or different (one
      line naming the step and the file).
  """
  try:
    checksums.verify_tree_manifest(step_dir)
  except ValueError as e:
    raise CheckpointError(f"step {step} ({step_dir}): {e}") from None


def saved_steps(root: str) -> list[int]:
  """The steps with a saved model under a checkpoint root, ascending."""
  if not fileio.isdir(root):
    return []
  return sorted(int(d) for d in fileio.listdir(root)
                if d.isdigit() and fileio.isdir(os.path.join(root, d, "model")))


def find_checkpoint(path: str) -> tuple[str, int] | None:
  """Resolves an Orbax ``init_from`` path to (checkpoint root, step).

  Accepts a run's workdir, its ``checkpoints`` directory, or one step
  directory. Returns None if ``path`` holds no Orbax checkpoint.
  """
  path = fileio.abspath(path)
  candidates = [os.path.join(path, CHECKPOINT_SUBDIR), path]
  for root in candidates:
    steps = saved_steps(root)
    if steps:
      return root, steps[-1]
  base = os.path.basename(path)
  if base.isdigit() and fileio.isdir(os.path.join(path, "model")):
    return os.path.dirname(path), int(base)
  return None


PIPELINE_STAGES = ("rl", "sft")   # the stages that hold a model, last first


def pipeline_hint(path: str) -> str:
  """For a pipeline's root directory (no checkpoint of its own, stage
  directories below), the sentence that points at the stage to use; else "".
  """
  if not fileio.isdir(path) or find_checkpoint(path) is not None:
    return ""
  for stage in PIPELINE_STAGES:
    sub = os.path.join(path, stage)
    if find_checkpoint(sub) is not None:
      return (f"{path} is a pipeline directory; its model is in {sub} "
              f"(use {sub}, or {os.path.join(path, 'sft')} for the SFT policy)"
              if stage == "rl" else
              f"{path} is a pipeline directory; its model is in {sub}")
  return ""


@contextlib.contextmanager
def _absl_at_least(level: int):
  """Raises the absl logger's level for the ``with`` body."""
  logger = std_logging.getLogger("absl")
  old = logger.level
  logger.setLevel(max(level, old))
  try:
    yield
  finally:
    logger.setLevel(old)


def restore_model_state(path: str, abstract_model):
  """Model weights only, from an Orbax checkpoint (``init_from``).

  Raises:
    CheckpointError: ``path`` holds no readable checkpoint.
  """
  found = find_checkpoint(path)
  if found is None:
    raise CheckpointError(f"init_from={path}: no Orbax checkpoint there")
  root, step = found
  try:
    verify_step(os.path.join(root, str(step)), step)
  except CheckpointError as e:
    raise CheckpointError(f"init_from={path}: {e}") from None
  # A read-only manager (init_from may be a shipped, read-only directory).
  # Orbax logs three WARNING lines for that choice ("read_only=True, setting
  # create=False", "Given directory is read only"), one per restore; they
  # describe what was asked for, so they are dropped here.
  with _absl_at_least(std_logging.ERROR):
    manager = ocp.CheckpointManager(
        root, options=ocp.CheckpointManagerOptions(read_only=True),
        item_names=("model", "opt", "meta"))
  try:
    out = manager.restore(step, args=ocp.args.Composite(
        model=ocp.args.StandardRestore(abstract_model)))
  except (OSError, ValueError, KeyError, TypeError, RuntimeError) as e:
    raise CheckpointError(f"init_from={path}: cannot read step {step}: "
                          f"{_one_line(e)}") from None
  finally:
    manager.close()
  return out.model
