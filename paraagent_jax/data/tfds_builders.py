"""TFDS builders (array_record, no TensorFlow) for ToolEnv tasks and demos.

Two datasets are built from JSON-lines files in a source directory:

* `ToolEnvTasks` from ``tasks_<split>.jsonl`` (``toolenv.Task.to_dict()``):
  ``id``, ``kind``, ``split``, ``instruction`` and ``json`` (the whole record,
  whose extra fields stay opaque here);
* `Demonstrations` from ``demonstrations_<split>.jsonl`` (the cold-start
  producer's records): ``id``, ``task_id``, ``kind``, ``split``,
  ``strategy``, ``messages_json`` (the chat messages), ``roles_json`` (the
  role agent behind each assistant message), ``success``, ``turns``,
  ``calls``. With ``only_success`` (the default) failed ones are dropped.

Splits are ``train`` and ``test``. Usage::

  builder = build_dataset("demonstrations", source_dir, data_dir)
  source = builder.as_data_source(split="train")   # random access, no TF
  rec = decode_demonstration(source[0])

Checked on tfds 4.9.10 without TensorFlow: building with
``file_format="array_record"`` and reading with ``as_data_source`` works when
`_info` builds ``tfds.core.DatasetInfo`` directly (``dataset_info_from_configs``
looks for metadata files next to the module). Records are shuffled by key on
write and text reads back as bytes, so readers decode and never rely on order.
Messages are JSON text rather than a nested ``Sequence`` feature so that the
record layout does not depend on TFDS's nested-feature serialisation.
"""

from __future__ import annotations

import collections
import dataclasses
import hashlib
import json
import os
import sys
from typing import Any, Iterator

import numpy as np
import tensorflow_datasets as tfds

from paraagent_jax import fileio

SPLITS = ("train", "test")


@dataclasses.dataclass
class JsonlConfig(tfds.core.BuilderConfig):
  """A config per catalog: where the JSONL files are and what to keep.

  Attributes:
    catalog: the ToolEnv catalog the records come from (names the config).
    source_dir: directory holding the ``*_<split>.jsonl`` files; may be
      overridden by the builder's ``source_dir`` argument.
    only_success: `Demonstrations` keeps only successful trajectories.
  """
  catalog: str = "procedural"
  source_dir: str = ""
  only_success: bool = True


def _configs() -> list[JsonlConfig]:
  return [JsonlConfig(name=c, catalog=c, description=f"{c} catalog")
          for c in ("procedural", "openapi", "bfcl", "toolbench")]


def read_jsonl(path: str) -> Iterator[dict[str, Any]]:
  """Yields the JSON objects of a JSON-lines file (blank lines skipped)."""
  with fileio.open(path) as f:
    for n, line in enumerate(f, 1):
      if not line.strip():
        continue
      try:
        yield json.loads(line)
      except json.JSONDecodeError as e:
        raise ValueError(f"{path}:{n}: not JSON ({e.msg})") from None


def _text(x) -> str:
  return x.decode("utf-8") if isinstance(x, bytes) else str(x)


