"""Exports a training workdir's Orbax checkpoint as a Hugging Face Qwen3 model.

Usage::

  python -m paraagent_jax.export_hf --workdir=/tmp/sft_tiny --out=/tmp/export
  python -m paraagent_jax.export_hf --workdir=W --step=200 --out=O \
      --push_to_hub=user/repo

The run config (``WORKDIR/config.json``, written by `paraagent_jax.rundir.write_config`)
gives the model architecture and the tokenizer; the weights come from
``WORKDIR/checkpoints/<step>`` (the latest step unless --step). The output is
`hf_io.save_hf`'s directory (loadable by ``AutoModelForCausalLM`` and, when the
run had a tokenizer, ``AutoTokenizer`` with the run's chat template: the
tokenizer's, or ``protocol.chat_template`` when the run set one) plus a
README.md model card with the training config and any eval results found in
the workdir.
"""

from __future__ import annotations

import json
import os

from absl import flags
from absl import logging

from paraagent_jax import checkpoint as ckpt_lib
from paraagent_jax import cli
from paraagent_jax import config_utils
from paraagent_jax import fileio
from paraagent_jax import rundir
from paraagent_jax import tokenizer as tok_lib
from paraagent_jax.models import hf_io
from paraagent_jax.trainer import state as state_lib

PROG = "paraagent_jax.export_hf"
_STEP = cli.STEP
_OUT = flags.DEFINE_string("out", None, "Output HF directory.")
_PUSH = flags.DEFINE_string("push_to_hub", None, "Hub repo id (user/repo).")
_MAX_SHARD = flags.DEFINE_integer("max_shard_bytes", 2 * 1024 ** 3,
                                  "Largest safetensors shard.")

# Files in a workdir that hold evaluation results (written by the eval
# report, the RL stage and the pipeline's stage markers).
EVAL_FILES = ("report.json", "eval_report.json", "rl_eval.json", "DONE.json")


class ExportError(config_utils.ConfigError):
  """A workdir that cannot be exported (reported as one line)."""


def eval_results(workdir: str) -> dict:
  """Eval/result JSON files found in `workdir`, by file name."""
  out = {}
  for name in EVAL_FILES:
    p = os.path.join(workdir, name)
    if fileio.isfile(p):
      try:
        with fileio.open(p) as f:
          out[name] = json.load(f)
      except json.JSONDecodeError:
        continue  # A half-written report is not worth failing the export.
  return out


def model_card(config, model_cfg, step: int, evals: dict, has_tok: bool) -> str:
  """README.md text: what was trained, how, and how well."""
  lines = [
      "---", "library_name: transformers", "tags: [paraagent-jax, qwen3]",
      "---", "", "# ParaAgent-JAX Qwen3 export", "",
      f"Exported from an Orbax checkpoint at step {step} "
      f"(stage `{config.get('stage', '?')}`).", "",
      "## Architecture", "", "```json",
      json.dumps(model_cfg.to_hf_dict(), indent=1), "```", "",
      "## Usage", "", "```python",
      "from transformers import AutoModelForCausalLM, AutoTokenizer",
      "model = AutoModelForCausalLM.from_pretrained(PATH)"]
  if has_tok:
    lines += ["tok = AutoTokenizer.from_pretrained(PATH)",
              "text = tok.apply_chat_template(messages, tokenize=False, "
              "add_generation_prompt=True)"]
  lines += ["```", "", "## Training config", "", "```json",
            json.dumps(config_utils.to_dict(config), indent=1, default=str),
            "```", ""]
  lines += ["## Evaluation", ""]
  if evals:
    for name, obj in evals.items():
      lines += [f"`{name}`:", "", "```json",
                json.dumps(obj, indent=1, default=str)[:20000], "```", ""]
  else:
    lines += ["No evaluation report was found in the workdir.", ""]
  return "\n".join(lines)


