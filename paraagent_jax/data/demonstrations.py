"""SFT batches from the cold-start demonstrations (``data.source="demonstrations"``).

Reads the TFDS `Demonstrations` dataset (built on demand from
``<data_dir>/demonstrations_<split>.jsonl``), tokenises each conversation with
`paraagent_jax.tokenizer.ChatEncoder` exactly as the rollout does (one turn
per message, an assistant turn as ``generation_prompt_ids() + content +
end_of_turn_ids()``), and yields fixed-shape batches with the interface of
`paraagent_jax.data.synthetic`: ``tokens`` [B,T] int32, ``loss_mask`` [B,T]
float32 and ``attention_mask`` [B,T] int32.

The loss mask is 1 on the assistant contents and on the ``<|im_end|>`` that
closes them; never on the role header ``<|im_start|>assistant\\n``, the
newline after ``<|im_end|>`` (the rollout appends both itself) or any
system/user/tool token.

One demonstration per row, right-padded; or, with ``data.pack``, several
whole demonstrations per row (`paraagent_jax.data.packing`): the batch then
also has ``segment_ids`` and ``positions`` [B,T] int32, the model keeps the
demonstrations of a row apart (no attention across segments, RoPE positions
restarting at 0) and the loss mask is 0 on each segment's first token.

Length buckets (``data.length_bucket``): each epoch's permutation is cut
into windows of ``BUCKET_WINDOW`` global batches; a window is sorted by
length, cut into global batches and the batches are shuffled; a batch is
padded to the first bucket length that holds its longest row. Rows of a
batch then have similar lengths, so little compute goes to padding; each
bucket length is one compiled shape, so keep them few. The order is still a
pure function of (seed, epoch, position): resuming is exact.

Order: position ``p`` of the endless stream is example ``perm_e[p % N]`` of
epoch ``e = p // N``, ``perm_e`` a permutation seeded by (seed, e); row ``r``
of batch ``i`` on host ``h`` of ``H`` is position ``(i * H + h) * B + r``, so
hosts read disjoint rows and the position is one integer (exact resume).
Packed, the stream is one of rows instead of examples: epoch ``e``'s rows are
`packing.first_fit` of ``perm_e`` (every example once per epoch; the last
rows of an epoch may be part-filled), and they follow the rows of the
epochs before. Still a pure function of (seed, position): resuming is exact.

``data_config`` keys read (``config.data``):
  data_dir: directory with the JSONL files (required).
  tokenizer: tokenizer directory; "" means ``<data_dir>/tokenizer``, which
    is trained (`demo_tokenizer.train_demo_tokenizer`) when it does not exist.
  tokenizer_vocab_size: vocabulary of that trained tokenizer (default 4096).
  catalog: the TFDS builder config (default "procedural").
  tfds_dir: TFDS data directory; "" means ``<data_dir>/tfds`` (for a bucket
    data_dir, a local cache: `tfds_builders.LOCAL_CACHE`).
  overlong: "drop" (default) or "truncate" for conversations over seq_len.
  length_bucket: 0 (default: every batch is seq_len long), an int L (buckets
    at the multiples of L) or a string of lengths "512,768,1024" (seq_len is
    always the last bucket).
  pack: False (default: one demonstration per row) or True: demonstrations
    are packed first-fit into rows of seq_len (with length buckets, a batch
    is padded to the bucket of its longest packed row). Warm-up and copy
    batches are not packed.
  context_loss_weight: weight of the non-assistant tokens (system, task,
    observations) in the ``train`` split's loss mask (default 0: assistant
    tokens only). A small weight makes the model also predict the
    observations, whose tool names and ids repeat what came before: a cheap
    extra copying signal for a model trained from scratch. Other splits keep
    the 0/1 mask, so the validation loss stays the assistant-token loss.
  copy_warmup: the first this many batches of the ``train`` split are
    synthetic copy rows (`copy_batch`), the demonstrations follow from their
    own first batch (default 0: none). A model trained from scratch must
    copy names, ids and values from its context, which it learns late from
    the demonstrations alone; short copy rows teach it cheaply first.
  copy_len: padded length of a copy row (default 256).
  copy_rows: rows of a copy batch on this host (default 0: ``batch_size``);
    short copy rows are cheap, so a warm-up batch can hold more of them.
  turn_warmup: batches of opening turns after the copy batches (train split
    only; default 0): demonstrations cut after their first ``turn_count``
    (default 1) assistant turns, ``turn_rows`` rows (default ``batch_size``)
    of ``turn_len`` tokens (default 384). See `DemonstrationSFTData.turn_batch`.
  copy_mode: "pairs" (default: short user/assistant spans in the chat
    format), "repeat" (a span of distinct random non-special tokens, a
    separator, the same span again; the loss is on the second copy) or
    "induction" (like "repeat" with a random span length after a random
    prefix). "repeat" rows are learnt fast (32 rows x 65 tokens: 8.3 ->
    0.54 nats in 150 steps, where "pairs" rows stayed above 3.5 nats after
    300), but by a fixed-offset copy: S always has the same length, and the
    model copies 0% of "induction" rows. Only "induction" rows need (and
    teach) an induction head, which forms far more slowly
    (docs/records/cpu_demo.md, section 3).
  copy_every: after the warm-ups, every this many batches is a copy batch
    (train split only; default 0: none), so the copying skill is kept while
    the demonstrations train (copy rows alone at the start were forgotten).
"""

