"""Ships a finished demo SFT run as `pretrained/demo_sft` (HF directory + checksums).

  python scripts/ship_demo_sft.py --workdir=/tmp/sft_long --out=pretrained/demo_sft \
      --wall="1 h 27 min" --command="python -m paraagent_jax.train ..."

A recipe in phases (phase 2 started from phase 1's weights): ``--before=``
phase 1's workdir and one ``--command`` per phase, in order.

Exports the newest checkpoint with `paraagent_jax.export_hf` (safetensors,
config.json, the demo tokenizer with the ParaAct chat template), writes a
README.md with the command, wall time, a summary of the training log
(loss and throughput per phase, validation loss, the greedy held-out
evaluation from ``sft_eval.json``) and finally ``SHA256SUMS`` over every
file, which `hf_io.load_hf` and `tokenizer.load_tokenizer` check on load.
"""

import argparse
import json
import os
import shutil
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from paraagent_jax import checksums  # noqa: E402  pylint: disable=wrong-import-position
from paraagent_jax import export_hf  # noqa: E402  pylint: disable=wrong-import-position
from paraagent_jax import metrics as metrics_lib  # noqa: E402  pylint: disable=wrong-import-position
from paraagent_jax import rundir  # noqa: E402  pylint: disable=wrong-import-position
from paraagent_jax.trainer.sft import EVAL_FILE, format_eval  # noqa: E402  pylint: disable=wrong-import-position


def log_summary(workdir: str, copy_warmup: int, turn_warmup: int,
                copy_every: int = 0) -> list[str]:
  """Markdown lines: the training log at a few steps, per phase."""
  recs = metrics_lib.read_jsonl(os.path.join(workdir, "metrics.jsonl"))
  train = [r for r in recs if "train/loss" in r]
  evals = {int(r["step"]): r["eval/loss"] for r in recs if "eval/loss" in r}
  lines = ["| step | phase | train loss | validation loss | tokens/s (the log's train/tokens_per_sec) |",
           "|---|---|---|---|---|"]
  keep = {train[0]["step"], copy_warmup, copy_warmup + turn_warmup,
          train[-1]["step"]} | set(evals)
  keep |= {r["step"] for r in train if r["step"] % 200 == 0}
  if copy_every:
    # Copy batches are interleaved: show a demonstration step next to each.
    keep |= {r["step"] for r in train if r["step"] % 200 == 10
             and r["step"] > copy_warmup + turn_warmup}
  for r in train:
    s = int(r["step"])
    if s not in keep:
      continue
    warm = copy_warmup + turn_warmup
    phase = ("copy rows" if s <= copy_warmup else "opening turns" if s <= warm
             else f"copy rows (every {copy_every}th batch)"
             if copy_every and (s - warm) % copy_every == 0 else "demonstrations")
    ev = f"{evals[s]:.3f}" if s in evals else ""
    lines.append(f"| {s} | {phase} | {r['train/loss']:.3f} | {ev} | "
                 f"{r.get('train/tokens_per_sec', 0):.0f} |")
  return lines


def main():
  ap = argparse.ArgumentParser()
  ap.add_argument("--workdir", required=True, help="the finished SFT stage directory")
  ap.add_argument("--out", required=True)
  ap.add_argument("--command", required=True, action="append",
                  help="the command that trained it (repeat, in order, for a "
                  "recipe in phases)")
  ap.add_argument("--before", action="append", default=[],
                  help="the workdir of an earlier phase (repeat, in order): its "
                  "training log is summarised first")
  ap.add_argument("--wall", required=True, help="its wall time, as measured")
  ap.add_argument("--machine", default="2-core CPU VM (24 GB), JAX on CPU")
  args = ap.parse_args()
  if os.path.exists(args.out):
    shutil.rmtree(args.out)
  summary = export_hf.export(args.workdir, args.out)
  config = rundir.load_run_config(args.workdir)
  with open(os.path.join(args.workdir, EVAL_FILE)) as f:
    ev = json.load(f)
  m = config.model
  with open(os.path.join(args.out, "config.json")) as f:
    vocab = json.load(f)["vocab_size"]
  log_lines = []
  phases = args.before + [args.workdir]
  for i, wd in enumerate(phases):
    cfg = config if wd == args.workdir else rundir.load_run_config(wd)
    if len(phases) > 1:
      log_lines += [f"Phase {i + 1} ({wd}; steps count from 1 in each phase):", ""]
    log_lines += log_summary(wd, int(cfg.data.get("copy_warmup", 0)),
                             int(cfg.data.get("turn_warmup", 0)),
                             int(cfg.data.get("copy_every", 0))) + [""]
  n_params = sum(os.path.getsize(os.path.join(args.out, f)) for f in summary["files"]
                 if f.endswith(".safetensors")) // 4
  readme = [
      "# demo_sft: the CPU demo's shipped SFT policy",
      "",
      "A small Qwen3 (`Qwen3ForCausalLM`: "
      f"{m.num_layers} layers, hidden {m.hidden_size}, {m.num_heads} heads with "
      f"{m.num_kv_heads} KV heads, vocabulary {vocab}, "
      f"about {n_params / 1e6:.1f}M parameters, fp32) trained from scratch by "
      "supervised fine-tuning on ParaAct demonstrations of ToolEnv's procedural "
      "catalog, **train-split providers only**, with the demo BPE tokenizer "
      "(trained on the train split) and the ParaAct chat template.",
      "`configs/demo.py` starts RL from this directory; "
      "`from_scratch=True` retrains it.",
      "",
      "## How it was made",
      "",
      *[f"    {c}" for c in args.command],
      f"    python scripts/ship_demo_sft.py --workdir=WORKDIR --out={args.out} ...",
      "",
      f"Wall time of the training command: {args.wall} on a {args.machine}.",
      f"Exported from step {summary['step']}.",
      "",
      "## Training log (WORKDIR/metrics.jsonl)",
      "",
      *log_lines,
      "",
      f"## Greedy ParaAct on {ev.get('num_tasks')} held-out test-split tasks "
      "(providers never seen in training; the 50,011-tool catalog searched as usual)",
      "",
      "```",
      format_eval(ev),
      "```",
      "",
      "## Files",
      "",
      "`SHA256SUMS` lists every other file; loading (`paraagent_jax.models.hf_io.load_hf`, "
      "`paraagent_jax.tokenizer.load_tokenizer`) checks it and stops on a mismatch. "
      "By hand: `cd pretrained/demo_sft && sha256sum -c SHA256SUMS`.",
      "",
  ]
  with open(os.path.join(args.out, "README.md"), "w") as f:
    f.write("\n".join(readme))
  checksums.write_checksums(args.out)
  for name in os.listdir(args.out):
    os.chmod(os.path.join(args.out, name), 0o644)
  print(f"shipped step {summary['step']} to {args.out}: {sorted(os.listdir(args.out))}")


if __name__ == "__main__":
  main()
