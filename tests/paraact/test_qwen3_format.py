"""The qwen3 protocol format: Qwen3 tool calls through the tokenizer's chat template.

References independent of the code under test: a Hermes-style ``<tool_call>``
parser written here, and HF ``apply_chat_template`` of the whole conversation
(the tokens a model would have seen in pre-training).
"""

import json
import re

import pytest

import toolenv
from toolenv.catalog import procedural
from toolenv.schema import Call, Step
from paraagent_jax import tokenizer as T
from paraagent_jax.models import tiny_qwen3
from paraagent_jax.paraact import (chat_format, policies, protocol, qwen3_format, rollout,
                                   template_turns)


@pytest.fixture(scope="module")
def tok():
  return tiny_qwen3.train_tokenizer()


@pytest.fixture(scope="module")
def fmt(tok):
  return chat_format.ChatFormat(tok, "paraact", protocol_format="qwen3")


def hermes_calls(text):
  """An independent Hermes-style parser: every <tool_call> JSON block."""
  out = []
  for body in re.findall(r"<tool_call>(.*?)</tool_call>", text, flags=re.S):
    obj = json.loads(body)
    out.append((obj["name"], obj["arguments"]))
  return out


THREE = Step("execute", [Call("get_weather", {"city": "Zürich", "units": "metric"}),
                         Call("convert_currency", {"amount": 100, "from": "EUR", "to": "USD"}),
                         Call("get_time", {"zone": "a<b>c", "nested": {"x": [1, 2.5, None]}})],
             thought="all three are independent")


def test_three_parallel_calls_round_trip(fmt, tok):
  text = fmt.render(THREE)
  assert text.startswith("<execute> all three are independent\n<tool_call>\n{")
  assert text.count("<tool_call>") == 3 and "</step>" not in text and "<call>" not in text
  want = [(c.name, c.arguments) for c in THREE.calls]
  assert hermes_calls(text) == want
  parsed = fmt.parse(text + T.IM_END)
  assert parsed.parse_error is None and parsed.phase == "execute"
  assert parsed.thought == THREE.thought
  assert [(c.name, c.arguments) for c in parsed.calls] == want
  # The template renders the step's message (content + tool_calls) as that same text.
  msgs = [{"role": "user", "content": "q"}, qwen3_format.assistant_message(THREE)]
  rendered = tok.apply_chat_template(msgs, tokenize=False)
  assert f"<|im_start|>assistant\n{text}<|im_end|>\n" in rendered
  assert hermes_calls(rendered.split("<|im_start|>assistant\n", 1)[1]) == want


@pytest.mark.parametrize("text,dropped,json_errors", [
    ("<explore> x\n<tool_call>\n{\"name\": \"search_tools\", \"arguments\": {}}\n</tool_call>", 0, 0),
    ("<explore> x\n<tool_call>\n{\"name\": \"search_tools\", \"arguments\": \n</tool_call>", 1, 1),
    ("<execute>\n<tool_call>\n[1, 2]\n</tool_call>\n<tool_call>\n{\"name\": \"a\"}", 2, 0),
    ("<tool_call>{\"name\": \"a\"}</tool_call>", 0, 0),     # no phase tag
    ("<answer> 3 </answer>", 0, 0),
    (None, 0, 0), ("<execute>" * 3 + "<tool_call>" * 5, 1, 0),
])
def test_malformed_turns_parse_to_errors_never_raise(fmt, text, dropped, json_errors):
  step = fmt.parse(text)
  if text is not None and text.startswith("<answer>"):
    assert step.parse_error is None and step.answer == "3"
    return
  counts = protocol.failure_counts(step)
  assert counts == {"calls_dropped": dropped, "json_errors": json_errors, "unknown_tools": 0}
  assert (step.parse_error is None) == (text is not None and dropped == 0 and
                                        text.startswith("<explore>"))


def test_tags_failure_counts():
  step = protocol.parse_step('<execute> t\n<call>{"name": "a", </call>\n<call>{"name": "b"}'
                             '</call>\n<call>[]</call>\n<call>{"x": 1}</call>\n<call>{')
  assert [c.name for c in step.calls] == ["b"]
  assert protocol.failure_counts(step) == {"calls_dropped": 4, "json_errors": 1,
                                           "unknown_tools": 0}
  refused = Step("execute", parse_error="unknown tool 'x' (not among the tools given); "
                 "call is not valid JSON (y arguments): {")
  assert protocol.failure_counts(refused) == {"calls_dropped": 2, "json_errors": 1,
                                              "unknown_tools": 1}


def _messages_of(transcript, fmt, tail):
  """The conversation of a transcript, each call's result its own tool message."""
  msgs = fmt.prompt_messages(transcript[0]["text"])
  calls = 0
  for entry in transcript[1:]:
    if entry["role"] == "assistant":
      msgs.append({"role": "assistant", "content": entry["text"].split(T.IM_END)[0]})
      calls = len(hermes_calls(entry["text"]))
    else:
      obs = fmt.observation_content(entry["text"], tail)
      blocks = re.split(r"\n(?=\[\d+\] )", obs)
      if len(blocks) != calls or not all(b.startswith(f"[{k + 1}] ")
                                         for k, b in enumerate(blocks)):
        blocks = [obs]
      msgs += [{"role": "tool", "content": b} for b in blocks]
  return msgs


