"""BFCL reader and our BFCL-rule checker on hand-written entries."""

import os

import pytest

from toolenv.benchmarks import bfcl as checker
from toolenv.catalog import bfcl

DATA = os.path.join(os.path.dirname(os.path.dirname(__file__)), "fixtures", "bfcl")
CATS = ("simple_python", "parallel")


@pytest.fixture(scope="module")
def entries():
  return {e.id: e for e in bfcl.load_entries(DATA, CATS)}


def test_reader_and_tools(entries):
  assert sorted(entries) == ["parallel_0", "simple_python_0"]
  e = entries["simple_python_0"]
  assert e.instruction.startswith("Area of a triangle")
  tool = bfcl.function_to_tool(e.functions[0])
  assert tool.properties["base"]["type"] == "number"  # BFCL "float".
  assert tool.properties["tags"] == {"type": "array", "description": "Tags.",
                                     "items": {"type": "string"}}
  assert tool.required == ["base", "height"] and tool.source == "bfcl"


def test_simple_rules(entries):
  e = entries["simple_python_0"]
  ok = lambda args: checker.check(e, [{"calc_area": args}])
  assert ok({"base": 10.0, "height": 5.0}) == (True, "")
  assert ok({"base": 10, "height": 5})[0]  # int accepted for float.
  assert ok({"base": 10.0, "height": 5, "unit": "CM"})[0]  # case-free.
  assert ok({"base": 10.0, "height": 5, "tags": ["new york"]})[0]
  assert ok({"base": 10.0, "height": 5, "unit": "m"}) == (False, "value_error")
  assert ok({"base": 10.0}) == (False, "missing_required")
  assert ok({"base": 10.0, "height": 5, "x": 1}) == (False, "unexpected_param")
  assert ok({"base": "10", "height": 5}) == (False, "type_error")
  assert ok({"base": 10.0, "height": True}) == (False, "type_error")
  assert checker.check(e, []) == (False, "wrong_count")


def test_parallel_is_order_free(entries):
  e = entries["parallel_0"]
  a = {"spotify.play": {"artist": "Taylor Swift", "duration": 20}}
  b = {"spotify.play": {"artist": "Maroon 5", "duration": 15}}
  assert checker.check(e, [a, b])[0] and checker.check(e, [b, a])[0]
  assert checker.check(e, [a, a]) == (False, "cannot_find_match")
  assert checker.check(e, [a]) == (False, "wrong_count")
  assert checker.check(e, [a, b, b]) == (False, "wrong_count")


@pytest.mark.parametrize("setting", ["closed", "open"])
def test_oracle_scores_100(entries, setting):
  assert checker.score_oracle(list(entries.values()), setting) == 1.0
  tasks, pool = checker.make_tasks(list(entries.values()), setting)
  assert len(tasks) == 2 and len(pool) == (2 if setting == "open" else 0)


def test_perturbations_are_judged(entries):
  import random  # pylint: disable=g-import-not-at-top
  e = entries["parallel_0"]
  verdicts = {k: checker.check(e, c)[0]
              for k, c in checker.perturb(e, random.Random(0))}
  assert verdicts["swapped_order"] and not verdicts["extra_call"]
  assert not verdicts["missing_call"] and not verdicts["wrong_value"]
