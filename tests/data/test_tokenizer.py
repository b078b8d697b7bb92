"""Tests of the demo BPE tokenizer and the chat template."""

import pytest

from paraagent_jax import tokenizer as T
from paraagent_jax.learner import batch as batch_lib
from paraagent_jax.paraact import protocol as p
from toolenv.schema import Call, Step

_STEPS = [
    Step(phase="explore", thought="find weather tools", calls=[
        Call("search_tools", {"query": "weather forecast city", "top_k": 5})]),
    Step(phase="execute", thought="call both", calls=[
        Call("get_weather", {"city": "Paris"}),
        Call("convert_currency", {"from": "EUR", "to": "USD"})]),
    Step(phase="answer", answer="21 C; 1 EUR = 1.08 USD"),
]


@pytest.fixture(scope="module")
def tok(tmp_path_factory):
  texts = [p.system_prompt()] * 20 + [p.render_step(s) for s in _STEPS] * 50
  texts += [f"city number {i} has weather {i % 7} and rate {i / 3:.2f}"
            for i in range(300)]
  out = str(tmp_path_factory.mktemp("tok"))
  T.train_bpe_tokenizer(texts, vocab_size=512, out_dir=out)
  return T.load_tokenizer(out)


def _messages():
  return [{"role": "system", "content": p.system_prompt()},
          {"role": "user", "content": "Weather in Paris and EUR to USD?"},
          {"role": "assistant", "content": p.render_step(_STEPS[0])},
          {"role": "tool", "content": "get_weather: weather of a city"},
          {"role": "assistant", "content": p.render_step(_STEPS[1])},
          {"role": "tool", "content": '{"temp": 21}'},
          {"role": "tool", "content": '{"rate": 1.08}'},
          {"role": "assistant", "content": p.render_step(_STEPS[2])}]


def test_protocol_tags_are_single_tokens(tok):
  enc = T.ChatEncoder(tok)
  for t in T.PROTOCOL_TOKENS + (T.IM_START, T.IM_END):
    assert len(enc.encode(t)) == 1, t
  assert all(len(s) == 1 for s in enc.stop_sequences())
  text = p.render_step(_STEPS[1])
  assert tok.decode(enc.encode(text), skip_special_tokens=True) == text
  assert len(tok) <= 512


def test_jinja_and_python_render_identically(tok):
  msgs = _messages()
  for gen in (False, True):
    jinja = tok.apply_chat_template(msgs, tokenize=False,
                                    add_generation_prompt=gen)
    assert jinja == T.render_messages(msgs, add_generation_prompt=gen)
  # Qwen3 shape, written out by hand.
  assert T.render_messages([{"role": "tool", "content": "x"}]) == (
      "<|im_start|>user\n<tool_response>\nx\n</tool_response><|im_end|>\n")


def test_incremental_ids_equal_one_piece(tok):
  enc = T.ChatEncoder(tok)
  msgs = _messages()[:6]
  ids = enc.turn_ids("system", msgs[0]["content"])
  ids += enc.turn_ids("user", msgs[1]["content"])
  for m in msgs[2:]:
    if m["role"] == "assistant":
      ids += enc.generation_prompt_ids() + enc.encode(m["content"])
      ids += enc.end_of_turn_ids()
    else:
      ids += enc.turn_ids(m["role"], m["content"])
  whole = tok.encode(T.render_messages(msgs), add_special_tokens=False)
  assert ids == whole


def test_offsets_give_token_kinds(tok):
  text = p.render_step(_STEPS[1])
  out = tok(text, add_special_tokens=False, return_offsets_mapping=True)
  kinds = p.token_kinds(out["offset_mapping"], p.classify_spans(text))
  call_id = tok.convert_tokens_to_ids("<call>")
  first = out["input_ids"].index(call_id)
  assert set(kinds[:first]) == {batch_lib.KIND_PLAN} and set(kinds[first:]) == {batch_lib.KIND_ACTION}


def test_missing_directory_is_clear_error(tmp_path):
  with pytest.raises(FileNotFoundError):
    T.load_tokenizer(str(tmp_path / "nope"))
