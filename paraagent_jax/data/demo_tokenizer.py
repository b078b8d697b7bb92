"""The CPU demo's BPE tokenizer, trained on demonstrations and ToolEnv text.

`train_demo_tokenizer` gathers text (rendered demonstrations in the chat
format, task instructions, the meta-tool docs and, when a catalog is given,
one search-result line and one ``get_tool_doc`` JSON per tool), then calls
`paraagent_jax.tokenizer.train_bpe_tokenizer`, which adds the chat and ParaAct
protocol tokens as single tokens and saves ``tokenizer.json`` in HF format.
The result loads with `paraagent_jax.tokenizer.load_tokenizer` and with
``transformers.AutoTokenizer.from_pretrained``, exactly like a real Qwen3
tokenizer directory.
"""

from __future__ import annotations

import json
import os
from typing import Iterable, Iterator

from paraagent_jax import fileio
from paraagent_jax import tokenizer as tokenizer_lib
from paraagent_jax.paraact import protocol
from toolenv import search


def demonstration_texts(data_dir: str, split: str = "train") -> Iterator[str]:
  """Texts from ``demonstrations_<split>.jsonl`` and ``tasks_<split>.jsonl``.

  Each demonstration becomes its whole rendered conversation (chat markers
  included, so merges across turn boundaries are learnt as they occur);
  each task contributes its instruction. Only the train split by default:
  a merge learnt from a test-split provider name would give that unseen
  name a token whose embedding no training row ever updates.
  """
  pattern = "*" if split == "all" else split
  paths = sorted(fileio.glob(os.path.join(data_dir, f"demonstrations_{pattern}.jsonl")))
  tasks = sorted(fileio.glob(os.path.join(data_dir, f"tasks_{pattern}.jsonl")))
  if not paths and not tasks:
    raise FileNotFoundError(f"no demonstrations_{pattern}.jsonl or "
                            f"tasks_{pattern}.jsonl in {data_dir}")
  for path in paths + tasks:
    with fileio.open(path) as f:
      for line in f:
        if not line.strip():
          continue
        rec = json.loads(line)
        if "messages" in rec:
          yield tokenizer_lib.render_messages(rec["messages"])
        elif rec.get("instruction"):
          yield rec["instruction"]


def tool_doc_texts(catalog=None, max_tools: int | None = None
                   ) -> Iterator[str]:
  """The meta-tool docs, and per catalog tool its search line and doc JSON.

  Args:
    catalog: a ``toolenv.catalog.store.Catalog`` or None.
    max_tools: use only the first this many tools (None: all).
  """
  yield from protocol.META_TOOLS
  if catalog is None:
    return
  for i, tool in enumerate(catalog):
    if max_tools is not None and i >= max_tools:
      break
    yield search.result_line(tool)
    yield json.dumps(search.get_tool_doc(catalog, tool.name),
                     ensure_ascii=False)


def train_demo_tokenizer(texts_or_dir: str | Iterable[str], out_dir: str,
                         vocab_size: int = 4096, catalog=None,
                         max_tools: int | None = None):
  """Trains the demo BPE and saves it in HF format in ``out_dir``.

  Args:
    texts_or_dir: a directory with the demonstration/task JSONL files, or an
      iterable of training texts.
    out_dir: where ``tokenizer.json`` and ``tokenizer_config.json`` go.
    vocab_size: total vocabulary size, special and added tokens included.
    catalog: optional ToolEnv catalog whose tool docs are added to the text.
    max_tools: cap on the catalog tools used (large catalogs slow training).

  Returns:
    The tokenizer as loaded back from ``out_dir`` by `load_tokenizer` (so
    the caller sees exactly what later stages will load).
  """
  if isinstance(texts_or_dir, (str, os.PathLike)):
    texts = list(demonstration_texts(os.fspath(texts_or_dir)))
  else:
    texts = list(texts_or_dir)
  texts.extend(tool_doc_texts(catalog, max_tools))
  tokenizer_lib.train_bpe_tokenizer(texts, vocab_size=vocab_size,
                                    out_dir=out_dir)
  return tokenizer_lib.load_tokenizer(out_dir)
