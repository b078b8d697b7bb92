"""A synthetic, in-memory SFT dataset, and the SFT data interface it defines.

The SFT stage (`paraagent_jax.trainer.sft`) reads any object with this interface
(the demonstrations pipeline in `paraagent_jax.data` provides the same):

* iterating yields *global-batch rows of this host* as numpy dicts:
  ``tokens`` [B,T] int32, ``loss_mask`` [B,T] float32 (1 on assistant
  tokens to learn), ``attention_mask`` [B,T] int32 (1 on real tokens);
  B and T are the same for every batch (fixed shapes: one compilation).
* ``state() -> dict``: the position, JSON-serialisable (ints, strings,
  lists); saved in every checkpoint.
* ``restore(state)``: continue exactly after the batch that was last
  yielded when ``state()`` was taken.
* attributes ``batch_size``, ``seq_len``, ``vocab_size``.

A source module named in ``config.data.source`` (``synthetic`` is this one)
exposes ``make_sft_data(data_config, *, split, batch_size, seq_len, seed,
process_index, process_count)`` returning such an object.

The task here is copying: ``BOS prompt SEP prompt EOS pad...``, with the loss
on the copy and EOS. Each example is a pure function of (seed, split,
index), so the position is one integer and resuming is exact.
"""

from __future__ import annotations

from typing import Any, Iterator, Mapping

import numpy as np

PAD, BOS, SEP, EOS = 0, 1, 2, 3
FIRST_WORD = 4
_SPLIT_OFFSETS = {"train": 0, "validation": 1, "test": 2}


def make_example(rng: np.random.Generator, seq_len: int, vocab_size: int,
                 min_len: int, max_len: int) -> dict[str, np.ndarray]:
  """One copy example, padded to ``seq_len``."""
  longest = (seq_len - 3) // 2
  hi = max(1, min(max_len, longest))
  lo = max(1, min(min_len, hi))
  n = int(rng.integers(lo, hi + 1))
  words = rng.integers(FIRST_WORD, vocab_size, size=n)
  seq = np.concatenate([[BOS], words, [SEP], words, [EOS]]).astype(np.int32)
  tokens = np.full(seq_len, PAD, np.int32)
  tokens[:len(seq)] = seq
  attention = np.zeros(seq_len, np.int32)
  attention[:len(seq)] = 1
  loss_mask = np.zeros(seq_len, np.float32)
  # The copy and EOS are the "assistant" part; the prompt is context only.
  loss_mask[n + 2:len(seq)] = 1.0
  return {"tokens": tokens, "loss_mask": loss_mask,
          "attention_mask": attention}


class SyntheticSFTData:
  """Endless deterministic stream of fixed-shape copy-task batches.

  Attributes:
    batch_size: rows per batch on this host.
    seq_len: T.
    vocab_size: token ids are in [0, vocab_size).
  """

  def __init__(self, *, batch_size: int, seq_len: int, vocab_size: int,
               seed: int = 0, split: str = "train", min_len: int = 2,
               max_len: int = 16, process_index: int = 0,
               process_count: int = 1):
    if vocab_size <= FIRST_WORD:
      raise ValueError(f"vocab_size={vocab_size} must exceed {FIRST_WORD}")
    if seq_len < 5:
      raise ValueError(f"seq_len={seq_len} is too short (need >= 5)")
    if split not in _SPLIT_OFFSETS:
      raise ValueError(f"split={split!r}; choose from {sorted(_SPLIT_OFFSETS)}")
    self.batch_size = int(batch_size)
    self.seq_len = int(seq_len)
    self.vocab_size = int(vocab_size)
    self._seed = int(seed)
    self._split = split
    self._min_len, self._max_len = int(min_len), int(max_len)
    self._process_index = int(process_index)
    self._process_count = int(process_count)
    self._next_batch = 0

  def state(self) -> dict[str, Any]:
    """The position: index of the next batch (JSON-serialisable)."""
    return {"next_batch": self._next_batch, "seed": self._seed,
            "split": self._split}

  def restore(self, state: Mapping[str, Any]) -> None:
    """Continues after the batch that was last yielded at ``state()``."""
    if state.get("seed", self._seed) != self._seed or state.get(
        "split", self._split) != self._split:
      raise ValueError(f"data state {dict(state)} was saved for another "
                       f"seed/split than seed={self._seed} "
                       f"split={self._split!r}")
    self._next_batch = int(state["next_batch"])

  def row_ids(self, index: int) -> list[int]:
    """The rows of batch ``index`` on this host: their numbers in the stream
    (global batch ``index`` is rows ``index * B`` to ``(index + 1) * B - 1``
    of all hosts together, host ``h``'s share the ``h``-th slice)."""
    first = (index * self._process_count + self._process_index) * self.batch_size
    return list(range(first, first + self.batch_size))

  def last_row_ids(self) -> list[int]:
    """`row_ids` of the batch last yielded (the ``debug.rows_log`` hook)."""
    return self.row_ids(self._next_batch - 1)

  def batch(self, index: int) -> dict[str, np.ndarray]:
    """Batch number ``index`` (this host's rows), without moving."""
    rows = []
    for row in self.row_ids(index):
      rng = np.random.default_rng(
          [self._seed, _SPLIT_OFFSETS[self._split], row])
      rows.append(make_example(rng, self.seq_len, self.vocab_size,
                               self._min_len, self._max_len))
    return {k: np.stack([x[k] for x in rows]) for k in rows[0]}

  def __iter__(self) -> Iterator[dict[str, np.ndarray]]:
    return self

  def __next__(self) -> dict[str, np.ndarray]:
    out = self.batch(self._next_batch)
    self._next_batch += 1
    return out


def make_sft_data(data_config, *, split: str, batch_size: int, seq_len: int,
                  seed: int, process_index: int = 0,
                  process_count: int = 1) -> SyntheticSFTData:
  """The source hook used by the SFT stage (`trainer.sft.make_sft_data`, ``data.source``).

  Args:
    data_config: ``config.data``; reads ``vocab_size``, ``min_len``,
      ``max_len`` when present.
    split: "train", "validation" or "test".
    batch_size: rows per host.
    seq_len: T.
    seed: data seed.
    process_index: this host.
    process_count: number of hosts.
  """
  get = lambda k, d: data_config.get(k, d) if data_config is not None else d
  return SyntheticSFTData(batch_size=batch_size, seq_len=seq_len,
                          vocab_size=int(get("vocab_size", 256)), seed=seed,
                          split=split, min_len=int(get("min_len", 2)),
                          max_len=int(get("max_len", 16)),
                          process_index=process_index,
                          process_count=process_count)
