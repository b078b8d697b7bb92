"""Warm-up rows for SFT from scratch: synthetic copy rows and opening turns.

Pure functions of their arguments (the caller seeds ``rng`` by seed, batch
index and host), used by `demonstrations.DemonstrationSFTData`'s
``copy_batch`` and ``turn_batch``. Each returns a batch dict with
``tokens`` [b, t] int32 (``pad`` where empty), ``loss_mask`` [b, t] float32
and ``attention_mask`` [b, t] int32.

* `copy_pair_rows` (``copy_mode="pairs"``): chat-format pairs
  ``<|im_start|>user\\n S <|im_end|>\\n<|im_start|>assistant\\n S <|im_end|>\\n``,
  S 4-24 tokens, the loss on the assistant's S and its ``<|im_end|>``.
* `repeat_rows` (``"repeat"``, ``"induction"``): ``S sep S`` with the loss
  on the second S.
* `opening_turn_rows`: demonstrations cut after their first assistant turns.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np


def empty_batch(b: int, t: int, pad: int):
  """(tokens all ``pad``, loss mask 0, attention mask 0) of a [b, t] batch."""
  return (np.full((b, t), pad, np.int32), np.zeros((b, t), np.float32),
          np.zeros((b, t), np.int32))


def _batch(tokens, loss_mask, attention) -> dict[str, np.ndarray]:
  return {"tokens": tokens, "loss_mask": loss_mask, "attention_mask": attention}


def copy_pair_rows(rng, examples: Sequence[np.ndarray], glue, special: set[int],
                   b: int, t: int, pad: int) -> dict[str, np.ndarray]:
  """Rows of copy pairs; S is half the time a span of a random example of
  ``examples`` (token-id arrays), half the time tokens drawn at random from
  one (so only copying predicts it); ``special`` ids are left out of S.

  ``glue``: (head, mid, tail, n_end): the token ids before the user's S,
  between the two S, after the assistant's S, and how many of ``tail`` the
  loss covers (the ``<|im_end|>``).
  """
  head, mid, tail, n_end = glue
  tokens, loss_mask, attention = empty_batch(b, t, pad)
  for r in range(b):
    ids, mask = [], []
    while True:
      ex = examples[int(rng.integers(len(examples)))]
      n = int(rng.integers(4, 25))
      if rng.random() < 0.5:
        start = int(rng.integers(max(1, len(ex) - n)))
        span = [int(x) for x in ex[start:start + n]]
      else:
        span = [int(x) for x in ex[rng.integers(len(ex), size=n)]]
      span = [x for x in span if x not in special] or [int(ex[0])]
      pair = head + span + mid + span + tail
      if len(ids) + len(pair) > t:
        break
      ids += pair
      mask += ([0] * (len(head) + len(span) + len(mid)) + [1] * (len(span) + n_end)
               + [0] * (len(tail) - n_end))
    tokens[r, :len(ids)] = ids
    loss_mask[r, :len(ids)] = mask
    attention[r, :len(ids)] = 1
  return _batch(tokens, loss_mask, attention)


def repeat_rows(rng, sep: Sequence[int], vocab_size: int, special: set[int], b: int,
                t: int, pad: int, vary: bool = False) -> dict[str, np.ndarray]:
  """``S sep S`` rows with the loss on the second S.

  S has ``(t - len(sep)) // 2`` distinct tokens drawn uniformly from the
  non-special vocabulary, so nothing but the first copy predicts the
  second and every token of S names one position of it (drawing S from
  demonstration text instead, with its many repeated quotes and spaces,
  made the task ambiguous and the copy loss fell 3x slower).
  """
  tokens, loss_mask, attention = empty_batch(b, t, pad)
  n = (t - len(sep)) // 2
  pool = np.setdiff1d(np.arange(vocab_size, dtype=np.int32),
                      np.asarray(sorted(special), np.int32))
  n = min(n, len(pool))
  for r in range(b):
    # vary ("induction"): a random-length span after a random-length
    # prefix of random tokens, so the copy's offset differs row to row and
    # only matching content (not a fixed relative position) finds it.
    m = int(rng.integers(max(4, n // 4), n + 1)) if vary else n
    span = rng.choice(pool, size=m, replace=False).astype(np.int32)
    pre = (rng.choice(pool, size=int(rng.integers(0, n - m + 1)) * 2).astype(np.int32)
           if vary else np.zeros(0, np.int32))
    row = np.concatenate([pre, span, np.asarray(sep, np.int32), span])[:t]
    tokens[r, :len(row)] = row
    attention[r, :len(row)] = 1
    loss_mask[r, len(row) - len(span) + 1:len(row)] = 1
  return _batch(tokens, loss_mask, attention)


def opening_turn_rows(examples: Sequence[tuple[np.ndarray, np.ndarray]], t: int, pad: int,
                      im_start: int, turn_count: int = 1,
                      with_system: bool = True) -> dict[str, np.ndarray]:
  """One row per (ids, loss mask) example, cut after its first ``turn_count``
  assistant turns (and to ``t``); without ``with_system`` the row starts at
  the second turn (the task). The loss mask is the example's, cut with it.
  """
  tokens, loss_mask, attention = empty_batch(len(examples), t, pad)
  for r, (ids, mask) in enumerate(examples):
    if not with_system:
      starts = np.nonzero(ids == im_start)[0]
      if len(starts) > 1:
        ids, mask = ids[starts[1]:], mask[starts[1]:]
    # A turn's learnt tokens end where the mask falls back to 0.
    ends = np.nonzero((mask[:-1] > 0) & (mask[1:] == 0))[0]
    cut = int(ends[turn_count - 1]) + 2 if len(ends) >= turn_count else len(ids)
    cut = min(cut, t)
    tokens[r, :cut], loss_mask[r, :cut], attention[r, :cut] = ids[:cut], mask[:cut], 1
  return _batch(tokens, loss_mask, attention)