class _JsonlBuilder(tfds.core.GeneratorBasedBuilder):
  """Shared part: the source directory, splits and build-time statistics."""

  BUILDER_CONFIGS = _configs()
  FILE_PREFIX = ""  # "tasks" or "demonstrations"
  # TFDS looks for checksums next to the module via `code_path`, which for a
  # package module needs `importlib_resources` (not installed); these
  # datasets download nothing, so there is no code path to look in.
  code_path = None

  def __init__(self, *, source_dir: str = "", **kwargs):
    kwargs.setdefault("file_format", "array_record")
    super().__init__(**kwargs)
    self._source_dir = source_dir or self.builder_config.source_dir
    self.build_stats: dict[str, dict[str, Any]] = {}

  # TFDS announces "Downloading and preparing dataset Unknown size ..." and
  # "downloaded and prepared" for every build; these datasets download
  # nothing (local JSONL), so say what really happens, in one line.
  def _log_download_bytes(self) -> None:
    print(f"tfds: preparing {self.name} from {self._source_dir} into "
          f"{self.data_dir}", flush=True)

  def _log_download_done(self) -> None:
    """Silent: `_log_download_bytes` already said where the data goes."""

  def source_path(self, split: str) -> str:
    """The JSONL file of a split."""
    if not self._source_dir:
      raise ValueError(f"{self.name}: no source_dir given (builder argument "
                       "or config.source_dir)")
    return os.path.join(self._source_dir, f"{self.FILE_PREFIX}_{split}.jsonl")

  def _split_generators(self, dl_manager):
    del dl_manager
    out = {}
    for split in SPLITS:
      path = self.source_path(split)
      if not fileio.exists(path):
        raise FileNotFoundError(f"{self.name}: missing {path}")
      records = list(read_jsonl(path))
      self.build_stats[split] = self.statistics(records, split)
      print(format_statistics(self.name, split, self.build_stats[split]),
            flush=True)
      out[split] = self._generate_examples(records)
    return out

  def statistics(self, records: list[dict[str, Any]], split: str
                 ) -> dict[str, Any]:
    """Per-split numbers printed at build time."""
    del split
    kinds = collections.Counter(r.get("kind", "") for r in records)
    return {"count": len(records), "per_kind": dict(sorted(kinds.items()))}

  def _generate_examples(self, records):
    raise NotImplementedError


class ToolEnvTasks(_JsonlBuilder):
  """ToolEnv tasks (``toolenv.Task.to_dict()`` records), one per example."""

  VERSION = tfds.core.Version("1.0.0")
  RELEASE_NOTES = {"1.0.0": "Tasks from tasks_<split>.jsonl; array_record."}
  FILE_PREFIX = "tasks"

  def _info(self) -> tfds.core.DatasetInfo:
    return tfds.core.DatasetInfo(
        builder=self, description=self.__doc__ or "",
        features=tfds.features.FeaturesDict({
            "id": tfds.features.Text(), "kind": tfds.features.Text(),
            "split": tfds.features.Text(),
            "instruction": tfds.features.Text(),
            "json": tfds.features.Text()}))

  def _generate_examples(self, records):
    for r in records:
      yield r["id"], {"id": r["id"], "kind": r.get("kind", ""),
                      "split": r.get("split", ""),
                      "instruction": r.get("instruction", ""),
                      "json": json.dumps(r, sort_keys=True)}


class Demonstrations(_JsonlBuilder):
  """Linearised ParaAct demonstrations of the multi-agent cold start."""

  VERSION = tfds.core.Version("1.0.0")
  RELEASE_NOTES = {"1.0.0": "Demonstrations from demonstrations_<split>.jsonl;"
                            " messages and roles as JSON text; array_record."}
  FILE_PREFIX = "demonstrations"

  def _info(self) -> tfds.core.DatasetInfo:
    t = tfds.features.Text
    return tfds.core.DatasetInfo(
        builder=self, description=self.__doc__ or "",
        features=tfds.features.FeaturesDict({
            "id": t(), "task_id": t(), "kind": t(), "split": t(),
            "strategy": t(), "messages_json": t(), "roles_json": t(),
            "success": np.bool_, "turns": np.int32, "calls": np.int32}))

  def statistics(self, records, split):
    """Kept fraction per kind, mean turns, calls per step.

    The producer may write only successful demonstrations; when
    ``tasks_<split>.jsonl`` (every task attempted) sits next to them, the
    kept fraction of a kind is kept demonstrations over attempted tasks,
    otherwise successful over all records.
    """
    per_kind = collections.defaultdict(lambda: [0, 0])
    kept = [r for r in records if self._keep(r)]
    tasks = os.path.join(self._source_dir, f"tasks_{split}.jsonl")
    attempted = list(read_jsonl(tasks)) if fileio.exists(tasks) else records
    for r in attempted:
      per_kind[r.get("kind", "")][0] += 1
    for r in kept:
      per_kind[r.get("kind", "")][1] += 1
    turns = sum(int(r.get("turns", 0)) for r in kept)
    calls = sum(int(r.get("calls", 0)) for r in kept)
    return {
        "count": len(records), "kept": len(kept),
        "kept_fraction_per_kind": {
            k: v[1] / max(v[0], 1) for k, v in sorted(per_kind.items())},
        "kept_of": "tasks" if attempted is not records else "records",
        "mean_turns": turns / len(kept) if kept else 0.0,
        # Steps are assistant turns, so this is calls per step overall.
        "calls_per_step": calls / turns if turns else 0.0,
    }

  def _keep(self, r) -> bool:
    return bool(r.get("success", True)) or not self.builder_config.only_success

  def _generate_examples(self, records):
    for r in records:
      if not self._keep(r):
        continue
      yield r["id"], {
          "id": r["id"], "task_id": r.get("task_id", ""),
          "kind": r.get("kind", ""), "split": r.get("split", ""),
          "strategy": r.get("strategy", ""),
          "messages_json": json.dumps(r["messages"], ensure_ascii=False),
          "roles_json": json.dumps(r.get("roles", [])),
          "success": bool(r.get("success", True)),
          "turns": int(r.get("turns", 0)), "calls": int(r.get("calls", 0))}


