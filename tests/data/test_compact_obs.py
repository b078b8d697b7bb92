"""The demo's short-context options: ToolEnv ``obs_format="compact"`` and the
SFT ``context_loss_weight``.

References are independent of the code under test: the full-format search
lines (name, description, parameter list) cut by hand-written string
operations, the gold oracle's steps, and masks re-derived from the 0/1
assistant mask with numpy.
"""

import os
import re

import ml_collections
import numpy as np
import pytest

import toolenv
from paraagent_jax.coldstart import orchestrator, roles
from paraagent_jax import tokenizer as tokenizer_lib
from paraagent_jax.data import demo_tokenizer, demonstrations
from paraagent_jax.paraact import chat_format, policies, rollout
from toolenv.catalog import procedural
from toolenv.schema import Call, Step

from tests.data import test_data_pipeline as tdp  # the demonstrations fixture data


@pytest.fixture(scope="module")
def cat():
  return procedural.build_catalog(seed=0, size=3000)


@pytest.fixture(scope="module")
def tasks(cat):
  return toolenv.TaskGenerator(cat, seed=0).generate(10, split="test")


def _search(env, query, k=3):
  step = Step("explore", [Call("search_tools", {"query": query, "top_k": k})])
  return env.step(step).observation


def test_compact_search_lines_are_full_lines_without_description(cat, tasks):
  full = toolenv.ToolEnv(cat)
  compact = toolenv.ToolEnv(cat, obs_format="compact")
  for task in tasks[:5]:
    full.reset(task)
    compact.reset(task)
    for node in task.nodes:
      a = _search(full, node["query"]).splitlines()
      b = _search(compact, node["query"]).splitlines()
      assert len(a) == len(b) == 3
      for la, lb in zip(a, b):
        la = re.sub(r"^\[1\] search_tools: ", "", la)
        lb = re.sub(r"^\[1\] search_tools: ", "", lb)
        name, rest = la.split(": ", 1)
        params = rest[rest.rindex(" (") + 1:]       # the trailing "(...)"
        # Same tool at the same rank, its parameter list, no description.
        assert lb == name + params
        assert cat[name].description not in lb


def test_compact_is_shorter_and_bad_format_rejected(cat, tasks):
  full = toolenv.ToolEnv(cat)
  compact = toolenv.ToolEnv(cat, obs_format="compact")
  full.reset(tasks[0])
  compact.reset(tasks[0])
  q = tasks[0].nodes[0]["query"]
  assert len(_search(compact, q)) < 0.75 * len(_search(full, q))
  with pytest.raises(ValueError, match="obs_format"):
    toolenv.ToolEnv(cat, obs_format="tiny")


def test_block_mentions_both_formats():
  full = "acme_get_book: Look up one Acme book by id. (book_id*: str)"
  compact = "acme_get_book(book_id*: str)\nacme_list_books(format*: a|b)"
  assert roles.block_mentions(full, "acme_get_book")
  assert roles.block_mentions(compact, "acme_list_books")
  assert not roles.block_mentions(compact, "acme_delete_book")
  # A tool named in a parameter list is no mention.
  assert not roles.block_mentions("acme_get_book(str_id*: str)", "str_id")


def test_compact_demos_succeed_and_oracle_scores_100(cat, tasks):
  orch = orchestrator.Orchestrator(
      cat, roles.scripted_roles(cat, roles.Imperfection.default(), search_top_k=3),
      obs_format="compact")
  kept, stats = orch.run(tasks)
  assert stats["kept_fraction"] == 1.0
  tool_text = [m["content"] for d in kept for m in d["messages"] if m["role"] == "tool"]
  assert any("search_tools:" in t for t in tool_text)
  # No description text (": " after a tool name) in any search result line.
  for t in tool_text:
    if "search_tools:" in t:
      for line in t.splitlines():
        line = re.sub(r"^\[\d+\] search_tools: ", "", line)
        assert re.fullmatch(r"[a-z0-9_]+\(.*\)", line), line


