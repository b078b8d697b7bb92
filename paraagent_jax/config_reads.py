"""Who reads the config: a recorder of ConfigDict reads, by function.

The stages read their config only at their door (`trainer.specs` builds typed
specs from it; every layer below takes typed arguments). `config_reads`
measures that: ``tests/trainer`` runs whole RL and SFT stages under it, and
``scripts/config_readers.py`` prints its table for a tiny RL run.
"""

from __future__ import annotations

import collections
import contextlib
import os
import sys

import ml_collections

_READS = ("__getattr__", "__getitem__", "get", "items", "keys", "values", "to_dict",
          "__contains__", "__iter__")


@contextlib.contextmanager
def config_reads(root: str):
  """Records which functions read a ConfigDict while the block runs.

  Yields a `collections.Counter` ``{"path/to/file.py:function": reads}`` of
  the functions in files under ``root`` (paths relative to it) that read
  any key of any ConfigDict, in any way; ml_collections' own frames are
  skipped, so a read is charged to the function that made it.
  """
  readers: collections.Counter = collections.Counter()
  lib = os.path.dirname(ml_collections.__file__)
  root = os.path.abspath(root)
  originals = {name: getattr(ml_collections.ConfigDict, name) for name in _READS}

  def wrap(fn):
    def read(self, *args, **kwargs):
      frame = sys._getframe(1)  # pylint: disable=protected-access
      while frame is not None and frame.f_code.co_filename.startswith(lib):
        frame = frame.f_back
      # A read made inside another (``c.x`` is ``c["x"]``) was counted once, outside.
      nested = frame is not None and frame.f_code.co_filename == __file__
      if (frame is not None and not nested
          and os.path.abspath(frame.f_code.co_filename).startswith(root)):
        path = os.path.relpath(frame.f_code.co_filename, root)
        readers[f"{path}:{frame.f_code.co_name}"] += 1
      return fn(self, *args, **kwargs)
    return read

  try:
    for name, fn in originals.items():
      setattr(ml_collections.ConfigDict, name, wrap(fn))
    yield readers
  finally:
    for name, fn in originals.items():
      setattr(ml_collections.ConfigDict, name, fn)