from __future__ import annotations

import bisect
import os
from typing import Any, Iterator, Mapping, Sequence

import ml_collections
import numpy as np

from paraagent_jax import config_utils
from paraagent_jax import fileio
from paraagent_jax import tokenizer as tokenizer_lib
from paraagent_jax.data import copy_stats
from paraagent_jax.data import demo_tokenizer
from paraagent_jax.data import packing
from paraagent_jax.data import tfds_builders
from paraagent_jax.data import warmup
# The row encoding and the length buckets (re-exported for callers).
from paraagent_jax.data.rows import (  # pylint: disable=unused-import
    bucket_lengths, encode_conversations, encode_demonstrations)

# The SFT stage evaluates on "validation"; the held-out demonstrations are "test".
_SPLIT_ALIASES = {"train": "train", "validation": "test", "test": "test"}
OVERLONG_MODES = ("drop", "truncate")
COPY_MODES = ("pairs", "repeat", "induction")
BUCKET_WINDOW = 32   # global batches sorted together by length


def _data(data_config) -> ml_collections.ConfigDict:
  """``config.data`` with the defaults of `config_utils.demonstration_defaults`."""
  return config_utils.with_defaults(data_config, config_utils.demonstration_defaults())


def resolve_tokenizer(data_config, data_dir: str):
  """Loads ``data.tokenizer`` (or ``<data_dir>/tokenizer``, trained if absent)."""
  data_config = _data(data_config)
  path = data_config.tokenizer
  if path:
    return tokenizer_lib.load_tokenizer(path)
  path = os.path.join(data_dir, "tokenizer")
  if fileio.exists(os.path.join(path, "tokenizer.json")):
    return tokenizer_lib.load_tokenizer(path)
  return demo_tokenizer.train_demo_tokenizer(
      data_dir, path, vocab_size=int(data_config.tokenizer_vocab_size))


