"""Packed SFT rows (``data.pack``): lossless, exact resume, no cross-segment attention.

References are independent of the code under test: a plain-Python first-fit,
hand-written packed arrays, the conversations as `tokenizer.render_messages`
writes them, the unpacked pipeline's rows, and the model's log-likelihood of
each demonstration in a row of its own.
"""

import json
import os

from flax import nnx
import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import pytest

from paraagent_jax import config_utils
from paraagent_jax import metrics as metrics_lib
from paraagent_jax import tokenizer as tokenizer_lib
from paraagent_jax.data import demonstrations, packing
from paraagent_jax.learner import logprobs
from paraagent_jax.learner import optimizer as optim
from paraagent_jax.learner import sft_loss
from paraagent_jax.learner import step as ts
from paraagent_jax.models import qwen3
from paraagent_jax.trainer import sft as sft_lib

from tests.data import test_data_pipeline as tdp  # the demonstrations fixture data

N_TRAIN = 16
SEQ = 400   # two or three of the fixture's demonstrations (108-168 tokens) a row


@pytest.fixture(scope="module")
def cfg(tmp_path_factory):
  d = tmp_path_factory.mktemp("packsrc")
  for split, n in (("train", N_TRAIN), ("test", 5)):
    tdp._write(d / f"demonstrations_{split}.jsonl", [tdp._demo(split, i) for i in range(n)])  # pylint: disable=protected-access
    tdp._write(d / f"tasks_{split}.jsonl", [tdp._task(split, i) for i in range(n)])  # pylint: disable=protected-access
  return ml_collections.ConfigDict({"data_dir": str(d), "tokenizer": "",
                                    "catalog": "procedural",
                                    "tokenizer_vocab_size": 600, "pack": True})


def _make(cfg, batch_size=2, seed=0, **kw):
  c = ml_collections.ConfigDict(dict(cfg.to_dict(), **kw))
  return demonstrations.make_sft_data(c, split="train", batch_size=batch_size,
                                      seq_len=SEQ, seed=seed)


@pytest.fixture(scope="module")
def tok(cfg):
  _make(cfg)   # trains <data_dir>/tokenizer
  return tokenizer_lib.load_tokenizer(os.path.join(cfg.data_dir, "tokenizer"))


def _first_fit_reference(lengths, capacity):
  """First-fit in plain Python: the first row with room, else a new row."""
  rows, room = [], []
  for i, n in enumerate(lengths):
    for r, left in enumerate(room):
      if left >= n:
        break
    else:
      r = len(rows)
      rows.append([])
      room.append(capacity)
    rows[r].append(i)
    room[r] -= n
  return rows


def test_first_fit_hand_example_and_reference():
  # 5 opens row 0, 3 fills it; 4 opens row 1, 2 and 1 join it.
  got = packing.first_fit([5, 3, 4, 2, 1], 8)
  assert [r.tolist() for r in got] == [[0, 1], [2, 3, 4]]
  assert [r.tolist() for r in packing.first_fit([8, 1, 7], 8)] == [[0], [1, 2]]
  assert packing.first_fit([], 8) == []
  rng = np.random.default_rng(0)
  for cap in (16, 100):
    lengths = rng.integers(1, cap + 1, size=300)
    got = [r.tolist() for r in packing.first_fit(lengths, cap)]
    assert got == _first_fit_reference(lengths.tolist(), cap)
    assert sorted(i for r in got for i in r) == list(range(300))
  with pytest.raises(ValueError, match="capacity=8"):
    packing.first_fit([3, 9], 8)
  with pytest.raises(ValueError, match="capacity=8"):
    packing.first_fit([3, 0], 8)


