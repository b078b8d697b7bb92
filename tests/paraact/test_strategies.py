"""Tests of the acting strategies (formats, phase inference, rules)."""

import pytest

from paraagent_jax.paraact import strategies as S
from toolenv.schema import Call, Step

_EXPLORE = Step(phase="explore", thought="find", calls=[
    Call("search_tools", {"query": "weather"})])
_EXECUTE = Step(phase="execute", thought="do", calls=[
    Call("get_weather", {"city": "Paris"}), Call("get_rate", {"a": "EUR"})])
_ANSWER = Step(phase="answer", answer="21 C")


@pytest.mark.parametrize("name", S.STRATEGY_NAMES)
def test_round_trip(name):
  s = S.get_strategy(name)
  for step in (_EXPLORE, _EXECUTE, _ANSWER):
    assert s.parse_step(s.render_step(step)) == step


def test_untagged_format_and_inference():
  s = S.get_strategy("react")
  text = s.render_step(_EXPLORE)
  assert text.startswith("<act> find") and "<explore>" not in text
  mixed = s.parse_step('<act>\n<call>{"name": "search_tools", "arguments": {}}'
                       '</call>\n<call>{"name": "x", "arguments": {}}</call>'
                       '\n</step>')
  assert mixed.phase == "execute"
  assert S.get_strategy("interleaved").check_step(mixed) == "mixed_phase"
  assert "<act>" in s.system_prompt() and "<explore>" not in s.system_prompt()


def test_rules():
  assert S.get_strategy("react").check_step(_EXECUTE) is not None
  assert S.get_strategy("react").check_step(_EXPLORE) is None
  pe = S.get_strategy("plan_execute")
  assert pe.check_step(_EXPLORE, [_EXPLORE]) is None
  assert pe.check_step(_EXPLORE, [_EXPLORE, _EXECUTE]) is not None
  assert S.get_strategy("paraact").check_step(_EXPLORE, [_EXECUTE]) is None
  bad = Step(phase="explore", calls=[Call("get_weather", {})])
  assert S.get_strategy("paraact").check_step(bad) is not None
  with pytest.raises(ValueError):
    S.get_strategy("nope")
