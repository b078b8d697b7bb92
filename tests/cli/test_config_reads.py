"""`config_reads` charges each ConfigDict read to the function that made it."""

import os

import ml_collections

from paraagent_jax import config_reads

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _reads_three_ways(c):
  return c.a, c["b"], c.get("x", 0)


def test_reads_are_charged_to_the_reading_function_and_restored():
  c = ml_collections.ConfigDict({"a": 1, "b": {"c": 2}})
  with config_reads.config_reads(ROOT) as readers:   # the recorder's own file included
    _reads_three_ways(c)
    dict(c.b.items())
  # c.a is c["a"] inside ml_collections: one read, charged once, to its caller.
  assert readers == {"tests/cli/test_config_reads.py:_reads_three_ways": 3,
                     "tests/cli/test_config_reads.py:test_reads_are_charged_to_the_reading_"
                     "function_and_restored": 2}
  # Outside the block the ConfigDict is untouched and nothing more is counted.
  assert c.a == 1 and ml_collections.ConfigDict.get.__name__ == "get"
  assert sum(readers.values()) == 5