class DemonstrationSFTData:
  """Endless, deterministic, host-sharded SFT batches of demonstrations.

  Attributes:
    batch_size: rows per batch on this host.
    seq_len: T.
    vocab_size: the tokenizer's size (``len(tokenizer)``).
    num_examples: demonstrations that fit (after dropping/truncating).
    num_dropped: over-long demonstrations dropped.
    num_truncated: over-long demonstrations truncated.
    ids: record ids, aligned with the examples.
    pack: several demonstrations per row (`paraagent_jax.data.packing`).
  """

  def __init__(self, records, tokenizer, *, batch_size: int, seq_len: int,
               seed: int = 0, split: str = "train", overlong: str = "drop",
               process_index: int = 0, process_count: int = 1,
               encoded=None, length_bucket: int | str | Sequence[int] = 0,
               context_weight: float = 0.0, copy_warmup: int = 0,
               copy_len: int = 256, copy_rows: int = 0,
               copy_mode: str = "pairs", turn_warmup: int = 0,
               turn_rows: int = 0, turn_len: int = 384, turn_count: int = 1,
               turn_system: bool = True, copy_every: int = 0,
               pack: bool = False):
    if not 0.0 <= context_weight <= 1.0:
      raise ValueError(f"context_loss_weight={context_weight} not in [0, 1]")
    self._context_weight = float(context_weight)
    self.copy_warmup, self.copy_len = int(copy_warmup), int(copy_len)
    self.copy_rows = int(copy_rows) or int(batch_size)
    if copy_mode not in COPY_MODES:
      raise ValueError(f"copy_mode={copy_mode!r}; expected one of {COPY_MODES}")
    self.copy_mode = copy_mode
    self.copy_statistic = None   # set by make_sft_data (train split)
    self.turn_warmup, self.turn_len = int(turn_warmup), int(turn_len)
    self.turn_rows, self.turn_count = int(turn_rows) or int(batch_size), int(turn_count)
    self.turn_system = bool(turn_system)
    self._im_start = tokenizer.convert_tokens_to_ids(tokenizer_lib.IM_START)
    if self.turn_warmup < 0 or self.turn_len < 32 or self.turn_count < 1:
      raise ValueError(f"turn_warmup={turn_warmup} must be >= 0, turn_len="
                       f"{turn_len} >= 32 and turn_count={turn_count} >= 1")
    self.copy_every = int(copy_every)
    if self.copy_every < 0 or self.copy_every == 1:
      raise ValueError(f"copy_every={copy_every} must be 0 (off) or >= 2")
    if self.copy_warmup < 0 or self.copy_len < 32:
      raise ValueError(f"copy_warmup={copy_warmup} must be >= 0 and "
                       f"copy_len={copy_len} >= 32")
    enc = tokenizer_lib.ChatEncoder(tokenizer)
    self._copy_glue = (enc.encode(f"{tokenizer_lib.IM_START}user\n"),
                       enc.encode(f"{tokenizer_lib.IM_END}\n") +
                       enc.generation_prompt_ids(), enc.end_of_turn_ids(),
                       len(enc.encode(tokenizer_lib.IM_END)))
    self._special = set(getattr(tokenizer, "all_special_ids", []) or [])
    self._special |= {i for t, i in tokenizer.get_added_vocab().items()}
    if overlong not in OVERLONG_MODES:
      raise ValueError(f"overlong={overlong!r}; expected one of "
                       f"{OVERLONG_MODES}")
    if not 0 <= process_index < process_count:
      raise ValueError(f"process_index={process_index} not in "
                       f"[0, {process_count})")
    self.batch_size, self.seq_len = int(batch_size), int(seq_len)
    self.vocab_size = len(tokenizer)
    self._seed, self._split = int(seed), split
    self._process_index, self._process_count = process_index, process_count
    pad = tokenizer.pad_token_id
    self._pad = 0 if pad is None else int(pad)
    encoder = tokenizer_lib.ChatEncoder(tokenizer)
    self.num_dropped = self.num_truncated = 0
    self.ids, self._examples = [], []
    # Sorted by id: TFDS stores records shuffled by key.
    records = sorted(records, key=lambda r: r["id"])
    if encoded is None:  # else: `encode_demonstrations` of sorted records
      encoded = encode_demonstrations(encoder,
                                      [r["messages"] for r in records])
    for rec, (ids, mask) in zip(records, encoded):
      if len(ids) > self.seq_len:
        if overlong == "drop" or not mask[:self.seq_len].any():
          self.num_dropped += 1
          continue
        ids, mask = ids[:self.seq_len], mask[:self.seq_len]
        self.num_truncated += 1
      self.ids.append(rec["id"])
      self._examples.append((ids, mask))
    self.num_examples = len(self._examples)
    self.buckets = bucket_lengths(length_bucket, self.seq_len)
    self._lengths = np.asarray([len(ids) for ids, _ in self._examples], np.int64)
    if not self._examples:
      raise config_utils.ConfigError(
          f"data: split {split!r}: no demonstration fits seq_len={seq_len} "
          f"({self.num_dropped} dropped); raise seq_len or set "
          f"data.overlong=truncate")
    self.pack = bool(pack)
    self._perms: dict[int, np.ndarray] = {}
    # Packed: epoch e's rows (example indices) and the first row position of
    # each epoch (extended as far as a position needs).
    self._packs: dict[int, list[np.ndarray]] = {}
    self._row_starts = [0]
    self._next_batch = 0

  def state(self) -> dict[str, Any]:
    """The position: index of the next batch (JSON-serialisable)."""
    return {"next_batch": self._next_batch, "seed": self._seed,
            "split": self._split, "num_examples": self.num_examples,
            "pack": self.pack}

  def restore(self, state: Mapping[str, Any]) -> None:
    """Continues after the batch that was last yielded at ``state()``."""
    mine = self.state()
    for key in ("seed", "split", "num_examples"):
      if key in state and state[key] != mine[key]:
        raise ValueError(f"data state {dict(state)} was saved for another "
                         f"{key} than this data ({self.state()})")
    # A state saved before packing existed is one of unpacked rows.
    if bool(state.get("pack", False)) != self.pack:
      raise ValueError(f"data state {dict(state)} was saved with data.pack="
                       f"{bool(state.get('pack', False))}; this data has "
                       f"data.pack={self.pack}")
    self._next_batch = int(state["next_batch"])

  def _perm(self, epoch: int) -> np.ndarray:
    if epoch not in self._perms:
      if len(self._perms) > 4:
        self._perms.clear()
      rng = np.random.default_rng([self._seed, epoch])
      perm = rng.permutation(self.num_examples)
      if self.buckets and not self.pack:
        perm = self._group_by_length(perm, rng)
      self._perms[epoch] = perm
    return self._perms[epoch]

  def _group_by_length(self, perm: np.ndarray, rng) -> np.ndarray:
    """``perm`` with each window sorted by length and its batches shuffled."""
    g = self.batch_size * self._process_count          # one global batch
    n_full = len(perm) // g * g
    out = []
    for start in range(0, n_full, g * BUCKET_WINDOW):
      window = perm[start:min(start + g * BUCKET_WINDOW, n_full)]
      window = window[np.argsort(self._lengths[window], kind="stable")]
      blocks = window.reshape(-1, g)
      out.append(blocks[rng.permutation(len(blocks))].reshape(-1))
    out.append(perm[n_full:])   # the partial batch stays last
    return np.concatenate(out)

  def _interleaved(self, j: int) -> tuple[bool, int]:
    """(is a copy batch, its index) of batch ``j`` after the warm-ups.

    With ``copy_every = k``, every k-th batch is a copy batch (copy batch
    numbers continue after the warm-up's); the others are demonstration
    batches ``j - j // k``, so no demonstration is skipped.
    """
    k = self.copy_every
    if k and j % k == k - 1:
      return True, self.copy_warmup + j // k
    return False, j - (j // k if k else 0)

  def batch_len(self, index: int) -> int:
    """Padded length T of batch ``index`` (the same on every host)."""
    if index < self.copy_warmup:
      return min(self.copy_len, self.seq_len)
    index -= self.copy_warmup
    if index < self.turn_warmup:
      return min(self.turn_len, self.seq_len)
    index -= self.turn_warmup
    is_copy, index = self._interleaved(index)
    if is_copy:
      return min(self.copy_len, self.seq_len)
    if not self.buckets:
      return self.seq_len
    g = self.batch_size * self._process_count
    if self.pack:
      longest = max(int(self._lengths[self.packed_row(index * g + r)].sum())
                    for r in range(g))
    else:
      longest = max(self._lengths[self.example_index(index * g + r)]
                    for r in range(g))
    return self.buckets[bisect.bisect_left(self.buckets, longest)]

  def example_index(self, position: int) -> int:
    """Index (into `ids`) of the example at a stream position."""
    epoch, i = divmod(position, self.num_examples)
    return int(self._perm(epoch)[i])

  def epoch_rows(self, epoch: int) -> list[np.ndarray]:
    """Packed rows of an epoch: example indices, `packing.first_fit` of its
    permutation."""
    if epoch not in self._packs:
      if len(self._packs) > 4:
        self._packs.clear()
      perm = self._perm(epoch)
      self._packs[epoch] = [perm[r] for r in
                            packing.first_fit(self._lengths[perm], self.seq_len)]
    return self._packs[epoch]

  def packed_row(self, position: int) -> np.ndarray:
    """Example indices of packed row ``position`` of the endless row stream."""
    starts = self._row_starts
    while starts[-1] <= position:
      starts.append(starts[-1] + len(self.epoch_rows(len(starts) - 1)))
    epoch = bisect.bisect_right(starts, position) - 1
    return self.epoch_rows(epoch)[position - starts[epoch]]

  def pack_summary(self) -> str:
    """Epoch 0's packing: rows, demonstrations a row, slots filled."""
    rows = self.epoch_rows(0)
    return (f"packed {self.num_examples} demonstrations into {len(rows)} rows of "
            f"{self.seq_len} ({self.num_examples / len(rows):.2f} a row, "
            f"{packing.fill(self._lengths, rows, self.seq_len):.1%} of the slots "
            f"filled; one per row: "
            f"{packing.fill(self._lengths, self._lengths, self.seq_len):.1%})")

  def _example(self, k: int) -> tuple[np.ndarray, np.ndarray]:
    """Example ``k``'s ids and loss mask (context tokens weighted)."""
    ids, mask = self._examples[k]
    if self._context_weight:
      mask = np.where(mask > 0, mask, self._context_weight).astype(np.float32)
    return ids, mask

  def copy_batch(self, index: int) -> dict[str, np.ndarray]:
    """Synthetic copy batch ``index`` (`warmup.copy_pair_rows`, or
    `warmup.repeat_rows` for ``copy_mode`` "repeat"/"induction"): a pure
    function of (seed, index, host)."""
    b, t = self.copy_rows, min(self.copy_len, self.seq_len)
    rng = np.random.default_rng([self._seed, 7919, index, self._process_index])
    if self.copy_mode in ("repeat", "induction"):
      return warmup.repeat_rows(rng, self._copy_glue[1], self.vocab_size, self._special,
                                b, t, self._pad, vary=self.copy_mode == "induction")
    return warmup.copy_pair_rows(rng, [ex[0] for ex in self._examples], self._copy_glue,
                                 self._special, b, t, self._pad)

  def turn_batch(self, index: int) -> dict[str, np.ndarray]:
    """Opening-turns batch ``index`` (`warmup.opening_turn_rows`): ``turn_rows``
    demonstrations of the epoch-0 order, cut after their first ``turn_count``
    assistant turns, ``turn_len`` long.

    These rows hold the decisions that copy from the instruction (the
    provider name into the first search queries, values into the first
    calls) several times more densely than whole demonstrations, for the
    same tokens.
    """
    b, t = self.turn_rows, min(self.turn_len, self.seq_len)
    first = (index * self._process_count + self._process_index) * b
    rows = [self._examples[self.example_index(first + r)] for r in range(b)]
    return warmup.opening_turn_rows(rows, t, self._pad, self._im_start, self.turn_count,
                                    with_system=self.turn_system)

  def _locate(self, index: int) -> tuple[str, int]:
    """What batch ``index`` is: ("copy", i) copy batch i, ("turns", i)
    opening-turns batch i or ("demos", i) demonstrations batch i."""
    if index < self.copy_warmup:
      return "copy", index
    if index < self.copy_warmup + self.turn_warmup:
      return "turns", index - self.copy_warmup
    is_copy, index = self._interleaved(index - self.copy_warmup - self.turn_warmup)
    return ("copy" if is_copy else "demos"), index

  def row_ids(self, index: int) -> list:
    """The demonstrations of batch ``index``'s rows on this host: an id per
    row (a list of ids per packed row; "turns:<id>" for an opening-turns
    row); [] for a copy batch, whose rows are synthetic."""
    kind, i = self._locate(index)
    if kind == "copy":
      return []
    rows = self.turn_rows if kind == "turns" else self.batch_size
    first = (i * self._process_count + self._process_index) * rows
    if kind == "turns":
      return [f"turns:{self.ids[self.example_index(first + r)]}" for r in range(rows)]
    if self.pack:
      return [[self.ids[k] for k in self.packed_row(first + r)] for r in range(rows)]
    return [self.ids[self.example_index(first + r)] for r in range(rows)]

  def last_row_ids(self) -> list:
    """`row_ids` of the batch last yielded (the ``debug.rows_log`` hook)."""
    return self.row_ids(self._next_batch - 1)

  def batch(self, index: int) -> dict[str, np.ndarray]:
    """Batch number ``index`` (this host's rows), without moving."""
    kind, i = self._locate(index)
    if kind == "copy":
      return self.copy_batch(i)
    if kind == "turns":
      return self.turn_batch(i)
    b, t = self.batch_size, self.batch_len(index)
    first = (i * self._process_count + self._process_index) * b
    if self.pack:
      return packing.pack_rows(
          [[self._example(k) for k in self.packed_row(first + r)]
           for r in range(b)], t, self._pad)
    tokens, loss_mask, attention = warmup.empty_batch(b, t, self._pad)
    for r in range(b):
      ids, mask = self._example(self.example_index(first + r))
      tokens[r, :len(ids)] = ids
      loss_mask[r, :len(ids)] = mask
      attention[r, :len(ids)] = 1
    return {"tokens": tokens, "loss_mask": loss_mask,
            "attention_mask": attention}

  def __iter__(self) -> Iterator[dict[str, np.ndarray]]:
    return self

  def __next__(self) -> dict[str, np.ndarray]:
    out = self.batch(self._next_batch)
    self._next_batch += 1
    return out


def load_demonstrations(data_config, split: str) -> list[dict[str, Any]]:
  """Decoded records of a split from TFDS, building the dataset if needed."""
  data_config = _data(data_config)
  data_dir = data_config.data_dir
  if not data_dir:
    raise ValueError("data.data_dir is empty: set it to the directory with "
                     "demonstrations_<split>.jsonl")
  if split not in _SPLIT_ALIASES:
    raise ValueError(f"split={split!r}; choose from {sorted(_SPLIT_ALIASES)}")
  tfds_dir = data_config.tfds_dir or tfds_builders.default_data_dir(data_dir)
  if fileio.is_remote(tfds_dir):
    raise ValueError(f"data.tfds_dir={tfds_dir}: the prepared TFDS files "
                     f"(array_record) are written and read on the local disk "
                     f"only (array_record has no gs:// support without "
                     f"TensorFlow); leave data.tfds_dir empty to cache them "
                     f"under {tfds_builders.LOCAL_CACHE}")
  builder = tfds_builders.build_dataset(
      "demonstrations", data_dir, tfds_dir,
      config=data_config.catalog)
  return tfds_builders.load_records(builder, _SPLIT_ALIASES[split])


# The SFT stage makes the validation data anew at every evaluation; tokenising
# thousands of demonstrations each time would dominate a CPU run.
_CACHE: dict[tuple, tuple] = {}


def _load_encoded(data_config, split: str, protocol=None):
  """(sorted records, tokenizer, their encodings in ``protocol``'s format),
  cached per source state."""
  data_config = _data(data_config)
  data_dir = data_config.data_dir
  tok_path = data_config.tokenizer or os.path.join(
      data_dir or ".", "tokenizer")
  key = (split, tok_path, data_config.tfds_dir,
         data_config.catalog, protocol) + tfds_builders.files_key(
             *(os.path.join(data_dir or ".", f"demonstrations_{s}.jsonl")
               for s in tfds_builders.SPLITS),
             os.path.join(tok_path, "tokenizer.json"))
  if key not in _CACHE:
    records = sorted(load_demonstrations(data_config, split),
                     key=lambda r: r["id"])
    tok = resolve_tokenizer(data_config, data_dir)
    encoded = encode_conversations(tok, [r["messages"] for r in records], protocol)
    if len(_CACHE) >= 4:
      _CACHE.clear()
    # The key is taken again: training the tokenizer changes its mtime.
    key = key[:5] + tfds_builders.files_key(*(k[0] for k in key[5:]))
    _CACHE[key] = (records, tok, encoded)
  return _CACHE[key]


def make_sft_data(data_config, *, split: str, batch_size: int, seq_len: int,
                  seed: int, process_index: int = 0, process_count: int = 1,
                  protocol=None) -> DemonstrationSFTData:
  """The source hook used by the SFT stage (`trainer.sft.make_sft_data`, ``data.source``).

  Args:
    data_config: ``config.data`` (keys in the module docstring).
    split: "train", "validation" (the test demonstrations) or "test".
    batch_size: rows per host.
    seq_len: T.
    seed: shuffling seed.
    process_index: this host.
    process_count: number of hosts.
    protocol: the run's `paraact.chat_format.ProtocolSpec` (None = tags).

  Returns:
    A `DemonstrationSFTData`.
  """
  data_config = _data(data_config)
  records, tok, encoded = _load_encoded(data_config, split, protocol)
  data = DemonstrationSFTData(
      records, tok, batch_size=batch_size, seq_len=seq_len, seed=seed,
      split=split, overlong=str(data_config.overlong),
      process_index=process_index, process_count=process_count,
      encoded=encoded, length_bucket=data_config.length_bucket,
      context_weight=(float(data_config.context_loss_weight)
                      if split == "train" else 0.0),
      copy_warmup=int(data_config.copy_warmup) if split == "train" else 0,
      copy_len=int(data_config.copy_len),
      copy_rows=int(data_config.copy_rows) // process_count,
      copy_mode=str(data_config.copy_mode),
      turn_warmup=int(data_config.turn_warmup) if split == "train" else 0,
      turn_rows=int(data_config.turn_rows) // process_count,
      turn_len=int(data_config.turn_len),
      turn_count=int(data_config.turn_count),
      turn_system=bool(data_config.turn_system),
      copy_every=int(data_config.copy_every) if split == "train" else 0,
      pack=bool(data_config.pack))
  print(f"demonstrations[{split}]: {data.num_examples} examples, "
        f"{data.num_dropped} dropped and {data.num_truncated} truncated "
        f"(over {seq_len} tokens), vocab {data.vocab_size}", flush=True)
  if data.pack:
    print(f"demonstrations[{split}]: {data.pack_summary()}", flush=True)
  if split == "train" and process_index == 0:
    stat = copy_stats.copy_statistic(records, tok, max_rows=200)
    data.copy_statistic = stat["copy_statistic"]
    print(f"demonstrations[{split}]: " + copy_stats.format_copy_statistic(stat),
          flush=True)
  return data
