"""The copy statistic: do the spans a policy copies keep their token ids?

A ParaAct policy writes few tokens of its own: most of what decides success is
copied from its context (the provider name of the instruction into a search
query, a tool name from a search result into a call, an id from one
observation into the next call, a value into the answer). A small model
learns such copies as induction (attend to the earlier occurrence, emit the
token that followed it), which moves token *ids*: a copy whose text occurs
earlier under other ids (`` Triraon`` in the instruction, ``"Triraon`` in
the query) must be learnt per name, and a name never seen in training
cannot be.

`copy_spans` marks the copied spans of each assistant message (tool names,
string argument values split at whitespace, answer words) and
`copy_statistic` measures, over those whose text occurs earlier in the row,
the fraction of their tokens whose exact id sequence occurs earlier too.
"""

from __future__ import annotations

import json
import re
from typing import Iterable, Iterator

import numpy as np

from paraagent_jax import tokenizer as tokenizer_lib

_CALL = re.compile(r"<call>(.*?)</call>", re.S)
_ANSWER = re.compile(r"<answer>(.*?)</answer>", re.S)
_WORD = re.compile(r"\S+")
_EDGE_PUNCT = ".,:;!?()[]{}'\""
SPAN_KINDS = ("name", "argument", "answer")


def _strings(value) -> Iterator[str]:
  if isinstance(value, str):
    yield value
  elif isinstance(value, dict):
    for v in value.values():
      yield from _strings(v)
  elif isinstance(value, list):
    for v in value:
      yield from _strings(v)


def _words(text: str, base: int, kind: str) -> Iterator[tuple[int, int, str]]:
  for m in _WORD.finditer(text):
    word = m.group(0)
    lead = len(word) - len(word.lstrip(_EDGE_PUNCT))
    core = word.strip(_EDGE_PUNCT)
    if core:
      yield base + m.start() + lead, base + m.start() + lead + len(core), kind


def copy_spans(content: str) -> list[tuple[int, int, str]]:
  """Copied spans of one assistant message: ``(start, end, kind)`` offsets.

  Kinds: ``name`` (a call's tool name), ``argument`` (a word of a string
  argument value, e.g. a query word, an id, a value), ``answer`` (a word of
  the answer). Malformed calls contribute nothing.
  """
  spans = []
  for m in _CALL.finditer(content):
    body, base = m.group(1), m.start(1)
    try:
      call = json.loads(body)
    except ValueError:
      continue
    if not isinstance(call, dict):
      continue
    name = call.get("name")
    if isinstance(name, str) and name:
      i = body.find(json.dumps(name, ensure_ascii=False))
      if i >= 0:
        spans.append((base + i + 1, base + i + 1 + len(name), "name"))
    cursor = body.find('"arguments"')
    for s in _strings(call.get("arguments", {})):
      quoted = json.dumps(s, ensure_ascii=False)
      i = body.find(quoted, max(cursor, 0))
      if i < 0 or quoted != f'"{s}"':   # escaped text: offsets would drift
        continue
      cursor = i + len(quoted)
      spans.extend(_words(s, base + i + 1, "argument"))
  for m in _ANSWER.finditer(content):
    spans.extend(_words(m.group(1), m.start(1), "answer"))
  return spans


def _contains(haystack: np.ndarray, needle: np.ndarray) -> bool:
  if len(needle) == 0 or len(needle) > len(haystack):
    return False
  h, n = haystack.astype("<i4").tobytes(), needle.astype("<i4").tobytes()
  i = h.find(n)
  while i >= 0:
    if i % 4 == 0:
      return True
    i = h.find(n, i + 1)
  return False


def row_copy_tokens(messages: list[dict], tokenizer) -> Iterator[dict]:
  """Per copied span that occurs earlier as text: its tokens and whether its
  exact id sequence occurs earlier in the row.

  Yields dicts ``{"kind", "text", "token_index" (list of row positions),
  "same_ids" (bool)}``. The row is the chat rendering of ``messages``.
  """
  text = tokenizer_lib.render_messages(messages)
  enc = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
  ids = np.asarray(enc["input_ids"], np.int32)
  offsets = np.asarray(enc["offset_mapping"], np.int64).reshape(-1, 2)
  pos = 0
  for m in messages:
    rendered = tokenizer_lib.render_messages([m])
    start = text.find(rendered, pos)
    if start < 0:
      break
    pos = start + len(rendered)
    if m["role"] != "assistant":
      continue
    content_at = start + rendered.find(m["content"])
    first = int(np.searchsorted(offsets[:, 1], content_at, side="right"))
    for s, e, kind in copy_spans(m["content"]):
      s, e = s + content_at, e + content_at
      # Earlier as a whole word (not inside a longer run of letters/digits,
      # which the tokenizer may split elsewhere: "list" in "waitlists").
      word = re.compile(r"(?<![^\W_])" + re.escape(text[s:e]) + r"(?![^\W_])")
      if not word.search(text, 0, content_at):
        continue      # nothing earlier to copy from (e.g. a planned word)
      idx = np.nonzero((offsets[:, 0] < e) & (offsets[:, 1] > s))[0]
      if len(idx) == 0:
        continue
      yield {"kind": kind, "text": text[s:e], "token_index": idx.tolist(),
             "same_ids": _contains(ids[:first], ids[idx])}


def copy_statistic(records: Iterable[dict], tokenizer,
                   max_rows: int | None = 400) -> dict:
  """The copy statistic of demonstration records (``messages`` lists).

  Returns:
    ``{"copy_statistic": fraction of copied tokens whose id sequence occurs
    earlier, "copy_tokens": their count, "rows": rows read, and per kind
    "copy_statistic/<kind>"}``.
  """
  same = {k: 0 for k in SPAN_KINDS}
  total = {k: 0 for k in SPAN_KINDS}
  rows = 0
  for rec in records:
    if max_rows is not None and rows >= max_rows:
      break
    rows += 1
    for span in row_copy_tokens(rec["messages"], tokenizer):
      n = len(span["token_index"])
      total[span["kind"]] += n
      same[span["kind"]] += n * span["same_ids"]
  all_total = sum(total.values())
  out = {"copy_statistic": sum(same.values()) / max(all_total, 1),
         "copy_tokens": all_total, "rows": rows}
  for k in SPAN_KINDS:
    out[f"copy_statistic/{k}"] = same[k] / max(total[k], 1)
  return out


def format_copy_statistic(stat: dict) -> str:
  """One line for the console."""
  per = ", ".join(f"{k} {stat[f'copy_statistic/{k}']:.3f}" for k in SPAN_KINDS)
  return (f"copy statistic {stat['copy_statistic']:.3f} of {stat['copy_tokens']} "
          f"copied tokens in {stat['rows']} rows ({per})")
