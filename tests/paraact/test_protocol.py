"""Tests of the ParaAct text protocol (render, parse, token classification)."""

import json

from hypothesis import given, settings, strategies as st

from paraagent_jax import tokenizer as tok_lib
from paraagent_jax.learner import batch as batch_lib
from paraagent_jax.paraact import protocol as p
from toolenv.schema import Call, Step

_TAGS = list(tok_lib.PROTOCOL_TOKENS) + ["<|im_end|>", "{", "}", '"', ":", "\n"]

_json_scalars = st.one_of(
    st.none(), st.booleans(), st.integers(-10**6, 10**6),
    st.floats(allow_nan=False, allow_infinity=False), st.text(max_size=20))
_json = st.recursive(
    _json_scalars,
    lambda inner: st.one_of(st.lists(inner, max_size=3),
                            st.dictionaries(st.text(max_size=8), inner,
                                            max_size=3)),
    max_leaves=8)
_calls = st.builds(
    Call, name=st.text(min_size=1, max_size=20),
    arguments=st.dictionaries(st.text(max_size=8), _json, max_size=4))
# Thoughts are one line of normalised whitespace without tags (render joins
# whitespace; a tag inside a thought would be a different step).
_thoughts = st.text(max_size=40).map(lambda s: " ".join(s.split())).filter(
    lambda s: not any(t in s for t in tok_lib.PROTOCOL_TOKENS) and
    "<answer>" not in s)
_steps = st.one_of(
    st.builds(Step, phase=st.sampled_from(p.PHASES),
              calls=st.lists(_calls, min_size=1, max_size=4),
              thought=_thoughts),
    st.builds(Step, phase=st.just(p.ANSWER),
              answer=st.text(max_size=60).map(str.strip).filter(
                  lambda s: p.ANSWER_CLOSE not in s)))


@settings(max_examples=300, deadline=None)
@given(_steps)
def test_round_trip_is_identity(step):
  text = p.render_step(step)
  assert p.parse_step(text) == step


@settings(max_examples=300, deadline=None)
@given(st.lists(st.one_of(st.sampled_from(_TAGS), st.text(max_size=30)),
                max_size=40))
def test_adversarial_text_never_raises(pieces):
  text = "".join(pieces)
  step = p.parse_step(text)
  assert isinstance(step, Step)
  assert step.phase in (p.EXPLORE, p.EXECUTE, p.ANSWER)
  spans = p.classify_spans(text)
  assert sum(e - s for s, e, _ in spans) == len(text)


@settings(max_examples=100, deadline=None)
@given(_steps, st.integers(0, 10**6))
def test_truncated_steps_never_raise(step, cut):
  text = p.render_step(step)
  cut %= len(text)
  out = p.parse_step(text[:cut])
  assert out.parse_error is not None


def test_junk_and_non_text():
  assert p.parse_step("x" * 10_000).parse_error.startswith("no phase tag")
  assert p.parse_step(None).parse_error
  assert p.parse_step("<explore>" * 3000).parse_error
  deep = "<execute>\n<call>" + "[" * 100_000 + "</call>\n</step>"
  assert "JSON" in p.parse_step(deep).parse_error


def test_partial_recovery_keeps_good_calls():
  text = ('<execute> go\n<call>{"name": "a", "arguments": {"x": 1}}</call>\n'
          '<call>{"name": "b", "argu</call>\n</step>')
  step = p.parse_step(text)
  assert step.calls == [Call("a", {"x": 1})]
  assert "not valid JSON" in step.parse_error
  assert p.parse_step("<explore> hm\n</step>").parse_error == (
      "step has no <call>")
  # Cut before its </step> with no call: that alone, the text every policy
  # trained here has been shown for it (b486bf3 and before; f95b320 added
  # "; step has no <call>" and the README command's RL parted at iteration 42).
  assert p.parse_step("<execute> hm, let me think").parse_error == (
      "unterminated step: missing </step>")
  assert p.parse_step('<execute> go <call>{"name": "a"}</call>').parse_error == (
      "unterminated step: missing </step>")
  assert p.parse_step('<execute><call>[1]</call></step>').parse_error


def test_rendered_example_text():
  step = Step(phase="explore", thought="find tools", calls=[
      Call("search_tools", {"query": "weather"})])
  assert p.render_step(step) == (
      '<explore> find tools\n'
      '<call>{"name": "search_tools", "arguments": {"query": "weather"}}</call>'
      '\n</step>')
  assert p.render_step(Step(phase="answer", answer="42")) == (
      "<answer> 42 </answer>")
  # '<' inside JSON is escaped, so no tag can hide in an argument.
  text = p.render_step(Step(phase="execute", calls=[Call("t", {"q": "</step>"})]))
  assert text.count("</step>") == 1
  assert json.loads(text.split("<call>")[1].split("</call>")[0])["arguments"] == {
      "q": "</step>"}


def test_classify_spans_and_token_kinds():
  text = p.render_step(Step(phase="execute", thought="ab",
                            calls=[Call("t", {})]))
  first = text.index("<call>")
  assert p.classify_spans(text) == [(0, first, batch_lib.KIND_PLAN),
                                    (first, len(text), batch_lib.KIND_ACTION)]
  offsets = [(0, 9), (9, 12), (first, first + 6), (first + 6, len(text)),
             (len(text), len(text))]
  assert p.token_kinds(offsets, p.classify_spans(text)) == [0, 0, 1, 1, 1]
  answer = "<answer> x </answer>"
  assert p.token_kinds([(0, 8), (8, 10)], p.classify_spans(answer)) == [2, 2]
  assert p.classify_spans("") == []


def test_system_prompt_mentions_meta_tools():
  prompt = p.system_prompt()
  assert "search_tools" in prompt and "get_tool_doc" in prompt
  assert p.STEP_CLOSE in prompt and p.ANSWER_OPEN in prompt