def push_to_hub(out_dir: str, repo_id: str) -> None:
  """Uploads `out_dir` to the Hub; a one-line error when that is impossible."""
  try:
    # Optional: only --push_to_hub needs it, and the export works without it.
    import huggingface_hub  # pylint: disable=g-import-not-at-top
  except ImportError:
    raise ExportError("--push_to_hub needs the huggingface_hub package") from None
  if fileio.is_remote(out_dir):
    raise ExportError(f"--push_to_hub uploads a local folder; --out={out_dir} is "
                      f"remote: export to a local --out to push (the export "
                      f"is in {out_dir})")
  try:
    api = huggingface_hub.HfApi()
    api.create_repo(repo_id, exist_ok=True)
    api.upload_folder(folder_path=out_dir, repo_id=repo_id)
  except (OSError, ValueError, RuntimeError) as e:
    raise ExportError(
        f"push_to_hub={repo_id} failed (offline or not logged in? the export "
        f"is in {out_dir}): {' '.join(str(e).split())[:300]}") from None


def export(workdir: str, out_dir: str, step: int | None = None,
           push_to_hub_repo: str | None = None,
           max_shard_bytes: int = 2 * 1024 ** 3) -> dict:
  """Library entry point: writes the HF directory; returns a summary dict."""
  workdir = fileio.abspath(workdir)
  hint = ckpt_lib.pipeline_hint(workdir)
  if hint:
    raise ExportError(f"--workdir={workdir}: {hint}")
  config = rundir.load_run_config(workdir)
  tok_path = rundir.tokenizer_dir(config)
  if not fileio.isfile(os.path.join(tok_path, "tokenizer.json")):
    tok_path = ""   # synthetic data: no tokenizer to export
  tokenizer = tok_lib.load_tokenizer(tok_path) if tok_path else None
  template = str((config.get("protocol") or {}).get("chat_template", "") or "")
  if tokenizer is not None and template:
    # The template the run's turns went through (protocol.chat_template), so
    # that the exported model is served with the tokens it was trained on.
    with fileio.open(template) as f:
      tokenizer.chat_template = f.read()
  model, step = rundir.load_model(workdir, len(tokenizer) if tokenizer else 0, step)
  model_cfg = model.config
  files = hf_io.save_hf(model, out_dir, tokenizer=tokenizer,
                        max_shard_bytes=max_shard_bytes)
  evals = eval_results(workdir)
  fileio.write_text_atomic(os.path.join(out_dir, "README.md"), model_card(
      config, model_cfg, step, evals, tokenizer is not None))
  if push_to_hub_repo:
    push_to_hub(out_dir, push_to_hub_repo)
  return {"step": step, "files": files, "tokenizer": tok_path,
          "evals": sorted(evals)}


def main(argv) -> None:
  """Command line: one-line errors for bad input."""
  if len(argv) > 1:
    cli.fail(PROG, f"unexpected arguments {argv[1:]}")
  if not flags.FLAGS["verbosity"].present:
    # Orbax logs every file it reads at INFO; keep the console readable.
    logging.set_verbosity(logging.WARNING)
  if not cli.WORKDIR.value or not _OUT.value:
    cli.fail(PROG, "--workdir and --out are required")
  cli.check_paths(PROG, cli.WORKDIR.value, _OUT.value)
  try:
    summary = state_lib.on_process_0(PROG, "the export", lambda: export(
        cli.WORKDIR.value, _OUT.value, _STEP.value, _PUSH.value, _MAX_SHARD.value))
  except (ExportError, ckpt_lib.CheckpointError, config_utils.ConfigError,
          OSError, ValueError, KeyError) as e:
    cli.fail(PROG, str(e))
  if summary is not None:   # process 0 (the others waited)
    print(f"exported step {summary['step']} to {_OUT.value}: "
          f"{', '.join(summary['files'])}", flush=True)


if __name__ == "__main__":
  cli.run(main, PROG, __doc__, own=("out", "push_to_hub", "max_shard_bytes"),
          shared=("workdir", "step"))
