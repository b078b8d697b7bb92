"""Fixtures of the trainer tests: who reads the config while a stage runs."""

import os

import pytest

from paraagent_jax import config_reads

_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.fixture
def config_readers():
  """``{"paraagent_jax/trainer/specs.py:rl_spec": n, ...}``: the project's
  functions that read a ConfigDict while the test runs
  (`config_reads.config_reads`), with their read counts."""
  with config_reads.config_reads(os.path.join(_ROOT, "paraagent_jax")) as readers:
    yield {f"paraagent_jax/{k}": v for k, v in readers.items()}