def format_statistics(name: str, split: str, stats: dict[str, Any]) -> str:
  """One or two human-readable lines of build statistics."""
  head = f"{name}[{split}]: {stats['count']} records"
  if "kept" not in stats:
    kinds = ", ".join(f"{k}={v}" for k, v in stats["per_kind"].items())
    return f"{head} ({kinds})"
  kinds = ", ".join(f"{k}={v:.2f}" for k, v in
                    stats["kept_fraction_per_kind"].items())
  return (f"{head}, kept {stats['kept']}; kept fraction (of "
          f"{stats['kept_of']}) per kind: {kinds}; "
          f"mean turns {stats['mean_turns']:.2f}; calls per step "
          f"{stats['calls_per_step']:.2f}")


BUILDERS = {"tool_env_tasks": ToolEnvTasks, "tasks": ToolEnvTasks,
            "demonstrations": Demonstrations}


def build_dataset(name: str, source_dir: str, data_dir: str,
                  config: str = "procedural", **config_overrides
                  ) -> tfds.core.DatasetBuilder:
  """Builds (if not yet prepared) and returns a dataset builder.

  Args:
    name: "tasks" / "tool_env_tasks" or "demonstrations".
    source_dir: directory with the ``*_<split>.jsonl`` files.
    data_dir: TFDS data directory to write into.
    config: the builder config name (a catalog).
    **config_overrides: fields of `JsonlConfig` (e.g. ``only_success``);
      they change the records, so they need a config of their own name.

  Returns:
    The prepared builder; read with ``builder.as_data_source(split=...)``.
  """
  if name not in BUILDERS:
    raise ValueError(f"unknown dataset {name!r}; expected one of "
                     f"{sorted(BUILDERS)}")
  cls = BUILDERS[name]
  cfg = config
  if config_overrides:
    base = {c.name: c for c in cls.BUILDER_CONFIGS}.get(config)
    if base is None:
      raise ValueError(f"unknown config {config!r} of {name}")
    suffix = "-".join(f"{k}={v}" for k, v in sorted(config_overrides.items()))
    cfg = dataclasses.replace(base, name=f"{config}-{suffix}",
                              **config_overrides)
  builder = cls(source_dir=source_dir, data_dir=data_dir, config=cfg)
  # TFDS reuses a prepared version whatever the source says; rebuild when
  # the JSONL files changed (e.g. demonstrations regenerated in place).
  fingerprint = source_fingerprint(builder)
  stamp = os.path.join(builder.data_dir, SOURCE_STAMP)
  if fileio.exists(stamp):
    if fileio.read_text(stamp).strip() != fingerprint:
      # A fresh builder on an emptied version dir: regenerating in place
      # trips TFDS's "DatasetInfo already initialised" check.
      fileio.rmtree(builder.data_dir)
      builder = cls(source_dir=source_dir, data_dir=data_dir, config=cfg)
  if not _stderr_is_tty():
    # tqdm bars become carriage-return soup in log files.
    tfds.disable_progress_bar()
  builder.download_and_prepare(
      file_format="array_record",
      download_config=tfds.download.DownloadConfig(manual_dir=source_dir))
  fileio.write_text_atomic(stamp, fingerprint)
  return builder


