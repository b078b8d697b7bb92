"""TFDS builders, the demonstrations SFT source and the demo tokenizer.

Everything is built from small hand-written JSONL files in tmp dirs, with
TensorFlow absent; expected values come from the source records and from an
independent rendering (`tokenizer.render_messages`, decoding), never from the
pipeline's own encoding.
"""

import json
import os
import subprocess
import sys

import ml_collections
import numpy as np
import pytest

from paraagent_jax import config_utils
from paraagent_jax import tokenizer as tokenizer_lib
from paraagent_jax.data import demo_tokenizer
from paraagent_jax.data import demonstrations
from paraagent_jax.data import tfds_builders

KINDS = ("single", "parallel", "chain")
FAILED = (2, 5, 7)


def _demo(split, i):
  q = f"weather {i} city"
  messages = [
      {"role": "system", "content": "You are a ParaAct agent."},
      {"role": "user", "content": f"Task {split} {i}: what is the weather in "
                                  f"town{i}?" + " Be quick." * i},
      {"role": "assistant", "content":
       f'<explore> find tools\n<call>{{"name": "search_tools", "arguments": '
       f'{{"query": "{q}"}}}}</call>\n</step>'},
      {"role": "tool", "content": f'[{{"name": "weather_{i}"}}]'},
      {"role": "assistant", "content":
       f"<answer> it is {i + 10} C in town{i} </answer>"},
  ]
  return {"id": f"{split}-{i:02d}", "task_id": f"task-{split}-{i}",
          "kind": KINDS[i % 3], "split": split, "strategy": "paraact",
          "messages": messages, "roles": ["explorer", "answerer"],
          # The kept fraction then differs per kind.
          "success": i not in FAILED, "turns": 2, "calls": 1 + i % 2}


def _task(split, i):
  return {"id": f"t-{split}-{i}", "kind": KINDS[i % 3], "split": split,
          "instruction": f"Find the weather in town{i}.",
          "nodes": [{"id": 0, "tool": f"weather_{i}", "arguments": {"c": i}}],
          "answers": [{"label": "t", "value": str(i)}], "max_turns": 8}


def _write(path, rows):
  with open(path, "w", encoding="utf-8") as f:
    for r in rows:
      f.write(json.dumps(r) + "\n")


@pytest.fixture(scope="module")
def source(tmp_path_factory):
  d = tmp_path_factory.mktemp("src")
  sizes = {"train": 12, "test": 5}
  for split, n in sizes.items():
    _write(d / f"demonstrations_{split}.jsonl",
           [_demo(split, i) for i in range(n)])
    _write(d / f"tasks_{split}.jsonl", [_task(split, i) for i in range(n)])
  return str(d)


@pytest.fixture(scope="module")
def sft_config(source):
  # tokenizer "" -> <data_dir>/tokenizer is trained on demand.
  return ml_collections.ConfigDict({"data_dir": source, "tokenizer": "",
                                    "catalog": "procedural",
                                    "tokenizer_vocab_size": 600})


@pytest.fixture(scope="module")
def tok(sft_config):
  demonstrations.make_sft_data(sft_config, split="train", batch_size=2,
                               seq_len=256, seed=0)
  return tokenizer_lib.load_tokenizer(
      os.path.join(sft_config.data_dir, "tokenizer"))


def test_tensorflow_absent():
  r = subprocess.run([sys.executable, "-c", "import tensorflow"],
                     capture_output=True, text=True, check=False)
  assert r.returncode != 0 and "No module named" in r.stderr


@pytest.mark.parametrize("name,prefix", [("demonstrations", "demonstrations"),
                                         ("tasks", "tasks")])
