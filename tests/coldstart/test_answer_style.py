"""The answerer's answer styles (`toolenv.oracle.answer_text`), hand-worked."""

import os

import pytest

import toolenv
from toolenv import oracle
from toolenv import rewards as rw
from toolenv.catalog import procedural
from toolenv.schema import Step
from toolenv.tasks import Task, answer_key
from paraagent_jax import config_utils as cu
from paraagent_jax.coldstart import build, roles


@pytest.fixture(scope="module")
def cat():
  return procedural.build_catalog(seed=0, size=3000)


def _task(answers):
  return Task(id="t", kind="single", split="train", instruction="x", nodes=[],
              answers=answers, gold_state="", writes=False, max_turns=6, seed=0)


def test_answer_key():
  assert answer_key("owner") == "owner"
  assert answer_key("items[0].name") == "name"
  assert answer_key("results[2].film_id") == "film_id"
  assert answer_key("a.b[]") == "b"


def test_styles_hand_worked():
  t = _task([{"label": "owner", "value": "Goran Haddad", "key": "owner",
              "json": '"Goran Haddad"'},
             {"label": "week count", "value": "12", "key": "count", "json": "12"}])
  assert oracle.answer_text(t) == "owner: Goran Haddad; week count: 12"
  assert oracle.answer_text(t, "json") == '"owner": "Goran Haddad"; "count": 12'
  # Tasks saved before answers kept their field fall back to the label.
  old = _task([{"label": "owner", "value": "Goran Haddad"}])
  assert oracle.answer_text(old, "json") == "owner: Goran Haddad"
  with pytest.raises(ValueError, match="answer style"):
    oracle.answer_text(t, "yaml")
  with pytest.raises(ValueError, match="answer_style"):
    roles.ScriptedAnswerer("yaml")


def test_json_answers_echo_the_observation_and_succeed(cat):
  """Every json answer item is verbatim text of an oracle observation."""
  gen = toolenv.TaskGenerator(cat, seed=0)
  tasks = gen.generate(40, split="test")
  assert {t.kind for t in tasks} == set(toolenv.KINDS)
  for task in tasks:
    env = toolenv.ToolEnv(cat)
    env.reset(task)
    steps = oracle.solve(task, "paraact")
    seen = ""
    for s in steps[:-1]:
      seen += env.step(s).observation
    answer = oracle.answer_text(task, "json")
    for item in answer.split("; "):
      assert item in seen, (task.id, item)
    assert rw.answer_correct([a["value"] for a in task.answers], answer)
    env.step(Step("answer", answer=answer))
    assert env.rewards().success, task.id


def test_demo_config_answers_in_json_style(cat):
  demo = cu.load_config(os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(
      os.path.abspath(__file__)))), "configs", "demo.py"))
  assert build.make_roles(demo.data, cat, 0).answerer.style == "json"
  assert build.make_roles({}, cat, 0).answerer.style == "label"   # the default