def test_oracle_rollout_compact(cat, tasks, tmp_path):
  """The oracle through the text path in the compact env solves every task."""
  texts = [t.instruction for t in tasks] + ["search_tools get_tool_doc"] * 3
  tok = demo_tokenizer.train_demo_tokenizer(texts, str(tmp_path), vocab_size=600)
  fmt = chat_format.ChatFormat(tok, strategy="paraact")
  env = toolenv.VectorToolEnv(cat, num_envs=len(tasks), obs_format="compact",
                              **toolenv.oracle.env_options("paraact"))
  res = rollout.run_rollout(policies.OraclePolicy(fmt), env, tasks, fmt,
                            rollout.RolloutConfig(max_turns=16, max_len=8192))
  assert all(e["success"] for e in res.episodes)


@pytest.fixture(scope="module")
def sft_config(tmp_path_factory):
  d = tmp_path_factory.mktemp("src")
  for split, n in {"train": 12, "test": 5}.items():
    tdp._write(d / f"demonstrations_{split}.jsonl", [tdp._demo(split, i) for i in range(n)])
    tdp._write(d / f"tasks_{split}.jsonl", [tdp._task(split, i) for i in range(n)])
  return ml_collections.ConfigDict({"data_dir": str(d), "tokenizer": "",
                                    "catalog": "procedural", "tokenizer_vocab_size": 600})


def test_context_loss_weight(sft_config):
  base = demonstrations.make_sft_data(sft_config, split="train", batch_size=3,
                                      seq_len=256, seed=1)
  cfg = ml_collections.ConfigDict(dict(sft_config, context_loss_weight=0.25))
  weighted = demonstrations.make_sft_data(cfg, split="train", batch_size=3,
                                          seq_len=256, seed=1)
  a, b = next(base), next(weighted)
  np.testing.assert_array_equal(a["tokens"], b["tokens"])
  real = a["attention_mask"] > 0
  want = np.where(a["loss_mask"] > 0, 1.0, np.where(real, 0.25, 0.0))
  np.testing.assert_allclose(b["loss_mask"], want)
  assert (b["loss_mask"][~real] == 0).all() and (b["loss_mask"] == 0.25).any()
  # The validation split keeps the assistant-only 0/1 mask.
  v = next(demonstrations.make_sft_data(cfg, split="validation", batch_size=2,
                                        seq_len=256, seed=0))
  assert set(np.unique(v["loss_mask"])) <= {0.0, 1.0}
  bad = ml_collections.ConfigDict(dict(sft_config, context_loss_weight=1.5))
  with pytest.raises(ValueError, match="context_loss_weight"):
    demonstrations.make_sft_data(bad, split="train", batch_size=2, seq_len=256, seed=0)


def test_copy_warmup_batches(sft_config):
  base = demonstrations.make_sft_data(sft_config, split="train", batch_size=2,
                                      seq_len=256, seed=1)
  tok = tokenizer_lib.load_tokenizer(os.path.join(sft_config.data_dir, "tokenizer"))
  cfg = ml_collections.ConfigDict(dict(sft_config, copy_warmup=3, copy_len=128,
                                       copy_rows=3))
  data = demonstrations.make_sft_data(cfg, split="train", batch_size=2,
                                      seq_len=256, seed=1)
  for i in range(3):
    bt = data.batch(i)
    assert bt["tokens"].shape == (3, 128) and data.batch_len(i) == 128
    np.testing.assert_array_equal(bt["tokens"], data.batch(i)["tokens"])
    for r in range(3):
      n = int(bt["attention_mask"][r].sum())
      text = tok.decode(bt["tokens"][r, :n])
      # Every pair: the assistant repeats exactly what the user turn said.
      pairs = re.findall(r"<\|im_start\|>user\n(.*?)<\|im_end\|>\n"
                         r"<\|im_start\|>assistant\n(.*?)<\|im_end\|>\n", text, re.S)
      assert pairs and all(u == a for u, a in pairs)
      assert "".join(f"<|im_start|>user\n{u}<|im_end|>\n<|im_start|>assistant\n"
                     f"{a}<|im_end|>\n" for u, a in pairs) == text
      learnt = [tok.decode(bt["tokens"][r, a:b]) for a, b in tdp._runs(bt["loss_mask"][r])]
      assert learnt == [a + "<|im_end|>" for _, a in pairs]
  # After the warm-up the demonstrations start from their own first batch.
  for i in range(2):
    np.testing.assert_array_equal(data.batch(3 + i)["tokens"], base.batch(i)["tokens"])
  # Not in the validation split.
  v = demonstrations.make_sft_data(cfg, split="validation", batch_size=2, seq_len=256, seed=0)
  assert v.copy_warmup == 0