def test_build_and_read_back(source, tmp_path, capsys, name, prefix):
  builder = tfds_builders.build_dataset(name, source, str(tmp_path))
  assert "tensorflow" not in sys.modules
  for split in ("train", "test"):
    with open(os.path.join(source, f"{prefix}_{split}.jsonl")) as f:
      want = [json.loads(line) for line in f]
    if name == "demonstrations":
      want = [r for r in want if r["success"]]
    got = tfds_builders.load_records(builder, split)
    assert got == sorted(want, key=lambda r: r["id"])
    # Raw text fields come back as bytes.
    raw = builder.as_data_source(split=split)[0]
    assert isinstance(raw["id"], bytes)
  out = capsys.readouterr().out
  if name == "demonstrations":
    # train: i=2,5,7 fail; kinds i%3 -> single {0,3,6,9}: 4/4 kept,
    # parallel {1,4,7,10}: 3/4, chain {2,5,8,11}: 2/4. 9 kept, 18 turns,
    # calls 1+i%2 over kept i -> 0,1,3,4,6,8,9,10,11 -> 5*1 + 4*2 = 13.
    # Per kind 4 tasks attempted in tasks_train.jsonl, the same kept counts.
    assert ("demonstrations[train]: 12 records, kept 9; kept fraction (of "
            "tasks) per "
            "kind: chain=0.50, parallel=0.75, single=1.00; mean turns 2.00;"
            f" calls per step {13 / 18:.2f}") in out
  else:
    assert "tool_env_tasks[test]: 5 records (chain=1, parallel=2, single=2)" \
        in out


def test_rebuilds_when_source_changes(tmp_path):
  src = tmp_path / "src"
  src.mkdir()
  for split in ("train", "test"):
    _write(src / f"tasks_{split}.jsonl", [_task(split, i) for i in range(3)])
  out = str(tmp_path / "tfds")
  first = tfds_builders.build_dataset("tasks", str(src), out)
  assert len(tfds_builders.load_records(first, "train")) == 3
  _write(src / "tasks_train.jsonl", [_task("train", i) for i in range(4)])
  again = tfds_builders.build_dataset("tasks", str(src), out)
  assert [r["id"] for r in tfds_builders.load_records(again, "train")] == [
      f"t-train-{i}" for i in range(4)]


def test_kept_fraction_against_attempted_tasks(tmp_path, capsys):
  # The producer wrote only successes; 2 of 3 "single" tasks were kept.
  for split in ("train", "test"):
    _write(tmp_path / f"demonstrations_{split}.jsonl",
           [_demo(split, i) for i in (0, 3)])
    _write(tmp_path / f"tasks_{split}.jsonl",
           [_task(split, i) for i in (0, 3, 6, 1)])
  tfds_builders.build_dataset("demonstrations", str(tmp_path),
                              str(tmp_path / "tfds"))
  assert ("kept fraction (of tasks) per kind: parallel=0.00, single=0.67;"
          in capsys.readouterr().out)


def test_unknown_dataset_and_missing_source(tmp_path):
  with pytest.raises(ValueError, match="unknown dataset"):
    tfds_builders.build_dataset("nope", str(tmp_path), str(tmp_path / "o"))
  with pytest.raises(FileNotFoundError, match="demonstrations_train.jsonl"):
    tfds_builders.build_dataset("demonstrations", str(tmp_path),
                                str(tmp_path / "o"))


def _runs(mask):
  """[start, end) of each run of ones."""
  edges = np.diff(np.concatenate([[0], (mask > 0).astype(int), [0]]))
  return list(zip(np.flatnonzero(edges == 1), np.flatnonzero(edges == -1)))


def test_loss_mask_is_exactly_assistant_spans(sft_config, tok):
  data = demonstrations.make_sft_data(sft_config, split="train",
                                      batch_size=3, seq_len=256, seed=1)
  by_id = {r["id"]: r for r in (_demo("train", i) for i in range(12))}
  batch = next(data)
  for r in range(3):
    rec = by_id[data.ids[data.example_index(r)]]
    n = int(batch["attention_mask"][r].sum())
    toks = batch["tokens"][r]
    # The whole row is the conversation as the Jinja-equivalent renderer
    # writes it (one tool message per turn, so no merging applies).
    assert tok.decode(toks[:n]) == tokenizer_lib.render_messages(
        rec["messages"])
    # The same ids as the rollout's turn-by-turn encoding (one call each).
    enc = tokenizer_lib.ChatEncoder(tok)
    assert list(toks[:n]) == [i for m in rec["messages"]
                              for i in enc.turn_ids(m["role"], m["content"])]
    assert (batch["attention_mask"][r, n:] == 0).all()
    assert (toks[n:] == tok.pad_token_id).all()
    spans = [tok.decode(toks[a:b]) for a, b in _runs(batch["loss_mask"][r])]
    want = [m["content"] + tokenizer_lib.IM_END for m in rec["messages"]
            if m["role"] == "assistant"]
    assert spans == want
  assert batch["tokens"].dtype == np.int32
  assert batch["loss_mask"].dtype == np.float32
  assert data.vocab_size == len(tok)


