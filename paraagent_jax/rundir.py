"""A run directory: its lock, its config, its tokenizer and its model.

Everything that opens a run's directory goes through here, so every entry
point agrees on where things are:

* the lock (`held`): one run per workdir. ``train`` takes ``WORKDIR/.lock``
  before it writes anything and removes it when it exits (normally, on an
  error or on an interrupt). A second command on the same workdir stops with
  one line naming the owner. A lock left by a process that is gone is stale:
  on the same host the pid is checked and the lock is taken over with a note;
  a lock from another host cannot be checked from here, so the message says
  which file to delete. Only the primary process takes it. On a bucket the
  lock is an object created only if absent (``ifGenerationMatch=0``,
  `fileio.create_exclusive`); ``PARAAGENT_NO_LOCK=1`` turns it off for file
  systems without exclusive create.
* ``config.json`` (`write_config`, `load_run_config`): the run's config, which
  `evaluate --checkpoint` and `export_hf --workdir` read the model from,
  and ``machine.json`` beside it (where the run ran: `provenance`);
* the tokenizer (`tokenizer_dir`): ``rl.tokenizer``, ``data.tokenizer``, else
  the demonstrations' (``data.data_dir/tokenizer``) or ``init_from``'s;
* the model (`model_config`, `check_init_from`, `load_model`): from an HF
  directory or an Orbax training workdir.

Paths may be local or ``gs://``: every read and write goes through
`paraagent_jax.fileio`, whose writes are atomic.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import socket
import sys
import time
from typing import Any

from flax import nnx
import jax
import jax.numpy as jnp
import ml_collections

from paraagent_jax import checkpoint as ckpt_lib
from paraagent_jax import config_utils
from paraagent_jax import fileio
from paraagent_jax import provenance
from paraagent_jax import sharding as shd
from paraagent_jax.models import hf_io
from paraagent_jax.models import qwen3

CONFIG_FILE = "config.json"


# ----------------------------------------------------------------------------
# The lock: one run per workdir.
# ----------------------------------------------------------------------------

LOCK_FILE = ".lock"


class WorkdirLocked(config_utils.ConfigError):
  """Another live run holds the workdir; the message is one line."""


def _alive(pid: int) -> bool:
  try:
    os.kill(pid, 0)
  except ProcessLookupError:
    return False
  except PermissionError:    # exists, owned by another user
    return True
  return True


def _read(path: str) -> dict:
  try:
    with fileio.open(path) as f:
      return json.load(f)
  except (OSError, ValueError):
    return {}   # half-written or garbage: treated as stale below


def acquire(workdir: str) -> str:
  """Takes ``workdir/.lock``; returns its path ("" if this process already
  holds it). Raises `WorkdirLocked` if a live run holds it."""
  try:
    fileio.makedirs(workdir)
  except OSError as e:   # a parent is a file, no permission, read-only disk
    raise config_utils.ConfigError(
        f"workdir {workdir}: cannot create it ({e.strerror or e})") from None
  path = os.path.join(workdir, LOCK_FILE)
  host = socket.gethostname()
  me = {"pid": os.getpid(), "host": host, "since": time.strftime(
      "%Y-%m-%d %H:%M:%S"), "argv": " ".join(sys.argv)}
  for _ in range(3):
    if fileio.create_exclusive(path, json.dumps(me)):
      return path
    owner = _read(path)
    pid, where = owner.get("pid"), owner.get("host")
    if isinstance(pid, int) and where == host and _alive(pid):
      if pid == os.getpid():
        return ""            # already ours: the outer holder releases it
      raise WorkdirLocked(
          f"workdir {workdir} is in use by pid {pid} on {host} since "
          f"{owner.get('since', '?')} ({owner.get('argv', '')[:120]}); wait "
          f"for it to finish or stop it, then rerun to resume")
    if isinstance(pid, int) and where and where != host:
      raise WorkdirLocked(
          f"workdir {workdir} is locked by pid {pid} on host {where} since "
          f"{owner.get('since', '?')}; if no run is active there, delete "
          f"{path} and rerun")
    print(f"workdir lock: taking over a stale lock ({path}: pid {pid} on "
          f"{where} is not running)", file=sys.stderr, flush=True)
    with contextlib.suppress(FileNotFoundError):
      fileio.remove(path)
  raise WorkdirLocked(f"workdir {workdir}: could not take {path} (another run "
                      f"keeps creating it)")


def release(path: str) -> None:
  """Removes the lock if this process owns it."""
  if _read(path).get("pid") == os.getpid():
    with contextlib.suppress(FileNotFoundError):
      fileio.remove(path)


@contextlib.contextmanager
def held(workdir: str, enabled: bool = True):
  """Holds the workdir lock for the ``with`` body (no-op when disabled)."""
  if not enabled or os.environ.get("PARAAGENT_NO_LOCK") == "1":
    yield None
    return
  path = acquire(workdir)
  try:
    yield path
  finally:
    if path:
      release(path)


# ----------------------------------------------------------------------------
# The run's config and tokenizer.
# ----------------------------------------------------------------------------


def write_config(config, workdir: str) -> None:
  """Writes ``workdir/config.json`` and ``workdir/machine.json`` (where it ran:
  `provenance.machine`) on the primary host; creates workdir."""
  fileio.makedirs(workdir)
  if jax.process_index() == 0:
    fileio.write_json_atomic(os.path.join(workdir, CONFIG_FILE),
                             config_utils.to_dict(config))
    fileio.write_json_atomic(os.path.join(workdir, provenance.MACHINE_FILE),
                             provenance.machine())


def load_run_config(workdir: str) -> ml_collections.ConfigDict:
  """The run config a training workdir saved (``config.json``).

  Raises:
    ConfigError: no config.json (not a training workdir) or an unreadable one.
  """
  path = os.path.join(workdir, CONFIG_FILE)
  if not fileio.isfile(path):
    raise config_utils.ConfigError(f"{workdir}: no {CONFIG_FILE} (not a training workdir)")
  try:
    with fileio.open(path) as f:
      return ml_collections.ConfigDict(json.load(f))
  except ValueError as e:
    raise config_utils.ConfigError(f"{path}: not a JSON config ({e})") from None


def tokenizer_dir(config) -> str:
  """Where the run's tokenizer lives ("" if it has none: synthetic data).

  ``rl.tokenizer`` or ``data.tokenizer`` when set (as given); else the first
  of ``data.data_dir/tokenizer``, ``init_from/tokenizer`` and ``init_from``
  (an HF directory with ``tokenizer.json``) that exists, or the first of them
  that the config names, so an error can say where it looked.
  """
  data = config.get("data") or {}
  for p in ((config.get("rl") or {}).get("tokenizer", ""), data.get("tokenizer", "")):
    if p:
      return p
  data_dir, init = data.get("data_dir", ""), config.get("init_from", "")
  cands = ([os.path.join(data_dir, "tokenizer")] if data_dir else []) + (
      [os.path.join(init, "tokenizer"), init] if init else [])
  for c in cands:
    if fileio.isfile(os.path.join(c, "tokenizer.json")):
      return c
  return cands[0] if cands else ""


# ----------------------------------------------------------------------------
# The model: from an HF directory or an Orbax workdir.
# ----------------------------------------------------------------------------


def is_hf_dir(path: str) -> bool:
  """True for a directory with an HF ``config.json`` and safetensors."""
  return (fileio.isfile(os.path.join(path, "config.json")) and any(
      f.endswith(".safetensors") for f in fileio.listdir(path)))


def check_init_from(path: str) -> str:
  """Validates ``config.init_from``: returns "", "hf" or "orbax"."""
  if not path:
    return ""
  if not fileio.isdir(path):
    raise config_utils.ConfigError(f"init_from={path}: no such directory")
  if is_hf_dir(path):
    return "hf"
  if ckpt_lib.find_checkpoint(path) is not None:
    return "orbax"
  raise config_utils.ConfigError(
      f"init_from={path}: neither an HF checkpoint (config.json + "
      f"*.safetensors) nor an Orbax checkpoint (checkpoints/<step>/)")


@dataclasses.dataclass(frozen=True)
class ModelSpec:
  """A run's model settings: ``model.*`` and ``init_from``, read once.

  `qwen3_config` resolves them: ``init_from``'s HF config.json when it is an
  HF directory or a workdir whose run started from one (`hf_origin`; with the
  other ``model.*`` keys as overrides), else the preset, its vocabulary ``vocab_size`` or (when that is 0) the data's.
  """
  preset: str
  vocab_size: int
  overrides: tuple[tuple[str, Any], ...]
  init_from: str = ""

  def qwen3_config(self, vocab_size: int = 0) -> qwen3.Qwen3Config:
    """The Qwen3Config; ``vocab_size``: the data's, used when the spec's is 0."""
    overrides = dict(self.overrides)
    vocab = int(self.vocab_size) or int(vocab_size)
    try:
      hf = hf_origin(self.init_from)
      if hf:
        with fileio.open(os.path.join(hf, "config.json")) as f:
          return qwen3.Qwen3Config.from_hf_dict(json.load(f), **overrides)
      if vocab:
        overrides["vocab_size"] = vocab
      return qwen3.Qwen3Config.preset(self.preset, **overrides)
    except (ValueError, TypeError) as e:
      raise config_utils.ConfigError(f"model: {e}") from None


def hf_origin(init_from: str, depth: int = 4) -> str:
  """The HF directory whose architecture a run from ``init_from`` has: itself,
  or for a training workdir the one its own run started from (followed
  through a few workdirs: a pipeline's sft -> sft2 -> rl); "" if none."""
  kind = check_init_from(init_from)
  if kind == "hf":
    return init_from
  if kind != "orbax" or depth <= 0:
    return ""
  path = os.path.join(init_from, CONFIG_FILE)
  try:   # the saved run config as plain JSON (no ConfigDict below the doors)
    with fileio.open(path) as f:
      parent = str(json.load(f).get("init_from", "") or "")
    return hf_origin(parent, depth - 1) if parent else ""
  except (OSError, ValueError, AttributeError):
    return ""   # a step dir, an unreadable config, a gone parent: the preset's


def model_spec(config) -> ModelSpec:
  """The `ModelSpec` of a run config (reads ``model.*`` and ``init_from``)."""
  m = config.model
  overrides = []
  for k in m.keys():
    if k not in ("preset", "vocab_size"):
      overrides.append((k, m[k]))
  return ModelSpec(preset=m.preset, vocab_size=int(m.vocab_size), overrides=tuple(overrides),
                   init_from=str(config.get("init_from", "") or ""))


def model_config(config, vocab_size: int = 0) -> qwen3.Qwen3Config:
  """The Qwen3Config of a run config (`model_spec` resolved with the data's
  ``vocab_size``)."""
  return model_spec(config).qwen3_config(vocab_size)


def load_model(path: str, vocab_size: int = 0, step: int | None = None
               ) -> tuple[qwen3.Qwen3, int | None]:
  """(model, checkpoint step) from an HF directory or an Orbax workdir.

  An Orbax workdir's architecture comes from its ``config.json`` (its model
  and data settings; ``vocab_size`` is the tokenizer's when the config left
  it to the data); ``step`` picks a checkpoint (default: the newest). The
  model is placed on the first device. An HF directory has no step (None).

  Raises:
    ConfigError: no such directory, neither kind of checkpoint, no
      config.json next to the checkpoints, or no checkpoint ``step``.
  """
  if not fileio.exists(path):
    raise config_utils.ConfigError(f"{path}: no such directory")
  if is_hf_dir(path):
    return hf_io.load_hf(path), None
  if ckpt_lib.find_checkpoint(path) is None:
    raise config_utils.ConfigError(f"{path}: neither an HF directory nor a training "
                                   "workdir with checkpoints")
  run_cfg = load_run_config(path)
  # The architecture of a run that started from an HF directory (itself or
  # through earlier workdirs) is that directory's config.json (the run's
  # model.* keys are overrides on it): init_from points there while it
  # exists; the weights come from the checkpoint below, never from init_from.
  try:
    run_cfg.init_from = hf_origin(str(run_cfg.get("init_from", "") or ""))
  except config_utils.ConfigError:
    run_cfg.init_from = ""
  vocab = int(run_cfg.model.get("vocab_size", 0)) or int(vocab_size) or int(
      run_cfg.data.get("vocab_size", 0))
  model_cfg = model_config(run_cfg, vocab_size=vocab)
  ckpt_path = path
  if step is not None:
    ckpt_path = os.path.join(path, ckpt_lib.CHECKPOINT_SUBDIR, str(step))
    if not fileio.isdir(os.path.join(ckpt_path, "model")):
      have = ckpt_lib.saved_steps(os.path.join(path, ckpt_lib.CHECKPOINT_SUBDIR))
      raise config_utils.ConfigError(
          f"{path}: no checkpoint for step {step}; saved steps: "
          f"{', '.join(map(str, have)) or 'none'}")
  found = ckpt_lib.find_checkpoint(ckpt_path)
  abstract_model = nnx.eval_shape(lambda: qwen3.Qwen3(model_cfg, rngs=nnx.Rngs(0)))
  graphdef, abstract = nnx.split(abstract_model)
  mesh = shd.make_mesh({"data": 1, "fsdp": 1, "tensor": 1}, devices=jax.devices()[:1])
  state = ckpt_lib.restore_model_state(ckpt_path, ckpt_lib.with_shardings(
      abstract, shd.param_shardings(abstract, mesh)))
  return nnx.merge(graphdef, state), found[1]


def load_init_weights(kind: str, path: str, abstract, shardings, model_cfg):
  """Model state from ``init_from`` (`check_init_from`'s kind), placed with
  ``shardings``."""
  if kind == "orbax":
    return ckpt_lib.restore_model_state(path, ckpt_lib.with_shardings(abstract, shardings))
  try:
    loaded = hf_io.load_hf(path, dtype=jnp.dtype(model_cfg.param_dtype))
  except (OSError, ValueError, KeyError) as e:
    raise config_utils.ConfigError(f"init_from={path}: {e}") from None
  state = nnx.state(loaded)
  if jax.tree.structure(state) != jax.tree.structure(abstract):
    raise config_utils.ConfigError(f"init_from={path}: parameters do not match "
                                   f"the model built from its config.json")
  return jax.device_put(state, shardings)
