"""Fixtures of the trainer tests: who reads the config while a stage runs."""

import os

import pytest

from paraagent_jax import config_reads

_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.fixture
def config_readers():
  """``{"paraagent_jax/trainer/specs.py:rl_spec": n, ...}``: the functions of
  the repository (tests included) that read a ConfigDict while the test runs
  (`config_reads.config_reads`), with their read counts."""
  with config_reads.config_reads(_ROOT) as readers:
    yield readers   # filled as the test runs (paths from the repository root)
