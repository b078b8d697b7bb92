"""Teacher-forced accuracy of an SFT checkpoint per class of assistant token.

  python scripts/sft_token_classes.py --workdir=/tmp/demo/sft --split=test --n=40 [--kind=parallel]

Given the correct preceding tokens of a demonstration, is the argmax the
demonstrated token? Counted separately for the tokens a policy copies from
its context (``name``: tool names in calls; ``argument``: words of string
arguments, e.g. query words, ids, values; ``answer``: answer words;
`paraagent_jax.data.copy_stats`), for the first token of each copied span
(where the choice of *what* to copy is made; also split by where the
copy comes from, the task instruction or an observation), for entity ids
(``id``: first token, ``id_span``: the whole id), and for the other assistant
tokens (protocol tags, JSON punctuation, thoughts). Train rows show what
was learnt, test rows (providers never seen in training) whether it
generalises. Prints one JSON line per split.
"""

import argparse
import json
import os
import re
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from flax import nnx  # noqa: E402  pylint: disable=wrong-import-position
import ml_collections  # noqa: E402  pylint: disable=wrong-import-position
import numpy as np  # noqa: E402  pylint: disable=wrong-import-position
from paraagent_jax import checkpoint as ckpt_lib  # noqa: E402  pylint: disable=wrong-import-position
from paraagent_jax import rundir  # noqa: E402  pylint: disable=wrong-import-position
from paraagent_jax import sharding as shd  # noqa: E402  pylint: disable=wrong-import-position
from paraagent_jax import tokenizer as tok_lib  # noqa: E402  pylint: disable=wrong-import-position
from paraagent_jax.data import copy_stats  # noqa: E402  pylint: disable=wrong-import-position
from paraagent_jax.trainer import state as state_lib  # noqa: E402  pylint: disable=wrong-import-position


_ID = re.compile(r"[a-z]{3}-[0-9a-f]{6}")   # `toolenv.executor.make_id`


def token_class_accuracy(model, tokenizer, records, max_len: int = 2048) -> dict:
  """Accuracy per token class over ``records`` (demonstration dicts)."""
  hits: dict[str, list[int]] = {}

  def count(name, ok):
    h = hits.setdefault(name, [0, 0])
    h[0] += int(ok)
    h[1] += 1

  for rec in records:
    instruction = next(m["content"] for m in rec["messages"] if m["role"] == "user")
    text = tok_lib.render_messages(rec["messages"])
    enc = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
    ids = np.asarray(enc["input_ids"], np.int32)[:max_len]
    offsets = np.asarray(enc["offset_mapping"]).reshape(-1, 2)[:max_len]
    logits = np.asarray(model(ids[None])[0])
    pred = np.concatenate([[-1], logits.argmax(-1)[:-1]])   # pred[i] for ids[i]
    # Assistant content tokens (what the SFT loss trains).
    assistant = np.zeros(len(ids), bool)
    pos = 0
    for m in rec["messages"]:
      rendered = tok_lib.render_messages([m])
      start = text.find(rendered, pos)
      pos = start + len(rendered)
      if m["role"] == "assistant":
        s = start + rendered.find(m["content"])
        e = s + len(m["content"])
        assistant |= (offsets[:, 0] >= s) & (offsets[:, 1] <= e) & (offsets[:, 1] > offsets[:, 0])
    copied = np.zeros(len(ids), bool)
    for span in copy_stats.row_copy_tokens(rec["messages"], tokenizer):
      idx = [i for i in span["token_index"] if i < len(ids)]
      if not idx:
        continue
      copied[idx] = True
      # Where the copy comes from: the task instruction or an observation.
      source = "instruction" if re.search(
          r"(?<![^\W_])" + re.escape(span["text"]) + r"(?![^\W_])", instruction) else "observation"
      is_id = _ID.fullmatch(span["text"]) is not None   # e.g. aud-3e9184
      if is_id:
        count("id", pred[idx[0]] == ids[idx[0]])
        count("id_span", all(pred[i] == ids[i] for i in idx))
      for j, i in enumerate(idx):
        count(span["kind"], pred[i] == ids[i])
        if j == 0:
          count(f"{span['kind']}_first", pred[i] == ids[i])
          count(f"{span['kind']}_first_from_{source}", pred[i] == ids[i])
      count(f"{span['kind']}_span", all(pred[i] == ids[i] for i in idx))
    for i in np.nonzero(assistant & ~copied)[0]:
      count("other", pred[i] == ids[i])
  return {k: round(v[0] / max(v[1], 1), 4) for k, v in sorted(hits.items())} | {
      f"n_{k}": v[1] for k, v in sorted(hits.items())}


def main():
  ap = argparse.ArgumentParser()
  ap.add_argument("--workdir", required=True, help="an SFT stage directory")
  ap.add_argument("--data_dir", default="", help="demonstrations (default: "
                  "the run's data.data_dir or WORKDIR/../demos)")
  ap.add_argument("--split", default="train,test")
  ap.add_argument("--n", type=int, default=40)
  ap.add_argument("--kind", default="", help="only rows of these task kinds, "
                  "comma-separated (e.g. parallel,mixed); default all")
  args = ap.parse_args()
  with open(os.path.join(args.workdir, "config.json")) as f:
    config = ml_collections.ConfigDict(json.load(f))
  data_dir = (args.data_dir or config.data.get("data_dir", "")
              or os.path.join(os.path.dirname(os.path.abspath(args.workdir)), "demos"))
  config.data.data_dir = data_dir
  tok = tok_lib.load_tokenizer(rundir.tokenizer_dir(config))
  mcfg = rundir.model_config(config, vocab_size=len(tok))
  mesh = shd.make_mesh({"data": 1, "fsdp": -1, "tensor": 1})
  graphdef, abstract, shardings = state_lib.abstract_model(mcfg, mesh, shd.as_rules(None))
  state = ckpt_lib.restore_model_state(args.workdir,
                                       ckpt_lib.with_shardings(abstract, shardings))
  model = nnx.merge(graphdef, state)
  for split in args.split.split(","):
    with open(os.path.join(data_dir, f"demonstrations_{split}.jsonl")) as f:
      records = (json.loads(line) for line in f)
      if args.kind:
        kinds = set(args.kind.split(","))
        records = (r for r in records if r.get("kind") in kinds)
      records = [r for _, r in zip(range(args.n), records)]
    out = token_class_accuracy(model, tok, records)
    print(json.dumps({"split": split, "kind": args.kind or "all", "rows": len(records),
                      **out}), flush=True)


if __name__ == "__main__":
  main()