def test_oracle_episodes_equal_the_template_turn_by_turn(fmt, tok):
  catalog = procedural.build_catalog(seed=0, size=3000)
  gen = toolenv.TaskGenerator(catalog, seed=0)
  tasks = gen.generate(4, "train")
  env = toolenv.VectorToolEnv(catalog, len(tasks), **toolenv.oracle.env_options("paraact"))
  config = rollout.RolloutConfig(max_turns=8, max_turn_tokens=400, max_len=8192,
                                 max_obs_tokens=100000)
  result = rollout.run_rollout(policies.OraclePolicy(fmt), env, tasks, fmt, config)
  assert all(r["success"] for r in result.episodes), [r["turns"] for r in result.episodes]
  turns = template_turns.TemplateTurns(tok)
  parallel = 0
  for rec, buf in zip(result.episodes, result.buffers):
    msgs = _messages_of(rec["transcript"], fmt, config.max_obs_tokens)
    # Whole episode: the stream is the template's rendering of the conversation.
    want = tok.apply_chat_template(msgs, tools=list(qwen3_format.META_TOOL_SCHEMAS),
                                   tokenize=False)
    assert buf.tokens == tok.encode(want, add_special_tokens=False)
    # Turn by turn: each assistant turn's tokens start where the template's
    # rendering of the conversation before it (with the generation prompt) ends.
    starts = [i for i in range(len(buf.tokens)) if buf.loss_mask[i] and (
        i == 0 or not buf.loss_mask[i - 1])]
    assistant_at = [k for k, m in enumerate(msgs) if m["role"] == "assistant"]
    assert len(starts) == len(assistant_at) == rec["turns"]
    for start, k in zip(starts, assistant_at):
      prefix = turns.encode(turns.text(msgs[:k], True))
      assert buf.tokens[:start] == prefix
    # A parallel step's results are a <tool_response> each in one user turn.
    if any(len(hermes_calls(e["text"])) > 1 for e in rec["transcript"][1:]
           if e["role"] == "assistant"):
      assert re.search(r"</tool_response>\n<tool_response>", want)
      parallel += 1
    # Calls are the action tokens, the phase tag and thought plan tokens.
    first = starts[0]
    assert buf.token_kind[first] == 0
    assert 1 in buf.token_kind
  assert parallel


# A Qwen3-style template that writes an empty thinking block into the last
# assistant turn only (as Qwen3's own does): earlier turns re-render differently.
BROKEN = tiny_qwen3.QWEN3_STYLE_TEMPLATE.replace(
    "{{- '<|im_start|>assistant\\n' + content }}",
    "{{- '<|im_start|>assistant\\n' + ('<think>\\n\\n</think>\\n\\n' if loop.last else '')"
    " + content }}")


def test_a_template_that_breaks_the_prefix_gives_one_clear_error(tok):
  assert BROKEN != tiny_qwen3.QWEN3_STYLE_TEMPLATE
  with pytest.raises(template_turns.TemplatePrefixError,
                     match=r"prefix property at assistant turn 1: .*protocol.chat_template"):
    chat_format.ChatFormat(tok, "paraact", protocol_format="qwen3", chat_template=BROKEN)
  # The same check runs inside a rollout's conversation: the thinking block
  # shows up when the episode's last turn is closed.
  turns = template_turns.TemplateTurns(tok, chat_template=BROKEN)
  conv = turns.start([{"role": "system", "content": "s"}, {"role": "user", "content": "u"}])
  text = qwen3_format.render_step(THREE)
  conv.advance(text, {"role": "assistant", "content": text},
               [{"role": "tool", "content": "r"}], final=False)
  with pytest.raises(template_turns.TemplatePrefixError, match="assistant turn 2: the text"):
    conv.advance("<answer> a </answer>", {"role": "assistant", "content": "<answer> a </answer>"},
                 [], final=True)


def test_a_template_with_another_tool_call_layout_is_refused(tok):
  other = tiny_qwen3.QWEN3_STYLE_TEMPLATE.replace("<tool_call>\\n{", "<tool_call>{")
  with pytest.raises(template_turns.TemplatePrefixError, match="not Qwen3's"):
    chat_format.ChatFormat(tok, "paraact", protocol_format="qwen3", chat_template=other)


def test_untagged_strategies_in_qwen3(tok):
  fmt = chat_format.ChatFormat(tok, "interleaved", protocol_format="qwen3")
  text = fmt.render(THREE)
  assert text.startswith("<act> ") and hermes_calls(text) == [
      (c.name, c.arguments) for c in THREE.calls]
  assert fmt.parse(text).phase == "execute"
  assert "<act>" in fmt.system_text and "<explore>" not in fmt.system_text