def test_resume_gives_identical_batches(sft_config, tok):
  del tok
  mk = lambda: demonstrations.make_sft_data(
      sft_config, split="train", batch_size=2, seq_len=256, seed=3)
  a = mk()
  for _ in range(5):  # past the 9-example epoch boundary
    next(a)
  state = json.loads(json.dumps(a.state()))
  want = [next(a) for _ in range(4)]
  b = mk()
  b.restore(state)
  got = [next(b) for _ in range(4)]
  for x, y in zip(want, got):
    for k in x:
      np.testing.assert_array_equal(x[k], y[k])
  with pytest.raises(ValueError, match="another"):
    demonstrations.make_sft_data(sft_config, split="train", batch_size=2,
                                 seq_len=256, seed=4).restore(state)


def _rows(batch):
  return [tuple(row) for row in batch["tokens"]]


def test_hosts_disjoint_and_epochs_complete(sft_config, tok):
  del tok
  hosts = [demonstrations.make_sft_data(
      sft_config, split="train", batch_size=2, seq_len=256, seed=5,
      process_index=h, process_count=2) for h in range(2)]
  single = demonstrations.make_sft_data(
      sft_config, split="train", batch_size=4, seq_len=256, seed=5)
  n = single.num_examples
  assert n == 9
  h0, h1 = next(hosts[0]), next(hosts[1])
  assert not set(_rows(h0)) & set(_rows(h1))
  # The two hosts' rows together are the one-host global batch.
  assert _rows(h0) + _rows(h1) == _rows(next(single))
  # Each epoch visits every kept demonstration once, in a seeded order.
  first = [single.ids[single.example_index(p)] for p in range(n)]
  second = [single.ids[single.example_index(p)] for p in range(n, 2 * n)]
  kept = sorted(f"train-{i:02d}" for i in range(12) if i not in FAILED)
  assert sorted(first) == sorted(second) == kept
  assert first != second
  other = demonstrations.make_sft_data(sft_config, split="train",
                                       batch_size=4, seq_len=256, seed=6)
  assert first != [other.ids[other.example_index(p)] for p in range(n)]


def test_overlong_dropped_or_truncated(sft_config, tok):
  lengths = [len(tokenizer_lib.ChatEncoder(tok).encode(
      tokenizer_lib.render_messages(_demo("train", i)["messages"])))
             for i in range(12) if i not in FAILED]
  limit = int(np.median(lengths))
  too_long = sum(x > limit for x in lengths)
  assert 0 < too_long < len(lengths)
  d = demonstrations.make_sft_data(sft_config, split="train", batch_size=2,
                                   seq_len=limit, seed=0)
  assert (d.num_dropped, d.num_examples) == (too_long,
                                             len(lengths) - too_long)
  cfg = ml_collections.ConfigDict(sft_config.to_dict())
  cfg.overlong = "truncate"
  t = demonstrations.make_sft_data(cfg, split="train", batch_size=9,
                                   seq_len=limit, seed=0)
  assert (t.num_dropped, t.num_truncated, t.num_examples) == (
      0, too_long, len(lengths))
  batch = next(t)
  assert batch["tokens"].shape == (9, limit)
  full = batch["attention_mask"].sum(1) == limit
  assert full.sum() >= too_long
  # Nothing fits: one line naming the fix, not an empty dataset.
  with pytest.raises(config_utils.ConfigError,
                     match=r"no demonstration fits seq_len=2 .*overlong=truncate"):
    demonstrations.make_sft_data(sft_config, split="train", batch_size=2,
                                 seq_len=2, seed=0)
  # "validation" reads the held-out test demonstrations (4 of 5 kept).
  v = demonstrations.make_sft_data(sft_config, split="validation",
                                   batch_size=2, seq_len=256, seed=0)
  assert sorted(v.ids) == ["test-00", "test-01", "test-03", "test-04"]