def test_copy_warmup_repeat_rows(sft_config):
  """``copy_mode="repeat"``: S sep S of distinct non-special tokens, loss on S2."""
  tok = tokenizer_lib.load_tokenizer(os.path.join(sft_config.data_dir, "tokenizer"))
  special = set(tok.all_special_ids) | set(tok.get_added_vocab().values())
  sep = tokenizer_lib.ChatEncoder(tok).encode(f"{tokenizer_lib.IM_END}\n") + \
      tokenizer_lib.ChatEncoder(tok).generation_prompt_ids()
  cfg = ml_collections.ConfigDict(dict(sft_config, copy_warmup=2, copy_len=65,
                                       copy_rows=4, copy_mode="repeat"))
  data = demonstrations.make_sft_data(cfg, split="train", batch_size=2,
                                      seq_len=256, seed=1)
  n = (65 - len(sep)) // 2
  for i in range(2):
    bt = data.batch(i)
    assert bt["tokens"].shape == (4, 65)
    np.testing.assert_array_equal(bt["tokens"], data.batch(i)["tokens"])
    for r in range(4):
      row = [int(x) for x in bt["tokens"][r, :int(bt["attention_mask"][r].sum())]]
      assert len(row) == 2 * n + len(sep)
      s1, mid, s2 = row[:n], row[n:n + len(sep)], row[n + len(sep):]
      assert s1 == s2 and mid == sep
      assert len(set(s1)) == n and not set(s1) & special
      # Loss on the second copy but its first token (nothing predicts that).
      want = np.zeros(65, np.float32)
      want[n + len(sep) + 1:len(row)] = 1
      np.testing.assert_array_equal(bt["loss_mask"][r], want)
    assert not np.array_equal(bt["tokens"][0], bt["tokens"][1])
  with pytest.raises(ValueError, match="copy_mode"):
    demonstrations.make_sft_data(
        ml_collections.ConfigDict(dict(cfg, copy_mode="echo")), split="train",
        batch_size=2, seq_len=256, seed=1)