def test_pack_rows_hand_example():
  rows = [[(np.array([11, 12, 13]), np.array([0.5, 1, 1], np.float32)),
           (np.array([21, 22]), np.array([1, 1], np.float32))],
          [(np.array([31]), np.array([1], np.float32))]]
  got = packing.pack_rows(rows, 7, pad_id=9)
  want = {
      "tokens": [[11, 12, 13, 21, 22, 9, 9], [31, 9, 9, 9, 9, 9, 9]],
      # 0 on each segment's first token: its logit belongs to the segment before.
      "loss_mask": [[0, 1, 1, 0, 1, 0, 0], [0, 0, 0, 0, 0, 0, 0]],
      "attention_mask": [[1, 1, 1, 1, 1, 0, 0], [1, 0, 0, 0, 0, 0, 0]],
      "segment_ids": [[1, 1, 1, 2, 2, 0, 0], [1, 0, 0, 0, 0, 0, 0]],
      "positions": [[0, 1, 2, 0, 1, 0, 0], [0, 0, 0, 0, 0, 0, 0]],
  }
  assert set(got) == set(packing.PACKED_FIELDS) == set(want)
  for k, v in want.items():
    np.testing.assert_array_equal(got[k], v, err_msg=k)
  assert got["loss_mask"].dtype == np.float32
  assert all(got[k].dtype == np.int32 for k in want if k != "loss_mask")
  back = packing.unpack_row(got, 0)
  assert [a.tolist() for a, _ in back] == [[11, 12, 13], [21, 22]]
  with pytest.raises(ValueError, match="seq_len=4"):
    packing.pack_rows(rows, 4, pad_id=9)


def _segments(batches):
  """(ids, mask, positions) of every segment of every row, in stream order."""
  out = []
  for b in batches:
    for r in range(b["tokens"].shape[0]):
      seg = b["segment_ids"][r]
      n = int((seg > 0).sum())
      # Segments are 1, 2, ... and contiguous, then padding (id 0).
      ids_in_order = seg[:n]
      assert (np.diff(ids_in_order) >= 0).all() and ids_in_order[0] == 1
      assert set(ids_in_order) == set(range(1, ids_in_order[-1] + 1))
      assert (seg[n:] == 0).all() and (b["attention_mask"][r] == (seg > 0)).all()
      assert (b["loss_mask"][r, n:] == 0).all() and (b["positions"][r, n:] == 0).all()
      for s in range(1, int(seg.max()) + 1):
        at = seg == s
        out.append((b["tokens"][r, at], b["loss_mask"][r, at], b["positions"][r, at]))
  return out


