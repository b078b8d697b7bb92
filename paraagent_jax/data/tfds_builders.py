"""TFDS builders (array_record, no TensorFlow) for JSON records.

Checked by hand on tfds 4.9.10 without TensorFlow installed: building with
``file_format="array_record"`` and reading with ``builder.as_data_source(split)``
works, provided `_info` builds ``tfds.core.DatasetInfo`` directly
(``dataset_info_from_configs`` looks for metadata files next to the module).
Records are shuffled by key on write. Text features read back as bytes.

Work in progress: the task and demonstration builders (issue 6 item 3) are
meant to subclass `JsonRecordsBuilder` and fill `_records(split)`.
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any, Iterator

import numpy as np
import tensorflow_datasets as tfds


@dataclasses.dataclass
class JsonRecordsConfig(tfds.core.BuilderConfig):
  """A config per catalog and size."""
  catalog: str = "procedural"
  num_tasks: int = 64
  seed: int = 0


class JsonRecordsBuilder(tfds.core.GeneratorBasedBuilder):
  """Each example: a string id, a kind, and one JSON document."""

  VERSION = tfds.core.Version("0.1.0")
  RELEASE_NOTES = {"0.1.0": "JSON records, array_record format."}
  BUILDER_CONFIGS = [JsonRecordsConfig(name="procedural-small", num_tasks=64)]
  SPLITS = ("train", "test")

  def _info(self) -> tfds.core.DatasetInfo:
    return tfds.core.DatasetInfo(
        builder=self, description=self.__doc__ or "",
        features=tfds.features.FeaturesDict({
            "id": tfds.features.Text(), "kind": tfds.features.Text(),
            "json": tfds.features.Text(), "turns": np.int32}))

  def _split_generators(self, dl_manager):
    del dl_manager
    return {s: self._generate_examples(s) for s in self.SPLITS}

  def _records(self, split: str) -> Iterator[dict[str, Any]]:
    """Subclasses yield dicts with id, kind, turns and any JSON payload."""
    raise NotImplementedError

  def _generate_examples(self, split):
    for rec in self._records(split):
      yield rec["id"], {"id": rec["id"], "kind": rec.get("kind", ""),
                        "json": json.dumps(rec, sort_keys=True),
                        "turns": int(rec.get("turns", 0))}


def load_records(builder: tfds.core.DatasetBuilder, split: str) -> list[dict[str, Any]]:
  """Reads a prepared split back as decoded JSON dicts (no TensorFlow)."""
  source = builder.as_data_source(split)
  return [json.loads(source[i]["json"]) for i in range(len(source))]
