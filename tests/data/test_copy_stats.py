"""The copy statistic (`paraagent_jax.data.copy_stats`) on hand-worked rows."""

from tokenizers import pre_tokenizers

from paraagent_jax import tokenizer as tok_lib
from paraagent_jax.data import copy_stats

ROW = [
    {"role": "user", "content": "Task: On Triraon, find the gym 'sierra'."},
    {"role": "assistant", "content":
     '<explore> find it\n<call>{"name": "search_tools", "arguments": '
     '{"query": "Triraon search gyms", "top_k": 3}}</call>\n</step>'},
    {"role": "tool", "content": "[1] search_tools: triraon_search_gyms: Triraon: search gyms."},
    {"role": "assistant", "content":
     '<execute>\n<call>{"name": "triraon_search_gyms", "arguments": '
     '{"query": "sierra"}}</call>\n</step>'},
    {"role": "tool", "content": '[1] triraon_search_gyms: {"results": [{"gym_id": "gym-e9c055"}]}'},
    {"role": "assistant", "content": "<answer> gym_id: gym-e9c055 </answer>"},
]


def test_copy_spans_hand_worked():
  content = ROW[1]["content"]
  spans = [(content[s:e], kind) for s, e, kind in copy_stats.copy_spans(content)]
  assert spans == [("search_tools", "name"), ("Triraon", "argument"),
                   ("search", "argument"), ("gyms", "argument")]
  content = ROW[5]["content"]
  assert [(content[s:e], k) for s, e, k in copy_stats.copy_spans(content)] == [
      ("gym_id", "answer"), ("gym-e9c055", "answer")]
  # Malformed calls contribute nothing and raise nothing.
  assert copy_stats.copy_spans('<call>{"name": </call><call>[1]</call>') == []


def _tokenizer():
  texts = [tok_lib.render_messages(ROW)] * 5 + ["Vixelist Marulia Dortaix sierra gym"]
  return tok_lib.train_bpe_tokenizer(texts, vocab_size=400)


def test_copy_statistic_demo_tokenizer_is_one():
  tok = _tokenizer()
  spans = list(copy_stats.row_copy_tokens(ROW, tok))
  texts = [s["text"] for s in spans]
  # Only words with an earlier whole-word occurrence count: not
  # search_tools, "search" or "gyms" of the first query.
  assert texts == ["Triraon", "triraon_search_gyms", "sierra", "gym_id", "gym-e9c055"]
  assert all(s["same_ids"] for s in spans)
  stat = copy_stats.copy_statistic([{"messages": ROW}], tok)
  assert stat["copy_statistic"] == 1.0 and stat["rows"] == 1
  assert stat["copy_tokens"] == sum(len(s["token_index"]) for s in spans)


def test_copy_statistic_gpt2_pretokenizer_moves_ids(monkeypatch):
  """With the old GPT-2 regex a leading space/quote joins the word."""
  monkeypatch.setattr(pre_tokenizers, "Sequence",
                      lambda _: pre_tokenizers.ByteLevel(add_prefix_space=False))
  tok = _tokenizer()
  assert tok.tokenize(' Triraon') != tok.tokenize('"Triraon')[1:]
  stat = copy_stats.copy_statistic([{"messages": ROW}], tok)
  assert stat["copy_statistic"] < 0.9


def test_ids_are_one_pre_token_wherever_they_stand():
  """``gym-e9c055`` is one word: its first piece follows the unique prefix.

  With "-" a piece of its own, the hex digits followed a "-" that occurs
  everywhere, and the policy copied ids by a two-token context only.
  """
  tok = _tokenizer()
  pre = tok.backend_tokenizer.pre_tokenizer
  for text in (" gym-e9c055.", '"gym-e9c055"', ": gym-e9c055 "):
    words = [w for w, _ in pre.pre_tokenize_str(text)]
    assert "gym-e9c055" in words, (text, words)
  ids = tok("gym-e9c055")["input_ids"]
  for text in ('Look up gym-e9c055.', '{"gym_id": "gym-e9c055"}'):
    row = tok(text)["input_ids"]
    assert any(row[i:i + len(ids)] == ids for i in range(len(row))), text
  # Hyphenated prose stays one word too; spaces and quotes are still split off.
  assert [w for w, _ in pre.pre_tokenize_str('a one-line "x"')] == [
      "a", "Ġ", "one-line", 'Ġ"', "x", '"']