@pytest.mark.parametrize("context_weight", [0.0, 0.25])
def test_packing_is_lossless(cfg, tok, context_weight):
  packed = _make(cfg, seed=1, context_loss_weight=context_weight)
  plain = _make(cfg, seed=1, context_loss_weight=context_weight, pack=False)
  n = packed.num_examples
  assert n == N_TRAIN - len(tdp.FAILED)
  rows_epoch0 = len(packed.epoch_rows(0))
  assert rows_epoch0 < n / 1.5          # several demonstrations a row
  # Whole batches cover epoch 0's rows and a little more.
  n_batches = -(-rows_epoch0 // 2)
  segs = _segments([next(packed) for _ in range(n_batches)])
  # The unpacked rows of the same demonstrations, keyed by their text.
  want = {}
  for _ in range(-(-n // 2)):
    b = next(plain)
    for r in range(2):
      m = int(b["attention_mask"][r].sum())
      want[tok.decode(b["tokens"][r, :m])] = (b["tokens"][r, :m], b["loss_mask"][r, :m])
  rendered = {tokenizer_lib.render_messages(tdp._demo("train", i)["messages"])  # pylint: disable=protected-access
              for i in range(N_TRAIN) if i not in tdp.FAILED}
  assert set(want) == rendered
  texts = [tok.decode(ids) for ids, _, _ in segs]
  # Epoch 0's rows hold every kept demonstration exactly once.
  epoch0 = sum(len(r) for r in packed.epoch_rows(0))
  assert epoch0 == n and sorted(texts[:n]) == sorted(rendered)
  for (ids, mask, pos), text in zip(segs, texts):
    ref_ids, ref_mask = want[text]
    np.testing.assert_array_equal(ids, ref_ids)
    np.testing.assert_array_equal(pos, np.arange(len(ids)))
    assert mask[0] == 0.0                      # no loss on a segment's first token
    np.testing.assert_array_equal(mask[1:], ref_mask[1:])
    # Spans of ones are exactly the assistant turns (+ <|im_end|>).
    if not context_weight:
      spans = [tok.decode(ids[a:b]) for a, b in tdp._runs(mask)]  # pylint: disable=protected-access
      assert all(s.endswith(tokenizer_lib.IM_END) for s in spans) and len(spans) == 2


def test_packed_resume_is_exact(cfg, tok):
  del tok
  a = _make(cfg, seed=3)
  rows_per_epoch = len(a.epoch_rows(0))
  steps = 3 * rows_per_epoch // 2 + 2          # past two epoch boundaries
  want = [next(a) for _ in range(steps + 4)]
  b = _make(cfg, seed=3)
  for _ in range(steps):
    next(b)
  state = json.loads(json.dumps(b.state()))
  assert state["pack"] is True
  # A fresh iterator (no packing computed yet) jumps straight to the position.
  c = _make(cfg, seed=3)
  c.restore(state)
  for x, y in zip(want[steps:], [next(c) for _ in range(4)]):
    assert set(x) == set(packing.PACKED_FIELDS)
    for k in x:
      np.testing.assert_array_equal(x[k], y[k], err_msg=k)
  with pytest.raises(ValueError, match="data.pack"):
    _make(cfg, seed=3, pack=False).restore(state)
  old = {k: v for k, v in state.items() if k != "pack"}   # saved before packing
  with pytest.raises(ValueError, match="data.pack"):
    _make(cfg, seed=3).restore(old)
  _make(cfg, seed=3, pack=False).restore(old)
  # Another seed packs other rows.
  other = _make(cfg, seed=4)
  assert any(not np.array_equal(next(other)["tokens"], w["tokens"]) for w in want[:3])


def test_packed_hosts_split_the_global_rows(cfg, tok):
  del tok
  single = _make(cfg, batch_size=4, seed=5)
  hosts = [demonstrations.make_sft_data(
      ml_collections.ConfigDict(cfg.to_dict()), split="train", batch_size=2,
      seq_len=SEQ, seed=5, process_index=h, process_count=2) for h in range(2)]
  for _ in range(3):
    whole, h0, h1 = next(single), next(hosts[0]), next(hosts[1])
    for k in whole:
      np.testing.assert_array_equal(np.concatenate([h0[k], h1[k]]), whole[k])


def test_packed_length_buckets(cfg, tok):
  del tok
  data = _make(cfg, seed=6, length_bucket="128,256,320")
  lengths = []
  for i in range(8):
    b = data.batch(i)
    t = b["tokens"].shape[1]
    longest = int(b["attention_mask"].sum(1).max())
    # The smallest bucket that holds the batch's longest packed row.
    assert t == data.batch_len(i) == min(x for x in (128, 256, 320, SEQ) if x >= longest)
    lengths.append(t)
  assert len(set(lengths)) > 1


def _train(cfg, workdir, total_steps):
  c = config_utils.load_config(os.path.join(
      os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "configs",
      "sft_tiny.py"))
  c.data = ml_collections.ConfigDict(dict(cfg.to_dict(), source="demonstrations",
                                          seed=0))
  c.model.vocab_size = 0        # the tokenizer's
  c.seq_len, c.batch_size, c.total_steps = SEQ, 8, total_steps
  c.ckpt_every, c.log_every, c.eval_every = 2, 1, 0
  c.optimizer.schedule, c.optimizer.warmup_steps = "constant", 0
  c.progress = c.tensorboard = False
  sft_lib.run_sft(c, str(workdir))
  return {r["step"]: r["train/loss"] for r in
          metrics_lib.read_jsonl(os.path.join(str(workdir), "metrics.jsonl"))}


@pytest.mark.slow
def test_packed_sft_run_resumes_exactly(cfg, tok, tmp_path, capsys):
  del tok
  # 8 rows a step over an 8-device mesh; the 13 demonstrations fill ~6 rows,
  # so every step crosses an epoch boundary.
  whole = _train(cfg, tmp_path / "whole", 4)
  _train(cfg, tmp_path / "resumed", 2)
  capsys.readouterr()
  resumed = _train(cfg, tmp_path / "resumed", 4)
  assert "resumed at step 2/4" in capsys.readouterr().out
  assert sorted(whole) == [1, 2, 3, 4]
  assert [resumed[s] for s in (3, 4)] == [whole[s] for s in (3, 4)]
  assert whole[4] < whole[1]     # it trains


def _random_demos(rng, lengths, vocab):
  out = []
  for n in lengths:
    mask = (rng.random(n) < 0.6).astype(np.float32)
    mask[0] = 1.0    # ignored unpacked (position 0), zeroed packed
    out.append((rng.integers(1, vocab, n).astype(np.int32), mask))
  return out


def _one_per_row(demos):
  t = max(len(i) for i, _ in demos)
  b = {"tokens": np.zeros((len(demos), t), np.int32),
       "loss_mask": np.zeros((len(demos), t), np.float32),
       "attention_mask": np.zeros((len(demos), t), np.int32)}
  for r, (ids, mask) in enumerate(demos):
    b["tokens"][r, :len(ids)], b["loss_mask"][r, :len(ids)] = ids, mask
    b["attention_mask"][r, :len(ids)] = 1
  return b


def _nll_sum(model, batch):
  logp = logprobs.model_logprobs(model, jnp.asarray(batch["tokens"]), jnp.asarray(batch["attention_mask"]),
      None if "positions" not in batch else jnp.asarray(batch["positions"]),
      None if "segment_ids" not in batch else jnp.asarray(batch["segment_ids"]))
  mask = np.array(batch["loss_mask"])
  mask[:, 0] = 0.0        # the SFT loss's convention: position 0 has no prediction
  return float(-(logp * mask).sum())


@pytest.mark.slow
@pytest.mark.parametrize("attention", ["reference", "chunked"])
def test_packed_loss_equals_one_demonstration_per_row(attention):
  cfg = qwen3.Qwen3Config.preset("tiny", attention=attention, attention_chunk=16,
                                 logits_chunk=16)
  model = qwen3.Qwen3(cfg, rngs=nnx.Rngs(0))
  rng = np.random.default_rng(0)
  demos = _random_demos(rng, [13, 30, 7, 25, 9, 18, 40, 3], cfg.vocab_size)
  seq = 48
  rows = packing.first_fit([len(i) for i, _ in demos], seq)
  assert max(len(r) for r in rows) >= 3
  packed = packing.pack_rows([[demos[k] for k in r] for r in rows], seq, pad_id=0)
  plain = _one_per_row(demos)
  want = _nll_sum(model, plain)
  got = _nll_sum(model, packed)
  tol = 1e-5 * abs(want)
  assert abs(got - want) <= tol
  # The control: the same packed rows without segment ids and positions
  # attend across demonstrations, and the tolerance tells them apart (a
  # random model's log-probs depend little on context: ~80x tol here).
  leaky = {k: packed[k] for k in sft_loss.SFT_FIELDS}
  assert abs(_nll_sum(model, leaky) - want) > 20 * tol

  # The SFT train step (loss, gradients) sees the same demonstrations alike.
  mesh = jax.make_mesh((1, 1, 1), ts.DEFAULT_BATCH_AXES + ("tensor",),
                       axis_types=(jax.sharding.AxisType.Auto,) * 3,
                       devices=jax.devices()[:1])
  optimizer = optim.make_optimizer(optim.OptimizerConfig(learning_rate=1e-3))
  graphdef, state = nnx.split(model)
  step = sft_loss.make_sft_train_step(graphdef, optimizer, mesh)
  metrics = {}
  for name, batch in (("plain", plain), ("packed", packed)):
    st, opt = ts.shard_train_state(jax.tree.map(jnp.copy, state), optimizer, mesh)
    _, _, m = step(st, opt, batch, jax.random.key(0))
    metrics[name] = {k: float(v) for k, v in m.items()}
  for k in ("loss", "num_tokens", "grad_norm"):
    np.testing.assert_allclose(metrics["packed"][k], metrics["plain"][k], rtol=1e-5,
                               err_msg=k)