def test_tokenizer_round_trip_and_atomic_tokens(source, tmp_path):
  out = str(tmp_path / "tok")
  tok = demo_tokenizer.train_demo_tokenizer(source, out, vocab_size=500)
  from transformers import AutoTokenizer  # pylint: disable=g-import-not-at-top
  hf = AutoTokenizer.from_pretrained(out, local_files_only=True)
  text = ('<|im_start|>assistant\n<execute> go\n<call>{"name": "weather_3", '
          '"arguments": {"c": 3}}</call>\n</step><|im_end|>\nünïcode 42')
  for t in (tok, hf):
    ids = t.encode(text, add_special_tokens=False)
    assert t.decode(ids) == text
  assert hf.encode(text, add_special_tokens=False) == tok.encode(
      text, add_special_tokens=False)
  specials = list(tokenizer_lib.SPECIAL_TOKENS) + list(
      tokenizer_lib.ADDED_TOKENS)
  ids = [hf.encode(s, add_special_tokens=False) for s in specials]
  assert all(len(i) == 1 for i in ids)
  assert len({i[0] for i in ids}) == len(specials)
  # Glued to text, a tag still splits off as its single token.
  glued = hf.encode("x<call>y", add_special_tokens=False)
  assert ids[specials.index("<call>")][0] in glued
  assert len(hf) <= 500
  assert os.path.exists(os.path.join(out, "tokenizer.json"))


def test_length_buckets_group_similar_lengths(sft_config, tok):
  del tok
  cfg = ml_collections.ConfigDict(dict(sft_config.to_dict(), length_bucket=16))
  data = demonstrations.make_sft_data(cfg, split="train", batch_size=2,
                                      seq_len=256, seed=7)
  plain = demonstrations.make_sft_data(sft_config, split="train", batch_size=2,
                                       seq_len=256, seed=7)
  n = data.num_examples
  assert n == 9
  assert plain.batch(0)["tokens"].shape == (2, 256)
  lengths = {i: len(e[0])
             for i, e in zip(plain.ids, plain._examples)}  # pylint: disable=protected-access
  assert len(set(lengths.values())) == n      # the fixture's lengths differ
  epoch = [data.ids[data.example_index(p)] for p in range(n)]
  assert sorted(epoch) == sorted(data.ids)    # still every example once
  # 4 full batches fit in one window: the 8 examples before the leftover
  # one, sorted by length, cut into consecutive pairs, are the batches.
  by_len = sorted(epoch[:8], key=lengths.get)
  want = {frozenset(by_len[i:i + 2]) for i in range(0, 8, 2)}
  got = {frozenset(epoch[i:i + 2]) for i in range(0, 8, 2)}
  assert got == want
  for b in range(4):
    batch = data.batch(b)
    t = batch["tokens"].shape[1]
    longest = int(batch["attention_mask"].sum(1).max())
    assert t % 16 == 0 and longest <= t < longest + 16
    # Same rows as the unbucketed layout, only less padding.
    for r in range(2):
      ids = data._examples[data.example_index(2 * b + r)][0]  # pylint: disable=protected-access
      np.testing.assert_array_equal(batch["tokens"][r, :len(ids)], ids)
      assert batch["attention_mask"][r].sum() == len(ids)
  # Two hosts agree on each batch's length and split its rows.
  hosts = [demonstrations.make_sft_data(
      cfg, split="train", batch_size=1, seq_len=256, seed=7,
      process_index=h, process_count=2) for h in range(2)]
  for b in range(4):
    h0, h1 = hosts[0].batch(b), hosts[1].batch(b)
    assert h0["tokens"].shape == h1["tokens"].shape == (1, data.batch_len(b))
    assert _rows(h0) + _rows(h1) == _rows(data.batch(b))
  for bad in (-1, "64,x", "0,64"):
    with pytest.raises(ValueError, match="length_bucket"):
      demonstrations.make_sft_data(
          ml_collections.ConfigDict(dict(sft_config.to_dict(), length_bucket=bad)),
          split="train", batch_size=2, seq_len=256, seed=7)


def test_bucket_lengths():
  assert demonstrations.bucket_lengths(0, 512) == []
  assert demonstrations.bucket_lengths(128, 512) == [128, 256, 384, 512]
  assert demonstrations.bucket_lengths("300, 100", 256) == [100, 256]
  assert demonstrations.bucket_lengths((100, 900), 512) == [100, 512]
