"""Fixtures of the trainer tests: who reads the config while a stage runs."""

import collections
import os
import sys

import ml_collections
import pytest

_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
_READS = ("__getattr__", "__getitem__", "get", "items", "keys", "values", "to_dict",
          "__contains__", "__iter__")


@pytest.fixture
def config_readers(monkeypatch):
  """``{"paraagent_jax/trainer/rl.py:run_rl": n, ...}``: the functions of the
  project that read a `ml_collections.ConfigDict` (any key, any way) while the
  test runs, with their read counts. ml_collections' own frames are skipped,
  so a read is charged to the project function that made it."""
  readers = collections.Counter()
  lib = os.path.dirname(ml_collections.__file__)

  def wrap(name, fn):
    def read(self, *args, **kwargs):
      frame = sys._getframe(1)  # pylint: disable=protected-access
      while frame is not None and frame.f_code.co_filename.startswith(lib):
        frame = frame.f_back
      if frame is not None:
        path = os.path.relpath(frame.f_code.co_filename, _ROOT)
        if path.startswith(("paraagent_jax", "toolenv")):
          readers[f"{path}:{frame.f_code.co_name}"] += 1
      return fn(self, *args, **kwargs)
    return read

  for name in _READS:
    monkeypatch.setattr(ml_collections.ConfigDict, name,
                        wrap(name, getattr(ml_collections.ConfigDict, name)))
  return readers