def test_induction_rows_and_copy_every(sft_config):
  """``copy_mode="induction"``: prefix, S, sep, S with S's length and offset
  varying per row; ``copy_every``: copy batches interleaved, no demo skipped."""
  tok = tokenizer_lib.load_tokenizer(os.path.join(sft_config.data_dir, "tokenizer"))
  enc = tokenizer_lib.ChatEncoder(tok)
  sep = enc.encode(f"{tokenizer_lib.IM_END}\n") + enc.generation_prompt_ids()
  base = demonstrations.make_sft_data(sft_config, split="train", batch_size=2,
                                      seq_len=256, seed=1)
  cfg = ml_collections.ConfigDict(dict(sft_config, copy_warmup=2, copy_len=96,
                                       copy_rows=8, copy_mode="induction", copy_every=3))
  data = demonstrations.make_sft_data(cfg, split="train", batch_size=2,
                                      seq_len=256, seed=1)
  offsets = set()
  for bt in (data.batch(0), data.batch(1), data.batch(4)):
    assert bt["tokens"].shape == (8, 96)
    for r in range(8):
      row = [int(x) for x in bt["tokens"][r, :int(bt["attention_mask"][r].sum())]]
      m = int(bt["loss_mask"][r].sum()) + 1           # the second copy's length
      s1, mid, s2 = row[-2 * m - len(sep):-m - len(sep)], row[-m - len(sep):-m], row[-m:]
      assert s1 == s2 and mid == sep and len(set(s1)) == m
      assert bt["loss_mask"][r, len(row) - m + 1:len(row)].all()
      offsets.add((len(row) - 2 * m - len(sep), m))
  assert len(offsets) > 4        # prefixes and span lengths vary
  # After the warm-up: demo, demo, copy, demo, demo, copy ...; demos in order.
  kinds = ["copy" if data.batch_len(2 + j) == 96 and data.batch(2 + j)["tokens"].shape[0] == 8
           else "demo" for j in range(6)]
  assert kinds == ["demo", "demo", "copy", "demo", "demo", "copy"]
  for j, i in ((0, 0), (1, 1), (3, 2), (4, 3)):
    np.testing.assert_array_equal(data.batch(2 + j)["tokens"], base.batch(i)["tokens"])
  with pytest.raises(ValueError, match="copy_every"):
    demonstrations.make_sft_data(ml_collections.ConfigDict(dict(cfg, copy_every=1)),
                                 split="train", batch_size=2, seq_len=256, seed=1)


@pytest.mark.parametrize("turns,system", [(1, True), (2, True), (1, False)])
def test_turn_warmup_batches(sft_config, turns, system):
  """Opening-turn rows: the demonstration up to its first ``turns`` assistant
  turns (text and loss mask unchanged), then the demonstrations as before."""
  base = demonstrations.make_sft_data(sft_config, split="train", batch_size=2,
                                      seq_len=512, seed=1)
  tok = tokenizer_lib.load_tokenizer(os.path.join(sft_config.data_dir, "tokenizer"))
  cfg = ml_collections.ConfigDict(dict(sft_config, copy_warmup=1, turn_warmup=2,
                                       turn_rows=3, turn_len=400, turn_count=turns,
                                       turn_system=system))
  data = demonstrations.make_sft_data(cfg, split="train", batch_size=2, seq_len=512, seed=1)
  assert data.batch_len(0) == 256   # the copy batch (copy_len default)
  for i in (1, 2):
    bt = data.batch(i)
    assert bt["tokens"].shape == (3, 400) and data.batch_len(i) == 400
    for r in range(3):
      n = int(bt["attention_mask"][r].sum())
      pos = (i - 1) * 3 + r
      ids, mask = base._examples[base.example_index(pos)]
      if not system:   # the row starts at the task's user turn
        start = [j for j, x in enumerate(ids) if x == tok.convert_tokens_to_ids("<|im_start|>")][1]
        assert tok.decode(ids[:start]).startswith("<|im_start|>system\n")
        ids, mask = ids[start:], mask[start:]
      text = tok.decode(ids)
      assert text.startswith("<|im_start|>system" if system else "<|im_start|>user")
      # Hand-cut: everything up to the end of the turns-th assistant turn.
      cut = -1
      for _ in range(turns):
        cut = text.index("<|im_end|>\n", text.index("<|im_start|>assistant\n", cut + 1)) + 11
      want = text[:cut] if len(tok(text[:cut], add_special_tokens=False)["input_ids"]) <= 400 else None
      got = tok.decode(bt["tokens"][r, :n])
      if want is not None:
        assert got == want
      np.testing.assert_array_equal(bt["loss_mask"][r, :n], mask[:n])
      assert bt["loss_mask"][r, n:].sum() == 0 and got.count("<|im_start|>assistant") == turns
  # After both warm-ups the demonstrations start from their own first batch.
  np.testing.assert_array_equal(data.batch(3)["tokens"], base.batch(0)["tokens"])
  with pytest.raises(ValueError, match="turn_count"):
    demonstrations.make_sft_data(ml_collections.ConfigDict(dict(cfg, turn_count=0)),
                                 split="train", batch_size=2, seq_len=512, seed=1)
