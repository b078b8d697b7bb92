"""Packed SFT rows: several whole demonstrations per row, kept apart by segment ids.

A packed row holds demonstrations one after another, then padding::

  tokens          a0 a1 a2 a3 b0 b1 b2 c0 c1 pad pad
  segment_ids      1  1  1  1  2  2  2  3  3   0   0
  positions        0  1  2  3  0  1  2  0  1   0   0
  attention_mask   1  1  1  1  1  1  1  1  1   0   0
  loss_mask        0  .  .  .  0  .  .  0  .   0   0

The model lets a token attend only to earlier tokens of its own segment
(``Qwen3.__call__(..., positions, segment_ids)``) and restarts RoPE at each
segment's first token, so every demonstration is computed as in a row of its
own. The logit at t - 1 predicts token t; at a segment's first token that
logit comes from the previous segment, so the loss mask is 0 there (in a row
of its own, position 0 has no prediction either: the SFT loss ignores it).

`first_fit` assigns demonstrations to rows, `pack_rows` writes the arrays and
`unpack_row` reads a row back into its demonstrations.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

PACKED_FIELDS = ("tokens", "loss_mask", "attention_mask", "segment_ids",
                 "positions")


def first_fit(lengths: Sequence[int], capacity: int) -> list[np.ndarray]:
  """Rows of item indices: each item, in order, joins the first row with room.

  A row that has no room for the item is skipped; when none has room, a new
  row opens. The result is a pure function of the lengths and their order
  (so of the data seed, when the order is a seeded permutation). Rows are in
  the order they opened; items keep their order within a row.

  Args:
    lengths: tokens of each item, each in [1, capacity].
    capacity: tokens a row holds.

  Returns:
    One int64 array of item indices per row.

  Raises:
    ValueError: an item longer than ``capacity`` or shorter than 1.
  """
  lengths = np.asarray(lengths, np.int64)
  if len(lengths) and (lengths.max() > capacity or lengths.min() < 1):
    raise ValueError(f"first_fit: item lengths {lengths.min()}..{lengths.max()} "
                     f"must be in [1, capacity={capacity}]")
  room = np.empty(len(lengths), np.int64)   # at most one row per item
  rows: list[list[int]] = []
  for i, n in enumerate(lengths):
    fits = room[:len(rows)] >= n
    r = int(np.argmax(fits)) if len(rows) else 0
    if not len(rows) or not fits[r]:
      r = len(rows)
      rows.append([])
      room[r] = capacity
    rows[r].append(i)
    room[r] -= n
  return [np.asarray(r, np.int64) for r in rows]


def pack_rows(rows: Sequence[Sequence[tuple[np.ndarray, np.ndarray]]],
              seq_len: int, pad_id: int) -> dict[str, np.ndarray]:
  """A packed batch [len(rows), seq_len] of `PACKED_FIELDS`.

  Args:
    rows: per row, its demonstrations as (token ids [n], loss mask [n]).
    seq_len: T.
    pad_id: token id of the padding.

  Returns:
    ``tokens`` int32, ``loss_mask`` float32 (0 on every segment's first
    token), ``attention_mask`` int32, ``segment_ids`` int32 (1, 2, ... per
    row; padding 0) and ``positions`` int32 (0, 1, ... in each segment;
    padding 0).

  Raises:
    ValueError: a row longer than ``seq_len``.
  """
  b = len(rows)
  out = {"tokens": np.full((b, seq_len), pad_id, np.int32),
         "loss_mask": np.zeros((b, seq_len), np.float32),
         "attention_mask": np.zeros((b, seq_len), np.int32),
         "segment_ids": np.zeros((b, seq_len), np.int32),
         "positions": np.zeros((b, seq_len), np.int32)}
  for r, row in enumerate(rows):
    total = sum(len(ids) for ids, _ in row)
    if total > seq_len:
      raise ValueError(f"pack_rows: row {r} holds {total} tokens > seq_len={seq_len}")
    start = 0
    for seg, (ids, mask) in enumerate(row, start=1):
      end = start + len(ids)
      out["tokens"][r, start:end] = ids
      out["loss_mask"][r, start:end] = mask
      out["loss_mask"][r, start] = 0.0
      out["attention_mask"][r, start:end] = 1
      out["segment_ids"][r, start:end] = seg
      out["positions"][r, start:end] = np.arange(len(ids))
      start = end
  return out


def unpack_row(batch, r: int) -> list[tuple[np.ndarray, np.ndarray]]:
  """The (token ids, loss mask) of each segment of row ``r``, in order."""
  seg = np.asarray(batch["segment_ids"][r])
  return [(np.asarray(batch["tokens"][r])[seg == s],
           np.asarray(batch["loss_mask"][r])[seg == s])
          for s in range(1, int(seg.max(initial=0)) + 1)]


def fill(lengths: Sequence[int], rows: Sequence[np.ndarray], seq_len: int) -> float:
  """Fraction of the rows' ``seq_len`` slots that hold tokens."""
  return float(np.sum(lengths)) / max(len(rows) * seq_len, 1)