SOURCE_STAMP = "source_fingerprint.txt"


def _stderr_is_tty() -> bool:
  return hasattr(sys.stderr, "isatty") and sys.stderr.isatty()


def source_fingerprint(builder: _JsonlBuilder) -> str:
  """sha256 over the split files' bytes (what the prepared data came from)."""
  h = hashlib.sha256()
  for split in SPLITS:
    path = builder.source_path(split)
    if not fileio.exists(path):
      raise FileNotFoundError(f"{builder.name}: missing {path}")
    h.update(split.encode())
    with fileio.open(path, "rb") as f:
      for chunk in iter(lambda: f.read(1 << 20), b""):
        h.update(chunk)
  return h.hexdigest()


def decode_demonstration(example: dict[str, Any]) -> dict[str, Any]:
  """A `Demonstrations` example (bytes fields) back as the source record."""
  out = {k: _text(example[k]) for k in ("id", "task_id", "kind", "split",
                                        "strategy")}
  out["messages"] = json.loads(_text(example["messages_json"]))
  out["roles"] = json.loads(_text(example["roles_json"]))
  out["success"] = bool(example["success"])
  out["turns"] = int(example["turns"])
  out["calls"] = int(example["calls"])
  return out


def decode_task(example: dict[str, Any]) -> dict[str, Any]:
  """A `ToolEnvTasks` example back as the ``Task.to_dict()`` record."""
  return json.loads(_text(example["json"]))


def load_records(builder: tfds.core.DatasetBuilder, split: str
                 ) -> list[dict[str, Any]]:
  """All records of a prepared split, decoded, sorted by id (no TF)."""
  source = builder.as_data_source(split=split)
  decode = decode_task if isinstance(builder, ToolEnvTasks) else (
      decode_demonstration)
  return sorted((decode(source[i]) for i in range(len(source))),
                key=lambda r: r["id"])


# Where a bucket's demonstrations are prepared for reading: a local cache,
# one folder per data_dir (rebuilt from the bucket's JSONL when they change).
LOCAL_CACHE = os.path.join(
    os.environ.get("XDG_CACHE_HOME", os.path.expanduser("~/.cache")),
    "paraagent_jax", "tfds")


def default_data_dir(data_dir: str) -> str:
  """``data_dir/tfds``; for a bucket a local cache folder named by it."""
  if not fileio.is_remote(data_dir):
    return os.path.join(data_dir, "tfds")
  key = hashlib.sha256(data_dir.rstrip("/").encode()).hexdigest()[:16]
  return os.path.join(LOCAL_CACHE, key)


def files_key(*paths: str) -> tuple:
  """Per file ``(path, size, mtime_ns)``, ``(path,)`` when absent.

  On a bucket ``(path, size)``: the file layer gives no modification time
  there, so a file rewritten in the bucket at the same size keeps its cache
  entry. Locally `os.stat` (a local file's own clock).
  """
  out = []
  for p in paths:
    if not fileio.exists(p):
      out.append((p,))
    elif fileio.is_remote(p):
      out.append((p, fileio.getsize(p)))
    else:
      st = os.stat(p)   # local only: see above
      out.append((p, st.st_size, st.st_mtime_ns))
  return tuple(out)
